package maintenance

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/liveowner"
)

// Cache indexes.
const (
	indexNodeName = "spec.nodeName" // NodeMaintenance by node
)

// +kubebuilder:rbac:groups=maintenance.nvidia.com,resources=nodemaintenances,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=maintenance.nvidia.com,resources=nodemaintenances/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=maintenance.nvidia.com,resources=nodemaintenances/finalizers,verbs=update
// +kubebuilder:rbac:groups=maintenance.nvidia.com,resources=maintenanceoperatorconfigs,verbs=get;list;watch
// +kubebuilder:rbac:groups=maintenance.nvidia.com,resources=maintenanceoperatorconfigs/status,verbs=get;update;patch,namespace=gpufleet-system
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Options configure the maintenance controllers.
type Options struct {
	Namespace string
	PodName   string
	Clock     clock.PassiveClock
	// BoundedRequestors: requestors whose objects are never
	// garbage-collected (Reconciler.BoundedRequestors).
	BoundedRequestors []string
	// AllowedNamespaces: the namespaces whose NodeMaintenance objects are
	// scheduled, besides the operator's (empty: all).
	AllowedNamespaces []string
	// Leases judges NVIDIA's Maintenance Operator's lease (nil: one of the
	// capability's own).
	Leases *liveowner.Observer
}

// Setup registers the scheduler and the lifecycle controller with mgr.
func Setup(mgr manager.Manager, opts Options) error {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Leases == nil {
		opts.Leases = &liveowner.Observer{}
	}
	ctx := context.Background()
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &maintenancev1.NodeMaintenance{}, indexNodeName, func(o client.Object) []string {
		return []string{o.(*maintenancev1.NodeMaintenance).Spec.NodeName}
	}); err != nil {
		return fmt.Errorf("indexing NodeMaintenance by node: %w", err)
	}
	computeDomains := &ComputeDomainNames{Reader: mgr.GetAPIReader(), Clock: opts.Clock}
	kube, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("creating clientset: %w", err)
	}

	reasons := &WaitReasons{Client: mgr.GetClient(), Clock: opts.Clock}
	if err := mgr.Add(reasons); err != nil {
		return fmt.Errorf("adding the wait-reason writer: %w", err)
	}
	timers, ok := opts.Clock.(clock.WithDelayedExecution)
	if !ok {
		timers = clock.RealClock{}
	}
	alarm := NewAlarm(timers)
	sched := &Scheduler{
		Client: mgr.GetClient(), Live: mgr.GetAPIReader(), Namespace: opts.Namespace, Clock: opts.Clock,
		Recorder: mgr.GetEventRecorder("gpufleet-maintenance-scheduler"), Reasons: reasons, Alarm: alarm,
		ComputeDomains: computeDomains, AllowedNamespaces: opts.AllowedNamespaces, Leases: opts.Leases,
	}
	isDefaultConfig := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == opts.Namespace && o.GetName() == maintenancev1.DefaultConfigName
	})
	toScheduler := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		sched.Changed()
		return []reconcile.Request{schedulerKey}
	})
	sb := builder.ControllerManagedBy(mgr)
	if src := opts.Leases.Rivals.Source(toScheduler); src != nil {
		// NVIDIA's operator without leader election, or a second gpufleet,
		// started or stopped.
		sb = sb.WatchesRawSource(src)
	}
	err = sb.
		Named("nodemaintenance-scheduler").
		Watches(&maintenancev1.NodeMaintenance{}, toScheduler, builder.WithPredicates(schedulingRelevantNM, sched.notOwnWrite())).
		Watches(&corev1.Node{}, toScheduler, builder.WithPredicates(sched.nodeChangeRelevant())).
		Watches(&maintenancev1.MaintenanceOperatorConfig{}, toScheduler, builder.WithPredicates(isDefaultConfig, specChanged)).
		Watches(&coordinationv1.Lease{}, toScheduler, builder.WithPredicates(liveowner.HolderChanged)).
		WatchesRawSource(alarm.Source(handler.TypedFuncs[struct{}, reconcile.Request]{
			GenericFunc: func(_ context.Context, _ event.TypedGenericEvent[struct{}], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				sched.Changed()
				q.Add(schedulerKey)
			},
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(sched)
	if err != nil {
		return fmt.Errorf("setting up the scheduler: %w", err)
	}

	pods := NewPodWatch(kube)
	if err := mgr.Add(pods); err != nil {
		return fmt.Errorf("adding the pod watch: %w", err)
	}
	rec := &Reconciler{
		Client: mgr.GetClient(), Kube: kube, Pods: pods, Namespace: opts.Namespace, PodName: opts.PodName, Clock: opts.Clock,
		Recorder: mgr.GetEventRecorder("gpufleet-maintenance"), ComputeDomains: computeDomains,
		BoundedRequestors: opts.BoundedRequestors, Leases: opts.Leases,
	}
	if err := mgr.Add(rec.evictions()); err != nil {
		return fmt.Errorf("adding the evictor: %w", err)
	}
	byNode := func(node string) []reconcile.Request {
		var list maintenancev1.NodeMaintenanceList
		if err := mgr.GetClient().List(context.Background(), &list, client.MatchingFields{indexNodeName: node}); err != nil {
			mgr.GetLogger().WithName("maintenance").Error(err, "listing the NodeMaintenance objects of a node for an event; their next event reconciles them", "node", node)
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for i := range list.Items {
			if list.Items[i].InProgress() || list.Items[i].DeletionTimestamp != nil {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
		}
		return reqs
	}
	lb := builder.ControllerManagedBy(mgr)
	if src := opts.Leases.Rivals.Source(handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		return objectsIn(ctx, mgr, "")
	})); src != nil {
		lb = lb.WatchesRawSource(src)
	}
	err = lb.
		Named("nodemaintenance").
		For(&maintenancev1.NodeMaintenance{}).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return byNode(o.GetName())
		}), builder.WithPredicates(availabilityChanged)).
		// A ComputeDomain's workload started or ended on a node: the
		// objects waiting for pods look again (waitForComputeDomains).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return objectsIn(ctx, mgr, maintenancev1.PhaseWaitForPodCompletion)
		}), builder.WithPredicates(computeDomainChanged)).
		WatchesRawSource(source.Channel(pods.Changes(), handler.TypedEnqueueRequestsFromMapFunc(
			func(_ context.Context, node string) []reconcile.Request { return byNode(node) }))).
		Watches(&maintenancev1.MaintenanceOperatorConfig{}, handler.EnqueueRequestsFromMapFunc(
			func(ctx context.Context, _ client.Object) []reconcile.Request {
				// The GC age limit, and waitForComputeDomains, may have changed.
				return append(objectsIn(ctx, mgr, maintenancev1.PhaseReady), objectsIn(ctx, mgr, maintenancev1.PhaseWaitForPodCompletion)...)
			}),
			builder.WithPredicates(isDefaultConfig, specChanged)).
		// NVIDIA's Maintenance Operator released its lease (or another
		// replica of it took it): every object is looked at again.
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(
			func(ctx context.Context, _ client.Object) []reconcile.Request {
				return objectsIn(ctx, mgr, "")
			}),
			builder.WithPredicates(liveowner.HolderChanged)).
		// A budget that allows more disruptions lets refused evictions be
		// retried now rather than after their backoff.
		Watches(&policyv1.PodDisruptionBudget{}, handler.EnqueueRequestsFromMapFunc(
			func(ctx context.Context, pdb client.Object) []reconcile.Request {
				rec.evictions().budgetGrew(pdb.GetNamespace() + "/" + pdb.GetName())
				return objectsIn(ctx, mgr, maintenancev1.PhaseDraining)
			}),
			builder.WithPredicates(moreDisruptionsAllowed)).
		// A budget that shows the disruption controller has counted the
		// eviction holding its turn passes the turn on (no reconcile).
		Watches(&policyv1.PodDisruptionBudget{}, handler.Funcs{
			UpdateFunc: func(_ context.Context, e event.UpdateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				old, oldOK := e.ObjectOld.(*policyv1.PodDisruptionBudget)
				cur, curOK := e.ObjectNew.(*policyv1.PodDisruptionBudget)
				if oldOK && curOK {
					rec.evictions().budgetChanged(old, cur)
				}
			},
		}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 16}).
		Complete(rec)
	if err != nil {
		return fmt.Errorf("setting up the NodeMaintenance controller: %w", err)
	}
	return nil
}

// objectsIn lists the objects in phase: Ready ones are re-examined when
// the GC age limit may have changed, Draining ones when a budget allows
// more disruptions; every object ("") when another operator's lease
// changed hands.
func objectsIn(ctx context.Context, mgr manager.Manager, phase maintenancev1.Phase) []reconcile.Request {
	var list maintenancev1.NodeMaintenanceList
	if err := mgr.GetClient().List(ctx, &list); err != nil {
		mgr.GetLogger().WithName("maintenance").Error(err, "listing NodeMaintenance for an event; they are re-examined at their next event", "phase", phase)
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if phase == "" || (list.Items[i].Phase() == phase && list.Items[i].DeletionTimestamp == nil) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

// schedulingRelevantNM passes creations, deletions and the changes a plan
// reads: an object going into or out of Pending, the deletion of a Pending
// object starting, its initialisation, its urgency (its node and requestor
// are immutable, in the schema). The steps of a maintenance in progress
// (Scheduled, Cordon, WaitForPodCompletion, Draining, Ready, its deletion
// starting: it holds its node until it is gone) change no plan: at 10,000
// nodes each brought a pass over every node, and the passes kept the
// scheduler busy for the whole rollout.
var schedulingRelevantNM = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*maintenancev1.NodeMaintenance), e.ObjectNew.(*maintenancev1.NodeMaintenance)
		return o.InProgress() != n.InProgress() || (!n.InProgress() && (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)) ||
			initialised(o) != initialised(n) || o.Annotations[maintenancev1.AnnotationUrgent] != n.Annotations[maintenancev1.AnnotationUrgent]
	},
}

// specChanged passes config creations, deletions and spec changes, not the
// scheduler's own status writes.
var specChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration()
	},
}

// moreDisruptionsAllowed passes budgets created or deleted, and budgets
// whose allowed disruptions grew.
var moreDisruptionsAllowed = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*policyv1.PodDisruptionBudget), e.ObjectNew.(*policyv1.PodDisruptionBudget)
		return n.Status.DisruptionsAllowed > o.Status.DisruptionsAllowed
	},
}

// availabilityChanged passes node creations, deletions and changes of
// readiness or schedulability — not heartbeats.
var availabilityChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return o.Spec.Unschedulable != n.Spec.Unschedulable || nodeReady(o) != nodeReady(n) ||
			(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
	},
}

// computeDomainChanged passes node changes of LabelComputeDomain.
var computeDomainChanged = predicate.Funcs{
	CreateFunc:  func(e event.CreateEvent) bool { return e.Object.GetLabels()[LabelComputeDomain] != "" },
	DeleteFunc:  func(e event.DeleteEvent) bool { return e.Object.GetLabels()[LabelComputeDomain] != "" },
	GenericFunc: func(event.GenericEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetLabels()[LabelComputeDomain] != e.ObjectNew.GetLabels()[LabelComputeDomain]
	},
}
