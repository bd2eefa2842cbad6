package maintenance

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpufleet/gpufleet/internal/liveowner"
)

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch

// CacheObjects restricts the manager's cache of Leases to the leader
// lease of NVIDIA's Maintenance Operator (any namespace): the only Lease
// the maintenance controllers read, and not the kubelets' heartbeats.
func CacheObjects() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Field: fields.OneTermEqualSelector("metadata.name", liveowner.MaintenanceOperator.Lease)},
	}
}

// liveOwnerRecheck is added to a holding's expiry before looking again,
// so the lease is seen expired then.
const liveOwnerRecheck = 100 * time.Millisecond

// otherOwner returns the live holding of NVIDIA's Maintenance Operator's
// lease, if any, as obs judges it (by observation on gpufleet's clock), or
// else what obs's Rivals find (it runs without leader election; a second
// gpufleet runs): while it runs, gpufleet does not act on NodeMaintenance objects (it
// would cordon, drain and write phases beside it).
func otherOwner(ctx context.Context, c client.Reader, obs *liveowner.Observer, now time.Time) (liveowner.Holding, bool, error) {
	var leases coordinationv1.LeaseList
	if err := c.List(ctx, &leases, client.UnsafeDisableDeepCopy); err != nil { // read only
		return liveowner.Holding{}, false, fmt.Errorf("listing the leader leases of other operators: %w", err)
	}
	if h, held := obs.Held(leases.Items, liveowner.MaintenanceOperator, now); held {
		return h, true, nil
	}
	return obs.Rival(ctx, liveowner.MaintenanceOperator, now)
}
