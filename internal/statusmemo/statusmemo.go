// Package statusmemo keeps a status writer from writing the same status
// again when the API server drops part of it. A CRD schema older than
// gpufleet's (NVIDIA's own, put back by its Helm chart) prunes the status
// fields it does not know: the status read back then always differs from
// the one computed, and a writer that compares the two would write at
// every pass. The memo remembers, per object, the status last written and
// the resourceVersion the API server answered with; while the object is
// unchanged since and the computed status is the same, there is nothing
// new to write.
package statusmemo

import (
	"encoding/json"
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
)

// Memo of the statuses written, by object UID. Safe for concurrent use.
type Memo[S any] struct {
	mu      sync.Mutex
	written map[types.UID]entry[S]
}

type entry[S any] struct {
	resourceVersion string
	status          S
}

// Unchanged reports whether status is what was written to the object uid
// last, and the object (at resourceVersion) has not changed since: writing
// it again would store the same. Statuses are compared as they are sent
// (JSON: a condition's time to the second).
func (m *Memo[S]) Unchanged(uid types.UID, resourceVersion string, status S) bool {
	m.mu.Lock()
	e, ok := m.written[uid]
	m.mu.Unlock()
	return ok && resourceVersion != "" && e.resourceVersion == resourceVersion && equality.Semantic.DeepEqual(e.status, sent(status))
}

// sent is status as the API server receives it (a JSON round trip).
func sent[S any](status S) S {
	data, err := json.Marshal(status)
	if err != nil {
		return status
	}
	var out S
	if err := json.Unmarshal(data, &out); err != nil {
		return status
	}
	return out
}

// Written records that status was written to the object uid, which the API
// server answered with resourceVersion.
func (m *Memo[S]) Written(uid types.UID, resourceVersion string, status S) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.written == nil {
		m.written = map[types.UID]entry[S]{}
	}
	m.written[uid] = entry[S]{resourceVersion: resourceVersion, status: sent(status)}
}

// Forget drops what was written to the object uid (deleted).
func (m *Memo[S]) Forget(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.written, uid)
}
