package gpucluster

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/liveowner"
)

// +kubebuilder:rbac:groups=nvidia.com,resources=gpuclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=nvidia.com,resources=gpuclusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete,namespace=gpufleet-system
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete,namespace=gpufleet-system
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaimtemplates,verbs=update;patch,namespace=gpufleet-system
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles;clusterrolebindings,verbs=update;patch;delete,resourceNames=nvidia-dra-driver-kubeletplugin;nvidia-dra-driver-controller
// +kubebuilder:rbac:groups=resource.k8s.io,resources=deviceclasses,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
//
// The rules the operator gives the DRA driver's ClusterRoles, which it must
// hold itself to grant them:
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims,verbs=get
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims/status,verbs=update
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceslices,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaimtemplates,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=resource.nvidia.com,resources=computedomains,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=resource.nvidia.com,resources=computedomains/status,verbs=update;patch
// +kubebuilder:rbac:groups=resource.nvidia.com,resources=computedomaincliques,verbs=get;list;watch;create;update;patch;delete

// Options configure the GPUCluster controller.
type Options struct {
	// Namespace the stack is deployed in (the operator's).
	Namespace string
	Clock     clock.PassiveClock
	// Leases is the cache of NVIDIA's GPU Operator's leader lease
	// (liveowner.NewCache; nil: Setup makes one). While that lease is
	// held, the GPUCluster is the GPU Operator's.
	Leases cluster.Cluster
	// Observer judges it (nil: one of the capability's own).
	Observer *liveowner.Observer
}

// CacheObjects restricts the manager's cache of the kinds only the
// GPUCluster's stack adds (the DaemonSets, Services, ServiceAccounts and
// cluster RBAC objects are restricted by the ClusterPolicy's): the ones
// labelled managed-by gpufleet, the namespaced ones in the operator's
// namespace, and of namespaces that one only.
func CacheObjects(namespace string) map[client.Object]cache.ByObject {
	managed := labels.SelectorFromSet(labels.Set{gpustack.LabelManagedBy: managedBy})
	inNamespace := map[string]cache.Config{namespace: {}}
	out := map[client.Object]cache.ByObject{
		&resourcev1.DeviceClass{}: {Label: managed},
		&corev1.Namespace{}:       {Field: fields.OneTermEqualSelector("metadata.name", namespace)},
	}
	for _, o := range []client.Object{&appsv1.Deployment{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}, &resourcev1.ResourceClaimTemplate{}} {
		out[o] = cache.ByObject{Namespaces: inNamespace, Label: managed}
	}
	return out
}

// Setup registers the GPUCluster controller with mgr.
func Setup(mgr manager.Manager, opts Options) error {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	leases := opts.Leases
	if leases == nil {
		var err error
		if leases, err = liveowner.NewCache(mgr, liveowner.GPUOperator); err != nil {
			return err
		}
	}
	r := &Reconciler{Client: mgr.GetClient(), Live: mgr.GetAPIReader(), Leases: leases.GetCache(), Observer: liveowner.OrNew(opts.Observer, ""), Namespace: opts.Namespace, Clock: opts.Clock,
		Recorder: mgr.GetEventRecorder("gpufleet-gpucluster")}
	// Everything maps to the one GPUCluster.
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: nvidiav1alpha1.GPUClusterName}}}
	})
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetLabels()[gpustack.LabelPartOf] == partOf })
	// A node matters when its labels change (GPU found, deploy label
	// removed) or it comes or goes, not on heartbeats.
	nodeChanged := predicate.Or[client.Object](predicate.LabelChangedPredicate{}, predicate.Funcs{
		UpdateFunc: func(event.UpdateEvent) bool { return false }})
	rollout := predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool { return statusOf(e.ObjectOld) != statusOf(e.ObjectNew) }})
	b := builder.ControllerManagedBy(mgr)
	if src := r.Observer.Rivals.Source(one); src != nil {
		b = b.WatchesRawSource(src) // the GPU Operator without leader election, a second gpufleet
	}
	err := b.
		Named("gpucluster").
		// A spec change, or an annotation (AnnotationOtherNamespaceCleared).
		For(&nvidiav1alpha1.GPUCluster{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Watches(&nvidiav1.ClusterPolicy{}, one, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(event.UpdateEvent) bool { return false }})).
		Watches(&appsv1.DaemonSet{}, one, builder.WithPredicates(ours, rollout)).
		Watches(&appsv1.Deployment{}, one, builder.WithPredicates(ours, rollout)).
		Watches(&corev1.Node{}, one, builder.WithPredicates(nodeChanged)).
		Watches(&corev1.Namespace{}, one, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&resourcev1.DeviceClass{}, one, builder.WithPredicates(ours)).
		// The GPU Operator's leader lease: a new holder or a release; its
		// expiry is a requeue.
		WatchesRawSource(source.Kind[client.Object](leases.GetCache(), &coordinationv1.Lease{}, one, liveowner.HolderChanged)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the GPUCluster controller: %w", err)
	}
	return nil
}

// statusOf is a workload's rollout counters, to tell a change that
// matters to the status from one that does not.
func statusOf(o client.Object) string {
	switch w := o.(type) {
	case *appsv1.DaemonSet:
		s := w.Status
		return fmt.Sprint(s.ObservedGeneration, s.DesiredNumberScheduled, s.NumberReady, s.UpdatedNumberScheduled)
	case *appsv1.Deployment:
		s := w.Status
		return fmt.Sprint(s.ObservedGeneration, s.AvailableReplicas, s.UpdatedReplicas)
	}
	return ""
}

// Unserved names the first kind the GPUCluster controller needs that the
// API server does not serve, or "".
func Unserved(mapper meta.RESTMapper) string {
	for _, gvk := range []schema.GroupVersionKind{nvidiav1alpha1.GroupVersion.WithKind("GPUCluster"), resourcev1.SchemeGroupVersion.WithKind("DeviceClass")} {
		if _, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return gvk.String()
		}
	}
	return ""
}
