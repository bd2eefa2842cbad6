package agent

import (
	"context"
	"fmt"
	"os/exec"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	corev1 "k8s.io/api/core/v1"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// ExecRunner runs commands with os/exec.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// NewManager builds the agent's manager: it watches only its own node's
// NodeRepairs and runs their pending actions with exec.
func NewManager(cfg *rest.Config, nodeName string, exec Executor) (manager.Manager, error) {
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
			&corev1.Node{}: {Field: fieldsForNode(nodeName)},
		}},
		// One agent per process on a node; tests run several in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the agent manager: %w", err)
	}
	mine := predicate.NewPredicateFuncs(func(o client.Object) bool {
		nr := o.(*repairv1.NodeRepair)
		return nr.Spec.NodeName == nodeName && nr.Status.Pending != nil
	})
	err = builder.ControllerManagedBy(mgr).Named("repair-agent").
		For(&repairv1.NodeRepair{}, builder.WithPredicates(mine)).
		Complete(&Agent{Client: mgr.GetClient(), NodeName: nodeName, Executor: exec, Clock: clock.RealClock{}})
	if err != nil {
		return nil, err
	}
	return mgr, nil
}

func fieldsForNode(name string) fields.Selector {
	return fields.OneTermEqualSelector("metadata.name", name)
}
