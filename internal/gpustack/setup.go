package gpustack

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/liveowner"
	"github.com/gpufleet/gpufleet/internal/maintenance/requestor"
)

// +kubebuilder:rbac:groups=nvidia.com,resources=clusterpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=nvidia.com,resources=clusterpolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch;create;update;patch;delete,namespace=gpufleet-system
// +kubebuilder:rbac:groups="",resources=serviceaccounts;services,verbs=get;list;watch;create;update;patch;delete,namespace=gpufleet-system
// +kubebuilder:rbac:groups="",resources=pods,verbs=delete,namespace=gpufleet-system
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles;clusterrolebindings,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles;clusterrolebindings,verbs=update;patch;delete,resourceNames=nvidia-mig-manager;nvidia-driver;nvidia-dcgm-exporter-read-pods
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=maintenance.nvidia.com,resources=nodemaintenances,verbs=get;list;watch;delete;patch
// +kubebuilder:rbac:groups=maintenance.nvidia.com,resources=maintenanceoperatorconfigs,verbs=get;list;watch
// +kubebuilder:rbac:groups=repair.gpufleet.dev,resources=noderepairs,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=monitoring.coreos.com,resources=servicemonitors,verbs=get;list;watch;create;update;patch;delete,namespace=gpufleet-system
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch,resourceNames=servicemonitors.monitoring.coreos.com;clusterpolicies.nvidia.com;nvidiadrivers.nvidia.com
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch

// Options configure the GPU stack controller.
type Options struct {
	Namespace      string
	Clock          clock.PassiveClock
	DegradedAfter  time.Duration
	UpgradeTimeout time.Duration
	// StatusInterval: component counts are written at most this often
	// (default 2s; state and condition changes are written at once).
	StatusInterval time.Duration
	// PassInterval: a ClusterPolicy's reconcile pass starts at most this
	// often (default 200ms; negative: a pass per event).
	PassInterval time.Duration
	// Leases is the cache of NVIDIA's GPU Operator's leader lease
	// (liveowner.NewCache), shared with the GPUCluster controller; nil:
	// Setup makes one.
	Leases cluster.Cluster
	// Observer judges it (nil: one of the capability's own).
	Observer *liveowner.Observer
}

// Setup registers the ClusterPolicy controller with mgr.
func Setup(mgr manager.Manager, opts Options) error {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.DegradedAfter == 0 {
		opts.DegradedAfter = 2 * time.Minute
	}
	if opts.StatusInterval == 0 {
		opts.StatusInterval = 2 * time.Second
	}
	if opts.PassInterval == 0 {
		opts.PassInterval = 200 * time.Millisecond
	}
	monitorCache, err := newMonitorCache(mgr, opts.Namespace)
	if err != nil {
		return err
	}
	monitors := &ServiceMonitors{CRDs: mgr.GetClient(), Mapper: mgr.GetRESTMapper(), Reader: monitorCache.GetCache()}
	leases := opts.Leases
	if leases == nil {
		if leases, err = liveowner.NewCache(mgr, liveowner.GPUOperator); err != nil {
			return err
		}
	}
	ours, err := OwnCRDs()
	if err != nil {
		return err
	}
	schemaCaches, err := newSchemaCaches(mgr)
	if err != nil {
		return err
	}
	r := &Reconciler{
		Client: countingWrites(mgr.GetClient()), StatusInterval: opts.StatusInterval, Live: mgr.GetAPIReader(), Namespace: opts.Namespace, Clock: opts.Clock, Assets: Assets,
		DegradedAfter: opts.DegradedAfter, UpgradeTimeout: opts.UpgradeTimeout, PassInterval: opts.PassInterval, Recorder: mgr.GetEventRecorder("gpufleet-gpustack"),
		Monitors: monitors, Leases: leases.GetCache(), Observer: liveowner.OrNew(opts.Observer, ""), Schemas: &ServedSchemas{Ours: ours, Served: byName(schemaCaches)},
	}
	allPolicies := enqueueAll(mgr, func() client.ObjectList { return &nvidiav1.ClusterPolicyList{} }, "ClusterPolicies")
	stackPod := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == opts.Namespace && nvidiav1.PodComponent(o.GetLabels()) != ""
	})
	b := builder.ControllerManagedBy(mgr).
		Named("clusterpolicy").
		// A spec change, or an annotation (AnnotationOtherNamespaceCleared).
		For(&nvidiav1.ClusterPolicy{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&appsv1.DaemonSet{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&corev1.Service{}).
		Owns(&rbacv1.ClusterRole{}).
		Owns(&rbacv1.ClusterRoleBinding{}).
		Watches(&corev1.Node{}, allPolicies, builder.WithPredicates(nodeRelevant)).
		Watches(&corev1.Pod{}, allPolicies, builder.WithPredicates(stackPod, podReadinessChanged)).
		Watches(&maintenancev1.NodeMaintenance{}, allPolicies,
			builder.WithPredicates(requestor.OfRequestor(UpgradeRequestor), requestor.Transitions)).
		Watches(&nvidiav1alpha1.NVIDIADriver{}, allPolicies, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// The maintenance config's domains: how driver upgrades start.
		Watches(&maintenancev1.MaintenanceOperatorConfig{}, allPolicies, builder.WithPredicates(defaultConfig(opts.Namespace), domainsChanged)).
		// The ServiceMonitor CRD only (CacheObjects): installed, established
		// or deleted, it brings the policy back.
		Watches(&apiextensionsv1.CustomResourceDefinition{}, allPolicies).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1})
	if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: repairv1.GroupVersion.Group, Kind: "NodeRepair"}, repairv1.GroupVersion.Version); err == nil {
		// The reboots that driver upgrades ask for (a kernel module in use).
		b = b.Watches(&repairv1.NodeRepair{}, allPolicies, builder.WithPredicates(
			predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetLabels()[LabelRebootOf] != "" }),
			predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectOld.(*repairv1.NodeRepair).Status.Phase != e.ObjectNew.(*repairv1.NodeRepair).Status.Phase
			}}))
	}
	if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: nvidiav1alpha1.GroupVersion.Group, Kind: "GPUCluster"}, nvidiav1alpha1.GroupVersion.Version); err == nil {
		// A GPUCluster created or deleted holds or releases the policies.
		b = b.Watches(&nvidiav1alpha1.GPUCluster{}, allPolicies, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				return (e.ObjectOld.GetDeletionTimestamp() == nil) != (e.ObjectNew.GetDeletionTimestamp() == nil)
			}}))
	}
	// NVIDIA's GPU Operator's leader lease: gpufleet waits while it is
	// held (a new holder, a release); its expiry is a requeue.
	b = b.WatchesRawSource(source.Kind[client.Object](leases.GetCache(), &coordinationv1.Lease{}, allPolicies, liveowner.HolderChanged))
	if src := r.Observer.Rivals.Source(allPolicies); src != nil {
		b = b.WatchesRawSource(src) // the GPU Operator without leader election, a second gpufleet
	}
	// The ClusterPolicy and NVIDIADriver CRDs: a new schema (the GPU
	// Operator chart's upgrade hook putting its own back, or gpufleet's
	// reinstalled) is compared at once.
	for _, name := range []string{ClusterPolicyCRD, NVIDIADriverCRD} {
		b = b.WatchesRawSource(source.Kind[client.Object](schemaCaches[name], &apiextensionsv1.CustomResourceDefinition{}, allPolicies,
			predicate.GenerationChangedPredicate{}))
	}
	c, err := b.Build(r)
	if err != nil {
		return fmt.Errorf("setting up the ClusterPolicy controller: %w", err)
	}
	// gpufleet's ServiceMonitors are watched once the API server serves
	// them (a watch of a kind it does not serve would fail the start).
	ownedBy := handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &nvidiav1.ClusterPolicy{}, handler.OnlyControllerOwner())
	changed := predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{})
	monitors.Watch = func(context.Context) error {
		return c.Watch(source.Kind[client.Object](monitorCache.GetCache(), newServiceMonitor(), ownedBy, changed))
	}
	monitors.Unwatch = func(ctx context.Context) error {
		return monitorCache.GetCache().RemoveInformer(ctx, newServiceMonitor())
	}
	return setupDriverStatus(mgr, opts, stackPod)
}

// newMonitorCache is a cache of gpufleet's ServiceMonitors (in its
// namespace, labelled managed-by gpufleet), started with the manager's
// caches. It is apart from the manager's cache because that one needs
// every kind it is configured for to be served when it starts; this one
// starts its ServiceMonitor informer on the first read, once they are.
func newMonitorCache(mgr manager.Manager, namespace string) (cluster.Cluster, error) {
	managed := labels.SelectorFromSet(labels.Set{LabelManagedBy: managedBy})
	c, err := cluster.New(mgr.GetConfig(), func(o *cluster.Options) {
		o.Scheme = mgr.GetScheme()
		o.HTTPClient = mgr.GetHTTPClient()
		o.MapperProvider = func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return mgr.GetRESTMapper(), nil }
		o.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{namespace: {}}, DefaultLabelSelector: managed,
			DefaultTransform: cache.TransformStripManagedFields()}
	})
	if err != nil {
		return nil, fmt.Errorf("creating the ServiceMonitor cache: %w", err)
	}
	if err := mgr.Add(c); err != nil {
		return nil, fmt.Errorf("adding the ServiceMonitor cache: %w", err)
	}
	return c, nil
}

func newServiceMonitor() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(ServiceMonitorGVK)
	return u
}

// setupDriverStatus registers the NVIDIADriver status controller: any
// change of drivers, policies, GPU nodes' labels or driver pods' readiness
// brings every NVIDIADriver back (there are a handful).
func setupDriverStatus(mgr manager.Manager, opts Options, stackPod predicate.Predicate) error {
	allDrivers := enqueueAll(mgr, func() client.ObjectList { return &nvidiav1alpha1.NVIDIADriverList{} }, "NVIDIADrivers")
	driverPod := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetLabels()[LabelNVIDIADriver] != "" })
	r := &DriverStatusReconciler{Client: mgr.GetClient(), Namespace: opts.Namespace, Clock: opts.Clock,
		Recorder: mgr.GetEventRecorder("gpufleet-gpustack")}
	err := builder.ControllerManagedBy(mgr).
		Named("nvidiadriver").
		For(&nvidiav1alpha1.NVIDIADriver{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&nvidiav1.ClusterPolicy{}, allDrivers, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Node{}, allDrivers, builder.WithPredicates(nodeRelevant)).
		Watches(&corev1.Pod{}, allDrivers, builder.WithPredicates(stackPod, driverPod, podReadinessChanged)).
		Watches(&appsv1.DaemonSet{}, allDrivers, builder.WithPredicates(stackPod, driverPod, predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the NVIDIADriver status controller: %w", err)
	}
	return nil
}

// enqueueAll maps any event to every object of a kind (ClusterPolicies,
// NVIDIADrivers: a handful each), listed from the cache.
func enqueueAll(mgr manager.Manager, newList func() client.ObjectList, kind string) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		list := newList()
		if err := mgr.GetClient().List(ctx, list); err != nil {
			mgr.GetLogger().WithName("gpustack").Error(err, "listing "+kind+" for an event; the next event reconciles them")
			return nil
		}
		var reqs []reconcile.Request
		_ = meta.EachListItem(list, func(o runtime.Object) error {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o.(client.Object))})
			return nil
		})
		return reqs
	})
}

// defaultConfig passes the maintenance config that driver upgrades read:
// "default" in the operator's namespace.
func defaultConfig(namespace string) predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == namespace && o.GetName() == maintenancev1.DefaultConfigName
	})
}

// domainsChanged passes a maintenance config's creation and deletion, and
// the updates that change what driver upgrades read of it.
var domainsChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		oldLabel, oldBy := upgradeDomainsOf(e.ObjectOld.(*maintenancev1.MaintenanceOperatorConfig))
		newLabel, newBy := upgradeDomainsOf(e.ObjectNew.(*maintenancev1.MaintenanceOperatorConfig))
		return oldLabel != newLabel || oldBy != newBy
	},
}

// nodeRelevant passes node changes that affect labels or facts: labels,
// container runtime, deletion — not heartbeats.
var nodeRelevant = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return !maps.Equal(o.Labels, n.Labels) ||
			o.Status.NodeInfo.ContainerRuntimeVersion != n.Status.NodeInfo.ContainerRuntimeVersion ||
			(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
	},
}

var podReadinessChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Pod), e.ObjectNew.(*corev1.Pod)
		return podutils.IsPodReady(o) != podutils.IsPodReady(n) || o.Spec.NodeName != n.Spec.NodeName ||
			(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) || unschedulableReason(o) != unschedulableReason(n) ||
			(nvidiav1.PodComponent(o.Labels) == Driver && (ModuleInUse(o) == "") != (ModuleInUse(n) == ""))
	},
}
