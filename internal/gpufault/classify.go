package gpufault

import (
	"fmt"
	"strconv"
	"strings"
)

// Class is what a fault calls for.
type Class string

const (
	// ClassInformational: an event, not a fault: nothing is broken and
	// nothing needs doing (NVIDIA: IGNORE). Recorded, no repair.
	ClassInformational Class = "Informational"
	// ClassApplication: the application's fault, or a fault confined to the
	// application's contexts; the GPU stays in service and the application
	// restarts (NVIDIA: RESTART_APP). Recorded, no repair.
	ClassApplication Class = "Application"
	// ClassResetGPU: reset the GPU once no pod uses it (NVIDIA: RESET_GPU).
	ClassResetGPU Class = "ResetGPU"
	// ClassReboot: reboot the node; a GPU reset cannot recover this
	// (NVIDIA: RESTART_BM, RESTART_VM).
	ClassReboot Class = "Reboot"
	// ClassReplace: the hardware needs a person: replacement (RMA) or
	// physical inspection. No automatic action fixes it.
	ClassReplace Class = "Replace"
)

// Classes lists the classes from the least to the most severe.
var Classes = []Class{ClassInformational, ClassApplication, ClassResetGPU, ClassReboot, ClassReplace}

// Valid reports whether c is one of Classes.
func (c Class) Valid() bool { return c.Rank() >= 0 }

// Rank orders the classes by severity (Informational 0 … Replace 4); -1 for
// an invalid class.
func (c Class) Rank() int {
	for i, k := range Classes {
		if c == k {
			return i
		}
	}
	return -1
}

// Repairs reports whether the class calls for a repair action.
func (c Class) Repairs() bool { return c.Rank() >= ClassResetGPU.Rank() }

// ParseClass reads a class name, as a policy spells it.
func ParseClass(s string) (Class, error) {
	if c := Class(s); c.Valid() {
		return c, nil
	}
	return "", fmt.Errorf("unknown fault class %q (want one of %v)", s, Classes)
}

// Entry describes one XID code.
type Entry struct {
	Code int
	// Mnemonic is NVIDIA's name for the code.
	Mnemonic string
	// Meaning says in a few words what the code reports.
	Meaning string
	// Class is what the code calls for (after policy overrides, in the
	// result of Classify).
	Class Class
	// Immediate and Investigatory are NVIDIA's resolution buckets for the
	// code ("Resolution Bucket (Immediate Action)" / "(Investigatory
	// Action)"), empty where the catalogue gives none.
	Immediate     string
	Investigatory string
	// Citation names the NVIDIA document (and section) the entry rests on.
	Citation string
	// Note explains the class where it is a reading of NVIDIA's buckets
	// rather than a one-to-one translation.
	Note string
	// Known is false for a code that is not in the catalogue.
	Known bool
	// Overridden is set when a policy override chose Class.
	Overridden bool
}

// unknownClass is the class of a code the catalogue does not list. A GPU
// reset: the driver attributes every XID to one GPU, a reset is the smallest
// action that clears that GPU's state without stopping its healthy siblings,
// and the repair ladder falls back to a reboot when the reset fails or the
// code keeps coming back (repeated faults end in RecoveryFailed). A reboot
// for a code nobody has classified would drain a whole node of GPUs for what
// is most often a new, GPU-local code of a newer driver.
const unknownClass = ClassResetGPU

// Lookup returns the catalogue's entry for code.
func Lookup(code int) (Entry, bool) {
	e, ok := catalogueByCode[code]
	return e, ok
}

// Entries returns the catalogue, ordered by code.
func Entries() []Entry {
	out := make([]Entry, len(catalogue))
	copy(out, catalogue)
	for i := range out {
		out[i].Known = true
	}
	return out
}

var catalogueByCode = func() map[int]Entry {
	m := make(map[int]Entry, len(catalogue))
	for _, e := range catalogue {
		e.Known = true
		m[e.Code] = e
	}
	return m
}()

// Classify returns the entry for an XID code with the class a policy chose:
// overrides[code] when it is a valid class, else the catalogue's class, else
// (for a code the catalogue does not list) ResetGPU, for the reason given at
// unknownClass.
func Classify(code int, overrides map[int]Class) Entry {
	e, ok := Lookup(code)
	if !ok {
		e = Entry{Code: code, Meaning: "XID code not in the catalogue", Class: unknownClass,
			Citation: "gpufleet: not in " + citeCatalogue,
			Note: "Unknown codes reset the GPU: the smallest action that clears the faulty GPU's state; the repair ladder " +
				"reboots when the reset fails or the code repeats"}
	}
	if c, ok := overrides[code]; ok && c.Valid() {
		e.Class, e.Overridden = c, true
	}
	return e
}

// ClassifyEvent is Classify for one event, which reads what the message adds
// to the code:
//
//   - XID 154 carries the driver's recovery action ("… to 0x1 (GPU Reset
//     Required)"), NVML's nvmlDeviceGpuRecoveryAction_t: none, GPU reset,
//     node reboot, drain P2P, drain and reset, recover IMEX domain, bus
//     reset, system reboot. The event's class is that action's (a drain is a
//     reset here; a bus reset, the IMEX domain and any action this build does
//     not know are a reboot, the safer choice).
//   - XIDs 144–150 (NVLink 5) say "Fatal" or "Nonfatal"; NVIDIA's decode
//     table resets the GPU for fatal reports and ignores most non-fatal ones,
//     so a non-fatal one is Informational.
//
// An override for the code still wins.
func ClassifyEvent(ev XIDEvent, overrides map[int]Class) Entry {
	e := Classify(ev.Code, overrides)
	if e.Overridden {
		return e
	}
	switch {
	case ev.Code == 154:
		if action, ok := recoveryAction(ev.Message); ok {
			e.Class = recoveryActionClass(action)
			e.Note = fmt.Sprintf("class from the recovery action in the message (0x%x)", action)
		}
	case ev.Code >= 144 && ev.Code <= 150:
		if hasWord(ev.Message, "Nonfatal") {
			e.Class = ClassInformational
			e.Note = "non-fatal NVLink 5 report (the catalogue's decode table ignores most of these)"
		}
	}
	return e
}

// recoveryAction reads the new action of "GPU recovery action changed from
// 0x0 (None) to 0x1 (GPU Reset Required)".
func recoveryAction(msg string) (uint64, bool) {
	_, after, ok := strings.Cut(msg, " to 0x")
	if !ok {
		return 0, false
	}
	n := 0
	for n < len(after) && n < 8 && isHexDigit(after[n]) {
		n++
	}
	v, err := strconv.ParseUint(after[:n], 16, 32)
	return v, err == nil
}

func recoveryActionClass(action uint64) Class {
	switch action {
	case 0: // none
		return ClassInformational
	case 1, 3, 4: // GPU reset; drain P2P; drain P2P and reset
		return ClassResetGPU
	default: // 2 node reboot, 5 IMEX domain, 6 bus reset, 7 system reboot, later ones
		return ClassReboot
	}
}

func hasWord(s, word string) bool {
	for _, f := range strings.Fields(s) {
		if f == word {
			return true
		}
	}
	return false
}
