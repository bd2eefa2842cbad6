package maintenance

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// scheduledRecord holds the objects the scheduler moved to Scheduled until
// its cache shows them. A pass plans with them in place of the cache's
// older copies (as kube-scheduler plans with the pods it assumed bound),
// so it neither waits for its own writes' watch events nor schedules from
// a cache that has not seen them, and those events bring no pass.
type scheduledRecord struct {
	mu sync.Mutex
	m  map[types.NamespacedName]scheduledObject
}

type scheduledObject struct {
	// before is the resourceVersion the write replaced.
	before string
	obj    *maintenancev1.NodeMaintenance
	at     time.Time
}

// wrote records obj (as the API server returned it) in place of the
// version before.
func (r *scheduledRecord) wrote(obj *maintenancev1.NodeMaintenance, before string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[types.NamespacedName]scheduledObject{}
	}
	r.m[types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}] = scheduledObject{before: before, obj: obj, at: now}
}

// overlay puts the recorded objects in place of the cache's copies that
// still show them as they were before the write, and forgets those the
// cache has caught up with (or that changed since), and after a minute
// those that are gone. It returns how many it put in place.
func (r *scheduledRecord) overlay(list *maintenancev1.NodeMaintenanceList, now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.m) == 0 {
		return 0
	}
	n := 0
	seen := make(map[types.NamespacedName]bool, len(r.m))
	for i := range list.Items {
		key := types.NamespacedName{Namespace: list.Items[i].Namespace, Name: list.Items[i].Name}
		rec, ok := r.m[key]
		if !ok {
			continue
		}
		seen[key] = true
		if list.Items[i].ResourceVersion != rec.before {
			delete(r.m, key) // caught up, or changed by another writer
			continue
		}
		list.Items[i] = *rec.obj // the list's own item: the cache is not touched
		n++
	}
	for key, rec := range r.m {
		if !seen[key] && now.Sub(rec.at) > time.Minute {
			delete(r.m, key)
		}
	}
	return n
}

// echo reports whether nm is the scheduler's own write coming back
// through the watch (the pass that wrote it planned with it already).
func (r *scheduledRecord) echo(nm *maintenancev1.NodeMaintenance) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.m[types.NamespacedName{Namespace: nm.Namespace, Name: nm.Name}]
	return ok && rec.obj.ResourceVersion == nm.ResourceVersion
}
