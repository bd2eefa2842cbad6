package devcluster

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// TestSimDRATaints: the simulated DRA driver taints a device as NVIDIA's
// driver does: one gpu.nvidia.com/xid taint with the latest XID (None for
// the application XIDs it skips), gpu.nvidia.com/gpu-lost for a GPU off the
// bus, nothing for XIDs before its kubelet plugin started.
func TestSimDRATaints(t *testing.T) {
	xid := func(code string, effect resourcev1.DeviceTaintEffect) resourcev1.DeviceTaint {
		return resourcev1.DeviceTaint{Key: DRATaintXID, Value: code, Effect: effect}
	}
	type inject struct{ gpu, code int }
	for name, tc := range map[string]struct {
		xids    []inject
		missing int // GPU index off the bus (-1 none)
		since   time.Time
		want    map[int][]resourcev1.DeviceTaint
	}{
		"healthy":                    {missing: -1, want: map[int][]resourcev1.DeviceTaint{}},
		"a fatal XID":                {xids: []inject{{2, 48}}, missing: -1, want: map[int][]resourcev1.DeviceTaint{2: {xid("48", resourcev1.DeviceTaintEffectNoSchedule)}}},
		"an application XID: None":   {xids: []inject{{1, 13}}, missing: -1, want: map[int][]resourcev1.DeviceTaint{1: {xid("13", resourcev1.DeviceTaintEffectNone)}}},
		"the latest XID of a device": {xids: []inject{{2, 48}, {2, 13}}, missing: -1, want: map[int][]resourcev1.DeviceTaint{2: {xid("13", resourcev1.DeviceTaintEffectNone)}}},
		"off the bus": {xids: []inject{{4, 79}}, missing: 4, want: map[int][]resourcev1.DeviceTaint{4: {xid("79", resourcev1.DeviceTaintEffectNoSchedule),
			{Key: DRATaintGPULost, Effect: resourcev1.DeviceTaintEffectNoSchedule}}}},
		"the plugin restarted after the XID": {xids: []inject{{2, 48}}, missing: -1, since: simT.Add(time.Second), want: map[int][]resourcev1.DeviceTaint{}},
	} {
		t.Run(name, func(t *testing.T) {
			c, _ := simHostCluster(t)
			for _, x := range tc.xids {
				if err := c.InjectXID(t.Context(), "gpu-003", x.gpu, x.code); err != nil {
					t.Fatal(err)
				}
			}
			if tc.missing >= 0 {
				if err := c.SetGPUState(t.Context(), "gpu-003", tc.missing, func(s *SimGPUState) { s.Missing = true }); err != nil {
					t.Fatal(err)
				}
			}
			h, err := ReadSimGPUHost(simNode(t, c))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, SimDRATaints(h, tc.since)); diff != "" {
				t.Errorf("taints (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSyncSliceTaintsReadsTheCache: a pass of the simulated DRA driver
// reads the node's slice from the loop's cache and sends one update when
// a taint changes, nothing otherwise (a GET per pass kept the loop
// minutes behind at 10,000 nodes); a slice of an earlier node of the same
// name, or none yet, is left alone.
func TestSyncSliceTaintsReadsTheCache(t *testing.T) {
	c, cs := simHostCluster(t)
	node := simNode(t, c)
	node.UID = "node-uid"
	slice := NodeSpec{Name: "gpu-003", GPUs: 8}.ResourceSlice(node.UID)
	if _, err := cs.ResourceV1().ResourceSlices().Create(t.Context(), slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	writes := func() (gets, updates int) {
		for _, a := range cs.Actions() {
			if a.GetResource().Resource != "resourceslices" {
				continue
			}
			switch a.GetVerb() {
			case "get", "list":
				gets++
			case "update":
				updates++
			}
		}
		return gets, updates
	}
	cs.ClearActions()
	// Not in the cache yet: nothing (the slice's creation queues the node).
	if err := c.syncSliceTaints(t.Context(), node, time.Time{}, store); err != nil {
		t.Fatal(err)
	}
	if err := store.Add(slice); err != nil {
		t.Fatal(err)
	}
	// Healthy: nothing to write.
	if err := c.syncSliceTaints(t.Context(), node, time.Time{}, store); err != nil {
		t.Fatal(err)
	}
	if g, u := writes(); g != 0 || u != 0 {
		t.Fatalf("before any XID: %d reads and %d updates of the slice, want none", g, u)
	}
	if err := c.InjectXID(t.Context(), "gpu-003", 2, 48); err != nil {
		t.Fatal(err)
	}
	node = simNode(t, c)
	node.UID = "node-uid"
	cs.ClearActions()
	if err := c.syncSliceTaints(t.Context(), node, time.Time{}, store); err != nil {
		t.Fatal(err)
	}
	if g, u := writes(); g != 0 || u != 1 {
		t.Fatalf("an XID: %d reads and %d updates of the slice, want 0 and 1", g, u)
	}
	got, err := cs.ResourceV1().ResourceSlices().Get(t.Context(), slice.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if taints := got.Spec.Devices[2].Taints; len(taints) != 1 || taints[0].Key != DRATaintXID || taints[0].Value != "48" {
		t.Errorf("device 2's taints %+v, want %s=48", taints, DRATaintXID)
	}
	if cached, _, _ := store.GetByKey(slice.Name); len(cached.(*resourcev1.ResourceSlice).Spec.Devices[2].Taints) != 0 {
		t.Errorf("the pass changed the cached slice in place")
	}
	// A slice an earlier node of the same name left: not this node's.
	other := node.DeepCopy()
	other.UID = "another-uid"
	cs.ClearActions()
	if err := c.syncSliceTaints(t.Context(), other, time.Time{}, store); err != nil {
		t.Fatal(err)
	}
	if g, u := writes(); g != 0 || u != 0 {
		t.Errorf("another node's slice: %d reads and %d updates, want none", g, u)
	}
}
