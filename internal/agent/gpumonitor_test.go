package agent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpufault"
)

// The node of the core's tests: GPU 3 at 0000:18:00.0, GPU 5 at
// 0000:2a:00.0, GPU 1 at 0000:0c:00.0; 8 GPUs.
const (
	gNode  = "gpu-003"
	gBoot  = "boot-1"
	bus3   = "0000:18:00.0"
	bus5   = "0000:2a:00.0"
	bus1   = "0000:0c:00.0"
	uuid3  = "GPU-33333333-3333-3333-3333-333333333333"
	uuid5  = "GPU-55555555-5555-5555-5555-555555555555"
	name3  = "gpu-003-0000-18-00-0"
	name5  = "gpu-003-0000-2a-00-0"
	name1  = "gpu-003-0000-0c-00-0"
	meta48 = "Uncorrectable (double-bit) ECC error in GPU memory"
)

var (
	t0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	// The core's clock is later than the XIDs it reads.
	gNow = t0.Add(time.Hour)
)

func mt(t time.Time) metav1.Time { return metav1.NewTime(t) }

// xidAt is an XID of the kernel log (parsed from the driver's line) with
// its time.
func xidAt(bus string, code int, at time.Time) XIDObservation {
	pci := strings.TrimSuffix(bus, ".0")
	ev, ok := gpufault.ParseKmsgXID(fmt.Sprintf("4,100,5000,-;NVRM: Xid (PCI:%s): %d, pid=1, name=python3, fault", pci, code))
	if !ok {
		panic("unparseable test XID")
	}
	return XIDObservation{Event: ev, Time: at}
}

// health is dcgm-exporter's view: GPUs 0–7 at made-up addresses, GPU 3 and
// 5 at bus3 and bus5, without the GPUs in skip; set changes GPU 3's health.
func health(set func(*gpufault.GPUHealth), skip ...int) map[gpufault.GPUKey]gpufault.GPUHealth {
	out := map[gpufault.GPUKey]gpufault.GPUHealth{}
	for i := range 8 {
		if contains(skip, i) {
			continue
		}
		k := gpufault.GPUKey{Index: i, UUID: fmt.Sprintf("GPU-%d%d%d%d%d%d%d%d-0000-0000-0000-000000000000", i, i, i, i, i, i, i, i),
			PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x40+i)}
		switch i {
		case 3:
			k.UUID, k.PCIBusID = uuid3, bus3
		case 5:
			k.UUID, k.PCIBusID = uuid5, bus5
		case 1:
			k.PCIBusID = bus1
		}
		h := gpufault.GPUHealth{Reported: []string{gpufault.MetricECCDBEVolatile}}
		if i == 3 && set != nil {
			set(&h)
		}
		out[k] = h
	}
	return out
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func dbe(n uint64) func(*gpufault.GPUHealth) {
	return func(h *gpufault.GPUHealth) { h.UncorrectableECCVolatile = n }
}

// rec is a stored record of the node (resourceVersion set).
func rec(name string, gpu repairv1.GPURef, st repairv1.GPUFaultStatus) repairv1.GPUFault {
	r := newRec(name, gpu, st)
	r.ResourceVersion = "7"
	return r
}

// newRec is a record as the core creates it.
func newRec(name string, gpu repairv1.GPURef, st repairv1.GPUFaultStatus) repairv1.GPUFault {
	if st.BootID == "" {
		st.BootID = gBoot
	}
	return repairv1.GPUFault{
		TypeMeta:   metav1.TypeMeta{APIVersion: "repair.gpufleet.dev/v1alpha1", Kind: "GPUFault"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       repairv1.GPUFaultSpec{NodeName: gNode, GPU: gpu},
		Status:     st,
	}
}

func ref(bus string) repairv1.GPURef { return repairv1.GPURef{PCIBusID: bus} }

func ref3() repairv1.GPURef {
	return repairv1.GPURef{Index: ptr.To[int32](3), UUID: uuid3, PCIBusID: bus3}
}

func x48(first, last time.Time, count int64, active bool) repairv1.GPUFaultEntry {
	e := gpufault.Classify(48, nil)
	return repairv1.GPUFaultEntry{Code: 48, Class: repairv1.GPUClassResetGPU, Meaning: e.Meaning, Citation: e.Citation,
		FirstSeen: mt(first), LastSeen: mt(last), Count: count, Active: active}
}

func x13(at time.Time, count int64) repairv1.GPUFaultEntry {
	e := gpufault.Classify(13, nil)
	return repairv1.GPUFaultEntry{Code: 13, Class: repairv1.GPUClassApplication, Meaning: e.Meaning, Citation: e.Citation,
		FirstSeen: mt(at), LastSeen: mt(at), Count: count, Active: true}
}

// dbeEntry is the volatile DBE counter fault as AssessWith words it.
func dbeEntry(first, last time.Time, count int64, active bool) repairv1.GPUFaultEntry {
	f := gpufault.AssessWith(health(dbe(1)), 8, gpufault.Policy{})[0]
	return repairv1.GPUFaultEntry{Counter: gpufault.MetricECCDBEVolatile, Class: repairv1.GPUClassResetGPU, Meaning: f.Meaning,
		Citation: truncate(f.Citation, maxEntryText), FirstSeen: mt(first), LastSeen: mt(last), Count: count, Active: active}
}

func missingEntry(meaning string, first, last time.Time, active bool) repairv1.GPUFaultEntry {
	f := gpufault.AssessWith(health(nil, 5), 8, gpufault.Policy{})[0]
	return repairv1.GPUFaultEntry{Counter: gpufault.CounterGPUMissing, Class: repairv1.GPUClassReboot, Meaning: meaning,
		Citation: f.Citation, FirstSeen: mt(first), LastSeen: mt(last), Count: 1, Active: active}
}

const missing5 = "dcgm-exporter reports 7 of the node's 8 GPUs, not this one: it fell off the bus or did not initialise"

func records(rs ...repairv1.GPUFault) map[string]repairv1.GPUFault {
	m := map[string]repairv1.GPUFault{}
	for _, r := range rs {
		m[r.Name] = r
	}
	return m
}

func TestDetectGPUFaults(t *testing.T) {
	t1, t2 := t0.Add(10*time.Second), t0.Add(20*time.Minute)
	sum48 := "Xid 48 (" + meta48 + ")"
	out48 := func(first, last time.Time, count int64, occ ...time.Time) repairv1.GPUFaultStatus {
		st := repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU, Summary: sum48,
			Faults: []repairv1.GPUFaultEntry{x48(first, last, count, true)}}
		for _, o := range occ {
			st.Occurrences = append(st.Occurrences, mt(o))
		}
		return st
	}
	// A GPU 3 reset after its XID 48 at t1: in service, the entry inactive.
	wasReset := rec(name3, ref(bus3), repairv1.GPUFaultStatus{Faults: []repairv1.GPUFaultEntry{x48(t1, t1, 1, false)},
		Occurrences: []metav1.Time{mt(t1)}})
	dbeActive := rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU,
		Summary:     counterLabel(gpufault.MetricECCDBEVolatile),
		Faults:      []repairv1.GPUFaultEntry{dbeEntry(t0, t0, 1, true)},
		Occurrences: []metav1.Time{mt(t0)}})
	tests := map[string]struct {
		in   GPUState
		want []repairv1.GPUFault
	}{
		"an XID 48 creates the GPU's record, out of service": {
			in:   GPUState{Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t1.Add(300*time.Millisecond))}}},
			want: []repairv1.GPUFault{newRec(name3, ref(bus3), out48(t1, t1, 1, gNow))},
		},
		"the same kernel log read again (agent restart) changes nothing": {
			in: GPUState{Records: records(rec(name3, ref(bus3), out48(t1, t1, 1, gNow))),
				Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t1.Add(300*time.Millisecond))}}},
		},
		"a later XID 48 is counted; still out of service, no new occurrence": {
			in: GPUState{Records: records(rec(name3, ref(bus3), out48(t1, t1, 1, t1))),
				Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t1), xidAt(bus3, 48, t2)}}},
			want: []repairv1.GPUFault{rec(name3, ref(bus3), out48(t1, t2, 2, t1))},
		},
		"two XIDs of a code within one second count once": {
			in: GPUState{Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t1.Add(100*time.Millisecond)),
				xidAt(bus3, 48, t1.Add(900*time.Millisecond))}}},
			want: []repairv1.GPUFault{newRec(name3, ref(bus3), out48(t1, t1, 1, gNow))},
		},
		"an XID from before the reset does not bring the fault back": {
			in: GPUState{Records: records(wasReset), Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t1)}}},
		},
		"an XID after the reset: out of service again, a second occurrence": {
			in:   GPUState{Records: records(wasReset), Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t1), xidAt(bus3, 48, t2)}}},
			want: []repairv1.GPUFault{rec(name3, ref(bus3), out48(t1, t2, 2, t1, gNow))},
		},
		"an application XID is recorded and the GPU stays in service": {
			in: GPUState{Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus1, 13, t1)}}},
			want: []repairv1.GPUFault{newRec(name1, ref(bus1), repairv1.GPUFaultStatus{
				Summary: "Xid 13 (" + gpufault.Classify(13, nil).Meaning + ")", Faults: []repairv1.GPUFaultEntry{x13(t1, 1)}})},
		},
		"a policy's override makes XID 13 a reset": {
			in: GPUState{Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus1, 13, t1)}},
				XIDClasses: map[int]gpufault.Class{13: gpufault.ClassResetGPU}},
			want: []repairv1.GPUFault{newRec(name1, ref(bus1), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU,
				Summary: "Xid 13 (" + gpufault.Classify(13, nil).Meaning + ")", Occurrences: []metav1.Time{mt(gNow)},
				Faults: []repairv1.GPUFaultEntry{func() repairv1.GPUFaultEntry {
					e := x13(t1, 1)
					e.Class = repairv1.GPUClassResetGPU
					return e
				}()}})},
		},
		"an override set later reclassifies the recorded XID": {
			in: GPUState{Records: records(rec(name3, ref(bus3), out48(t1, t1, 1, t1))),
				XIDClasses: map[int]gpufault.Class{48: gpufault.ClassReboot}},
			want: []repairv1.GPUFault{func() repairv1.GPUFault {
				st := out48(t1, t1, 1, t1)
				st.Class, st.Faults[0].Class = repairv1.GPUClassReboot, repairv1.GPUClassReboot
				return rec(name3, ref(bus3), st)
			}()},
		},
		"an XID a process wrote to /dev/kmsg is not the driver's": {
			in: GPUState{Observed: GPUObservation{XIDs: []XIDObservation{func() XIDObservation {
				x := xidAt(bus3, 79, t1)
				x.Event.FromUserspace = true
				return x
			}()}}},
		},
		"a reboot (new boot ID) clears the kernel-log XIDs, not the counters": {
			in: GPUState{BootID: "boot-2", Records: records(rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU,
				Summary: sum48, Faults: []repairv1.GPUFaultEntry{x48(t1, t1, 1, true), dbeEntry(t1, t1, 1, true)}, Occurrences: []metav1.Time{mt(t1)}})),
				Observed: GPUObservation{DCGM: health(dbe(2)), XIDs: []XIDObservation{xidAt(bus3, 48, t1)}}},
			want: []repairv1.GPUFault{rec(name3, ref3(), repairv1.GPUFaultStatus{BootID: "boot-2", Class: repairv1.GPUClassResetGPU,
				Summary: counterLabel(gpufault.MetricECCDBEVolatile), Occurrences: []metav1.Time{mt(t1)},
				Faults: []repairv1.GPUFaultEntry{x48(t1, t1, 1, false), dbeEntry(t1, t1, 1, true)}})},
		},
		"a reboot of a GPU with XIDs only: back in service": {
			in: GPUState{BootID: "boot-2", Records: records(rec(name3, ref(bus3), out48(t1, t1, 1, t1)))},
			want: []repairv1.GPUFault{rec(name3, ref(bus3), repairv1.GPUFaultStatus{BootID: "boot-2", Occurrences: []metav1.Time{mt(t1)},
				Faults: []repairv1.GPUFaultEntry{x48(t1, t1, 1, false)}})},
		},
		"the boot ID unknown: nothing cleared": {
			in: GPUState{BootID: "", Records: records(rec(name3, ref(bus3), out48(t1, t1, 1, t1)))},
		},
		"a volatile DBE count takes the GPU out of service, with index and UUID": {
			in: GPUState{Capacity: 8, Observed: GPUObservation{DCGM: health(dbe(1))}},
			want: []repairv1.GPUFault{newRec(name3, ref3(), func() repairv1.GPUFaultStatus {
				s := dbeActive.Status
				s.Faults = []repairv1.GPUFaultEntry{dbeEntry(gNow, gNow, 1, true)}
				s.Occurrences = []metav1.Time{mt(gNow)}
				return s
			}())},
		},
		"the counter still shows it: nothing to write": {
			in: GPUState{Capacity: 8, Records: records(dbeActive), Observed: GPUObservation{DCGM: health(dbe(3))}},
		},
		"the counter cleared (reset): back in service": {
			in: GPUState{Capacity: 8, Records: records(dbeActive), Observed: GPUObservation{DCGM: health(nil)}},
			want: []repairv1.GPUFault{rec(name3, ref3(), repairv1.GPUFaultStatus{Occurrences: []metav1.Time{mt(t0)},
				Faults: []repairv1.GPUFaultEntry{dbeEntry(t0, t0, 1, false)}})},
		},
		"the counter shows it again: counted, a second occurrence": {
			in: GPUState{Capacity: 8, Records: records(rec(name3, ref3(), repairv1.GPUFaultStatus{Occurrences: []metav1.Time{mt(t0)},
				Faults: []repairv1.GPUFaultEntry{dbeEntry(t0, t0, 1, false)}})), Observed: GPUObservation{DCGM: health(dbe(1))}},
			want: []repairv1.GPUFault{rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU,
				Summary: counterLabel(gpufault.MetricECCDBEVolatile), Occurrences: []metav1.Time{mt(t0), mt(gNow)},
				Faults: []repairv1.GPUFaultEntry{dbeEntry(t0, gNow, 2, true)}})},
		},
		"the exporter unreachable (no scrape): counters keep their state": {
			in: GPUState{Capacity: 8, Records: records(dbeActive), Observed: GPUObservation{DCGM: nil}},
		},
		"the exporter fills in index and UUID of a kernel-log record": {
			in:   GPUState{Capacity: 8, Records: records(rec(name3, ref(bus3), out48(t1, t1, 1, t1))), Observed: GPUObservation{DCGM: health(nil)}},
			want: []repairv1.GPUFault{rec(name3, ref3(), out48(t1, t1, 1, t1))},
		},
		"a missing GPU that has a record gets the fault": {
			in: GPUState{Capacity: 8, Records: records(rec(name5, ref(bus5), repairv1.GPUFaultStatus{})),
				Observed: GPUObservation{DCGM: health(nil, 5)}},
			want: []repairv1.GPUFault{rec(name5, ref(bus5), repairv1.GPUFaultStatus{Class: repairv1.GPUClassReboot,
				Summary: counterLabel(gpufault.CounterGPUMissing), Occurrences: []metav1.Time{mt(gNow)},
				Faults: []repairv1.GPUFaultEntry{missingEntry(missing5, gNow, gNow, true)}})},
		},
		"a missing GPU known from earlier scrapes gets its own record": {
			in: GPUState{Capacity: 8, Observed: GPUObservation{DCGM: health(nil, 5),
				KnownGPUs: []repairv1.GPURef{{Index: ptr.To[int32](5), UUID: uuid5, PCIBusID: "00000000:2A:00.0"}}}},
			want: []repairv1.GPUFault{newRec(name5, repairv1.GPURef{Index: ptr.To[int32](5), UUID: uuid5, PCIBusID: bus5},
				repairv1.GPUFaultStatus{Class: repairv1.GPUClassReboot, Summary: counterLabel(gpufault.CounterGPUMissing),
					Occurrences: []metav1.Time{mt(gNow)}, Faults: []repairv1.GPUFaultEntry{missingEntry(missing5, gNow, gNow, true)}})},
		},
		"a missing GPU nobody knows: the node's record": {
			in: GPUState{Capacity: 8, Observed: GPUObservation{DCGM: health(nil, 5)}},
			want: []repairv1.GPUFault{newRec("gpu-003-unidentified", repairv1.GPURef{}, repairv1.GPUFaultStatus{Class: repairv1.GPUClassReboot,
				Summary: counterLabel(gpufault.CounterGPUMissing), Occurrences: []metav1.Time{mt(gNow)},
				Faults: []repairv1.GPUFaultEntry{missingEntry(gpufault.AssessWith(health(nil, 5), 8, gpufault.Policy{})[0].Meaning, gNow, gNow, true)}})},
		},
		"the missing GPU is back: in service": {
			in: GPUState{Capacity: 8, Records: records(rec(name5, ref(bus5), repairv1.GPUFaultStatus{Class: repairv1.GPUClassReboot,
				Summary: counterLabel(gpufault.CounterGPUMissing), Occurrences: []metav1.Time{mt(t0)},
				Faults: []repairv1.GPUFaultEntry{missingEntry(missing5, t0, t0, true)}})), Observed: GPUObservation{DCGM: health(nil)}},
			want: []repairv1.GPUFault{rec(name5, repairv1.GPURef{Index: ptr.To[int32](5), UUID: uuid5, PCIBusID: bus5}, repairv1.GPUFaultStatus{
				Occurrences: []metav1.Time{mt(t0)}, Faults: []repairv1.GPUFaultEntry{missingEntry(missing5, t0, t0, false)}})},
		},
		"no GPU reported at all is no verdict on missing GPUs": {
			in: GPUState{Capacity: 8, Records: records(rec(name5, ref(bus5), repairv1.GPUFaultStatus{Class: repairv1.GPUClassReboot,
				Summary: counterLabel(gpufault.CounterGPUMissing), Occurrences: []metav1.Time{mt(t0)},
				Faults: []repairv1.GPUFaultEntry{missingEntry(missing5, t0, t0, true)}})),
				Observed: GPUObservation{DCGM: map[gpufault.GPUKey]gpufault.GPUHealth{}}},
		},
		"another node's record is not this node's": {
			in: GPUState{Records: records(func() repairv1.GPUFault {
				r := rec(name3, ref(bus3), out48(t1, t1, 1, t1))
				r.Spec.NodeName = "gpu-004"
				return r
			}()), Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t1)}}},
			want: []repairv1.GPUFault{newRec(name3, ref(bus3), out48(t1, t1, 1, gNow))},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.in.Node = gNode
			if tc.in.BootID == "" && !strings.Contains(name, "boot ID unknown") {
				tc.in.BootID = gBoot
			}
			got := DetectGPUFaults(tc.in, gNow.Add(400*time.Millisecond))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("records to write (-want +got):\n%s", diff)
			}
			// Applying the writes and looking again writes nothing.
			after := map[string]repairv1.GPUFault{}
			for k, v := range tc.in.Records {
				after[k] = v
			}
			for _, r := range got {
				after[r.Name] = r
			}
			tc.in.Records = after
			if again := DetectGPUFaults(tc.in, gNow.Add(time.Minute)); len(again) != 0 {
				t.Errorf("a second pass over the result writes %d records: %+v", len(again), again)
			}
		})
	}
}

func TestDetectGPUFaultsBoundsEntriesAndOccurrences(t *testing.T) {
	var xids []XIDObservation
	for code := 1; code <= 100; code++ {
		xids = append(xids, xidAt(bus3, code, t0.Add(time.Duration(code)*time.Second)))
	}
	got := DetectGPUFaults(GPUState{Node: gNode, BootID: gBoot, Observed: GPUObservation{XIDs: xids}}, gNow)
	if len(got) != 1 || len(got[0].Status.Faults) != maxFaultEntries {
		t.Fatalf("100 XID codes: %d records, want 1 with %d entries", len(got), maxFaultEntries)
	}
	if len(got[0].Status.Summary) > maxSummary {
		t.Errorf("summary of %d bytes, want at most %d", len(got[0].Status.Summary), maxSummary)
	}
	// Every repairing entry is kept (the application and informational
	// ones go first).
	kept := map[int32]bool{}
	for _, e := range got[0].Status.Faults {
		kept[e.Code] = true
	}
	for code := 1; code <= 100; code++ {
		if gpufault.Classify(code, nil).Class.Repairs() && !kept[int32(code)] {
			t.Errorf("XID %d (%s) dropped", code, gpufault.Classify(code, nil).Class)
		}
	}
	// Twenty times out of service and back: the last 16 occurrences.
	r := rec(name3, ref(bus3), repairv1.GPUFaultStatus{})
	for i := range 20 {
		at := t0.Add(time.Duration(i) * time.Hour)
		w := DetectGPUFaults(GPUState{Node: gNode, BootID: gBoot, Records: records(r), Observed: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, at)}}}, at)
		r = ResetDone(w, []repairv1.GPURef{ref(bus3)})[0]
	}
	if n := len(r.Status.Occurrences); n != maxOccurrences || !r.Status.Occurrences[n-1].Equal(ptr.To(mt(t0.Add(19*time.Hour)))) {
		t.Errorf("occurrences %v, want the last %d", r.Status.Occurrences, maxOccurrences)
	}
}

func TestResetDone(t *testing.T) {
	t1 := t0.Add(time.Minute)
	out := rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU, Summary: "x",
		Faults:      []repairv1.GPUFaultEntry{x48(t1, t1, 1, true), x13(t1, 2)},
		Occurrences: []metav1.Time{mt(t1)}})
	withDBE := rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU, Summary: "x",
		Faults:      []repairv1.GPUFaultEntry{x48(t1, t1, 1, true), dbeEntry(t1, t1, 1, true)},
		Occurrences: []metav1.Time{mt(t1)}})
	other := rec(name5, ref(bus5), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU, Summary: "x",
		Faults: []repairv1.GPUFaultEntry{x48(t1, t1, 1, true)}})
	tests := map[string]struct {
		records []repairv1.GPUFault
		gpus    []repairv1.GPURef
		want    []repairv1.GPUFault
	}{
		"the reset GPU's XIDs clear; back in service": {
			records: []repairv1.GPUFault{out, other}, gpus: []repairv1.GPURef{{PCIBusID: "00000000:18:00.0"}},
			want: []repairv1.GPUFault{rec(name3, ref3(), repairv1.GPUFaultStatus{Occurrences: []metav1.Time{mt(t1)},
				Faults: []repairv1.GPUFaultEntry{x48(t1, t1, 1, false), func() repairv1.GPUFaultEntry { e := x13(t1, 2); e.Active = false; return e }()}})},
		},
		"by UUID when the address is not given": {
			records: []repairv1.GPUFault{out}, gpus: []repairv1.GPURef{{UUID: uuid3}},
			want: []repairv1.GPUFault{rec(name3, ref3(), repairv1.GPUFaultStatus{Occurrences: []metav1.Time{mt(t1)},
				Faults: []repairv1.GPUFaultEntry{x48(t1, t1, 1, false), func() repairv1.GPUFaultEntry { e := x13(t1, 2); e.Active = false; return e }()}})},
		},
		"a counter still showing the fault keeps the GPU out": {
			records: []repairv1.GPUFault{withDBE}, gpus: []repairv1.GPURef{ref3()},
			want: []repairv1.GPUFault{rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU,
				Summary: counterLabel(gpufault.MetricECCDBEVolatile), Occurrences: []metav1.Time{mt(t1)},
				Faults: []repairv1.GPUFaultEntry{x48(t1, t1, 1, false), dbeEntry(t1, t1, 1, true)}})},
		},
		"nothing active: nothing to write": {
			records: []repairv1.GPUFault{rec(name3, ref3(), repairv1.GPUFaultStatus{Faults: []repairv1.GPUFaultEntry{x48(t1, t1, 1, false)}})},
			gpus:    []repairv1.GPURef{ref3()},
		},
		"no GPU named": {records: []repairv1.GPUFault{out}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ResetDone(tc.records, tc.gpus)); diff != "" {
				t.Errorf("records to write (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGPUProblemCondition(t *testing.T) {
	earlier := mt(t0)
	now := mt(gNow)
	outRec := func(name string, g repairv1.GPURef, class repairv1.GPUFaultClass, e repairv1.GPUFaultEntry) repairv1.GPUFault {
		e.Class = class
		return rec(name, g, repairv1.GPUFaultStatus{Class: class, Faults: []repairv1.GPUFaultEntry{e}})
	}
	gpu3 := outRec(name3, ref3(), repairv1.GPUClassResetGPU, x48(t0, t0, 1, true))
	gpu5 := outRec(name5, repairv1.GPURef{Index: ptr.To[int32](5), PCIBusID: bus5}, repairv1.GPUClassReboot,
		missingEntry(missing5, t0, t0, true))
	healthy := rec(name1, ref(bus1), repairv1.GPUFaultStatus{Faults: []repairv1.GPUFaultEntry{x13(t0, 1)}})
	msg3 := "GPU 3 (" + uuid3 + ", " + bus3 + "): Xid 48 (" + meta48 + ")"
	msg35 := msg3 + "; GPU 5 (" + bus5 + "): GPU missing (not reported by dcgm-exporter)"
	cond := func(status corev1.ConditionStatus, reason, msg string, transition, heartbeat metav1.Time) corev1.NodeCondition {
		return corev1.NodeCondition{Type: repairv1.ConditionGPUProblem, Status: status, Reason: reason, Message: msg,
			LastTransitionTime: transition, LastHeartbeatTime: heartbeat}
	}
	healthyMsg := "every GPU is in service"
	tests := map[string]struct {
		conditions []corev1.NodeCondition
		records    []repairv1.GPUFault
		want       *corev1.NodeCondition
	}{
		"no fault ever, no condition: nothing to write": {},
		"a GPU out of service: True, its class and the GPU": {
			records: []repairv1.GPUFault{gpu3, healthy},
			want:    ptr.To(cond(corev1.ConditionTrue, "ResetGPU", msg3, now, now)),
		},
		"unchanged: no write (no heartbeats)": {
			conditions: []corev1.NodeCondition{cond(corev1.ConditionTrue, "ResetGPU", msg3, earlier, earlier)},
			records:    []repairv1.GPUFault{gpu3, healthy},
		},
		"a second GPU, more severe: reason and message change, the transition stays": {
			conditions: []corev1.NodeCondition{cond(corev1.ConditionTrue, "ResetGPU", msg3, earlier, earlier)},
			records:    []repairv1.GPUFault{gpu5, gpu3},
			want:       ptr.To(cond(corev1.ConditionTrue, "Reboot", msg35, earlier, now)),
		},
		"back in service: False, GPUsHealthy": {
			conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
				cond(corev1.ConditionTrue, "ResetGPU", msg3, earlier, earlier)},
			records: []repairv1.GPUFault{healthy},
			want:    ptr.To(cond(corev1.ConditionFalse, repairv1.ReasonGPUsHealthy, healthyMsg, now, now)),
		},
		"a recorded application fault on a node without the condition: False": {
			records: []repairv1.GPUFault{healthy},
			want:    ptr.To(cond(corev1.ConditionFalse, repairv1.ReasonGPUsHealthy, healthyMsg, now, now)),
		},
		"a GPU's faults are separated by commas, GPUs by semicolons": {
			records: []repairv1.GPUFault{rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU,
				Faults: []repairv1.GPUFaultEntry{x48(t0, t0, 1, true), dbeEntry(t0, t0, 1, true), x13(t0, 1)}}), gpu5},
			want: ptr.To(cond(corev1.ConditionTrue, "Reboot", msg3+", "+counterLabel(gpufault.MetricECCDBEVolatile)+
				"; GPU 5 ("+bus5+"): GPU missing (not reported by dcgm-exporter)", now, now)),
		},
		"the unidentified record names no GPU": {
			records: []repairv1.GPUFault{outRec("gpu-003-unidentified", repairv1.GPURef{}, repairv1.GPUClassReboot, missingEntry("m", t0, t0, true))},
			want:    ptr.To(cond(corev1.ConditionTrue, "Reboot", "unidentified GPUs: GPU missing (not reported by dcgm-exporter)", now, now)),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := GPUProblemCondition(tc.conditions, tc.records, gNow.Add(300*time.Millisecond))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("condition (-want +got):\n%s", diff)
			}
		})
	}
}

func TestXIDClassesFor(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"pool": "a"}}}
	policy := func(name string, sel *metav1.LabelSelector, classes ...repairv1.XIDClass) repairv1.NodeRepairPolicy {
		return repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: repairv1.NodeRepairPolicySpec{NodeSelector: sel, GPU: repairv1.GPUSpec{XIDClasses: classes}}}
	}
	x := func(code int32, c repairv1.GPUFaultClass) repairv1.XIDClass {
		return repairv1.XIDClass{Code: code, Class: c}
	}
	poolA := &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}}
	poolB := &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "b"}}
	bad := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pool", Operator: "Bogus"}}}
	tests := map[string]struct {
		policies []repairv1.NodeRepairPolicy
		want     map[int]gpufault.Class
	}{
		"none":                       {},
		"all nodes":                  {policies: []repairv1.NodeRepairPolicy{policy("p", nil, x(94, "Reboot"))}, want: map[int]gpufault.Class{94: "Reboot"}},
		"another pool's policy":      {policies: []repairv1.NodeRepairPolicy{policy("p", poolB, x(94, "Reboot"))}},
		"an unusable selector":       {policies: []repairv1.NodeRepairPolicy{policy("p", bad, x(94, "Reboot"))}},
		"two policies: most severe":  {policies: []repairv1.NodeRepairPolicy{policy("p", nil, x(94, "Reboot"), x(13, "Application")), policy("q", poolA, x(94, "ResetGPU"), x(13, "ResetGPU"))}, want: map[int]gpufault.Class{94: "Reboot", 13: "ResetGPU"}},
		"an invalid class is passed": {policies: []repairv1.NodeRepairPolicy{policy("p", nil, x(94, "Sometimes"))}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, XIDClassesFor(node, tc.policies)); diff != "" {
				t.Errorf("classes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGPUFaultName(t *testing.T) {
	if got := GPUFaultName("gpu-003", "0000:18:00.0"); got != "gpu-003-0000-18-00-0" {
		t.Errorf("GPUFaultName: %q", got)
	}
	long := strings.Repeat("n", 250)
	a, b := GPUFaultName(long, "0000:18:00.0"), GPUFaultName(long, "0000:19:00.0")
	if len(a) > 253 || a == b {
		t.Errorf("long node names: %q (%d) and %q, want distinct names of at most 253 characters", a, len(a), b)
	}
}

// FuzzDetectGPUFaults runs the core on random observations: it never
// panics, what it writes stays within the API's bounds, and a second pass
// over its result writes nothing.
func FuzzDetectGPUFaults(f *testing.F) {
	f.Add([]byte{0, 48, 1, 3, 2, 1, 5}, uint8(8), false)
	f.Add([]byte{1, 79, 200, 7, 7, 7, 0, 13, 0, 2}, uint8(4), true)
	f.Add([]byte{4, 3, 49, 5, 7, 51, 6, 11, 21}, uint8(8), true)
	f.Fuzz(func(t *testing.T, data []byte, capacity uint8, bootChange bool) {
		var obs GPUObservation
		known := false
		for i := 0; i+2 < len(data); i += 3 {
			bus := fmt.Sprintf("0000:%02x:00.0", data[i]%40)
			at := t0.Add(time.Duration(data[i+2]) * time.Second)
			switch data[i+1] % 4 {
			case 0:
				obs.XIDs = append(obs.XIDs, xidAt(bus, int(data[i+1])%200+1, at))
			case 1:
				if obs.DCGM == nil {
					obs.DCGM = map[gpufault.GPUKey]gpufault.GPUHealth{}
				}
				obs.DCGM[gpufault.GPUKey{Index: int(data[i]) % 16, PCIBusID: bus}] = gpufault.GPUHealth{
					UncorrectableECCVolatile: uint64(data[i+2] % 3), RowRemapFailure: data[i+2]%7 == 0, RowRemapPending: data[i+2]%5 == 0,
					XIDCounts: map[int]uint64{int(data[i+2]) + 1: 1}}
			case 2:
				obs.KnownGPUs = append(obs.KnownGPUs, repairv1.GPURef{PCIBusID: bus})
				known = true
			default:
				if data[i+2]%2 == 0 {
					obs.XIDs = append(obs.XIDs, xidAt(bus, 48, at))
					break
				}
				// A DRA driver's device taint, some of keys that are no fault.
				key := []string{"gpu.nvidia.com/xid", "gpu.nvidia.com/gpu-lost", "gpu.nvidia.com/unmonitored", "x/y"}[data[i]%4]
				obs.DeviceTaints = append(obs.DeviceTaints, DeviceTaintObservation{GPU: repairv1.GPURef{PCIBusID: bus}, Device: "gpu-0",
					Key: key, Value: fmt.Sprint(int(data[i+2])%160 - 5), TimeAdded: at})
			}
		}
		in := GPUState{Node: gNode, BootID: gBoot, Capacity: int(capacity % 20), Observed: obs, XIDClasses: map[int]gpufault.Class{13: gpufault.ClassReboot}}
		got := DetectGPUFaults(in, gNow)
		check := func(rs []repairv1.GPUFault) {
			if len(rs) > maxRecordsPerNode+1 {
				t.Fatalf("%d records", len(rs))
			}
			for _, r := range rs {
				st := r.Status
				if len(st.Faults) > maxFaultEntries || len(st.Occurrences) > maxOccurrences || len(st.Summary) > maxSummary || len(r.Name) > 253 {
					t.Fatalf("record %s out of bounds: %d faults, %d occurrences, summary %d bytes", r.Name, len(st.Faults), len(st.Occurrences), len(st.Summary))
				}
				if r.Spec.NodeName != gNode {
					t.Fatalf("record of node %q", r.Spec.NodeName)
				}
			}
			if c := GPUProblemCondition(nil, rs, gNow); c != nil && len(c.Message) > maxConditionMessage {
				t.Fatalf("condition message of %d bytes", len(c.Message))
			}
		}
		check(got)
		stored := map[string]repairv1.GPUFault{}
		for _, r := range got {
			stored[r.Name] = r
		}
		in.Records = stored
		if again := DetectGPUFaults(in, gNow.Add(time.Minute)); len(again) != 0 {
			t.Fatalf("second pass writes %d records (known GPUs: %t): %+v", len(again), known, again[0].Status)
		}
		if bootChange {
			in.BootID = "boot-2"
			in.Observed.XIDs = nil
			check(DetectGPUFaults(in, gNow.Add(time.Hour)))
		}
	})
}

// TestValidationKeepsTheGPUOut: after a reset that awaits validation the
// GPU is out of service (ValidationPending, class ResetGPU) even when its
// sources show it healthy (the monitor does not clear what only a
// validation may); a passed validation returns it; a failed one keeps it
// out with the failure's class until a later validation passes; a reboot
// clears neither.
func TestValidationKeepsTheGPUOut(t *testing.T) {
	t1, t2 := t0.Add(time.Minute), t0.Add(2*time.Minute)
	out := rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU, Summary: "x",
		Faults: []repairv1.GPUFaultEntry{x48(t0, t0, 1, true)}, Occurrences: []metav1.Time{mt(t0)}, BootID: "boot-1"})
	gpus := []repairv1.GPURef{ref3()}
	apply := func(r repairv1.GPUFault, writes []repairv1.GPUFault) repairv1.GPUFault {
		for _, w := range writes {
			if w.Name == r.Name {
				return w
			}
		}
		return r
	}
	// The monitor looks at healthy sources (no XID, no counter), maybe in a
	// new boot.
	monitor := func(r repairv1.GPUFault, boot string, at time.Time) repairv1.GPUFault {
		return apply(r, DetectGPUFaults(GPUState{Node: gNode, BootID: boot, Capacity: 8, Records: records(r),
			Observed: GPUObservation{DCGM: health(nil)}}, at))
	}
	pending := apply(out, ValidationPending([]repairv1.GPUFault{out}, gpus, t1))
	if pending.InService() || pending.Status.Class != repairv1.GPUClassResetGPU {
		t.Fatalf("reset, awaiting validation: class %q", pending.Status.Class)
	}
	if m := monitor(pending, "boot-1", t1); m.InService() {
		t.Errorf("the monitor returned a GPU awaiting validation to service: %+v", m.Status.Faults)
	}
	passed := repairv1.GPUValidationResult{Time: mt(t2), Level: repairv1.GPUValidationHealth, Passed: true, Message: "Health validation passed"}
	if ok := apply(pending, ValidationDone([]repairv1.GPUFault{pending}, gpus, passed, repairv1.GPUClassReboot)); !ok.InService() || ok.Status.Validation == nil || !ok.Status.Validation.Passed {
		t.Errorf("passed: class %q validation %+v", ok.Status.Class, ok.Status.Validation)
	}
	// An XID after the reset is a new fault: a passed validation does not
	// clear it.
	later := pending.DeepCopy()
	later.Status.Faults = append(later.Status.Faults, repairv1.GPUFaultEntry{Code: 119, Class: repairv1.GPUClassReboot, FirstSeen: mt(t1.Add(30 * time.Second)),
		LastSeen: mt(t1.Add(30 * time.Second)), Count: 1, Active: true})
	if ok := apply(*later, ValidationDone([]repairv1.GPUFault{*later}, gpus, passed, repairv1.GPUClassReboot)); ok.InService() {
		t.Errorf("a passed validation cleared an XID seen after the reset: %+v", ok.Status.Faults)
	}
	failedResult := repairv1.GPUValidationResult{Time: mt(t2), Level: repairv1.GPUValidationHealth, Message: "Health validation failed: GPU 0000:18:00.0: a row remap failed"}
	failed := apply(pending, ValidationDone([]repairv1.GPUFault{pending}, gpus, failedResult, repairv1.GPUClassReboot))
	if failed.InService() || failed.Status.Class != repairv1.GPUClassReboot || !strings.Contains(failed.Status.Summary, "failed its validation") {
		t.Errorf("failed: class %q summary %q", failed.Status.Class, failed.Status.Summary)
	}
	if m := monitor(failed, "boot-2", t2.Add(time.Minute)); m.InService() {
		t.Errorf("a reboot returned a GPU that failed its validation to service: %+v", m.Status.Faults)
	}
	again := apply(failed, ValidationDone([]repairv1.GPUFault{failed}, gpus, passed, repairv1.GPUClassReplace))
	if !again.InService() {
		t.Errorf("a later validation that passed left it out: %+v", again.Status.Faults)
	}
	// Nothing to write when nothing changes; another GPU's record is left alone.
	if w := ValidationDone([]repairv1.GPUFault{again}, gpus, passed, repairv1.GPUClassReplace); len(w) != 0 {
		t.Errorf("a second identical result writes %d records", len(w))
	}
	if w := ValidationPending([]repairv1.GPUFault{out}, []repairv1.GPURef{{PCIBusID: "0000:99:00.0"}}, t1); len(w) != 0 {
		t.Errorf("another GPU's validation wrote %+v", w)
	}
}
