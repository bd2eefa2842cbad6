package devcluster

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourcev1 "k8s.io/api/resource/v1"
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
