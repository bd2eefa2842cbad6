package agent

import (
	"context"
	"fmt"
	"os/exec"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// The agent's permissions are its own ClusterRole, config/agent/rbac.yaml
// (and the chart's agent.yaml): no +kubebuilder:rbac markers here, so the
// operator's generated role does not carry what only the agent does
// (patching node status, creating GPUFault records). The local cluster,
// which runs the simulated agents inside the operator's process, binds that
// role to the operator's test identity too (devcluster.OperatorConfig).

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
	// GPUs, if set, shows the node's GPUs: the agent runs the GPU monitor
	// (GPUFault records, the GPUProblem condition). A source that is a
	// manager.Runnable is started with the manager; one with an Events
	// channel makes the monitor look again when it fires.
	GPUs GPUSource
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// Logger is the manager's logger (zero: controller-runtime's global
	// logger).
	Logger logr.Logger
}

// eventSource is a GPUSource that learns of news by itself.
type eventSource interface {
	Events() <-chan event.GenericEvent
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
		// The agent caches its own node and its node's NodeRepairs and
		// GPUFaults only (the CRDs make spec.nodeName selectable), without
		// managed fields: it runs on every node and must stay small.
		Cache: cache.Options{
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Node{}:         {Field: fieldsForNode(opts.NodeName)},
				&repairv1.NodeRepair{}: {Field: fields.OneTermEqualSelector("spec.nodeName", opts.NodeName)},
				&repairv1.GPUFault{}:   {Field: fields.OneTermEqualSelector("spec.nodeName", opts.NodeName)},
			},
			DefaultTransform: cache.TransformStripManagedFields(),
		},
		Controller: opts.Controller,
		Logger:     opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the agent manager: %w", err)
	}
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	mine := predicate.NewPredicateFuncs(func(o client.Object) bool {
		nr := o.(*repairv1.NodeRepair)
		return nr.Spec.NodeName == opts.NodeName && nr.Status.Pending != nil
	})
	err = builder.ControllerManagedBy(mgr).Named("repair-agent").
		For(&repairv1.NodeRepair{}, builder.WithPredicates(mine)).
		Complete(&Agent{Client: mgr.GetClient(), NodeName: opts.NodeName, Executor: opts.Executor, Clock: clk})
	if err != nil {
		return nil, err
	}
	if opts.GPUs != nil {
		if err := addGPUMonitor(mgr, opts.NodeName, opts.GPUs, clk); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// addGPUMonitor runs the GPU monitor of one node (the agent's) or, with
// node empty, of every node (the simulation).
func addGPUMonitor(mgr manager.Manager, node string, src GPUSource, clk clock.PassiveClock) error {
	c := mgr.GetClient()
	ofNode := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return node == "" || o.(*repairv1.GPUFault).Spec.NodeName == node
	})
	recordNode := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.(*repairv1.GPUFault).Spec.NodeName}}}
	})
	// A policy's XID classes concern the agent's node, or every node.
	policyNodes := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		if node != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: node}}}
		}
		var nodes corev1.NodeList
		if err := c.List(ctx, &nodes); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing nodes for a policy change")
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(nodes.Items))
		for _, n := range nodes.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: n.Name}})
		}
		return reqs
	})
	name := "gpu-monitor"
	if node == "" {
		name = "gpu-monitor-inprocess"
	}
	b := builder.ControllerManagedBy(mgr).Named(name).
		For(&corev1.Node{}, builder.WithPredicates(gpuNodeChanged)).
		Watches(&repairv1.GPUFault{}, recordNode, builder.WithPredicates(ofNode, gpuFaultChanged)).
		Watches(&repairv1.NodeRepairPolicy{}, policyNodes, builder.WithPredicates(xidClassesChanged))
	if es, ok := src.(eventSource); ok {
		b = b.WatchesRawSource(source.Channel(es.Events(), &handler.EnqueueRequestForObject{}))
	}
	if r, ok := src.(manager.Runnable); ok {
		if err := mgr.Add(r); err != nil {
			return err
		}
	}
	if node == "" {
		b = b.WithOptions(controller.Options{MaxConcurrentReconciles: 4})
	}
	if err := b.Complete(&GPUMonitor{Client: c, Source: src, Clock: clk, NodeName: node}); err != nil {
		return fmt.Errorf("setting up the GPU monitor: %w", err)
	}
	return nil
}

// AddInProcess adds to mgr one agent for every node: it runs the pending
// actions of all NodeRepairs with exec and, when exec is also a GPUSource
// (the simulated host is), the GPU monitor of every node. It is for
// simulated clusters (the dev command and tests), where no agent DaemonSet
// runs; mgr's scheme must have the repair and core types. clk nil = the
// real clock.
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
	if src, ok := exec.(GPUSource); ok {
		return addGPUMonitor(mgr, "", src, clk)
	}
	return nil
}

func fieldsForNode(name string) fields.Selector {
	return fields.OneTermEqualSelector("metadata.name", name)
}
