// Package devtest is what the integration tests of every package share:
// one local cluster per test binary, skipping in -short runs, and the
// operator run in-process, waiting for the cluster to reach a state.
// Only tests import it.
package devtest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// NeedCluster skips tb in -short runs: it needs the local cluster.
func NeedCluster(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("integration test: needs the local cluster (run without -short)")
	}
}

// Main is a TestMain body: unless -short, it starts a local cluster with
// nodes, the CRDs and namespace, hands it to use, runs the tests and stops
// the cluster. It returns the exit code.
func Main(m *testing.M, nodes []devcluster.NodeSpec, namespace string, scheme *runtime.Scheme, use func(*devcluster.Env)) int {
	return MainWith(m, func() devcluster.Options { return devcluster.Options{} }, nodes, namespace, scheme, use)
}

// MainWith is Main with the cluster's options, chosen once the flags are
// parsed (a benchmark flag may ask for a large cluster).
func MainWith(m *testing.M, options func() devcluster.Options, nodes []devcluster.NodeSpec, namespace string, scheme *runtime.Scheme, use func(*devcluster.Env)) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	env, err := devcluster.NewEnv(context.Background(), options(), nodes, namespace, scheme)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the local cluster:", err)
		return 1
	}
	defer env.Stop()
	use(env)
	return m.Run()
}

// StartOperator runs the operator built from opts against cfg in-process,
// with setup applied to its manager (e.g. an in-process agent), until the
// test ends or the returned stop is called; a manager error fails the test.
// Tests build several managers in one process, so controller names are not
// checked for uniqueness; metrics and probes are off unless opts says.
func StartOperator(tb testing.TB, cfg *rest.Config, opts operator.Options, setup ...func(manager.Manager) error) (stop func()) {
	tb.Helper()
	opts.Controller.SkipNameValidation = ptr.To(true)
	if opts.MetricsAddr == "" {
		opts.MetricsAddr = "0"
	}
	if opts.ProbeAddr == "" {
		opts.ProbeAddr = "0"
	}
	mgr, err := operator.New(cfg, opts)
	if err != nil {
		tb.Fatal(err)
	}
	for _, s := range setup {
		if err := s(mgr); err != nil {
			tb.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("operator: %v", err)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
