package allocation

import (
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
)

// PodGPUs is what the collector keeps of a pod: only pods that request
// GPUs or use ResourceClaims are kept, with their node and GPU request.
type PodGPUs struct {
	Namespace, Name, Node string
	// GPUs is the effective nvidia.com/gpu request (GPURequest).
	GPUs int64
}

// ClaimGPUs is what the collector keeps of a ResourceClaim allocated
// devices of DRADriver: their number and the pods it is reserved for.
type ClaimGPUs struct {
	Namespace string
	GPUs      int64
	Pods      []string
}

// store is a reflector's store (toolscache.ReflectorStore) that keeps, of
// each listed and watched object, only the small value keep derives from
// it (ok false: nothing). Unlike an informer's cache it holds no objects:
// the cluster's pods cost nothing but the few that hold GPUs.
type store[T any] struct {
	keep   func(obj any) (T, bool)
	mu     sync.RWMutex
	items  map[types.NamespacedName]T
	synced atomic.Bool
}

func newStore[T any](keep func(any) (T, bool)) *store[T] {
	return &store[T]{keep: keep, items: map[types.NamespacedName]T{}}
}

func keyOf(obj any) (types.NamespacedName, bool) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		ns, name, err := toolscache.SplitMetaNamespaceKey(d.Key)
		return types.NamespacedName{Namespace: ns, Name: name}, err == nil
	}
	type named interface {
		GetNamespace() string
		GetName() string
	}
	o, ok := obj.(named)
	if !ok {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}, true
}

// Add implements toolscache.ReflectorStore.
func (s *store[T]) Add(obj any) error { return s.Update(obj) }

// Update implements toolscache.ReflectorStore.
func (s *store[T]) Update(obj any) error {
	k, ok := keyOf(obj)
	if !ok {
		return nil
	}
	v, keep := s.keep(obj)
	s.mu.Lock()
	defer s.mu.Unlock()
	if keep {
		s.items[k] = v
	} else {
		delete(s.items, k)
	}
	return nil
}

// Delete implements toolscache.ReflectorStore.
func (s *store[T]) Delete(obj any) error {
	if k, ok := keyOf(obj); ok {
		s.mu.Lock()
		delete(s.items, k)
		s.mu.Unlock()
	}
	return nil
}

// Replace implements toolscache.ReflectorStore: a full list; the store
// has synced.
func (s *store[T]) Replace(list []any, _ string) error {
	items := make(map[types.NamespacedName]T)
	for _, obj := range list {
		if k, ok := keyOf(obj); ok {
			if v, keep := s.keep(obj); keep {
				items[k] = v
			}
		}
	}
	s.mu.Lock()
	s.items = items
	s.mu.Unlock()
	s.synced.Store(true)
	return nil
}

// Resync implements toolscache.ReflectorStore.
func (s *store[T]) Resync() error { return nil }

// snapshot returns the kept values.
func (s *store[T]) snapshot() []T {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]T, 0, len(s.items))
	for _, v := range s.items {
		out = append(out, v)
	}
	return out
}

// keepPod keeps a non-terminated pod that requests GPUs or uses claims.
func keepPod(obj any) (PodGPUs, bool) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return PodGPUs{}, false
	}
	gpus := GPURequest(p)
	if gpus == 0 && len(p.Spec.ResourceClaims) == 0 {
		return PodGPUs{}, false
	}
	return PodGPUs{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, GPUs: gpus}, true
}

// keepClaim keeps a claim allocated devices of DRADriver and the pods it
// is reserved for.
func keepClaim(obj any) (ClaimGPUs, bool) {
	c, ok := obj.(*resourcev1.ResourceClaim)
	if !ok {
		return ClaimGPUs{}, false
	}
	n := draGPUs(c)
	if n == 0 {
		return ClaimGPUs{}, false
	}
	out := ClaimGPUs{Namespace: c.Namespace, GPUs: n}
	for _, r := range c.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			out.Pods = append(out.Pods, r.Name)
		}
	}
	return out, true
}
