package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// taint is NVIDIA's DRA driver's taint key=value on GPU 3's device, added
// at.
func taint(key, value string, at time.Time) DeviceTaintObservation {
	return DeviceTaintObservation{GPU: ref3(), Device: "gpu-3", Key: key, Value: value, TimeAdded: at}
}

// detect runs the core on the records with only device taints observed
// and returns the records after its writes.
func detect(t *testing.T, recs map[string]repairv1.GPUFault, taints ...DeviceTaintObservation) (map[string]repairv1.GPUFault, []repairv1.GPUFault) {
	t.Helper()
	writes := DetectGPUFaults(GPUState{Node: gNode, BootID: gBoot, Capacity: 8, Records: recs, Observed: GPUObservation{DeviceTaints: taints}}, gNow)
	out := map[string]repairv1.GPUFault{}
	for k, v := range recs {
		out[k] = v
	}
	for _, w := range writes {
		w.ResourceVersion = "8"
		out[w.Name] = w
	}
	return out, writes
}

// TestDeviceTaintsAreAFaultSource: the DRA driver's device taints are
// faults of the same catalogue as the kernel log's XIDs: counted once by
// their timeAdded (a taint that stays after the reset that ended it is not
// a new fault, and no write), a lost GPU is a Reboot, the driver's
// informational taints and other keys are not faults, and a reboot ends
// them as it ends XIDs.
func TestDeviceTaintsAreAFaultSource(t *testing.T) {
	xid48 := taint("gpu.nvidia.com/xid", "48", t0)
	recs, writes := detect(t, nil, xid48)
	if len(writes) != 1 || writes[0].Name != name3 {
		t.Fatalf("writes %+v, want GPU 3's new record", writes)
	}
	got := recs[name3]
	if got.Status.Class != repairv1.GPUClassResetGPU || len(got.Status.Faults) != 1 {
		t.Fatalf("status %+v, want one ResetGPU fault", got.Status)
	}
	e := got.Status.Faults[0]
	if e.Code != 48 || e.Counter != "gpu.nvidia.com/xid" || !e.Active || e.Count != 1 || !e.LastSeen.Time.Equal(t0) ||
		!strings.Contains(e.Meaning, meta48) || !strings.Contains(e.Meaning, "device gpu-3") {
		t.Errorf("entry %+v", e)
	}
	if !strings.Contains(got.Status.Summary, "device taint gpu.nvidia.com/xid=48") {
		t.Errorf("summary %q", got.Status.Summary)
	}
	if diff := cmp.Diff(ref3(), got.Spec.GPU); diff != "" {
		t.Errorf("GPU (-want +got):\n%s", diff)
	}

	// Seen again: nothing to write.
	if _, writes := detect(t, recs, xid48); len(writes) != 0 {
		t.Errorf("the same taint wrote %+v", writes)
	}
	// The reset ends it; the driver keeps the taint until its plugin
	// restarts: still not a new fault.
	reset := ResetDone([]repairv1.GPUFault{recs[name3]}, []repairv1.GPURef{ref(bus3)})
	if len(reset) != 1 || reset[0].Status.Class != "" {
		t.Fatalf("reset %+v, want GPU 3 back in service", reset)
	}
	recs[name3] = reset[0]
	if _, writes := detect(t, recs, xid48); len(writes) != 0 {
		t.Errorf("the taint that stayed after the reset wrote %+v", writes)
	}
	// A new XID: the driver replaces the value and the API server dates it.
	recs, _ = detect(t, recs, taint("gpu.nvidia.com/xid", "79", t0.Add(time.Minute)))
	if c := recs[name3].Status.Class; c != repairv1.GPUClassReboot {
		t.Errorf("after XID 79: class %q, want Reboot", c)
	}
	// A reboot (new boot ID) ends it.
	after := DetectGPUFaults(GPUState{Node: gNode, BootID: "boot-2", Capacity: 8, Records: recs}, gNow)
	if len(after) != 1 || after[0].Status.Class != "" {
		t.Errorf("after a reboot: %+v, want GPU 3 in service", after)
	}

	for name, tc := range map[string]struct {
		taint DeviceTaintObservation
		class repairv1.GPUFaultClass
		write bool
	}{
		"a lost GPU":                    {taint("gpu.nvidia.com/gpu-lost", "", t0), repairv1.GPUClassReboot, true},
		"an application XID (None)":     {taint("gpu.nvidia.com/xid", "13", t0), repairv1.GPUClassApplication, true},
		"the driver's unmonitored note": {taint("gpu.nvidia.com/unmonitored", "", t0), "", false},
		"someone else's key":            {taint("example.com/maintenance", "", t0), "", false},
		"an XID that is no number":      {taint("gpu.nvidia.com/xid", "x", t0), "", false},
	} {
		t.Run(name, func(t *testing.T) {
			recs, writes := detect(t, nil, tc.taint)
			if (len(writes) > 0) != tc.write {
				t.Fatalf("writes %+v, want a write: %t", writes, tc.write)
			}
			// An Application fault leaves the GPU in service (no class).
			want := tc.class
			if want == repairv1.GPUClassApplication {
				want = ""
			}
			if tc.write && recs[name3].Status.Class != want {
				t.Errorf("class %q, want %q", recs[name3].Status.Class, tc.class)
			}
		})
	}

	// The kernel log and the driver report the same XID: two entries of
	// one class, counted once each; one reset ends both.
	writes = DetectGPUFaults(GPUState{Node: gNode, BootID: gBoot, Capacity: 8,
		Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t0)}, DeviceTaints: []DeviceTaintObservation{xid48}}}, gNow)
	if len(writes) != 1 || len(writes[0].Status.Faults) != 2 || writes[0].Status.Class != repairv1.GPUClassResetGPU {
		t.Fatalf("kernel log and driver: %+v", writes)
	}
	if reset := ResetDone(writes, []repairv1.GPURef{ref(bus3)}); len(reset) != 1 || reset[0].Status.Class != "" {
		t.Errorf("after the reset: %+v, want both entries ended", reset)
	}
}

// TestDeviceTaintsOf: the taints of the policy's driver on the node's
// devices, each with the GPU its device's attributes name.
func TestDeviceTaintsOf(t *testing.T) {
	added := metav1.NewTime(t0)
	dev := func(name, uuid, pciKey, pci string, taints ...resourcev1.DeviceTaint) resourcev1.Device {
		d := resourcev1.Device{Name: name, Taints: taints, Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"uuid": {StringValue: ptr.To(uuid)}, resourcev1.QualifiedName(pciKey): {StringValue: ptr.To(pci)}}}
		return d
	}
	x48 := resourcev1.DeviceTaint{Key: "gpu.nvidia.com/xid", Value: "48", Effect: resourcev1.DeviceTaintEffectNoSchedule, TimeAdded: &added}
	slice := func(driver, node string, devs ...resourcev1.Device) resourcev1.ResourceSlice {
		return resourcev1.ResourceSlice{Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node), Devices: devs}}
	}
	rs := []resourcev1.ResourceSlice{
		slice("gpu.nvidia.com", gNode, dev("gpu-3", uuid3, "resource.kubernetes.io/pciBusID", bus3, x48), dev("gpu-5", uuid5, "resource.kubernetes.io/pciBusID", bus5)),
		slice("gpu.nvidia.com", "other-node", dev("gpu-3", "GPU-x", "resource.kubernetes.io/pciBusID", bus3, x48)),
		slice("other.example.com", gNode, dev("gpu-3", uuid3, "pcieBusID", bus3, x48)),
		slice("old.nvidia.com", gNode, dev("gpu-5", uuid5, "gpu.nvidia.com/pcieBusID", bus5, x48)),
	}
	got := DeviceTaintsOf(rs, []string{"gpu.nvidia.com", "old.nvidia.com"}, gNode)
	want := []DeviceTaintObservation{
		{GPU: repairv1.GPURef{Index: ptr.To[int32](3), UUID: uuid3, PCIBusID: bus3}, Device: "gpu-3", Key: "gpu.nvidia.com/xid", Value: "48", TimeAdded: t0},
		{GPU: repairv1.GPURef{Index: ptr.To[int32](5), UUID: uuid5, PCIBusID: bus5}, Device: "gpu-5", Key: "gpu.nvidia.com/xid", Value: "48", TimeAdded: t0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("taints (-want +got):\n%s", diff)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"pool": "a"}}}
	pol := func(driver string, pool string) repairv1.NodeRepairPolicy {
		p := repairv1.NodeRepairPolicy{Spec: repairv1.NodeRepairPolicySpec{GPU: repairv1.GPUSpec{DRADriver: driver}}}
		p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"pool": pool}}
		return p
	}
	if got := DRADriversFor(node, nil); !cmp.Equal(got, []string{"gpu.nvidia.com"}) {
		t.Errorf("no policy: %v", got)
	}
	if got := DRADriversFor(node, []repairv1.NodeRepairPolicy{pol("x.example.com", "a"), pol("y.example.com", "b")}); !cmp.Equal(got, []string{"x.example.com"}) {
		t.Errorf("the node's policy: %v", got)
	}
}

// TestEventsEndedByTheResetStayEnded: a taint (or an XID) dated before the
// GPU's reset or validation is over even when a source first shows it
// after them (one of the same second counts: a new fault is never lost) — a slow agent that reads the driver's lingering taint only
// after the repair would otherwise take the GPU out again and start a
// second repair. One dated after them is a new fault.
func TestEventsEndedByTheResetStayEnded(t *testing.T) {
	validated := rec(name3, ref3(), repairv1.GPUFaultStatus{Validation: &repairv1.GPUValidationResult{Passed: true, Time: mt(t0.Add(time.Minute))}})
	if _, writes := detect(t, records(validated), taint("gpu.nvidia.com/xid", "48", t0)); len(writes) != 0 {
		t.Errorf("a taint from before the validation wrote %+v", writes)
	}
	w := DetectGPUFaults(GPUState{Node: gNode, BootID: gBoot, Capacity: 8, Records: records(validated),
		Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t0)}}}, gNow)
	if len(w) != 0 {
		t.Errorf("an XID from before the validation wrote %+v", w)
	}
	recs, writes := detect(t, records(validated), taint("gpu.nvidia.com/xid", "48", t0.Add(2*time.Minute)))
	if len(writes) != 1 || recs[name3].Status.Class != repairv1.GPUClassResetGPU {
		t.Errorf("a taint after the validation: writes %+v", writes)
	}
	w = DetectGPUFaults(GPUState{Node: gNode, BootID: gBoot, Capacity: 8, Records: records(validated),
		Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t0.Add(time.Minute+300*time.Millisecond))}}}, gNow)
	if len(w) != 1 || w[0].Status.Class != repairv1.GPUClassResetGPU {
		t.Errorf("an XID in the second of the validation was lost: %+v", w)
	}
	// Reset, waiting for its validation: the pending entry's time ends
	// what came before.
	pending := ValidationPending([]repairv1.GPUFault{rec(name3, ref3(), repairv1.GPUFaultStatus{})}, []repairv1.GPURef{ref3()}, t0.Add(time.Minute))[0]
	pending.ResourceVersion = "8"
	before := pending.DeepCopy()
	if _, writes := detect(t, records(pending), taint("gpu.nvidia.com/xid", "79", t0)); len(writes) != 0 {
		t.Errorf("a taint from before the reset wrote %+v (record was %+v)", writes, before.Status)
	}
}
