// Package operator wires gpufleet's controllers into one controller-runtime
// manager. Each capability (maintenance, gpustack, repair, allocation) can
// be switched on or off; the decisions themselves live in the capability
// packages.
package operator

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/pprof"
	"slices"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/allocation"
	"github.com/gpufleet/gpufleet/internal/apirequest"
	"github.com/gpufleet/gpufleet/internal/gpucluster"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/liveowner"
	"github.com/gpufleet/gpufleet/internal/maintenance"
	"github.com/gpufleet/gpufleet/internal/repair"
)

// Leader election needs leases in the operator's own namespace only (a
// namespaced Role; kustomize moves it with the namespace).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch,namespace=gpufleet-system

// DefaultNamespace is where the operator runs when neither --namespace nor
// POD_NAMESPACE says otherwise.
const DefaultNamespace = "gpufleet-system"

// Options configure the operator.
type Options struct {
	// Namespace is the operator's own namespace (its config objects live there).
	Namespace string
	// MetricsAddr serves Prometheus metrics; "0" disables it.
	MetricsAddr string
	// MetricsSecure serves the metrics (and pprof) over HTTPS, each request
	// authenticated (TokenReview) and authorized (SubjectAccessReview:
	// get on the path, e.g. the nonResourceURL /metrics). False: plain
	// HTTP without either (gpufleet dev, the tests; a cluster that scrapes
	// plain HTTP on a trusted network). The operator command's default is
	// true.
	MetricsSecure bool
	// MetricsCertDir holds tls.crt and tls.key for the secure metrics
	// server ("": a self-signed certificate made at start).
	MetricsCertDir string
	// ProbeAddr serves /healthz and /readyz; "0" disables it.
	ProbeAddr string
	// LeaderElection makes only one replica active at a time.
	LeaderElection bool
	// LeaderElectionID names the lease.
	LeaderElectionID string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election
	// (zero = controller-runtime defaults).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Capabilities to run; empty = all registered.
	Capabilities []string
	// Leases judges, by observation, whether NVIDIA's operators hold their
	// leader leases; shared by the capabilities and the fence (New makes
	// it).
	Leases *liveowner.Observer
	// PodName is the operator's own pod (never evicted by a drain).
	PodName string
	// Clock is injected into every controller; nil = real clock.
	Clock clock.WithTicker
	// GPUStackDegradedAfter: a GPU stack pod not Ready this long marks its
	// node Degraded (0 = 2 minutes).
	GPUStackDegradedAfter time.Duration
	// DriverUpgradeTimeout: a node whose new driver is not Ready this long
	// after the restart fails its upgrade (0 = 10 minutes).
	DriverUpgradeTimeout time.Duration
	// GPUStackPassInterval: a ClusterPolicy's reconcile pass starts at most
	// this often (0 = 200ms; negative: a pass per event).
	GPUStackPassInterval time.Duration
	// Profiling serves Go's pprof handlers under /debug/pprof/ on the
	// metrics address.
	Profiling bool
	// MaintenanceNamespaces, when set, are the only namespaces (besides the
	// operator's) whose NodeMaintenance objects may cordon and drain
	// nodes; the others wait, saying why.
	MaintenanceNamespaces []string
	// LogLevel, when set, follows spec.logLevel of the default
	// MaintenanceOperatorConfig in Namespace (see LogLevelReconciler); its
	// value when New is called is the level without a config. Nil: the
	// level is not managed.
	LogLevel *zap.AtomicLevel
	// Controller is passed to the manager as controller-runtime's
	// ctrl.Options.Controller: defaults for every controller (for example
	// SkipNameValidation, which a process that builds several managers
	// needs, or CacheSyncTimeout).
	Controller config.Controller
}

// Capability is one switchable part of the operator.
type Capability struct {
	Name string
	// AddToScheme registers the capability's API types.
	AddToScheme func(*runtime.Scheme) error
	// Setup registers the capability's controllers with the manager.
	Setup func(mgr manager.Manager, opts Options) error
	// Cache, if set, restricts what the manager caches of some kinds.
	Cache func(Options) map[client.Object]cache.ByObject
}

// registry lists every capability the binary has, in start order.
var registry = []Capability{
	{
		Name:        "maintenance",
		AddToScheme: maintenancev1.AddToScheme,
		Cache:       func(Options) map[client.Object]cache.ByObject { return maintenance.CacheObjects() },
		Setup: func(mgr manager.Manager, o Options) error {
			if err := maintenance.Setup(mgr, maintenance.Options{Namespace: o.Namespace, PodName: o.PodName, Clock: o.Clock, Leases: o.Leases,
				// gpufleet's own requestors end their objects within their own bounds.
				BoundedRequestors: []string{repairv1.RequestorID, gpustack.UpgradeRequestor}, AllowedNamespaces: o.MaintenanceNamespaces}); err != nil {
				return err
			}
			maintenance.ServeObjectMetrics(mgr.GetCache(), mgr.Elected())
			return nil
		},
	},
	{
		Name:        "repair",
		AddToScheme: repairv1.AddToScheme,
		Setup: func(mgr manager.Manager, o Options) error {
			if err := repair.Setup(mgr, repair.Options{Namespace: o.Namespace, Clock: o.Clock}); err != nil {
				return err
			}
			repair.ServeStateMetrics(mgr.GetCache(), mgr.Elected())
			return nil
		},
	},
	{
		Name: "gpustack",
		AddToScheme: func(s *runtime.Scheme) error {
			// apiextensions: the stack reads the ServiceMonitor CRD.
			return errors.Join(nvidiav1.AddToScheme(s), nvidiav1alpha1.AddToScheme(s), apiextensionsv1.AddToScheme(s))
		},
		Cache: func(o Options) map[client.Object]cache.ByObject {
			out := gpustack.CacheObjects(o.Namespace)
			maps.Copy(out, gpucluster.CacheObjects(o.Namespace))
			return out
		},
		Setup: func(mgr manager.Manager, o Options) error {
			// One cache of the GPU Operator's leader lease for both
			// controllers: neither acts while it is held.
			leases, err := liveowner.NewCache(mgr, liveowner.GPUOperator)
			if err != nil {
				return err
			}
			if err := gpustack.Setup(mgr, gpustack.Options{Namespace: o.Namespace, Clock: o.Clock, Leases: leases, Observer: o.Leases,
				DegradedAfter: o.GPUStackDegradedAfter, UpgradeTimeout: o.DriverUpgradeTimeout, PassInterval: o.GPUStackPassInterval}); err != nil {
				return err
			}
			// The GPUCluster controller runs when the API server serves
			// GPUCluster and DRA's DeviceClass (a cluster with an older
			// CRD set, or without DRA, runs the ClusterPolicy alone).
			if missing := gpucluster.Unserved(mgr.GetRESTMapper()); missing != "" {
				mgr.GetLogger().Info("the GPUCluster controller is off: the API server does not serve " + missing + " (restart the operator once it does)")
			} else if err := gpucluster.Setup(mgr, gpucluster.Options{Namespace: o.Namespace, Clock: o.Clock, Leases: leases, Observer: o.Leases}); err != nil {
				return err
			}
			gpustack.ServeMetrics(mgr.GetCache(), mgr.Elected())
			return nil
		},
	},
	{
		// GPUs held by pods, per pod and namespace, and each node's GPU
		// capacity (gpufleet_allocation_*), from a cache of every pod
		// stripped to its GPU request, held by the leader only.
		Name:        "allocation",
		AddToScheme: func(*runtime.Scheme) error { return nil },
		Setup: func(mgr manager.Manager, _ Options) error {
			return allocation.Setup(mgr, allocation.Options{})
		},
	},
}

// CapabilityNames lists the registered capabilities, sorted.
func CapabilityNames() []string {
	names := make([]string, 0, len(registry))
	for _, c := range registry {
		names = append(names, c.Name)
	}
	sort.Strings(names)
	return names
}

// Scheme returns a scheme with the Kubernetes types and every capability's types.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	for _, c := range registry {
		if c.AddToScheme == nil {
			continue
		}
		if err := c.AddToScheme(s); err != nil {
			return nil, fmt.Errorf("registering %s types: %w", c.Name, err)
		}
	}
	return s, nil
}

// New builds a manager with the selected capabilities. Start it with mgr.Start.
func New(cfg *rest.Config, opts Options) (manager.Manager, error) {
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.LeaderElectionID == "" {
		opts.LeaderElectionID = "gpufleet-operator"
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	selected, err := selectCapabilities(opts.Capabilities)
	if err != nil {
		return nil, err
	}
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	// Every request the operator sends is counted by verb and resource
	// (gpufleet_api_requests_total), so users can see what it asks of the
	// API server.
	cfg = apirequest.Instrument(cfg)
	metricsOpts := metricsserver.Options{BindAddress: orDefault(opts.MetricsAddr, ":8080")}
	if opts.MetricsSecure {
		// As controller-runtime offers it: TLS, and every scrape's token
		// reviewed and authorized by the API server (pprof's too).
		metricsOpts.SecureServing = true
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
		metricsOpts.CertDir = opts.MetricsCertDir
	}
	if opts.Profiling {
		metricsOpts.ExtraHandlers = map[string]http.Handler{
			"/debug/pprof/":        http.HandlerFunc(pprof.Index),
			"/debug/pprof/cmdline": http.HandlerFunc(pprof.Cmdline),
			"/debug/pprof/profile": http.HandlerFunc(pprof.Profile),
			"/debug/pprof/symbol":  http.HandlerFunc(pprof.Symbol),
			"/debug/pprof/trace":   http.HandlerFunc(pprof.Trace),
		}
	}
	// managedFields are never read; dropping them roughly halves the
	// memory of cached objects. Nodes lose their image lists too. The
	// cluster's pods are not cached at all: maintenance watches only the
	// pods of the nodes it drains, the GPU stack only its own.
	byObject := map[client.Object]cache.ByObject{&corev1.Node{}: {Transform: stripNode}}
	for _, c := range selected {
		if c.Cache != nil {
			maps.Copy(byObject, c.Cache(opts))
		}
	}
	mopts := ctrl.Options{
		Scheme: scheme,
		Cache: cache.Options{
			// ResourceSlices lose what no controller reads
			// (stripResourceSlice); a ByObject entry would need the API
			// server to serve DRA before the manager can start.
			DefaultTransform: stripDefault,
			ByObject:         byObject,
		},
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  orDefault(opts.ProbeAddr, ":8081"),
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        opts.LeaderElectionID,
		LeaderElectionNamespace: opts.Namespace,
		// Release the lease on a clean shutdown so a standby takes over at once.
		LeaderElectionReleaseOnCancel: true,
		Controller:                    opts.Controller,
	}
	if opts.LeaseDuration > 0 {
		mopts.LeaseDuration = &opts.LeaseDuration
	}
	if opts.RenewDeadline > 0 {
		mopts.RenewDeadline = &opts.RenewDeadline
	}
	if opts.RetryPeriod > 0 {
		mopts.RetryPeriod = &opts.RetryPeriod
	}
	mgr, err := ctrl.NewManager(cfg, mopts)
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding ready check: %w", err)
	}
	self := liveowner.FenceIdentity(opts.PodName)
	opts.Leases = liveowner.OrNew(opts.Leases, self)
	if fenced := fencedOperators(selected); len(fenced) > 0 {
		// While gpufleet acts in their place, it holds their leases.
		if err := liveowner.SetupFence(mgr, opts.Leases, self, opts.Clock, fenced...); err != nil {
			return nil, err
		}
		// What no lease shows: NVIDIA's operator run without leader
		// election, a second gpufleet in another namespace.
		if opts.Leases.Rivals == nil {
			if opts.Leases.Rivals, err = liveowner.NewRivals(mgr, opts.Namespace); err != nil {
				return nil, err
			}
		}
	}
	for _, c := range selected {
		if err := c.Setup(mgr, opts); err != nil {
			return nil, fmt.Errorf("setting up %s: %w", c.Name, err)
		}
	}
	if opts.LogLevel != nil {
		if err := setupLogLevel(mgr, opts.Namespace, opts.LogLevel); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// fencedOperators are the NVIDIA operators whose leases the selected
// capabilities act in place of.
func fencedOperators(selected []Capability) []liveowner.Operator {
	var out []liveowner.Operator
	for _, c := range selected {
		switch c.Name {
		case "maintenance":
			out = append(out, liveowner.MaintenanceOperator)
		case "gpustack":
			out = append(out, liveowner.GPUOperator)
		}
	}
	return out
}

// The secure metrics server reviews each scrape's token and asks whether
// its user may get the path.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

func init() { metrics.Registry.MustRegister(apirequest.Metric) }

func selectCapabilities(names []string) ([]Capability, error) {
	if len(names) == 0 {
		return registry, nil
	}
	var out []Capability
	for _, n := range names {
		n = strings.TrimSpace(n)
		i := slices.IndexFunc(registry, func(c Capability) bool { return c.Name == n })
		if i < 0 {
			return nil, fmt.Errorf("unknown capability %q (known: %s)", n, strings.Join(CapabilityNames(), ", "))
		}
		out = append(out, registry[i])
	}
	return out, nil
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
