package maintenance

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// scheduledRecord holds the objects the scheduler decided to move to
// Scheduled, from the decision until its cache shows the write. A pass
// plans with them in place of the cache's older copies, as kube-scheduler
// plans with the pods it has assumed bound: it neither waits for the
// writes of the pass before it nor for their watch events, never
// schedules from a cache that has not seen its decisions, and the echo of
// its own write brings no pass.
type scheduledRecord struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*scheduledObject
}

type scheduledObject struct {
	// orig is the cache's object the decision was made from (read only):
	// the base of the write, whose resourceVersion it must match.
	orig *maintenancev1.NodeMaintenance
	// obj is the object as decided (sending) or as the API server
	// returned it (written). Never changed once recorded.
	obj     *maintenancev1.NodeMaintenance
	sending bool
	// since is the first change the deciding pass planned for (Unix
	// nanoseconds; 0: none), for the scheduling latency.
	since int64
	at    time.Time
}

func keyOf(nm *maintenancev1.NodeMaintenance) types.NamespacedName {
	return types.NamespacedName{Namespace: nm.Namespace, Name: nm.Name}
}

// assume records a decision whose write is about to be sent.
func (r *scheduledRecord) assume(orig, decided *maintenancev1.NodeMaintenance, since int64, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[types.NamespacedName]*scheduledObject{}
	}
	r.m[keyOf(orig)] = &scheduledObject{orig: orig, obj: decided, sending: true, since: since, at: now}
}

// sending returns the decision of key whose write is still to be sent.
func (r *scheduledRecord) sending(key types.NamespacedName) (*scheduledObject, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.m[key]
	if !ok || !rec.sending {
		return nil, false
	}
	return rec, true
}

// written replaces rec, whose write succeeded, with the object the API
// server returned, until the cache shows it.
func (r *scheduledRecord) written(rec *scheduledObject, obj *maintenancev1.NodeMaintenance, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := keyOf(obj)
	if r.m[key] != rec {
		return
	}
	r.m[key] = &scheduledObject{orig: rec.orig, obj: obj, since: rec.since, at: now}
}

// drop forgets rec, whose write failed: the object is Pending again.
func (r *scheduledRecord) drop(rec *scheduledObject) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if key := keyOf(rec.orig); r.m[key] == rec {
		delete(r.m, key)
	}
}

// overlay puts the recorded objects in place of the cache's copies: a
// decision whose write is in flight always, a written one while the cache
// still shows the object as it was before the write. It forgets written
// ones the cache has caught up with (or that changed since), and after a
// minute those that are gone. It returns how many it put in place.
func (r *scheduledRecord) overlay(list *maintenancev1.NodeMaintenanceList, now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.m) == 0 {
		return 0
	}
	n := 0
	seen := make(map[types.NamespacedName]bool, len(r.m))
	for i := range list.Items {
		key := keyOf(&list.Items[i])
		rec, ok := r.m[key]
		if !ok {
			continue
		}
		seen[key] = true
		if !rec.sending && list.Items[i].ResourceVersion != rec.orig.ResourceVersion {
			delete(r.m, key) // caught up, or changed by another writer
			continue
		}
		list.Items[i] = *rec.obj // the list's own item: the cache is not touched
		n++
	}
	for key, rec := range r.m {
		if !seen[key] && !rec.sending && now.Sub(rec.at) > time.Minute {
			delete(r.m, key)
		}
	}
	return n
}

// echo reports whether nm is the scheduler's own write coming back
// through the watch (the passes since planned with it already).
func (r *scheduledRecord) echo(nm *maintenancev1.NodeMaintenance) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.m[keyOf(nm)]
	return ok && !rec.sending && rec.obj.ResourceVersion == nm.ResourceVersion
}
