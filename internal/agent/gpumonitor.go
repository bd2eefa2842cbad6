package agent

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpufault"
)

// The GPU monitor's pure core: from a node's GPUFault records and what its
// GPU sources show now, the records to write and the node's GPUProblem
// condition. No client, no clock: the caller reads and writes.
//
// What makes it safe to run at any time, again and after a restart:
//
//   - An XID is counted when its time (whole seconds) is after the lastSeen
//     of its code's entry; the kernel log can be read again from its start
//     (as an agent does after a restart) without counting anything twice,
//     and an XID from before a reset does not bring the fault back.
//   - A counter fault is active exactly while the exporter shows it.
//   - The kernel log belongs to a boot: when the node's boot ID is not the
//     one the records were written in, their XIDs are of an earlier boot and
//     the reboot cleared them.
//   - Nothing changes when nothing new was observed: zero writes.

// Bounds of what the core writes (the API's limits).
const (
	maxFaultEntries     = 64
	maxOccurrences      = 16
	maxSummary          = 512
	maxEntryText        = 512
	maxConditionMessage = 1024
	// maxRecordsPerNode bounds the records a node gets, against sources
	// that name endless bogus addresses (a node has at most 16 GPUs).
	maxRecordsPerNode = 32
)

// XIDObservation is one XID of the kernel log and its wall-clock time.
type XIDObservation struct {
	Event gpufault.XIDEvent
	Time  time.Time
}

// GPUObservation is what a node's GPU sources show at one moment.
type GPUObservation struct {
	// XIDs of the kernel log of the node's current boot, any window of it
	// (already counted ones are recognised by their time).
	XIDs []XIDObservation
	// DCGM is dcgm-exporter's latest view of the GPUs; nil when there is
	// none (exporter disabled or unreachable): counter faults keep their
	// state, as there is no verdict.
	DCGM map[gpufault.GPUKey]gpufault.GPUHealth
	// KnownGPUs are GPUs the host is known to have (seen by earlier
	// scrapes, or the simulated host's inventory): a GPU the exporter no
	// longer reports is recognised among them.
	KnownGPUs []repairv1.GPURef
	// DeviceTaints are the taints the node's DRA driver put on its GPUs'
	// devices in its ResourceSlices (nil: none, or no DRA).
	DeviceTaints []DeviceTaintObservation
}

// DeviceTaintObservation is a taint a DRA driver put on one of its
// devices (NVIDIA's: gpu.nvidia.com/xid=<XID>, gpu.nvidia.com/gpu-lost).
type DeviceTaintObservation struct {
	GPU       repairv1.GPURef
	Device    string
	Key       string
	Value     string
	TimeAdded time.Time
}

// GPUState is the core's input for one node.
type GPUState struct {
	Node string
	// BootID is the node's current boot ID (status.nodeInfo.bootID).
	BootID string
	// Capacity is the node's nvidia.com/gpu capacity (0: unknown).
	Capacity int
	// Records are the node's GPUFault records, by name.
	Records map[string]repairv1.GPUFault
	// Observed is what the sources show now.
	Observed GPUObservation
	// XIDClasses override the catalogue's classes (XIDClassesFor).
	XIDClasses map[int]gpufault.Class
}

// DetectGPUFaults returns the records to write, ordered by name: new ones
// (without a resourceVersion: create them, then write their status) and
// changed ones (spec and/or status). Rules:
//
//   - one record per GPU, named GPUFaultName; one entry per XID code or
//     counter, with class, meaning and citation from the gpufault
//     catalogue, firstSeen, lastSeen, count and active;
//   - XIDs come from the kernel log only: the exporter's XID gauge keeps
//     the last XID until the exporter restarts, so it cannot tell that a
//     reset repaired the GPU; the exporter gives the counters and the GPUs'
//     index and UUID;
//   - a counter entry's count is the number of times the fault appeared
//     (lastSeen: when it last appeared);
//   - status.class is the most severe active class that takes the GPU out
//     of service (Application and Informational faults never do); when a
//     GPU goes out of service, now is appended to its occurrences;
//   - a GPU missing from the exporter (fewer GPUs than capacity) gets the
//     GPUMissing fault on its own record when the records or KnownGPUs
//     tell which one it is, else on the node's record (NodeRecordName).
func DetectGPUFaults(s GPUState, now time.Time) []repairv1.GPUFault {
	w := newWorkSet(s.Node, s.Records)
	now = now.UTC().Truncate(time.Second)
	if s.BootID != "" {
		w.newBoot(s.BootID)
	}
	w.xids(s.Observed.XIDs, s.XIDClasses, s.BootID)
	w.deviceTaints(s.Observed.DeviceTaints, s.XIDClasses, s.BootID, now)
	if s.Observed.DCGM != nil {
		w.counters(s.Observed.DCGM, s.Capacity, s.Observed.KnownGPUs, s.XIDClasses, s.BootID, now)
	}
	return w.finish(s.XIDClasses, now)
}

// ResetDone returns the records of the reset GPUs (by PCI bus ID, else
// UUID) whose kernel-log XIDs were still active, with those XIDs made
// inactive: the reset cleared them, the GPU returns to service unless a
// counter still shows a fault. Counters clear by themselves when the
// exporter shows them cleared; a missing GPU stays missing.
func ResetDone(records []repairv1.GPUFault, gpus []repairv1.GPURef) []repairv1.GPUFault {
	var out []repairv1.GPUFault
	for _, r := range records {
		if !refersTo(r.Spec.GPU, gpus) {
			continue
		}
		after := r.DeepCopy()
		for i := range after.Status.Faults {
			if e := &after.Status.Faults[i]; isEvent(e) {
				e.Active = false
			}
		}
		setClassAndSummary(after, r.Status.Class, time.Time{})
		if !equality.Semantic.DeepEqual(r.Status, after.Status) {
			out = append(out, *after)
		}
	}
	return out
}

// ValidationDone is the records to write when the repair's GPUs were
// validated (pure): each gets the result. Passed: its XIDs are over and a
// failed validation's entry goes, so the GPU returns to service (unless a
// counter still shows a fault). Failed: an active entry with counter
// gpufault.CounterValidationFailed and class failed (Reboot while a reboot
// may still help, else Replace) keeps it out of service until a later
// validation passes.
func ValidationDone(records []repairv1.GPUFault, gpus []repairv1.GPURef, result repairv1.GPUValidationResult, failed repairv1.GPUFaultClass) []repairv1.GPUFault {
	return updateGPUs(records, gpus, result.Time.Time, func(after *repairv1.GPUFault) {
		after.Status.Validation = result.DeepCopy()
		// XIDs up to the reset (the pending entry's time) are over; one
		// seen since is a new fault the validation does not clear.
		var since *metav1.Time
		if p := entryFor(after, 0, gpufault.CounterValidationPending); p != nil && p.Active {
			since = &p.LastSeen
			p.Active = false
		}
		for i := range after.Status.Faults {
			if f := &after.Status.Faults[i]; isEvent(f) && since != nil && !f.LastSeen.After(since.Time) {
				f.Active = false
			}
		}
		if result.Passed {
			if e := entryFor(after, 0, gpufault.CounterValidationFailed); e != nil {
				e.Active = false
			}
			return
		}
		setValidationEntry(after, gpufault.CounterValidationFailed, failed, result.Message, result.Time)
	})
}

// ValidationPending is the records to write when the repair's GPUs were
// reset and must pass a validation before they return to service (pure):
// the reset cleared their XIDs, and an active ValidationPending entry
// (class ResetGPU) keeps them out of service whatever their sources show
// until the validation's result (ValidationDone).
func ValidationPending(records []repairv1.GPUFault, gpus []repairv1.GPURef, now time.Time) []repairv1.GPUFault {
	return updateGPUs(records, gpus, now, func(after *repairv1.GPUFault) {
		for i := range after.Status.Faults {
			if f := &after.Status.Faults[i]; isEvent(f) {
				f.Active = false
			}
		}
		setValidationEntry(after, gpufault.CounterValidationPending, repairv1.GPUClassResetGPU, "reset; returns to service once it passes its validation", metav1.NewTime(now))
	})
}

// updateGPUs applies change to the records of gpus and returns those that
// changed, reclassified and summarised.
func updateGPUs(records []repairv1.GPUFault, gpus []repairv1.GPURef, now time.Time, change func(*repairv1.GPUFault)) []repairv1.GPUFault {
	var out []repairv1.GPUFault
	for _, r := range records {
		if !refersTo(r.Spec.GPU, gpus) {
			continue
		}
		after := r.DeepCopy()
		change(after)
		sortAndBound(&after.Status)
		setClassAndSummary(after, r.Status.Class, now)
		if after.InService() {
			after.Status.Allocation = nil // as the monitor has it for a GPU in service (WithAllocations)
		}
		if !equality.Semantic.DeepEqual(r.Status, after.Status) {
			out = append(out, *after)
		}
	}
	return out
}

// setValidationEntry makes the entry of counter active with class and
// meaning.
func setValidationEntry(r *repairv1.GPUFault, counter string, class repairv1.GPUFaultClass, meaning string, at metav1.Time) {
	e := entryFor(r, 0, counter)
	if e == nil {
		e = addEntry(r, repairv1.GPUFaultEntry{Counter: counter, FirstSeen: at})
	}
	if !e.Active {
		e.Count++
	}
	e.Class, e.Meaning, e.LastSeen, e.Active = class, truncate(meaning, maxEntryText), at, true
}

func refersTo(g repairv1.GPURef, gpus []repairv1.GPURef) bool {
	for _, x := range gpus {
		if bus, ok := gpufault.NormalizePCIBusID(x.PCIBusID); ok && bus == g.PCIBusID {
			return true
		}
		if x.PCIBusID == "" && x.UUID != "" && x.UUID == g.UUID {
			return true
		}
	}
	return false
}

// GPUProblemCondition returns the node's GPUProblem condition for its
// records, or nil when the node already shows it (status, reason and
// message; no heartbeats are written) — and for a node without a
// condition whose GPUs never had a fault (nothing to say, no write on a
// healthy fleet). True, with the most severe class as the reason and
// each out-of-service GPU in the message, while a GPU is out of service;
// else False, GPUsHealthy. lastTransitionTime changes with the status.
func GPUProblemCondition(conditions []corev1.NodeCondition, records []repairv1.GPUFault, now time.Time) *corev1.NodeCondition {
	want := corev1.NodeCondition{Type: repairv1.ConditionGPUProblem, Status: corev1.ConditionFalse,
		Reason: repairv1.ReasonGPUsHealthy, Message: "every GPU is in service"}
	var worst repairv1.GPUFaultClass
	var parts []string
	for _, r := range sortedByGPU(records) {
		if r.InService() {
			continue
		}
		if r.Status.Class.Rank() > worst.Rank() {
			worst = r.Status.Class
		}
		parts = append(parts, r.Spec.GPU.Describe()+": "+describe(r.Status.Faults, true))
	}
	if worst != "" {
		want.Status, want.Reason, want.Message = corev1.ConditionTrue, string(worst), truncate(strings.Join(parts, "; "), maxConditionMessage)
	}
	t := metav1.NewTime(now).Rfc3339Copy()
	var cur *corev1.NodeCondition
	for i := range conditions {
		if conditions[i].Type == repairv1.ConditionGPUProblem {
			cur = &conditions[i]
		}
	}
	switch {
	case cur == nil && want.Status == corev1.ConditionFalse && len(records) == 0:
		return nil
	case cur == nil:
		want.LastTransitionTime, want.LastHeartbeatTime = t, t
	case cur.Status == want.Status && cur.Reason == want.Reason && cur.Message == want.Message:
		return nil
	default:
		want.LastTransitionTime, want.LastHeartbeatTime = cur.LastTransitionTime, t
		if cur.Status != want.Status {
			want.LastTransitionTime = t
		}
	}
	return &want
}

// XIDClassesFor merges the XID class overrides of the policies that
// select node. Where two policies class a code differently, the more
// severe class wins. Policies with an unusable selector are passed over
// (the repair controller reports them).
func XIDClassesFor(node *corev1.Node, policies []repairv1.NodeRepairPolicy) map[int]gpufault.Class {
	var out map[int]gpufault.Class
	for i := range policies {
		p := &policies[i]
		if len(p.Spec.GPU.XIDClasses) == 0 || !p.SelectsLabels(node.Labels) {
			continue
		}
		for _, x := range p.Spec.GPU.XIDClasses {
			c := gpufault.Class(x.Class)
			if !c.Valid() {
				continue
			}
			if out == nil {
				out = map[int]gpufault.Class{}
			}
			if old, ok := out[int(x.Code)]; !ok || c.Rank() > old.Rank() {
				out[int(x.Code)] = c
			}
		}
	}
	return out
}

// DRADriversFor are the DRA drivers whose device taints count for node:
// the gpu.draDriver of the policies that select it (the default, NVIDIA's
// gpu.nvidia.com, when none sets one).
func DRADriversFor(node *corev1.Node, policies []repairv1.NodeRepairPolicy) []string {
	var out []string
	for i := range policies {
		p := &policies[i]
		if d := p.Spec.GPU.DRADriver; d != "" && p.SelectsLabels(node.Labels) && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		out = []string{defaultDRADriver}
	}
	return out
}

// defaultDRADriver is NVIDIA's DRA driver for GPUs.
const defaultDRADriver = "gpu.nvidia.com"

// DeviceTaintsOf are the taints drivers put on node's devices in slices,
// each with the GPU its device is (attributes uuid and the PCI bus ID,
// resource.kubernetes.io/pciBusID or NVIDIA's older pcieBusID; a full
// GPU's name gpu-<index>).
func DeviceTaintsOf(rs []resourcev1.ResourceSlice, drivers []string, node string) []DeviceTaintObservation {
	var out []DeviceTaintObservation
	for i := range rs {
		s := &rs[i]
		if !slices.Contains(drivers, s.Spec.Driver) || s.Spec.NodeName == nil || *s.Spec.NodeName != node {
			continue
		}
		for _, d := range s.Spec.Devices {
			if len(d.Taints) == 0 {
				continue
			}
			ref := repairv1.GPURef{UUID: deviceAttr(d, "uuid"), PCIBusID: deviceAttr(d, "pciBusID")}
			if ref.PCIBusID == "" {
				ref.PCIBusID = deviceAttr(d, "pcieBusID")
			}
			if idx, err := strconv.Atoi(strings.TrimPrefix(d.Name, "gpu-")); err == nil && strings.HasPrefix(d.Name, "gpu-") && idx >= 0 && idx < 1<<16 {
				n := int32(idx)
				ref.Index = &n
			}
			for _, t := range d.Taints {
				o := DeviceTaintObservation{GPU: ref, Device: d.Name, Key: t.Key, Value: t.Value}
				if t.TimeAdded != nil {
					o.TimeAdded = t.TimeAdded.Time
				}
				out = append(out, o)
			}
		}
	}
	return out
}

// deviceAttr is a device's string attribute name, qualified or not.
func deviceAttr(d resourcev1.Device, name string) string {
	for k, v := range d.Attributes {
		if (string(k) == name || strings.HasSuffix(string(k), "/"+name)) && v.StringValue != nil {
			return *v.StringValue
		}
	}
	return ""
}

// NodeRecordName names the record of a node's GPUs that are missing and
// not identified (the exporter reports fewer GPUs than the node has, and
// nothing tells which).
func NodeRecordName(node string) string { return objectName(node + "-unidentified") }

// GPUFaultName names the record of a GPU: <node>-<PCI bus ID with ':' and
// '.' as '-'>, e.g. gpu-003-0000-18-00-0.
func GPUFaultName(node, pciBusID string) string {
	return objectName(node + "-" + strings.NewReplacer(":", "-", ".", "-").Replace(pciBusID))
}

// objectName keeps a name within the 253 characters of an object name:
// a longer one is cut and given a hash of the whole.
func objectName(s string) string {
	const limit = 253
	if len(s) <= limit {
		return s
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return strings.TrimRight(s[:limit-9], "-.") + fmt.Sprintf("-%08x", h.Sum32())
}

// workSet is the node's records being updated.
type workSet struct {
	node string
	orig map[string]repairv1.GPUFault
	recs map[string]*repairv1.GPUFault
}

func newWorkSet(node string, records map[string]repairv1.GPUFault) *workSet {
	w := &workSet{node: node, orig: map[string]repairv1.GPUFault{}, recs: map[string]*repairv1.GPUFault{}}
	for name, r := range records {
		if r.Spec.NodeName != node || r.Name != name {
			continue
		}
		w.orig[name] = r
		w.recs[name] = r.DeepCopy()
	}
	return w
}

// newBoot makes the kernel-log XIDs of records written in another boot
// inactive: the reboot cleared them.
func (w *workSet) newBoot(bootID string) {
	for _, r := range w.recs {
		if r.Status.BootID == bootID {
			continue
		}
		if r.Status.BootID != "" {
			for i := range r.Status.Faults {
				if e := &r.Status.Faults[i]; isEvent(e) {
					e.Active = false
				}
			}
		}
		r.Status.BootID = bootID
	}
}

// find returns the record of a GPU: by PCI bus ID, else by UUID.
func (w *workSet) find(pci, uuid string) *repairv1.GPUFault {
	if pci != "" {
		if r := w.recs[GPUFaultName(w.node, pci)]; r != nil {
			return r
		}
		for _, r := range w.recs {
			if r.Spec.GPU.PCIBusID == pci {
				return r
			}
		}
	}
	if uuid != "" {
		for _, r := range w.recs {
			if r.Spec.GPU.UUID == uuid {
				return r
			}
		}
	}
	return nil
}

// record returns the record of a GPU, created (with what ref tells of it)
// if needed; nil for a GPU without a PCI address that has no record, or
// when the node has too many records.
func (w *workSet) record(ref repairv1.GPURef, bootID string) *repairv1.GPUFault {
	if r := w.find(ref.PCIBusID, ref.UUID); r != nil {
		fillIdentity(&r.Spec.GPU, ref)
		return r
	}
	if ref.PCIBusID == "" || len(w.recs) >= maxRecordsPerNode {
		return nil
	}
	return w.create(GPUFaultName(w.node, ref.PCIBusID), ref, bootID)
}

func (w *workSet) create(name string, ref repairv1.GPURef, bootID string) *repairv1.GPUFault {
	r := &repairv1.GPUFault{
		TypeMeta:   metav1.TypeMeta{APIVersion: repairv1.GroupVersion.String(), Kind: "GPUFault"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       repairv1.GPUFaultSpec{NodeName: w.node, GPU: ref},
		Status:     repairv1.GPUFaultStatus{BootID: bootID},
	}
	w.recs[name] = r
	return r
}

// fillIdentity completes what a record knows of its GPU (a kernel-log
// XID names the address only; the exporter adds index and UUID).
func fillIdentity(g *repairv1.GPURef, from repairv1.GPURef) {
	if g.Index == nil && from.Index != nil {
		i := *from.Index
		g.Index = &i
	}
	if g.UUID == "" {
		g.UUID = from.UUID
	}
	if g.PCIBusID == "" {
		g.PCIBusID = from.PCIBusID
	}
}

// xids counts the kernel-log XIDs not counted yet.
func (w *workSet) xids(events []XIDObservation, overrides map[int]gpufault.Class, bootID string) {
	sorted := make([]XIDObservation, 0, len(events))
	for _, x := range events {
		if !x.Event.FromUserspace && x.Event.Code > 0 && x.Event.PCIBusID != "" && !x.Time.IsZero() {
			sorted = append(sorted, x)
		}
	}
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Time.Before(sorted[j].Time) })
	for _, x := range sorted {
		bus, ok := gpufault.NormalizePCIBusID(x.Event.PCIBusID)
		if !ok {
			continue
		}
		r := w.record(repairv1.GPURef{PCIBusID: bus, UUID: x.Event.UUID}, bootID)
		if r == nil {
			continue
		}
		t := metav1.NewTime(x.Time.UTC().Truncate(time.Second))
		e := entryFor(r, x.Event.Code, "")
		if e != nil && !t.After(e.LastSeen.Time) || t.Time.Before(overAt(r)) {
			continue // counted before, or ended by the GPU's reset
		}
		c := gpufault.ClassifyEvent(x.Event, overrides)
		class := repairv1.GPUFaultClass(c.Class)
		if e == nil {
			e = addEntry(r, repairv1.GPUFaultEntry{Code: int32(x.Event.Code), FirstSeen: t})
		}
		if !e.Active || class.Rank() > e.Class.Rank() {
			e.Class = class
		}
		e.Meaning, e.Citation = truncate(c.Meaning, maxEntryText), truncate(c.Citation, maxEntryText)
		e.LastSeen, e.Active = t, true
		e.Count++
	}
}

// overAt is when the GPU's events (XIDs, device taints) were last ended:
// its reset (the ValidationPending entry's time) or its last validation.
// An event dated before it is over even when a source first shows it later
// (a slow kernel-log follower, a driver's taint that stays). Both times
// have whole seconds: an event of the same second counts, as a new fault
// must never be lost (at worst a GPU is reset once more).
func overAt(r *repairv1.GPUFault) time.Time {
	var t time.Time
	if e := entryFor(r, 0, gpufault.CounterValidationPending); e != nil {
		t = e.LastSeen.Time
	}
	if v := r.Status.Validation; v != nil && v.Time.After(t) {
		t = v.Time.Time
	}
	return t
}

// Keys of NVIDIA's DRA driver's device taints, after its driver name.
const (
	taintXID     = "/xid"
	taintGPULost = "/gpu-lost"
)

// deviceTaints counts the DRA driver's device taints not counted yet: an
// XID taint is an entry of its code and key, classed by the catalogue as
// the kernel log's XID is; a lost GPU is an entry of its key, class
// Reboot. Like an XID, a taint is counted once, by its timeAdded: the
// driver keeps it until its kubelet plugin restarts, so one that stays
// after the reset that ended it is not a new fault. Other keys are not
// faults (the driver's unmonitored taint, anyone else's).
func (w *workSet) deviceTaints(taints []DeviceTaintObservation, overrides map[int]gpufault.Class, bootID string, now time.Time) {
	sorted := append([]DeviceTaintObservation(nil), taints...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].TimeAdded.Before(sorted[j].TimeAdded) })
	for _, d := range sorted {
		code, class, meaning, citation := 0, repairv1.GPUClassReboot, "the DRA driver lost the GPU (NVML: GPU is lost)", ""
		switch {
		case strings.HasSuffix(d.Key, taintXID):
			n, err := strconv.Atoi(d.Value)
			if err != nil || n <= 0 {
				continue
			}
			c := gpufault.ClassifyEvent(gpufault.XIDEvent{Code: n}, overrides)
			code, class, meaning, citation = n, repairv1.GPUFaultClass(c.Class), c.Meaning, c.Citation
		case strings.HasSuffix(d.Key, taintGPULost):
		default:
			continue
		}
		ref := d.GPU
		if bus, ok := gpufault.NormalizePCIBusID(ref.PCIBusID); ok {
			ref.PCIBusID = bus
		}
		r := w.record(ref, bootID)
		if r == nil {
			continue
		}
		at := d.TimeAdded
		if at.IsZero() {
			at = now // the API server sets it; a taint without one is new now
		}
		t := metav1.NewTime(at.UTC().Truncate(time.Second))
		e := entryFor(r, code, d.Key)
		if e != nil && !t.After(e.LastSeen.Time) || t.Time.Before(overAt(r)) {
			continue // counted before, or ended by the GPU's reset: the driver keeps its taint until its plugin restarts
		}
		if e == nil {
			e = addEntry(r, repairv1.GPUFaultEntry{Code: int32(code), Counter: d.Key, FirstSeen: t})
		}
		e.Class = class
		e.Meaning = truncate(fmt.Sprintf("%s, reported by the DRA driver on device %s", meaning, d.Device), maxEntryText)
		e.Citation = truncate(citation, maxEntryText)
		e.LastSeen, e.Active = t, true
		e.Count++
	}
}

// counters follows the exporter's counters: a fault is active while a
// counter shows it.
func (w *workSet) counters(health map[gpufault.GPUKey]gpufault.GPUHealth, capacity int, known []repairv1.GPURef,
	overrides map[int]gpufault.Class, bootID string, now time.Time) {
	faults := gpufault.AssessWith(health, capacity, gpufault.Policy{XIDOverrides: overrides})
	keys := make([]gpufault.GPUKey, 0, len(health))
	for k := range health {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.Index != b.Index {
			return a.Index < b.Index
		}
		if a.UUID != b.UUID {
			return a.UUID < b.UUID
		}
		return a.PCIBusID < b.PCIBusID
	})
	reported, handled := map[string]bool{}, map[string]bool{}
	var missing *gpufault.Fault
	for i := range faults {
		if faults[i].Counter == gpufault.CounterGPUMissing {
			missing = &faults[i]
		}
	}
	seen := map[string]bool{}
	for _, k := range keys {
		reported[k.PCIBusID] = true
		id := "pci:" + k.PCIBusID
		if k.PCIBusID == "" {
			id = "uuid:" + k.UUID
		}
		if seen[id] {
			continue // an exporter naming one GPU twice: the first counts
		}
		seen[id] = true
		var want []gpufault.Fault
		for _, f := range faults {
			if f.GPU == k && f.Code == 0 && f.Counter != "" {
				want = append(want, f)
			}
		}
		ref := refOf(k)
		r := w.find(ref.PCIBusID, ref.UUID)
		if r == nil && len(want) > 0 {
			r = w.record(ref, bootID)
		}
		if r == nil || handled[r.Name] {
			continue
		}
		handled[r.Name] = true
		fillIdentity(&r.Spec.GPU, ref)
		setCounters(r, want, now, func(e *repairv1.GPUFaultEntry) bool {
			return e.Counter != gpufault.CounterGPUMissing && !validationEntry(e)
		})
		// Reported again: not missing.
		setCounters(r, nil, now, func(e *repairv1.GPUFaultEntry) bool { return e.Counter == gpufault.CounterGPUMissing })
	}
	if len(health) == 0 {
		return // no GPU at all is no verdict on missing GPUs
	}
	meaning := fmt.Sprintf("dcgm-exporter reports %d of the node's %d GPUs, not this one: it fell off the bus or did not initialise",
		len(health), capacity)
	w.missing(missing, meaning, reported, known, bootID, now)
}

// missing gives the GPUMissing fault to the GPUs the exporter no longer
// reports, as far as they are known, and to the node's record for the rest.
func (w *workSet) missing(f *gpufault.Fault, meaning string, reported map[string]bool, known []repairv1.GPURef, bootID string, now time.Time) {
	isMissing := func(e *repairv1.GPUFaultEntry) bool { return e.Counter == gpufault.CounterGPUMissing }
	absent := map[string]repairv1.GPURef{}
	if f != nil {
		for _, r := range w.recs {
			if bus := r.Spec.GPU.PCIBusID; bus != "" && !reported[bus] {
				absent[bus] = r.Spec.GPU
			}
		}
		for _, g := range known {
			bus, ok := gpufault.NormalizePCIBusID(g.PCIBusID)
			if !ok || reported[bus] {
				continue
			}
			g.PCIBusID = bus
			if a, seen := absent[bus]; seen {
				fillIdentity(&a, g)
				g = a
			}
			absent[bus] = g
		}
	}
	buses := make([]string, 0, len(absent))
	for b := range absent {
		buses = append(buses, b)
	}
	sort.Strings(buses)
	for _, bus := range buses {
		if r := w.record(absent[bus], bootID); r != nil {
			setCounters(r, []gpufault.Fault{{Counter: f.Counter, Value: 1, Class: f.Class, Citation: f.Citation, Meaning: meaning}},
				now, isMissing)
		}
	}
	// Every other record: not missing (reported, or no GPU is missing).
	for _, r := range w.recs {
		if _, ok := absent[r.Spec.GPU.PCIBusID]; ok && r.Spec.GPU.PCIBusID != "" {
			continue
		}
		if r.Name == NodeRecordName(w.node) {
			continue
		}
		setCounters(r, nil, now, isMissing)
	}
	name := NodeRecordName(w.node)
	unattributed := f != nil && int(f.Value) > len(buses)
	r := w.recs[name]
	switch {
	case r == nil && !unattributed:
		return
	case r == nil:
		r = w.create(name, repairv1.GPURef{}, bootID)
	}
	var want []gpufault.Fault
	if unattributed {
		want = append(want, *f)
	}
	setCounters(r, want, now, isMissing)
}

// setCounters makes the entries of the faults in want active (created or
// reappearing: counted, lastSeen now) and every other entry selected by
// mine inactive.
func setCounters(r *repairv1.GPUFault, want []gpufault.Fault, now time.Time, mine func(*repairv1.GPUFaultEntry) bool) {
	t := metav1.NewTime(now)
	wanted := map[string]bool{}
	for _, f := range want {
		wanted[f.Counter] = true
		e := entryFor(r, 0, f.Counter)
		if e == nil {
			e = addEntry(r, repairv1.GPUFaultEntry{Counter: f.Counter, FirstSeen: t})
		}
		if !e.Active {
			e.Active, e.LastSeen = true, t
			e.Count++
		}
		e.Class = repairv1.GPUFaultClass(f.Class)
		e.Meaning, e.Citation = truncate(f.Meaning, maxEntryText), truncate(f.Citation, maxEntryText)
	}
	for i := range r.Status.Faults {
		if e := &r.Status.Faults[i]; !isEvent(e) && mine(e) && !wanted[e.Counter] {
			e.Active = false
		}
	}
}

func refOf(k gpufault.GPUKey) repairv1.GPURef {
	ref := repairv1.GPURef{UUID: k.UUID, PCIBusID: k.PCIBusID}
	if k.Index >= 0 {
		i := int32(min(k.Index, 1<<31-1))
		ref.Index = &i
	}
	return ref
}

func isXID(e *repairv1.GPUFaultEntry) bool { return e.Code != 0 && e.Counter == "" }

// isDeviceTaint: an entry read from a DRA driver's device taint; its
// counter is the taint's key, the only counters with a "/".
func isDeviceTaint(e *repairv1.GPUFaultEntry) bool { return strings.Contains(e.Counter, "/") }

// isEvent: an entry of something that happened (a kernel-log XID, a DRA
// driver's device taint) rather than a state a source shows: a reset or a
// reboot ends it, and it is counted once by its time.
func isEvent(e *repairv1.GPUFaultEntry) bool { return isXID(e) || isDeviceTaint(e) }

func entryFor(r *repairv1.GPUFault, code int, counter string) *repairv1.GPUFaultEntry {
	for i := range r.Status.Faults {
		if e := &r.Status.Faults[i]; int(e.Code) == code && e.Counter == counter {
			return e
		}
	}
	return nil
}

func addEntry(r *repairv1.GPUFault, e repairv1.GPUFaultEntry) *repairv1.GPUFaultEntry {
	r.Status.Faults = append(r.Status.Faults, e)
	return &r.Status.Faults[len(r.Status.Faults)-1]
}

// finish reclassifies, bounds and summarises the records, and returns
// those that changed.
func (w *workSet) finish(overrides map[int]gpufault.Class, now time.Time) []repairv1.GPUFault {
	names := make([]string, 0, len(w.recs))
	for n := range w.recs {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []repairv1.GPUFault
	for _, name := range names {
		r := w.recs[name]
		for i := range r.Status.Faults {
			if e := &r.Status.Faults[i]; isEvent(e) && e.Code != 0 {
				e.Class = xidClass(int(e.Code), e.Class, overrides)
			}
		}
		sortAndBound(&r.Status)
		old, existed := w.orig[name]
		setClassAndSummary(r, old.Status.Class, now)
		if !existed || !equality.Semantic.DeepEqual(old.Spec, r.Spec) || !equality.Semantic.DeepEqual(old.Status, r.Status) {
			out = append(out, *r)
		}
	}
	return out
}

// xidClass is an XID entry's class under the current overrides: the
// override, else the catalogue's — except for codes whose class depends
// on the message (154, the NVLink 5 codes), which keep the class their
// events gave.
func xidClass(code int, recorded repairv1.GPUFaultClass, overrides map[int]gpufault.Class) repairv1.GPUFaultClass {
	if c, ok := overrides[code]; ok && c.Valid() {
		return repairv1.GPUFaultClass(c)
	}
	if code == 154 || code >= 144 && code <= 150 {
		return recorded
	}
	return repairv1.GPUFaultClass(gpufault.Classify(code, nil).Class)
}

// sortAndBound orders the entries (XIDs by code, then counters by name)
// and keeps at most maxFaultEntries: the inactive ones seen longest ago go
// first, then the active ones that do not take the GPU out of service.
func sortAndBound(st *repairv1.GPUFaultStatus) {
	f := st.Faults
	for len(f) > maxFaultEntries {
		drop := 0
		for i := range f {
			if dropBefore(&f[i], &f[drop]) {
				drop = i
			}
		}
		f = append(f[:drop], f[drop+1:]...)
	}
	sort.SliceStable(f, func(i, j int) bool {
		a, b := &f[i], &f[j]
		if isXID(a) != isXID(b) {
			return isXID(a)
		}
		if a.Code != b.Code {
			return a.Code < b.Code
		}
		return a.Counter < b.Counter
	})
	st.Faults = f
}

// dropBefore reports whether a is dropped before b when there are too
// many entries.
func dropBefore(a, b *repairv1.GPUFaultEntry) bool {
	weight := func(e *repairv1.GPUFaultEntry) int {
		switch {
		case !e.Active:
			return 0
		case !e.Class.Repairs():
			return 1
		default:
			return 2
		}
	}
	if weight(a) != weight(b) {
		return weight(a) < weight(b)
	}
	return a.LastSeen.Before(&b.LastSeen)
}

// setClassAndSummary sets the class and summary from the active entries
// and, when the GPU just went out of service (it was in service with class
// before), records an occurrence at now (zero: none).
func setClassAndSummary(r *repairv1.GPUFault, before repairv1.GPUFaultClass, now time.Time) {
	var class repairv1.GPUFaultClass
	for i := range r.Status.Faults {
		if e := &r.Status.Faults[i]; e.Active && e.Class.Repairs() && e.Class.Rank() > class.Rank() {
			class = e.Class
		}
	}
	r.Status.Class = class
	r.Status.Summary = describe(r.Status.Faults, false)
	if class.Repairs() && !before.Repairs() && !now.IsZero() {
		r.Status.Occurrences = append(r.Status.Occurrences, metav1.NewTime(now))
	}
	if n := len(r.Status.Occurrences); n > maxOccurrences {
		r.Status.Occurrences = append([]metav1.Time(nil), r.Status.Occurrences[n-maxOccurrences:]...)
	}
}

// describe lists the active faults, the most severe first ("Xid 48
// (Uncorrectable …); row remap pending"), only those that take the GPU out
// of service, separated by commas (the condition message separates GPUs by
// semicolons), if repairing is set.
func describe(faults []repairv1.GPUFaultEntry, repairing bool) string {
	var active []repairv1.GPUFaultEntry
	for _, e := range faults {
		if e.Active && (!repairing || e.Class.Repairs()) {
			active = append(active, e)
		}
	}
	sort.SliceStable(active, func(i, j int) bool { return active[i].Class.Rank() > active[j].Class.Rank() })
	parts := make([]string, len(active))
	for i, e := range active {
		switch {
		case isXID(&e) && e.Meaning != "":
			parts[i] = fmt.Sprintf("Xid %d (%s)", e.Code, e.Meaning)
		case isXID(&e):
			parts[i] = fmt.Sprintf("Xid %d", e.Code)
		case isDeviceTaint(&e) && e.Code != 0:
			parts[i] = fmt.Sprintf("device taint %s=%d (%s)", e.Counter, e.Code, e.Meaning)
		case isDeviceTaint(&e):
			parts[i] = fmt.Sprintf("device taint %s (%s)", e.Counter, e.Meaning)
		default:
			parts[i] = counterLabel(e.Counter)
		}
	}
	if repairing {
		return truncate(strings.Join(parts, ", "), maxConditionMessage)
	}
	return truncate(strings.Join(parts, "; "), maxSummary)
}

var counterLabels = map[string]string{
	gpufault.MetricECCDBEVolatile:                 "uncorrectable ECC errors since the last reset (" + gpufault.MetricECCDBEVolatile + ")",
	gpufault.MetricRowRemapFailure:                "row remap failure (" + gpufault.MetricRowRemapFailure + ")",
	gpufault.MetricRowRemapPending:                "row remap pending (" + gpufault.MetricRowRemapPending + ")",
	gpufault.MetricRetiredPending:                 "pages pending retirement (" + gpufault.MetricRetiredPending + ")",
	gpufault.MetricNVLinkRecoveryPrefix + "TOTAL": "NVLink recoveries",
	gpufault.CounterGPUMissing:                    "GPU missing (not reported by dcgm-exporter)",
	gpufault.CounterValidationFailed:              "failed its validation after the repair",
	gpufault.CounterValidationPending:             "reset, waiting for its validation",
}

// validationEntry: an entry only a validation sets and clears (no GPU
// source shows it).
func validationEntry(e *repairv1.GPUFaultEntry) bool {
	return e.Counter == gpufault.CounterValidationFailed || e.Counter == gpufault.CounterValidationPending
}

func counterLabel(c string) string {
	if l, ok := counterLabels[c]; ok {
		return l
	}
	return c
}

// sortedByGPU orders records by PCI bus ID (the unidentified record last).
func sortedByGPU(records []repairv1.GPUFault) []repairv1.GPUFault {
	out := append([]repairv1.GPUFault(nil), records...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].Spec.GPU.PCIBusID, out[j].Spec.GPU.PCIBusID
		if (a == "") != (b == "") {
			return b == ""
		}
		return a < b
	})
	return out
}

// truncate keeps at most n bytes of s, valid UTF-8, marking a cut with "…".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n-len("…")], "") + "…"
}
