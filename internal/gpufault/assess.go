package gpufault

import (
	"fmt"
	"sort"
)

// CounterGPUMissing is the Counter of the fault Assess reports when the
// exporter shows fewer GPUs than the node's nvidia.com/gpu capacity.
const CounterGPUMissing = "GPUMissing"

// CounterValidationFailed is the Counter of the fault the node agent
// records when a repaired GPU fails its validation: it keeps the GPU out of
// service until a later validation passes (no source but the validation
// clears it).
const CounterValidationFailed = "ValidationFailed"

// CounterValidationPending is the Counter of the fault the node agent
// records when it reset a GPU that must pass its validation before it
// returns to service: whatever its sources show meanwhile, the GPU stays
// out of service (class ResetGPU) until the validation's result.
const CounterValidationPending = "ValidationPending"

// Fault is one problem found on a GPU.
type Fault struct {
	// GPU is the faulty GPU. Index is Unknown for a kernel-log XID (the log
	// names the address only) and for a missing GPU, whose identity the
	// exporter cannot give since it no longer reports it.
	GPU GPUKey
	// Code is the XID, 0 for a fault read from a counter.
	Code int
	// Counter is the dcgm-exporter metric the fault was read from
	// (CounterGPUMissing for a missing GPU); empty for a kernel-log XID.
	Counter string
	// Value is the counter's value (for an XID: how many the exporter
	// counted, 1 when it only shows the last XID; for a missing GPU: how
	// many are missing).
	Value    uint64
	Class    Class
	Meaning  string
	Citation string
}

// Policy adjusts the classes Assess gives.
type Policy struct {
	// XIDOverrides sets the class of an XID code (see Classify).
	XIDOverrides map[int]Class
	// CounterOverrides sets the class of a counter fault, by its Counter.
	CounterOverrides map[string]Class
}

// Assess turns dcgm-exporter's view of a node's GPUs into faults, with the
// default policy. capacity is the node's nvidia.com/gpu capacity (0: not
// known). See AssessWith.
func Assess(health map[GPUKey]GPUHealth, capacity int) []Fault {
	return AssessWith(health, capacity, Policy{})
}

// AssessWith turns dcgm-exporter's view of a node's GPUs into faults,
// ordered by GPU:
//
//   - each XID the exporter shows (the last one, and those it counted in its
//     window): the class of Classify;
//   - uncorrectable ECC errors since the driver loaded (volatile DBE count
//     above zero): ResetGPU, as NVIDIA's XID 48 workflow; the aggregate
//     (lifetime) count is not a fault, it never goes down;
//   - a failed row remap: Replace (an RMA condition);
//   - a row remap waiting for a reset: Informational (the GPU keeps working
//     and the memory is already avoided; the remap takes effect at the next
//     reset or reboot);
//   - pages waiting to be retired (older GPUs without row remapping, where
//     the bad page stays in use until the driver reloads): ResetGPU;
//   - NVLink link recoveries: Informational (CRC and replay counts, which
//     healthy links also accumulate, are not faults without a rate);
//   - fewer GPUs than capacity: a GPU fell off the bus or failed to come up,
//     Reboot, as NVIDIA's action for XID 79 (reboot the host). No GPU at all
//     is no verdict (the exporter may just be down), not a fault.
//
// Faults of the Application and Informational classes are returned too, to be
// recorded; Class.Repairs tells which call for a repair.
func AssessWith(health map[GPUKey]GPUHealth, capacity int, p Policy) []Fault {
	keys := make([]GPUKey, 0, len(health))
	for k := range health {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keyLess(keys[i], keys[j]) })
	var faults []Fault
	counter := func(k GPUKey, metric string, v uint64, c Class, meaning, cite string) {
		if o, ok := p.CounterOverrides[metric]; ok && o.Valid() {
			c = o
		}
		faults = append(faults, Fault{GPU: k, Counter: metric, Value: v, Class: c, Meaning: meaning, Citation: cite})
	}
	if n := len(health); capacity > 0 && n > 0 && n < capacity {
		counter(GPUKey{Index: Unknown}, CounterGPUMissing, uint64(capacity-n), ClassReboot,
			fmt.Sprintf("dcgm-exporter reports %d of the node's %d GPUs: a GPU fell off the bus or did not initialise", n, capacity),
			citeCatalogue+" (XID 79: RESTART_BM)")
	}
	for _, k := range keys {
		h := health[k]
		faults = append(faults, xidFaults(k, h, p.XIDOverrides)...)
		if h.UncorrectableECCVolatile > 0 {
			counter(k, MetricECCDBEVolatile, h.UncorrectableECCVolatile, ClassResetGPU,
				"Uncorrectable (double-bit) ECC errors since the driver loaded or the GPU was reset",
				citeCatalogue+" (XID 48 workflow); "+citeMemory)
		}
		if h.RowRemapFailure {
			counter(k, MetricRowRemapFailure, 1, ClassReplace,
				"Remapping a memory row failed: the GPU has run out of spare rows or cannot record the remap",
				citeMemory)
		}
		if h.RowRemapPending {
			counter(k, MetricRowRemapPending, 1, ClassInformational,
				"A memory row remap waits for the next GPU reset; until then the GPU keeps working",
				citeMemory)
		}
		if h.RetiredPagesPending > 0 {
			counter(k, MetricRetiredPending, h.RetiredPagesPending, ClassResetGPU,
				"Memory pages wait to be retired, which happens when the driver reloads the GPU; until then they stay in use",
				citePageRetirement)
		}
		if h.NVLink.Recovery > 0 {
			counter(k, MetricNVLinkRecoveryPrefix+"TOTAL", h.NVLink.Recovery, ClassInformational,
				"NVLink links of the GPU had to recover (retrain)", citeNVLinkChecks)
		}
	}
	return faults
}

// xidFaults returns one fault per XID code the exporter shows for a GPU.
func xidFaults(k GPUKey, h GPUHealth, overrides map[int]Class) []Fault {
	counts := map[int]uint64{}
	for code, n := range h.XIDCounts {
		if n > 0 {
			counts[code] = n
		}
	}
	if h.LastXID > 0 && counts[h.LastXID] == 0 {
		counts[h.LastXID] = 1
	}
	codes := make([]int, 0, len(counts))
	for c := range counts {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var out []Fault
	for _, code := range codes {
		e := Classify(code, overrides)
		metric := MetricXIDCount
		if h.XIDCounts[code] == 0 {
			metric = MetricXID
		}
		out = append(out, Fault{GPU: k, Code: code, Counter: metric, Value: counts[code], Class: e.Class,
			Meaning: e.Meaning, Citation: e.Citation})
	}
	return out
}

// FaultFromXID turns a kernel-log XID event into a fault of its GPU, with
// the class of ClassifyEvent. Whether to act on an event FromUserspace (not
// logged by the driver) is the caller's decision.
func FaultFromXID(ev XIDEvent, overrides map[int]Class) Fault {
	e := ClassifyEvent(ev, overrides)
	return Fault{GPU: GPUKey{Index: Unknown, UUID: ev.UUID, PCIBusID: ev.PCIBusID}, Code: ev.Code, Value: 1,
		Class: e.Class, Meaning: e.Meaning, Citation: e.Citation}
}

func keyLess(a, b GPUKey) bool {
	if a.Index != b.Index {
		return a.Index < b.Index
	}
	if a.PCIBusID != b.PCIBusID {
		return a.PCIBusID < b.PCIBusID
	}
	return a.UUID < b.UUID
}
