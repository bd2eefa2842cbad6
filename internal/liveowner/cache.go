package liveowner

import (
	"context"
	"fmt"
	"net/http"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// NewCache is a cache of op's leader-election Lease alone (every namespace,
// selected by name: the cluster's other leases, the nodes' heartbeats
// among them, are never held), started with the manager. Reading it needs
// get, list and watch of leases.
func NewCache(mgr manager.Manager, op Operator) (cluster.Cluster, error) {
	c, err := cluster.New(mgr.GetConfig(), func(o *cluster.Options) {
		o.Scheme = mgr.GetScheme()
		o.HTTPClient = mgr.GetHTTPClient()
		o.MapperProvider = func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return mgr.GetRESTMapper(), nil }
		o.Cache = cache.Options{
			ByObject: map[client.Object]cache.ByObject{
				&coordinationv1.Lease{}: {Field: fields.OneTermEqualSelector("metadata.name", op.Lease)},
			},
			DefaultTransform: cache.TransformStripManagedFields(),
		}
	})
	if err != nil {
		return nil, fmt.Errorf("creating the cache of lease %s: %w", op.Lease, err)
	}
	if err := mgr.Add(c); err != nil {
		return nil, fmt.Errorf("adding the cache of lease %s: %w", op.Lease, err)
	}
	return c, nil
}

// Read lists op's leases from r (its cache, NewCache; nil: none looked at)
// and returns its live holding, if any.
func Read(ctx context.Context, r client.Reader, op Operator, now time.Time) (Holding, bool, error) {
	if r == nil {
		return Holding{}, false, nil
	}
	var leases coordinationv1.LeaseList
	if err := r.List(ctx, &leases); err != nil {
		return Holding{}, false, fmt.Errorf("listing leases: %w", err)
	}
	h, ok := Held(leases.Items, op, now)
	return h, ok, nil
}

// HolderChanged passes a lease's creation, deletion and a change of its
// holder, not its renewals (every few seconds): an expiry is found by
// looking again at Holding.Until.
var HolderChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*coordinationv1.Lease), e.ObjectNew.(*coordinationv1.Lease)
		return holder(o) != holder(n)
	},
}

func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}
