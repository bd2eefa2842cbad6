package agent

import (
	"context"
	"encoding/json"
	"fmt"

	jsonpatch "github.com/evanphx/json-patch/v5"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// API is what the agent reads and writes of the cluster. Reads come from
// the agent's watch caches (objects the caller may change); every write
// returns the stored object in the argument, and the patches that take a
// before fail with a conflict when the stored object is newer than before
// (a merge patch carrying before's resourceVersion): the agent writes on
// the version it acted on, or not at all.
//
// The agent has its own small interface rather than controller-runtime's
// client: it runs on every GPU node, and controller-runtime's packages
// would double its memory there (BenchmarkAgentMemory).
type API interface {
	Node(ctx context.Context, name string) (*corev1.Node, error)
	NodeRepair(ctx context.Context, name string) (*repairv1.NodeRepair, error)
	// GPUFaults lists the GPUFault records of node.
	GPUFaults(ctx context.Context, node string) ([]repairv1.GPUFault, error)
	NodeRepairPolicies(ctx context.Context) ([]repairv1.NodeRepairPolicy, error)
	CreateGPUFault(ctx context.Context, f *repairv1.GPUFault) error
	// PatchGPUFault writes after's spec, PatchGPUFaultStatus its status.
	PatchGPUFault(ctx context.Context, before, after *repairv1.GPUFault) error
	PatchGPUFaultStatus(ctx context.Context, before, after *repairv1.GPUFault) error
	PatchNodeRepairStatus(ctx context.Context, before, after *repairv1.NodeRepair) error
	// PatchNodeStatus sends a strategic merge patch of node's status and
	// returns the stored node in node.
	PatchNodeStatus(ctx context.Context, node *corev1.Node, patch []byte) error
	// NodeMaintenances lists, from the API server (not a cache: read only
	// before a disruptive action), the NodeMaintenance objects of node in
	// every namespace.
	NodeMaintenances(ctx context.Context, node string) ([]maintenancev1.NodeMaintenance, error)
	// ResourceSlices lists the ResourceSlices of node (none when the API
	// server serves no DRA).
	ResourceSlices(ctx context.Context, node string) ([]resourcev1.ResourceSlice, error)
	// Fresh is this API reading the node, a NodeRepair and the node's
	// GPUFault records from the API server instead of the cache: after a write met a newer
	// version than the cache holds, reading the cache again would only
	// conflict again until it catches up.
	Fresh() API
}

// MergePatch is the JSON merge patch from before to after, carrying
// before's resourceVersion so that it fails with a conflict if the stored
// object changed since before was read (controller-runtime's
// MergeFromWithOptimisticLock).
func MergePatch(before, after any, resourceVersion string) ([]byte, error) {
	b, err := json.Marshal(before)
	if err != nil {
		return nil, err
	}
	a, err := json.Marshal(after)
	if err != nil {
		return nil, err
	}
	data, err := jsonpatch.CreateMergePatch(b, a)
	if err != nil {
		return nil, err
	}
	var patch map[string]any
	if err := json.Unmarshal(data, &patch); err != nil {
		return nil, err
	}
	meta, _ := patch["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		patch["metadata"] = meta
	}
	meta["resourceVersion"] = resourceVersion
	return json.Marshal(patch)
}

// kubeAPI is API on the API server: REST clients of the core and repair
// groups (the agent's own scheme: no client-go clientset) and the watch
// caches' stores.
type kubeAPI struct {
	core, repair, maintenance        rest.Interface
	nodes, repairs, faults, policies cache.Store
	// slices: nil when the API server serves no resource.k8s.io/v1.
	slices cache.Store
}

// newScheme knows the types the agent reads and writes.
func newScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := repairv1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := maintenancev1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := resourcev1.AddToScheme(s); err != nil {
		return nil, err
	}
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	return s, nil
}

// get returns a copy of the cached object name (a NotFound error when the
// cache has none).
func get[P runtime.Object](s cache.Store, resource, name string) (P, error) {
	var none P
	o, ok, err := s.GetByKey(name)
	if err != nil {
		return none, err
	}
	if !ok {
		return none, apierrors.NewNotFound(schema.GroupResource{Resource: resource}, name)
	}
	p, ok := o.(P)
	if !ok {
		return none, fmt.Errorf("%s %s: unexpected %T in the cache", resource, name, o)
	}
	return p.DeepCopyObject().(P), nil
}

// list returns copies of the cached objects.
func list[T any, P interface {
	*T
	runtime.Object
}](s cache.Store) []T {
	items := s.List()
	out := make([]T, 0, len(items))
	for _, o := range items {
		if p, ok := o.(P); ok {
			out = append(out, *p.DeepCopyObject().(P))
		}
	}
	return out
}

// indexNode indexes the cached GPUFaults and ResourceSlices by their node:
// the in-process agent of every simulated node reads one node's objects
// per pass, not a copy of all of them.
const indexNode = "node"

// nodeIndexer is indexNode's function: spec.nodeName of a GPUFault or a
// ResourceSlice.
func nodeIndexer(o any) ([]string, error) {
	switch v := o.(type) {
	case *repairv1.GPUFault:
		return []string{v.Spec.NodeName}, nil
	case *resourcev1.ResourceSlice:
		if v.Spec.NodeName != nil {
			return []string{*v.Spec.NodeName}, nil
		}
	}
	return nil, nil
}

// byNodeIndex returns copies of the cached objects of node.
func byNodeIndex[T any, P interface {
	*T
	runtime.Object
}](s cache.Store, node string) ([]T, error) {
	idx, ok := s.(cache.Indexer)
	if !ok {
		return nil, fmt.Errorf("the cache of %T is not indexed by node", P(nil))
	}
	items, err := idx.ByIndex(indexNode, node)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(items))
	for _, o := range items {
		if p, ok := o.(P); ok {
			out = append(out, *p.DeepCopyObject().(P))
		}
	}
	return out, nil
}

func (k *kubeAPI) Node(_ context.Context, name string) (*corev1.Node, error) {
	return get[*corev1.Node](k.nodes, "nodes", name)
}

func (k *kubeAPI) NodeRepair(_ context.Context, name string) (*repairv1.NodeRepair, error) {
	return get[*repairv1.NodeRepair](k.repairs, "noderepairs", name)
}

func (k *kubeAPI) GPUFaults(_ context.Context, node string) ([]repairv1.GPUFault, error) {
	return byNodeIndex[repairv1.GPUFault](k.faults, node)
}

func (k *kubeAPI) NodeRepairPolicies(context.Context) ([]repairv1.NodeRepairPolicy, error) {
	return list[repairv1.NodeRepairPolicy](k.policies), nil
}

func (k *kubeAPI) ResourceSlices(_ context.Context, node string) ([]resourcev1.ResourceSlice, error) {
	if k.slices == nil {
		return nil, nil
	}
	return byNodeIndex[resourcev1.ResourceSlice](k.slices, node)
}

func (k *kubeAPI) CreateGPUFault(ctx context.Context, f *repairv1.GPUFault) error {
	body, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return k.repair.Post().Resource("gpufaults").Body(body).Do(ctx).Into(f)
}

func (k *kubeAPI) PatchGPUFault(ctx context.Context, before, after *repairv1.GPUFault) error {
	return mergePatch(ctx, k.repair, "gpufaults", "", before, after, before.ResourceVersion, after)
}

func (k *kubeAPI) PatchGPUFaultStatus(ctx context.Context, before, after *repairv1.GPUFault) error {
	return mergePatch(ctx, k.repair, "gpufaults", "status", before, after, before.ResourceVersion, after)
}

func (k *kubeAPI) PatchNodeRepairStatus(ctx context.Context, before, after *repairv1.NodeRepair) error {
	return mergePatch(ctx, k.repair, "noderepairs", "status", before, after, before.ResourceVersion, after)
}

func (k *kubeAPI) PatchNodeStatus(ctx context.Context, node *corev1.Node, patch []byte) error {
	return k.core.Patch(types.StrategicMergePatchType).Resource("nodes").Name(node.Name).SubResource("status").
		Body(patch).Do(ctx).Into(node)
}

func (k *kubeAPI) Fresh() API { return freshAPI{k} }

// freshAPI reads the node, a NodeRepair and the node's GPUFault records
// from the API server.
type freshAPI struct{ *kubeAPI }

func (f freshAPI) Node(ctx context.Context, name string) (*corev1.Node, error) {
	n := &corev1.Node{}
	return n, f.core.Get().Resource("nodes").Name(name).Do(ctx).Into(n)
}

func (f freshAPI) NodeRepair(ctx context.Context, name string) (*repairv1.NodeRepair, error) {
	nr := &repairv1.NodeRepair{}
	return nr, f.repair.Get().Resource("noderepairs").Name(name).Do(ctx).Into(nr)
}

func (f freshAPI) GPUFaults(ctx context.Context, node string) ([]repairv1.GPUFault, error) {
	var l repairv1.GPUFaultList
	err := f.repair.Get().Resource("gpufaults").
		Param("fieldSelector", fields.OneTermEqualSelector("spec.nodeName", node).String()).Do(ctx).Into(&l)
	return l.Items, err
}

func (f freshAPI) Fresh() API { return f }

func (k *kubeAPI) NodeMaintenances(ctx context.Context, node string) ([]maintenancev1.NodeMaintenance, error) {
	var l maintenancev1.NodeMaintenanceList
	err := k.maintenance.Get().Resource("nodemaintenances").
		Param("fieldSelector", fields.OneTermEqualSelector("spec.nodeName", node).String()).Do(ctx).Into(&l)
	return l.Items, err
}

func mergePatch(ctx context.Context, c rest.Interface, resource, subresource string, before, after any, rv string, into runtime.Object) error {
	patch, err := MergePatch(before, after, rv)
	if err != nil {
		return err
	}
	name := into.(metav1.Object).GetName()
	req := c.Patch(types.MergePatchType).Resource(resource).Name(name)
	if subresource != "" {
		req = req.SubResource(subresource)
	}
	return req.Body(patch).Do(ctx).Into(into)
}
