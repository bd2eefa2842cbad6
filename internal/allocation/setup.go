package allocation

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
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
// pods and ResourceClaims through a watch of each, and the nodes from the
// manager's cache. The watches run on the leader only (a standby exports
// nothing) and keep only the pods that hold GPUs and the claims allocated
// NVIDIA GPUs, a few values each: no pod object is cached.
func Setup(mgr manager.Manager, opts Options) error {
	cs, err := kubernetes.NewForConfigAndClient(mgr.GetConfig(), mgr.GetHTTPClient())
	if err != nil {
		return fmt.Errorf("creating the allocation client: %w", err)
	}
	// Terminated pods hold no GPU: the API server filters them out.
	running := fields.AndSelectors(fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed))).String()
	r := &runner{
		pods:   newStore(keepPod),
		claims: newStore(keepClaim),
		nodes:  mgr.GetCache(),
		mapper: mgr.GetRESTMapper(),
		podLW: toolscache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
			func(o *metav1.ListOptions) { o.FieldSelector = running }),
		claimLW: toolscache.NewFilteredListWatchFromClient(cs.ResourceV1().RESTClient(), "resourceclaims", metav1.NamespaceAll,
			func(*metav1.ListOptions) {}),
	}
	collector.SetSource(&Source{Nodes: mgr.GetCache(), Pods: r.pods.snapshot, Claims: r.claimSnapshot, Ready: r.ready, PoolLabel: opts.PoolLabel})
	if err := mgr.Add(r); err != nil {
		return fmt.Errorf("adding the allocation watches: %w", err)
	}
	return nil
}

// runner runs the watches on the leader.
type runner struct {
	pods           *store[PodGPUs]
	claims         *store[ClaimGPUs]
	claimsServed   bool
	nodes          cache.Cache
	mapper         meta.RESTMapper
	podLW, claimLW toolscache.ListerWatcher
}

// NeedLeaderElection: only the leader watches the pods and reports.
func (r *runner) NeedLeaderElection() bool { return true }

// Start runs the watches until ctx ends.
func (r *runner) Start(ctx context.Context) error {
	// A cluster without DRA (resource.k8s.io/v1 not served) has no claims.
	_, err := r.mapper.RESTMapping(resourcev1.SchemeGroupVersion.WithKind("ResourceClaim").GroupKind(), resourcev1.SchemeGroupVersion.Version)
	r.claimsServed = err == nil
	if _, err := r.nodes.GetInformer(ctx, &corev1.Node{}); err != nil {
		return fmt.Errorf("starting the node informer: %w", err)
	}
	go toolscache.NewReflectorWithOptions(r.podLW, &corev1.Pod{}, r.pods, toolscache.ReflectorOptions{Name: "allocation-pods"}).RunWithContext(ctx)
	if r.claimsServed {
		go toolscache.NewReflectorWithOptions(r.claimLW, &resourcev1.ResourceClaim{}, r.claims,
			toolscache.ReflectorOptions{Name: "allocation-resourceclaims"}).RunWithContext(ctx)
	}
	<-ctx.Done()
	r.pods.synced.Store(false)
	r.claims.synced.Store(false)
	return nil
}

// ready: the watches have listed (and this replica leads: they run only
// on the leader).
func (r *runner) ready() bool {
	return r.pods.synced.Load() && (!r.claimsServed || r.claims.synced.Load())
}

func (r *runner) claimSnapshot() []ClaimGPUs {
	if !r.claimsServed {
		return nil
	}
	return r.claims.snapshot()
}
