package gpufault

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCatalogueEntries(t *testing.T) {
	entries := Entries()
	if len(entries) < 90 {
		t.Fatalf("catalogue has %d entries; NVIDIA's lists about a hundred codes in use", len(entries))
	}
	prev := 0
	for _, e := range entries {
		if e.Code <= prev {
			t.Errorf("code %d after %d: the table must be in ascending order without repeats", e.Code, prev)
		}
		prev = e.Code
		if !e.Class.Valid() {
			t.Errorf("XID %d: invalid class %q", e.Code, e.Class)
		}
		if !strings.Contains(e.Citation, "docs.nvidia.com") {
			t.Errorf("XID %d: citation %q names no NVIDIA document", e.Code, e.Citation)
		}
		if e.Mnemonic == "" || e.Meaning == "" {
			t.Errorf("XID %d: mnemonic %q, meaning %q", e.Code, e.Mnemonic, e.Meaning)
		}
		if !e.Known || e.Overridden {
			t.Errorf("XID %d: Known %v, Overridden %v", e.Code, e.Known, e.Overridden)
		}
		if got, ok := Lookup(e.Code); !ok || !cmp.Equal(got, e) {
			t.Errorf("Lookup(%d) = %+v, %v", e.Code, got, ok)
		}
	}
}

func TestApplicationCodes(t *testing.T) {
	for _, code := range []int{13, 31, 43, 45} {
		if e := Classify(code, nil); e.Class != ClassApplication || !e.Known {
			t.Errorf("XID %d: class %q (known %v), want Application", code, e.Class, e.Known)
		}
	}
}

// TestClassFollowsNVIDIABucket checks the table against the mapping its
// comment documents: every class is the translation of NVIDIA's immediate
// action, or one of the listed exceptions, or (for actions that are not
// repairs) explained in the entry's note.
func TestClassFollowsNVIDIABucket(t *testing.T) {
	byBucket := map[string]Class{
		"RESTART_APP": ClassApplication, "IGNORE": ClassInformational, "RESET_GPU": ClassResetGPU,
		"RESTART_BM": ClassReboot, "RESTART_VM": ClassReboot, "CHECK_MECHANICALS": ClassReplace,
		"WORKFLOW_XID_45": ClassApplication, "WORKFLOW_XID_48": ClassResetGPU, "WORKFLOW_NVLINK_ERR": ClassResetGPU,
		"WORKFLOW_NVLINK5_ERR": ClassResetGPU, "XID_154": ClassInformational,
	}
	exceptions := map[int]Class{37: ClassApplication, 43: ClassApplication, 64: ClassReplace}
	for _, e := range Entries() {
		want, ok := exceptions[e.Code]
		if !ok {
			want, ok = byBucket[e.Immediate]
		}
		if !ok {
			if e.Note == "" {
				t.Errorf("XID %d: immediate action %q is not a repair and the entry has no note saying why %s", e.Code, e.Immediate, e.Class)
			}
			continue
		}
		if e.Class != want {
			t.Errorf("XID %d: class %s, but NVIDIA's %q makes it %s", e.Code, e.Class, e.Immediate, want)
		}
		if _, exception := exceptions[e.Code]; exception && e.Note == "" {
			t.Errorf("XID %d: an exception to the mapping needs a note", e.Code)
		}
	}
}

func TestClassify(t *testing.T) {
	tests := map[string]struct {
		code           int
		overrides      map[int]Class
		wantClass      Class
		wantKnown      bool
		wantOverridden bool
	}{
		"uncorrectable ECC":               {code: 48, wantClass: ClassResetGPU, wantKnown: true},
		"fallen off the bus":              {code: 79, wantClass: ClassReboot, wantKnown: true},
		"row remap failure":               {code: 64, wantClass: ClassReplace, wantKnown: true},
		"aux power":                       {code: 54, wantClass: ClassReplace, wantKnown: true},
		"row remap event":                 {code: 63, wantClass: ClassInformational, wantKnown: true},
		"GSP timeout":                     {code: 119, wantClass: ClassResetGPU, wantKnown: true},
		"override":                        {code: 109, overrides: map[int]Class{109: ClassApplication}, wantClass: ClassApplication, wantKnown: true, wantOverridden: true},
		"invalid override is not applied": {code: 48, overrides: map[int]Class{48: "Ignore"}, wantClass: ClassResetGPU, wantKnown: true},
		"override of another code":        {code: 48, overrides: map[int]Class{13: ClassReboot}, wantClass: ClassResetGPU, wantKnown: true},
		"unknown code":                    {code: 999, wantClass: ClassResetGPU},
		"unused code":                     {code: 1, wantClass: ClassResetGPU},
		"unknown code, overridden":        {code: 999, overrides: map[int]Class{999: ClassReboot}, wantClass: ClassReboot, wantOverridden: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := Classify(tc.code, tc.overrides)
			if e.Code != tc.code || e.Class != tc.wantClass || e.Known != tc.wantKnown || e.Overridden != tc.wantOverridden {
				t.Errorf("Classify(%d) = code %d class %s known %v overridden %v; want class %s known %v overridden %v",
					tc.code, e.Code, e.Class, e.Known, e.Overridden, tc.wantClass, tc.wantKnown, tc.wantOverridden)
			}
			if e.Citation == "" || e.Meaning == "" {
				t.Errorf("Classify(%d): citation %q, meaning %q", tc.code, e.Citation, e.Meaning)
			}
		})
	}
}

func TestClassifyEvent(t *testing.T) {
	recovery := func(to string) XIDEvent {
		return xid("0000:43:00.0", 154, func(e *XIDEvent) { e.Message = "GPU recovery action changed from 0x0 (None) to " + to })
	}
	nvlink := func(code int, msg string) XIDEvent {
		return xid("0018:01:00.0", code, func(e *XIDEvent) { e.Message = msg })
	}
	tests := map[string]struct {
		ev        XIDEvent
		overrides map[int]Class
		want      Class
	}{
		"154: GPU reset":               {ev: recovery("0x1 (GPU Reset Required)"), want: ClassResetGPU},
		"154: node reboot":             {ev: recovery("0x2 (Node Reboot Required)"), want: ClassReboot},
		"154: drain P2P":               {ev: recovery("0x3 (Drain P2P)"), want: ClassResetGPU},
		"154: drain and reset":         {ev: recovery("0x4 (Drain and Reset)"), want: ClassResetGPU},
		"154: bus reset":               {ev: recovery("0x6 (Bus Reset)"), want: ClassReboot},
		"154: action this build lacks": {ev: recovery("0x1f (Something New)"), want: ClassReboot},
		"154: back to none": {ev: xid("0000:43:00.0", 154, func(e *XIDEvent) {
			e.Message = "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
		}), want: ClassInformational},
		"154: no action in message": {ev: xid("0000:43:00.0", 154, func(e *XIDEvent) { e.Message = "garbled" }), want: ClassInformational},
		"154: override wins":        {ev: recovery("0x2 (Node Reboot Required)"), overrides: map[int]Class{154: ClassResetGPU}, want: ClassResetGPU},
		"149 fatal":                 {ev: nvlink(149, "NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000)"), want: ClassResetGPU},
		"144 non-fatal":             {ev: nvlink(144, "SAW_MVB Nonfatal XC0 i0 Link -1 (0x00000001 0x00000008)"), want: ClassInformational},
		"144 without the word":      {ev: nvlink(144, "unknown format"), want: ClassResetGPU},
		"other codes by code alone": {ev: xid("0000:1b:00.0", 13, func(e *XIDEvent) { e.Message = "Nonfatal to 0x2" }), want: ClassApplication},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := ClassifyEvent(tc.ev, tc.overrides).Class; got != tc.want {
				t.Errorf("class %s, want %s", got, tc.want)
			}
		})
	}
}

func TestClassOrderAndParse(t *testing.T) {
	for i, c := range Classes {
		if c.Rank() != i || !c.Valid() {
			t.Errorf("%s: rank %d, valid %v", c, c.Rank(), c.Valid())
		}
		if got, err := ParseClass(string(c)); err != nil || got != c {
			t.Errorf("ParseClass(%q) = %q, %v", c, got, err)
		}
		if want := c == ClassResetGPU || c == ClassReboot || c == ClassReplace; c.Repairs() != want {
			t.Errorf("%s.Repairs() = %v", c, c.Repairs())
		}
	}
	if _, err := ParseClass("resetgpu"); err == nil {
		t.Error("ParseClass accepted a misspelt class")
	}
	if Class("").Valid() || Class("x").Repairs() {
		t.Error("an invalid class is valid or repairs")
	}
}
