package repair

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	"github.com/gpufleet/gpufleet/internal/gpufault"
	"github.com/gpufleet/gpufleet/internal/maintenance/requestor"
)

// indexNode indexes NodeRepairs by node; indexSliceNode, ResourceSlices;
// indexGPUNode, GPUFaults. (The API server serves the same field
// selectors, for a client without this cache.)
const (
	indexNode      = "spec.nodeName"
	indexSliceNode = "spec.nodeName"
	indexGPUNode   = "spec.nodeName"
)

// +kubebuilder:rbac:groups=repair.gpufleet.dev,resources=noderepairpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=repair.gpufleet.dev,resources=noderepairpolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=repair.gpufleet.dev,resources=noderepairs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=repair.gpufleet.dev,resources=noderepairs/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=repair.gpufleet.dev,resources=gpufaults,verbs=get;list;watch
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceslices;resourceclaims,verbs=get;list;watch

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
	log := mgr.GetLogger().WithName("repair")
	allPolicies := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var list repairv1.NodeRepairPolicyList
		if err := c.List(ctx, &list); err != nil {
			log.Error(err, "listing NodeRepairPolicies for an event; the policies' next event re-evaluates them")
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for i := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
		return reqs
	})
	det := &Detector{Client: c, Clock: opts.Clock, Recorder: mgr.GetEventRecorder("gpufleet-repair")}
	err := builder.ControllerManagedBy(mgr).Named("noderepair-detector").
		For(&repairv1.NodeRepairPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Node{}, allPolicies, builder.WithPredicates(healthChanged)).
		Watches(&repairv1.NodeRepair{}, allPolicies, builder.WithPredicates(repairChanged)).
		Watches(&maintenancev1.NodeMaintenance{}, allPolicies, builder.WithPredicates(holdChanged)).
		Watches(&repairv1.GPUFault{}, allPolicies, builder.WithPredicates(serviceChanged)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(det)
	if err != nil {
		return fmt.Errorf("setting up the repair detector: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &repairv1.NodeRepair{}, indexNode, func(o client.Object) []string {
		return []string{o.(*repairv1.NodeRepair).Spec.NodeName}
	}); err != nil {
		return fmt.Errorf("indexing NodeRepairs by node: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &repairv1.GPUFault{}, indexGPUNode, func(o client.Object) []string {
		return []string{o.(*repairv1.GPUFault).Spec.NodeName}
	}); err != nil {
		return fmt.Errorf("indexing GPUFaults by node: %w", err)
	}
	repairsOf := func(ctx context.Context, node string) []reconcile.Request {
		var list repairv1.NodeRepairList
		if err := c.List(ctx, &list, client.MatchingFields{indexNode: node}); err != nil {
			log.Error(err, "listing the repairs of a node for an event", "node", node)
			return nil
		}
		var reqs []reconcile.Request
		for i := range list.Items {
			if list.Items[i].Status.Phase == repairv1.PhaseRepairing {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
		}
		return reqs
	}
	repairsOfNode := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		return repairsOf(ctx, o.GetName())
	})
	repairsOfGPU := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		return repairsOf(ctx, o.(*repairv1.GPUFault).Spec.NodeName)
	})
	dra := draServed(mgr, log)
	if dra {
		// The isolator and the repair controller read the slices of one
		// node (the API server serves the same field selector, for a
		// client without this cache).
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), &resourcev1.ResourceSlice{}, indexSliceNode, func(o client.Object) []string {
			if n := o.(*resourcev1.ResourceSlice).Spec.NodeName; n != nil {
				return []string{*n}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("indexing ResourceSlices by node: %w", err)
		}
	}
	rep := &Repairer{Client: c, Live: mgr.GetAPIReader(), Namespace: opts.Namespace, Clock: opts.Clock, Recorder: mgr.GetEventRecorder("gpufleet-repair"), DRA: dra}
	// A node's device plugin giving a repaired GPU out again (allocatable),
	// or its DRA driver dropping its device taint, ends the repair's wait
	// for the GPU stack (stackReturn).
	b := builder.ControllerManagedBy(mgr).Named("noderepair").
		For(&repairv1.NodeRepair{}).
		Watches(&corev1.Node{}, repairsOfNode, builder.WithPredicates(predicate.Or(healthChanged, gpuAllocatableChanged))).
		Watches(&repairv1.GPUFault{}, repairsOfGPU, builder.WithPredicates(serviceChanged)).
		Watches(&maintenancev1.NodeMaintenance{}, requestor.EnqueueOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &repairv1.NodeRepair{}),
			builder.WithPredicates(requestor.OfRequestor(Requestor), requestor.Transitions))
	if dra {
		b = b.Watches(&resourcev1.ResourceSlice{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			if n := o.(*resourcev1.ResourceSlice).Spec.NodeName; n != nil {
				return repairsOf(ctx, *n)
			}
			return nil
		}), builder.WithPredicates(deviceTaintsChanged))
	}
	if err = b.WithOptions(controller.Options{MaxConcurrentReconciles: 4}).Complete(rep); err != nil {
		return fmt.Errorf("setting up the repair controller: %w", err)
	}
	if !dra {
		return nil
	}
	return setupIsolator(mgr, log)
}

// draServed reports whether the API server serves DRA's DeviceTaintRule and
// ResourceSlice (resource.k8s.io/v1); without them a faulty GPU is kept
// from new pods only by the device plugin's health marking.
func draServed(mgr manager.Manager, log logr.Logger) bool {
	for _, kind := range []string{"DeviceTaintRule", "ResourceSlice"} {
		if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: resourcev1.GroupName, Kind: kind}, resourcev1.SchemeGroupVersion.Version); err != nil {
			log.Info("GPU isolation through DRA is off: the API server does not serve it; a faulty GPU is kept from new pods only by the device plugin's health marking",
				"kind", resourcev1.SchemeGroupVersion.WithKind(kind).String(), "error", err.Error())
			return false
		}
	}
	return true
}

// deviceTaintsChanged passes a ResourceSlice whose devices' taints changed
// (or that appeared or went).
var deviceTaintsChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return gpufault.DeviceTaintsChanged(e.ObjectOld.(*resourcev1.ResourceSlice), e.ObjectNew.(*resourcev1.ResourceSlice))
	},
}

// recordsOutOfService are the GPUFault records of node ("": every node) whose GPU
// is out of service. A node's records come from the index: a slice or
// node event of one node reads that node's records, not the fleet's (at
// 10,000 nodes a burst of faults brings an event per faulty node).
func recordsOutOfService(ctx context.Context, c client.Reader, node string) ([]reconcile.Request, error) {
	var list repairv1.GPUFaultList
	opts := []client.ListOption{client.UnsafeDisableDeepCopy}
	if node != "" {
		opts = append(opts, client.MatchingFields{indexGPUNode: node})
	}
	if err := c.List(ctx, &list, opts...); err != nil {
		return nil, err
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if g := &list.Items[i]; !g.InService() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(g)})
		}
	}
	return reqs, nil
}

// isolatorWorkers: GPUs isolated at once.
const isolatorWorkers = 32

// setupIsolator registers the GPU isolator (the API server serves DRA).
func setupIsolator(mgr manager.Manager, log logr.Logger) error {
	c := mgr.GetClient()
	gpusOfNode := func(ctx context.Context, node string) []reconcile.Request {
		reqs, err := recordsOutOfService(ctx, c, node)
		if err != nil {
			log.Error(err, "listing GPUFaults for an event", "node", node)
		}
		return reqs
	}
	err := builder.ControllerManagedBy(mgr).Named("gpu-isolator").
		For(&repairv1.GPUFault{}, builder.WithPredicates(serviceChanged)).
		Owns(&resourcev1.DeviceTaintRule{}).
		Watches(&resourcev1.ResourceSlice{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			s := o.(*resourcev1.ResourceSlice)
			if s.Spec.NodeName == nil {
				return nil
			}
			return gpusOfNode(ctx, *s.Spec.NodeName)
		})).
		Watches(&repairv1.NodeRepairPolicy{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return gpusOfNode(ctx, "")
		}), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// The device plugin taking a GPU out (or back): the isolation note
		// of a GPU DRA does not publish says whether the plugin keeps it
		// from new pods.
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return gpusOfNode(ctx, o.GetName())
		}), builder.WithPredicates(gpuAllocatableChanged)).
		// Isolation is the first thing a burst of faults waits for; each
		// GPU's record is its own key, and an isolation is two small
		// writes (the rule, the note) that wait on the API server: 32 at
		// once (8 left 1,000 faults queued for up to 98 s at 10,000 nodes).
		WithOptions(controller.Options{MaxConcurrentReconciles: isolatorWorkers}).
		Complete(&Isolator{Client: c, Recorder: mgr.GetEventRecorder("gpufleet-repair")})
	if err != nil {
		return fmt.Errorf("setting up the GPU isolator: %w", err)
	}
	return nil
}

// gpuAllocatableChanged passes a change of a node's device-plugin GPU
// capacity or allocatable (not its creation: no GPUFault is older).
var gpuAllocatableChanged = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
	DeleteFunc: func(event.DeleteEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		oa, na := o.Status.Allocatable[gpuResource], n.Status.Allocatable[gpuResource]
		oc, nc := o.Status.Capacity[gpuResource], n.Status.Capacity[gpuResource]
		return oa.Cmp(na) != 0 || oc.Cmp(nc) != 0
	},
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

// repairChanged passes NodeRepair changes the detector counts: a phase
// change, or a failed repair marked resolved.
var repairChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*repairv1.NodeRepair), e.ObjectNew.(*repairv1.NodeRepair)
		return o.Status.Phase != n.Status.Phase || o.Labels[labelResolved] != n.Labels[labelResolved]
	},
}

// holdChanged passes NodeMaintenance changes that make a node held by a
// requestor or free again (creation and deletion included) — not a drain's
// progress.
var holdChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.(*maintenancev1.NodeMaintenance).Active() != e.ObjectNew.(*maintenancev1.NodeMaintenance).Active()
	},
}

// serviceChanged passes GPUFault records that appear, go, or change
// between in service and out of service (or to another class).
var serviceChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.(*repairv1.GPUFault).Status.Class != e.ObjectNew.(*repairv1.GPUFault).Status.Class
	},
}
