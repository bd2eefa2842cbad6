package agent

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// clientAPI is the agent's API on a controller-runtime client: the unit
// tests' fake client, which applies the agent's patches (MergePatch) with
// the API server's optimistic locking.
type clientAPI struct{ client.Client }

func (c clientAPI) Node(ctx context.Context, name string) (*corev1.Node, error) {
	n := &corev1.Node{}
	return n, c.Get(ctx, types.NamespacedName{Name: name}, n)
}

func (c clientAPI) NodeRepair(ctx context.Context, name string) (*repairv1.NodeRepair, error) {
	nr := &repairv1.NodeRepair{}
	return nr, c.Get(ctx, types.NamespacedName{Name: name}, nr)
}

func (c clientAPI) GPUFaults(ctx context.Context, node string) ([]repairv1.GPUFault, error) {
	var l repairv1.GPUFaultList
	if err := c.List(ctx, &l); err != nil {
		return nil, err
	}
	var out []repairv1.GPUFault
	for _, f := range l.Items {
		if f.Spec.NodeName == node {
			out = append(out, f)
		}
	}
	return out, nil
}

func (c clientAPI) NodeRepairPolicies(ctx context.Context) ([]repairv1.NodeRepairPolicy, error) {
	var l repairv1.NodeRepairPolicyList
	return l.Items, c.List(ctx, &l)
}

func (c clientAPI) ResourceSlices(ctx context.Context, node string) ([]resourcev1.ResourceSlice, error) {
	var l resourcev1.ResourceSliceList
	if err := c.List(ctx, &l); err != nil {
		return nil, err
	}
	var out []resourcev1.ResourceSlice
	for _, s := range l.Items {
		if s.Spec.NodeName != nil && *s.Spec.NodeName == node {
			out = append(out, s)
		}
	}
	return out, nil
}

func (c clientAPI) CreateGPUFault(ctx context.Context, f *repairv1.GPUFault) error {
	return c.Create(ctx, f)
}

func (c clientAPI) patch(before, after client.Object) (client.Patch, error) {
	data, err := MergePatch(before, after, before.GetResourceVersion())
	return client.RawPatch(types.MergePatchType, data), err
}

func (c clientAPI) PatchGPUFault(ctx context.Context, before, after *repairv1.GPUFault) error {
	p, err := c.patch(before, after)
	if err != nil {
		return err
	}
	return c.Patch(ctx, after, p)
}

func (c clientAPI) PatchGPUFaultStatus(ctx context.Context, before, after *repairv1.GPUFault) error {
	p, err := c.patch(before, after)
	if err != nil {
		return err
	}
	return c.Status().Patch(ctx, after, p)
}

func (c clientAPI) PatchNodeRepairStatus(ctx context.Context, before, after *repairv1.NodeRepair) error {
	p, err := c.patch(before, after)
	if err != nil {
		return err
	}
	return c.Status().Patch(ctx, after, p)
}

// Fresh: the fake client has no cache.
func (c clientAPI) Fresh() API { return c }

func (c clientAPI) PatchNodeStatus(ctx context.Context, node *corev1.Node, patch []byte) error {
	return c.Status().Patch(ctx, node, client.RawPatch(types.StrategicMergePatchType, patch))
}

// TestMergePatch: the patch carries what changed (and null for what was
// removed) and the resourceVersion read, nothing else.
func TestMergePatch(t *testing.T) {
	type obj struct {
		Metadata map[string]any `json:"metadata,omitempty"`
		Status   map[string]any `json:"status,omitempty"`
	}
	tests := map[string]struct {
		before, after obj
		want          string
	}{
		"a changed field": {
			before: obj{Metadata: map[string]any{"name": "r", "resourceVersion": "7"}, Status: map[string]any{"phase": "Repairing", "next": 1}},
			after:  obj{Metadata: map[string]any{"name": "r", "resourceVersion": "7"}, Status: map[string]any{"phase": "Repairing", "next": 2}},
			want:   `{"metadata":{"resourceVersion":"7"},"status":{"next":2}}`,
		},
		"a removed field": {
			before: obj{Metadata: map[string]any{"name": "r"}, Status: map[string]any{"phase": "Repairing", "pending": map[string]any{"action": "Reboot"}}},
			after:  obj{Metadata: map[string]any{"name": "r"}, Status: map[string]any{"phase": "Repairing"}},
			want:   `{"metadata":{"resourceVersion":"7"},"status":{"pending":null}}`,
		},
		"nothing changed: the lock only": {
			before: obj{Metadata: map[string]any{"name": "r"}},
			after:  obj{Metadata: map[string]any{"name": "r"}},
			want:   `{"metadata":{"resourceVersion":"7"}}`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := MergePatch(tc.before, tc.after, "7")
			if err != nil {
				t.Fatal(err)
			}
			var g, w any
			if err := json.Unmarshal(got, &g); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tc.want), &w); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(w, g); diff != "" {
				t.Errorf("patch %s (-want +got):\n%s", got, diff)
			}
		})
	}
}

func (c clientAPI) NodeMaintenances(ctx context.Context, node string) ([]maintenancev1.NodeMaintenance, error) {
	var l maintenancev1.NodeMaintenanceList
	if err := c.List(ctx, &l); err != nil {
		return nil, err
	}
	var out []maintenancev1.NodeMaintenance
	for _, nm := range l.Items {
		if nm.Spec.NodeName == node {
			out = append(out, nm)
		}
	}
	return out, nil
}
