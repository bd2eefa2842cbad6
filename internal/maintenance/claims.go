package maintenance

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	ctrl "sigs.k8s.io/controller-runtime"
)

// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims,verbs=get

// claimDriversFor is how long the DRA drivers of a pod's claims are
// remembered: a pod is bound only once its claims are allocated, and their
// allocation does not change while it runs; only a failed read is asked
// again at the next step.
const claimDriversFor = 10 * time.Minute

// unreadableClaim stands for a claim that could not be read: it counts as
// allocated by every driver (a pod is drained rather than left running on
// a GPU whose driver is about to restart), as NVIDIA's GPU Operator does.
const unreadableClaim = "*"

// podClaimDrivers remembers, by pod UID, the DRA drivers that allocated
// the devices of the pod's ResourceClaims (admin-access allocations left
// out): the drain's byDRADriverRegex filter reads them.
type podClaimDrivers struct {
	once  sync.Once
	found *utilcache.LRUExpireCache
}

// claimDrivers returns the drain's lookup of a pod's DRA drivers: read
// from the API server once per pod, then remembered.
func (r *Reconciler) claimDrivers(ctx context.Context) func(*corev1.Pod) []string {
	r.claims.once.Do(func() { r.claims.found = utilcache.NewLRUExpireCacheWithClock(8192, r.Clock) })
	return func(p *corev1.Pod) []string {
		if v, ok := r.claims.found.Get(p.UID); ok {
			return v.([]string)
		}
		drivers, complete := r.readClaimDrivers(ctx, p)
		if complete {
			r.claims.found.Add(p.UID, drivers, claimDriversFor)
		}
		return drivers
	}
}

// readClaimDrivers reads the pod's claims; complete is false when one could
// not be read (it then stands as unreadableClaim) or is not allocated yet.
func (r *Reconciler) readClaimDrivers(ctx context.Context, p *corev1.Pod) (drivers []string, complete bool) {
	complete = true
	for _, name := range podClaimNames(p) {
		claim, err := r.Kube.ResourceV1().ResourceClaims(p.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			ctrl.LoggerFrom(ctx).V(1).Info("reading a pod's ResourceClaim failed; the pod counts as using every DRA driver",
				"pod", types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, "claim", name, "error", err.Error())
			drivers, complete = append(drivers, unreadableClaim), false
			continue
		}
		if claim.Status.Allocation == nil {
			complete = false
			continue
		}
		drivers = append(drivers, allocatedDrivers(claim)...)
	}
	return drivers, complete
}

// allocatedDrivers lists the drivers of a claim's allocated devices, but
// for admin-access ones (monitoring, which uses no GPU).
func allocatedDrivers(claim *resourcev1.ResourceClaim) []string {
	var out []string
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.AdminAccess != nil && *res.AdminAccess {
			continue
		}
		out = append(out, res.Driver)
	}
	return out
}

// podClaimNames names the ResourceClaims of a pod: those it names, and
// those generated from its templates (in its status).
func podClaimNames(p *corev1.Pod) []string {
	var names []string
	for _, c := range p.Spec.ResourceClaims {
		if c.ResourceClaimName != nil {
			names = append(names, *c.ResourceClaimName)
			continue
		}
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.Name == c.Name && s.ResourceClaimName != nil {
				names = append(names, *s.ResourceClaimName)
			}
		}
	}
	return names
}
