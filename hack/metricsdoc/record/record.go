// Package record wraps controller-runtime's metrics registry so that
// hack/metricsdoc can see the collectors registered on it, and who
// registered them: a prometheus.Registry describes its metrics only
// through its collectors, and does not hand them out.
//
// Its init must run before any package that registers a metric. Go
// initializes, among the packages whose imports are initialized, the one
// first by import path (the language specification, "Package
// initialization"); this one imports only controller-runtime's metrics
// package, and github.com/gpufleet/gpufleet/hack/… comes before
// …/internal/… and before sigs.k8s.io/…. So only the collectors that
// controller-runtime's metrics package registers itself come before it.
// hack/metricsdoc checks that every gpufleet_ series the registry gathers
// was recorded.
package record

import (
	"runtime"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Registration is one collector registered on the registry.
type Registration struct {
	Collector prometheus.Collector
	// Package is the import path of the function that registered it.
	Package string
}

var (
	mu            sync.Mutex
	registrations []Registration
)

// Registrations are the collectors registered since this package's init,
// in order.
func Registrations() []Registration {
	mu.Lock()
	defer mu.Unlock()
	return append([]Registration(nil), registrations...)
}

// Registry is the registry the recorder wraps (everything registered
// before its init included).
var Registry metrics.RegistererGatherer

func init() {
	Registry = metrics.Registry
	metrics.Registry = recorder{Registry}
}

type recorder struct{ metrics.RegistererGatherer }

func (r recorder) Register(c prometheus.Collector) error {
	if err := r.RegistererGatherer.Register(c); err != nil {
		return err
	}
	record(c)
	return nil
}

func (r recorder) MustRegister(cs ...prometheus.Collector) {
	r.RegistererGatherer.MustRegister(cs...)
	for _, c := range cs {
		record(c)
	}
}

func (r recorder) Unregister(c prometheus.Collector) bool {
	ok := r.RegistererGatherer.Unregister(c)
	if ok {
		mu.Lock()
		defer mu.Unlock()
		for i, reg := range registrations {
			if reg.Collector == c {
				registrations = append(registrations[:i], registrations[i+1:]...)
				break
			}
		}
	}
	return ok
}

// record notes c with the package of the first caller outside this
// package and the prometheus client.
func record(c prometheus.Collector) {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	pkg := ""
	for {
		f, more := frames.Next()
		if p := funcPackage(f.Function); p != "" && !strings.HasPrefix(p, "github.com/prometheus/") && !strings.HasSuffix(p, "/hack/metricsdoc/record") {
			pkg = p
			break
		}
		if !more {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	registrations = append(registrations, Registration{Collector: c, Package: pkg})
}

// funcPackage is the import path of a function's full name
// ("github.com/a/b.init.0", "github.com/a/b.(*T).M").
func funcPackage(fn string) string {
	slash := strings.LastIndex(fn, "/")
	dot := strings.Index(fn[slash+1:], ".")
	if dot < 0 {
		return ""
	}
	return fn[:slash+1+dot]
}
