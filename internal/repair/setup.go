package repair

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// +kubebuilder:rbac:groups=repair.gpufleet.dev,resources=noderepairpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=repair.gpufleet.dev,resources=noderepairpolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=repair.gpufleet.dev,resources=noderepairs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=repair.gpufleet.dev,resources=noderepairs/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=maintenance.nvidia.com,resources=nodemaintenances,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// Options configure auto-repair.
type Options struct {
	Namespace string
	Clock     clock.PassiveClock
}

// Setup registers the detector and the repair ladder with mgr. The node
// agent (internal/agent) runs the actions.
func Setup(mgr manager.Manager, opts Options) error {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	c := mgr.GetClient()
	allPolicies := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var list repairv1.NodeRepairPolicyList
		if err := c.List(ctx, &list); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		for i := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
		return reqs
	})
	det := &Detector{Client: c, Namespace: opts.Namespace, Clock: opts.Clock, Recorder: mgr.GetEventRecorder("gpufleet-repair")}
	err := builder.ControllerManagedBy(mgr).Named("noderepair-detector").
		For(&repairv1.NodeRepairPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Node{}, allPolicies, builder.WithPredicates(healthChanged)).
		Watches(&repairv1.NodeRepair{}, allPolicies, builder.WithPredicates(phaseChanged)).
		Watches(&maintenancev1.NodeMaintenance{}, allPolicies).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(det)
	if err != nil {
		return fmt.Errorf("setting up the repair detector: %w", err)
	}
	repairsOfNode := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var list repairv1.NodeRepairList
		if err := c.List(ctx, &list); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		for i := range list.Items {
			if list.Items[i].Spec.NodeName == o.GetName() && list.Items[i].Status.Phase == repairv1.PhaseRepairing {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
		}
		return reqs
	})
	ownerRepair := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name, ok := strings.CutPrefix(o.GetName(), "repair-")
		if !ok || o.(*maintenancev1.NodeMaintenance).Spec.RequestorID != Requestor {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: name}}}
	})
	rep := &Repairer{Client: c, Live: mgr.GetAPIReader(), Namespace: opts.Namespace, Clock: opts.Clock, Recorder: mgr.GetEventRecorder("gpufleet-repair")}
	err = builder.ControllerManagedBy(mgr).Named("noderepair").
		For(&repairv1.NodeRepair{}).
		Watches(&corev1.Node{}, repairsOfNode, builder.WithPredicates(healthChanged)).
		Watches(&maintenancev1.NodeMaintenance{}, ownerRepair).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(rep)
	if err != nil {
		return fmt.Errorf("setting up the repair controller: %w", err)
	}
	return nil
}

// healthChanged passes node changes that matter to repairs: conditions
// (status, reason, message), boot ID, labels, deletion — not heartbeats.
var healthChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return !sameConditions(o.Status.Conditions, n.Status.Conditions) || o.Status.NodeInfo.BootID != n.Status.NodeInfo.BootID ||
			!equality.Semantic.DeepEqual(o.Labels, n.Labels) || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
	},
}

func sameConditions(a, b []corev1.NodeCondition) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Type != b[i].Type || a[i].Status != b[i].Status || a[i].Reason != b[i].Reason || a[i].Message != b[i].Message {
			return false
		}
	}
	return true
}

var phaseChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.(*repairv1.NodeRepair).Status.Phase != e.ObjectNew.(*repairv1.NodeRepair).Status.Phase
	},
}
