// Package ownwrites remembers this process's own writes until its cache
// shows them: the maintenance controllers and the GPU stack controller act
// only on objects whose cache has caught up with what they wrote.
package ownwrites

import (
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Record remembers, per object, its resourceVersion before this
// process's last write of it: a cache still showing that version has not
// seen the write, and acting on it would only end in a conflict (or a
// second patch of a deleted object). The write's own watch event brings
// the object back. The zero value is ready to use.
type Record struct {
	mu sync.Mutex
	m  map[types.NamespacedName]written
}

type written struct {
	rvBefore []string
	at       time.Time
}

// Behind reports whether a cached object at resourceVersion rv predates our
// last write of it (for at most a few seconds: a write the server found to
// change nothing would keep the old resourceVersion).
func (o *Record) Behind(key types.NamespacedName, rv string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	w, ok := o.m[key]
	if !ok {
		return false
	}
	// Wall time, not the injected clock: this is about cache propagation.
	if !slices.Contains(w.rvBefore, rv) || time.Since(w.at) > 5*time.Second {
		delete(o.m, key) // caught up, changed by someone else, or given up on
		return false
	}
	return true
}

// Wrote records a write that replaced resourceVersion rvBefore of key
// (several: successive writes of one step, e.g. metadata then status; a
// cache showing any of them has not seen the last).
func (o *Record) Wrote(key types.NamespacedName, rvBefore ...string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[types.NamespacedName]written{}
	}
	for k, w := range o.m {
		if time.Since(w.at) > time.Minute { // objects deleted since
			delete(o.m, k)
		}
	}
	o.m[key] = written{rvBefore: slices.Clone(rvBefore), at: time.Now()}
}

// Retain forgets the objects keep rejects.
func (o *Record) Retain(keep func(types.NamespacedName) bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k := range o.m {
		if !keep(k) {
			delete(o.m, k)
		}
	}
}

// Len is the number of writes not yet seen.
func (o *Record) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}
