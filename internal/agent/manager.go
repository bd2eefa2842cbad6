package agent

import (
	"context"
	"fmt"
	"os/exec"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// ExecRunner runs commands with os/exec.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// Options configure the agent's manager.
type Options struct {
	// NodeName is the agent's node: it runs the actions of this node's
	// NodeRepairs only.
	NodeName string
	// Executor runs the actions on the host.
	Executor Executor
	// Controller is passed to the manager as controller-runtime's
	// ctrl.Options.Controller (for example SkipNameValidation, which a
	// process that builds several managers needs).
	Controller config.Controller
}

// NewManager builds the agent's manager: it watches only its own node's
// NodeRepairs and runs their pending actions with opts.Executor.
func NewManager(cfg *rest.Config, opts Options) (manager.Manager, error) {
	scheme := runtime.NewScheme()
	if err := repairv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Node{}: {Field: fieldsForNode(opts.NodeName)},
		}},
		Controller: opts.Controller,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the agent manager: %w", err)
	}
	mine := predicate.NewPredicateFuncs(func(o client.Object) bool {
		nr := o.(*repairv1.NodeRepair)
		return nr.Spec.NodeName == opts.NodeName && nr.Status.Pending != nil
	})
	err = builder.ControllerManagedBy(mgr).Named("repair-agent").
		For(&repairv1.NodeRepair{}, builder.WithPredicates(mine)).
		Complete(&Agent{Client: mgr.GetClient(), NodeName: opts.NodeName, Executor: opts.Executor, Clock: clock.RealClock{}})
	if err != nil {
		return nil, err
	}
	return mgr, nil
}

// AddInProcess adds to mgr one agent for every node: it runs the pending
// actions of all NodeRepairs with exec. It is for simulated clusters (the
// dev command and tests), where no agent DaemonSet runs; mgr's scheme
// must have the repair and core types. clk nil = the real clock.
func AddInProcess(mgr manager.Manager, exec Executor, clk clock.PassiveClock) error {
	if clk == nil {
		clk = clock.RealClock{}
	}
	pending := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.(*repairv1.NodeRepair).Status.Pending != nil
	})
	err := builder.ControllerManagedBy(mgr).Named("repair-agent-inprocess").
		For(&repairv1.NodeRepair{}, builder.WithPredicates(pending)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(&Agent{Client: mgr.GetClient(), Executor: exec, Clock: clk})
	if err != nil {
		return fmt.Errorf("setting up the in-process agent: %w", err)
	}
	return nil
}

func fieldsForNode(name string) fields.Selector {
	return fields.OneTermEqualSelector("metadata.name", name)
}
