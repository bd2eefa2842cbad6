package gpufault

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func faultSummary(fs []Fault) []string {
	var out []string
	for _, f := range fs {
		out = append(out, fmt.Sprintf("%d %s xid=%d value=%d %s", f.GPU.Index, f.Counter, f.Code, f.Value, f.Class))
	}
	return out
}

func TestAssess(t *testing.T) {
	tests := map[string]struct {
		file     string // empty: no GPUs
		capacity int
		policy   Policy
		want     []string
	}{
		"HGX H100: application XID, ECC and pending remap, remap failure, NVLink recoveries": {
			file: "dcgm-h100.prom", capacity: 8,
			want: []string{
				"1 DCGM_FI_DEV_XID_ERRORS xid=13 value=1 Application",
				"3 DCGM_EXP_XID_ERRORS_COUNT xid=48 value=1 ResetGPU",
				"3 DCGM_EXP_XID_ERRORS_COUNT xid=63 value=1 Informational",
				"3 DCGM_FI_DEV_ECC_DBE_VOL_TOTAL xid=0 value=2 ResetGPU",
				"3 DCGM_FI_DEV_ROW_REMAP_PENDING xid=0 value=1 Informational",
				"5 DCGM_EXP_XID_ERRORS_COUNT xid=64 value=2 Replace",
				"5 DCGM_FI_DEV_ROW_REMAP_FAILURE xid=0 value=1 Replace",
				"6 DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL xid=0 value=3 Informational",
			},
		},
		"HGX H100 with policy overrides": {
			file: "dcgm-h100.prom", capacity: 8,
			policy: Policy{XIDOverrides: map[int]Class{13: ClassResetGPU, 48: ClassReboot},
				CounterOverrides: map[string]Class{MetricNVLinkRecoveryPrefix + "TOTAL": ClassResetGPU, MetricRowRemapPending: "bogus"}},
			want: []string{
				"1 DCGM_FI_DEV_XID_ERRORS xid=13 value=1 ResetGPU",
				"3 DCGM_EXP_XID_ERRORS_COUNT xid=48 value=1 Reboot",
				"3 DCGM_EXP_XID_ERRORS_COUNT xid=63 value=1 Informational",
				"3 DCGM_FI_DEV_ECC_DBE_VOL_TOTAL xid=0 value=2 ResetGPU",
				"3 DCGM_FI_DEV_ROW_REMAP_PENDING xid=0 value=1 Informational",
				"5 DCGM_EXP_XID_ERRORS_COUNT xid=64 value=2 Replace",
				"5 DCGM_FI_DEV_ROW_REMAP_FAILURE xid=0 value=1 Replace",
				"6 DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL xid=0 value=3 ResetGPU",
			},
		},
		"7 of 8 GPUs: one fell off the bus": {
			file: "dcgm-a100-gpu-missing.prom", capacity: 8,
			want: []string{"-1 GPUMissing xid=0 value=1 Reboot"},
		},
		"7 of 8 GPUs, policy replaces": {
			file: "dcgm-a100-gpu-missing.prom", capacity: 8,
			policy: Policy{CounterOverrides: map[string]Class{CounterGPUMissing: ClassReplace}},
			want:   []string{"-1 GPUMissing xid=0 value=1 Replace"},
		},
		"7 GPUs, capacity 7":           {file: "dcgm-a100-gpu-missing.prom", capacity: 7},
		"7 GPUs, capacity not known":   {file: "dcgm-a100-gpu-missing.prom"},
		"no GPUs at all is no verdict": {capacity: 8},
		"V100: double-bit error and a page pending retirement": {
			file: "dcgm-v100-retired-pages.prom", capacity: 4,
			want: []string{
				"1 DCGM_FI_DEV_XID_ERRORS xid=48 value=1 ResetGPU",
				"1 DCGM_FI_DEV_ECC_DBE_VOL_TOTAL xid=0 value=1 ResetGPU",
				"1 DCGM_FI_DEV_RETIRED_PENDING xid=0 value=1 ResetGPU",
			},
		},
		"MIG: an application XID on one instance, NVLink recoveries summed over lanes": {
			file: "dcgm-mig-old-namespace.prom", capacity: 2,
			want: []string{
				"0 DCGM_FI_DEV_XID_ERRORS xid=31 value=1 Application",
				"1 DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL xid=0 value=3 Informational",
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			health := map[GPUKey]GPUHealth{}
			if tc.file != "" {
				var err error
				if health, _, err = ParseDCGMMetrics(bytes.NewReader(readSample(t, tc.file))); err != nil {
					t.Fatal(err)
				}
			}
			faults := AssessWith(health, tc.capacity, tc.policy)
			if diff := cmp.Diff(tc.want, faultSummary(faults)); diff != "" {
				t.Errorf("faults (-want +got):\n%s", diff)
			}
			for _, f := range faults {
				if f.Meaning == "" || f.Citation == "" {
					t.Errorf("fault without meaning or citation: %+v", f)
				}
				if f.Counter != CounterGPUMissing && f.GPU.UUID == "" {
					t.Errorf("fault without its GPU: %+v", f)
				}
			}
			if tc.policy.XIDOverrides == nil && tc.policy.CounterOverrides == nil {
				if diff := cmp.Diff(faults, Assess(health, tc.capacity)); diff != "" {
					t.Errorf("Assess differs from AssessWith with no policy:\n%s", diff)
				}
			}
		})
	}
}

func TestFaultFromXID(t *testing.T) {
	ev := xid("0000:43:00.0", 154, func(e *XIDEvent) {
		e.UUID, e.Message = "GPU-0b9d4e21-77aa-4c3b-8e5f-112233445566", "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
	})
	got := FaultFromXID(ev, nil)
	want := Fault{GPU: GPUKey{Index: Unknown, UUID: ev.UUID, PCIBusID: "0000:43:00.0"}, Code: 154, Value: 1, Class: ClassReboot,
		Meaning: Classify(154, nil).Meaning, Citation: Classify(154, nil).Citation}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("fault (-want +got):\n%s", diff)
	}
	if got := FaultFromXID(xid("0000:1b:00.0", 13, nil), map[int]Class{13: ClassResetGPU}); got.Class != ClassResetGPU {
		t.Errorf("override not applied: %+v", got)
	}
}
