// Package cli holds what gpufleet's commands share, in the gpufleet binary
// and in the node agent's own binary (cmd/gpufleet-agent): the process's
// logger, the cluster credentials and the signal context. It must stay
// small: the agent binary links it, and everything it imports adds to the
// agent's memory on every GPU node (controller-runtime's log and config
// packages, not its root package, which links the whole of it).
package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	uzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// SignalContext is cancelled on SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// SetupLogging installs the process's logger (human-readable with
// development) at level and returns the level, which may change while the
// process runs.
func SetupLogging(development bool, level zapcore.Level) *uzap.AtomicLevel {
	atomic := uzap.NewAtomicLevelAt(level)
	logger := zap.New(zap.UseDevMode(development), zap.Level(atomic))
	crlog.SetLogger(logger)
	klog.SetLogger(logger)
	return &atomic
}

// RestConfig loads the credentials: kubeconfig, or with none
// controller-runtime's search ($KUBECONFIG, in-cluster, ~/.kube/config).
// Like controller-runtime's own loader, it turns client-go's client-side
// rate limit (5 requests/s) off and relies on the API server's priority and
// fairness: a 5/s limit would serialize a large cluster's maintenance
// behind the limiter.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := config.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("finding cluster credentials: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	return cfg, nil
}
