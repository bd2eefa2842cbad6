package gpufault

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func reported(names ...string) []string {
	sort.Strings(names)
	return names
}

// h100Reported is what dcgm-h100.prom reports for every GPU.
var h100Reported = []string{
	MetricCorrectableRemappedRows, MetricECCDBEAggregate, MetricECCDBEVolatile, MetricECCSBEAggregate, MetricECCSBEVolatile,
	MetricNVLinkCRCDataPrefix + "TOTAL", MetricNVLinkCRCFlitPrefix + "TOTAL", MetricNVLinkRecoveryPrefix + "TOTAL",
	MetricNVLinkReplayPrefix + "TOTAL", MetricRowRemapFailure, MetricRowRemapPending, MetricUncorrectableRemappedRows, MetricXID,
}

func h100(h GPUHealth) GPUHealth {
	h.ModelName, h.Hostname, h.DriverVersion = "NVIDIA H100 80GB HBM3", "gpu-node-3", "570.124.06"
	if h.Reported == nil {
		h.Reported = h100Reported
	}
	return h
}

func readSample(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestParseDCGMMetrics(t *testing.T) {
	trainer0 := []PodRef{{Namespace: "ml", Name: "llama-train-0", Container: "trainer"}}
	trainer1 := []PodRef{{Namespace: "ml", Name: "llama-train-1", Container: "trainer"}}
	tests := map[string]struct {
		file      string
		wantGPUs  int
		want      map[GPUKey]GPUHealth // the GPUs to compare (all of them when wantGPUs is len(want))
		wantStats DCGMStats
	}{
		"HGX H100, dcgm-exporter 4, optional counters enabled": {
			file:     "dcgm-h100.prom",
			wantGPUs: 8,
			want: map[GPUKey]GPUHealth{
				{0, "GPU-f3a3c571-7476-1899-75a3-adb3254a9493", "0000:18:00.0"}: h100(GPUHealth{Device: "nvidia0", Pods: trainer0,
					NVLink: NVLinkErrors{CRCFlit: 2}}),
				{1, "GPU-e88b7591-31db-6e32-d8dc-b35f94c662cd", "0000:2a:00.0"}: h100(GPUHealth{Device: "nvidia1", Pods: trainer0, LastXID: 13}),
				{3, "GPU-ef2843ff-74cf-f6a6-b6dc-0914faa30751", "0000:5d:00.0"}: h100(GPUHealth{Device: "nvidia3", Pods: trainer1,
					LastXID: 48, XIDCounts: map[int]uint64{48: 1, 63: 1},
					UncorrectableECCVolatile: 2, CorrectableECCVolatile: 14, UncorrectableECCAggregate: 2, CorrectableECCAggregate: 311,
					UncorrectableRemappedRows: 1, RowRemapPending: true,
					Reported: reported(append([]string{MetricXIDCount}, h100Reported...)...)}),
				{4, "GPU-32a7cae9-df32-7560-0500-2635f5bffffb", "0000:9a:00.0"}: h100(GPUHealth{Device: "nvidia4",
					Pods: []PodRef{{Namespace: "serving", Name: "vllm-7d9f6c-x2k4p", Container: "vllm"}}}),
				{5, "GPU-94aa3bff-595f-d6ff-9761-1f4ee0cb1e6b", "0000:ab:00.0"}: h100(GPUHealth{Device: "nvidia5",
					LastXID: 64, XIDCounts: map[int]uint64{64: 2}, UncorrectableECCAggregate: 9,
					UncorrectableRemappedRows: 8, CorrectableRemappedRows: 3, RowRemapFailure: true,
					Reported: reported(append([]string{MetricXIDCount}, h100Reported...)...)}),
				{6, "GPU-7aaf4542-e6ae-fc3c-fa6b-b9c4b5ef5e70", "0000:ba:00.0"}: h100(GPUHealth{Device: "nvidia6",
					NVLink: NVLinkErrors{CRCFlit: 57, Replay: 120, Recovery: 3}}),
			},
			wantStats: DCGMStats{Lines: 187, Used: 187},
		},
		"A100, dcgm-exporter 3 without pci_bus_id, one GPU missing": {
			file:     "dcgm-a100-gpu-missing.prom",
			wantGPUs: 7,
			want: map[GPUKey]GPUHealth{
				{5, "GPU-193988fd-b97b-9177-7b55-68426f35f0bb", ""}: {Device: "nvidia5", ModelName: "NVIDIA A100-SXM4-80GB",
					Hostname: "a100-node-12", DriverVersion: "535.161.08",
					Reported: reported(MetricXID, MetricUncorrectableRemappedRows, MetricCorrectableRemappedRows, MetricRowRemapFailure)},
			},
			wantStats: DCGMStats{Lines: 98, Used: 98},
		},
		"V100 with page retirement, hostname label of the latest exporter": {
			file:     "dcgm-v100-retired-pages.prom",
			wantGPUs: 4,
			want: map[GPUKey]GPUHealth{
				{1, "GPU-e87dbd18-cca7-9176-a044-59fe661380f3", "0000:2a:00.0"}: {Device: "nvidia1", ModelName: "Tesla V100-SXM2-32GB",
					Hostname: "v100-node-2", DriverVersion: "535.230.02", LastXID: 48,
					UncorrectableECCVolatile: 1, UncorrectableECCAggregate: 1, RetiredPagesDBE: 1, RetiredPagesPending: 1,
					Reported: reported(MetricXID, MetricECCSBEVolatile, MetricECCDBEVolatile, MetricECCDBEAggregate, MetricRetiredSBE,
						MetricRetiredDBE, MetricRetiredPending)},
			},
			wantStats: DCGMStats{Lines: 36, Used: 36},
		},
		"MIG instances, --use-old-namespace labels, per-link and per-lane NVLink counters, NVSwitch and CPU": {
			file:     "dcgm-mig-old-namespace.prom",
			wantGPUs: 2,
			want: map[GPUKey]GPUHealth{
				{0, "GPU-265c9814-6156-355b-e589-ff2064894f16", "0000:3b:00.0"}: {Device: "nvidia0", ModelName: "NVIDIA A30",
					Hostname: "a30-node-1", LastXID: 31,
					Pods: []PodRef{{Namespace: "search", Name: "bert-6c9d5-abcde", Container: "infer"},
						{Namespace: "search", Name: "bert-6c9d5-fghij", Container: "infer"}},
					Reported: reported(MetricXID, MetricECCDBEVolatile)},
				{1, "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49", "0000:af:00.0"}: {Device: "nvidia1", ModelName: "NVIDIA A30",
					Hostname: "a30-node-1", NVLink: NVLinkErrors{Replay: 7, Recovery: 3},
					Reported: reported(MetricXID, MetricECCDBEVolatile, MetricNVLinkReplayPrefix+"TOTAL", MetricNVLinkRecoveryPrefix+"TOTAL")},
			},
			wantStats: DCGMStats{Lines: 14, Used: 12, NotGPU: 2},
		},
		"unreadable lines among good ones": {
			file:     "dcgm-unreadable-lines.prom",
			wantGPUs: 2,
			want: map[GPUKey]GPUHealth{
				{0, "GPU-5a1c2e3f-0000-4000-8000-000000000000", "0000:01:00.0"}: {Device: "nvidia0", ModelName: "NVIDIA L40S",
					Hostname: "l40s-1", LastXID: 119, Reported: reported(MetricXID, MetricRowRemapFailure)},
				{1, "GPU-5a1c2e3f-0000-4000-8000-000000000001", "0000:02:00.0"}: {Device: "nvidia1", ModelName: `NVIDIA "L40S"`,
					Hostname: "l40s-1", Reported: reported(MetricXID)},
			},
			wantStats: DCGMStats{Lines: 12, Used: 3, Unreadable: 8, NotGPU: 1},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, stats, err := ParseDCGMMetrics(bytes.NewReader(readSample(t, tc.file)))
			if err != nil {
				t.Fatalf("ParseDCGMMetrics: %v", err)
			}
			if len(got) != tc.wantGPUs {
				t.Errorf("%d GPUs, want %d: %v", len(got), tc.wantGPUs, keysOf(got))
			}
			for k, want := range tc.want {
				h, ok := got[k]
				if !ok {
					t.Errorf("no GPU %+v in %v", k, keysOf(got))
					continue
				}
				if diff := cmp.Diff(want, h); diff != "" {
					t.Errorf("GPU %d (-want +got):\n%s", k.Index, diff)
				}
			}
			if diff := cmp.Diff(tc.wantStats, stats); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
		})
	}
}

func keysOf(m map[GPUKey]GPUHealth) []GPUKey {
	var ks []GPUKey
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return keyLess(ks[i], ks[j]) })
	return ks
}

func TestParseDCGMMetricsEdges(t *testing.T) {
	const uuid0 = `UUID="GPU-00000000-1111-2222-3333-444444444444"`
	errBoom := errors.New("connection reset")
	tests := map[string]struct {
		r         io.Reader
		wantKeys  []GPUKey
		wantStats DCGMStats
		wantErr   error
	}{
		"empty": {r: strings.NewReader("")},
		"a read error returns what was read": {
			r:         io.MultiReader(strings.NewReader(`DCGM_FI_DEV_XID_ERRORS{gpu="0",`+uuid0+`} 0`+"\n"), iotestErr{errBoom}),
			wantKeys:  []GPUKey{{0, "GPU-00000000-1111-2222-3333-444444444444", ""}},
			wantStats: DCGMStats{Lines: 1, Used: 1},
			wantErr:   errBoom,
		},
		"a line longer than MaxLineBytes is skipped": {
			r: strings.NewReader(`DCGM_FI_DEV_XID_ERRORS{gpu="0",pod="` + strings.Repeat("p", 3*MaxLineBytes) + `",` + uuid0 + "} 0\n" +
				`DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-1"} 0` + "\n"),
			wantKeys:  []GPUKey{{1, "GPU-1", ""}},
			wantStats: DCGMStats{Lines: 1, Used: 1, TooLong: 1},
		},
		"samples under an address only join the GPU with that address": {
			r: strings.NewReader(`DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-a",pci_bus_id="00000000:3B:00.0"} 0` + "\n" +
				`DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="0",pci_bus_id="0000:3b:00.0"} 1` + "\n" +
				`DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="1",pci_bus_id="0000:5d:00.0"} 0` + "\n"),
			wantKeys:  []GPUKey{{0, "GPU-a", "0000:3b:00.0"}, {1, "", "0000:5d:00.0"}},
			wantStats: DCGMStats{Lines: 3, Used: 3},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, stats, err := ParseDCGMMetrics(tc.r)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantKeys, keysOf(got)); diff != "" {
				t.Errorf("GPUs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantStats, stats); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
		})
	}
	got, _, _ := ParseDCGMMetrics(strings.NewReader(`DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-a",pci_bus_id="00000000:3B:00.0"} 0` + "\n" +
		`DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="0",pci_bus_id="0000:3b:00.0"} 1` + "\n"))
	if !got[GPUKey{0, "GPU-a", "0000:3b:00.0"}].RowRemapFailure {
		t.Errorf("the address-only sample was not merged: %+v", got)
	}
}

var dcgmSamples = []string{"dcgm-h100.prom", "dcgm-a100-gpu-missing.prom", "dcgm-v100-retired-pages.prom",
	"dcgm-mig-old-namespace.prom", "dcgm-unreadable-lines.prom"}

func FuzzParseDCGMMetrics(f *testing.F) {
	// Seeds: the samples in pieces of about a KiB (the fuzzer minimises every
	// new input it finds, which takes most of a run on a whole 50 KiB scrape).
	for _, name := range dcgmSamples {
		var chunk []byte
		for _, l := range bytes.SplitAfter(readSample(f, name), []byte("\n")) {
			if len(chunk)+len(l) > 1<<10 {
				f.Add(chunk)
				chunk = nil
			}
			chunk = append(chunk, l...)
		}
		f.Add(chunk)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		health, st, err := ParseDCGMMetrics(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("ParseDCGMMetrics of a byte slice: %v", err)
		}
		if st.Used+st.Unreadable+st.NotGPU != st.Lines {
			t.Fatalf("stats do not add up: %+v", st)
		}
		if len(health) > st.Used {
			t.Fatalf("%d GPUs from %d samples", len(health), st.Used)
		}
		for k := range health {
			if k.Index < 0 || k.UUID == "" && k.PCIBusID == "" {
				t.Fatalf("GPU without identity: %+v", k)
			}
		}
		for _, fault := range Assess(health, 8) {
			if !fault.Class.Valid() || fault.Meaning == "" || fault.Citation == "" {
				t.Fatalf("bad fault %+v", fault)
			}
		}
	})
}
