package allocation

import (
	"context"
	"fmt"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// +kubebuilder:rbac:groups="",resources=pods;nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims,verbs=get;list;watch

// Options configure the allocation metrics.
type Options struct {
	// PoolLabel names a node's pool (default DefaultPoolLabel).
	PoolLabel string
}

// Setup makes the registered collector read the cluster's non-terminated
// pods and ResourceClaims from a cache of its own, and the nodes from the
// manager's. That cache holds every pod stripped to its name, node, phase
// and GPU request (the manager's cache holds only the GPU stack's pods),
// and runs on the leader only: a standby replica exports nothing and holds
// no pods.
func Setup(mgr manager.Manager, opts Options) error {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient: mgr.GetHTTPClient(),
		Scheme:     mgr.GetScheme(),
		Mapper:     mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{
			// Terminated pods hold no GPU: the API server filters them out.
			&corev1.Pod{}: {
				Field: fields.AndSelectors(fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
					fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed))),
				Transform: stripPod,
			},
			&resourcev1.ResourceClaim{}: {Transform: stripClaim},
		},
	})
	if err != nil {
		return fmt.Errorf("creating the allocation cache: %w", err)
	}
	r := &runner{cache: c, nodes: mgr.GetCache(), mapper: mgr.GetRESTMapper()}
	collector.SetSource(&Source{Pods: c, Nodes: mgr.GetCache(), Ready: r.synced.Load, Claims: r.claims.Load, PoolLabel: opts.PoolLabel})
	if err := mgr.Add(r); err != nil {
		return fmt.Errorf("adding the allocation cache: %w", err)
	}
	return nil
}

// runner starts the cache on the leader and says when it has synced.
type runner struct {
	cache  cache.Cache
	nodes  cache.Cache
	mapper meta.RESTMapper
	synced atomic.Bool
	claims atomic.Bool // ResourceClaims are served and cached
}

// NeedLeaderElection: only the leader holds the pods and reports.
func (r *runner) NeedLeaderElection() bool { return true }

// Start runs the cache until ctx ends.
func (r *runner) Start(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- r.cache.Start(ctx) }()
	informers := []client.Object{&corev1.Pod{}}
	// A cluster without DRA (resource.k8s.io/v1 not served) has no claims.
	_, err := r.mapper.RESTMapping(resourcev1.SchemeGroupVersion.WithKind("ResourceClaim").GroupKind(), resourcev1.SchemeGroupVersion.Version)
	r.claims.Store(err == nil)
	if err == nil {
		informers = append(informers, &resourcev1.ResourceClaim{})
	}
	for _, o := range informers {
		if _, err := r.cache.GetInformer(ctx, o); err != nil {
			return fmt.Errorf("starting the allocation cache's informer of %T: %w", o, err)
		}
	}
	if _, err := r.nodes.GetInformer(ctx, &corev1.Node{}); err != nil {
		return fmt.Errorf("starting the node informer: %w", err)
	}
	if !r.cache.WaitForCacheSync(ctx) || !r.nodes.WaitForCacheSync(ctx) {
		return <-errc
	}
	r.synced.Store(true)
	err = <-errc
	r.synced.Store(false)
	return err
}

// stripPod is the cache transform of pods: it keeps the name, node, phase
// and the pod's effective GPU request (as one container's request), so a
// cluster's pods cost a small fraction of their full size. The decoded pod
// is trimmed in place.
var stripPod toolscache.TransformFunc = func(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	gpus := GPURequest(p)
	p.ObjectMeta = metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion}
	var containers []corev1.Container
	if gpus > 0 {
		containers = []corev1.Container{{Name: "gpus", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{ResourceGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}}}}
	}
	p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName, Containers: containers}
	p.Status = corev1.PodStatus{Phase: p.Status.Phase}
	return p, nil
}

// stripClaim is the cache transform of ResourceClaims: it keeps the
// allocation results of DRADriver and the pods that use the claim.
var stripClaim toolscache.TransformFunc = func(obj any) (any, error) {
	c, ok := obj.(*resourcev1.ResourceClaim)
	if !ok {
		return obj, nil
	}
	var results []resourcev1.DeviceRequestAllocationResult
	if c.Status.Allocation != nil {
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == DRADriver {
				results = append(results, resourcev1.DeviceRequestAllocationResult{Driver: r.Driver, Pool: r.Pool, Device: r.Device})
			}
		}
	}
	var reserved []resourcev1.ResourceClaimConsumerReference
	for _, r := range c.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			reserved = append(reserved, resourcev1.ResourceClaimConsumerReference{Resource: r.Resource, Name: r.Name, UID: r.UID})
		}
	}
	c.ObjectMeta = metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: c.UID, ResourceVersion: c.ResourceVersion}
	c.Spec = resourcev1.ResourceClaimSpec{}
	c.Status = resourcev1.ResourceClaimStatus{ReservedFor: reserved}
	if len(results) > 0 {
		c.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: results}}
	}
	return c, nil
}
