package gpufault

import (
	"bytes"
	"errors"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The dcgm-exporter metrics ParseDCGMMetrics reads (DCGM field names; the
// exporter's default counters enable the XID, remapped-row and row-remap
// failure ones, the others are commented out in its default-counters.csv
// and need enabling).
const (
	MetricXID                       = "DCGM_FI_DEV_XID_ERRORS"    // gauge: the last XID
	MetricXIDCount                  = "DCGM_EXP_XID_ERRORS_COUNT" // per xid label: XIDs in the exporter's window
	MetricECCDBEVolatile            = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
	MetricECCSBEVolatile            = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
	MetricECCDBEAggregate           = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
	MetricECCSBEAggregate           = "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"
	MetricUncorrectableRemappedRows = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
	MetricCorrectableRemappedRows   = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
	MetricRowRemapFailure           = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
	MetricRowRemapPending           = "DCGM_FI_DEV_ROW_REMAP_PENDING"
	MetricRetiredDBE                = "DCGM_FI_DEV_RETIRED_DBE"
	MetricRetiredSBE                = "DCGM_FI_DEV_RETIRED_SBE"
	MetricRetiredPending            = "DCGM_FI_DEV_RETIRED_PENDING"
	// NVLink error counters: <prefix>TOTAL per GPU, <prefix>L<n> per lane,
	// or <prefix>TOTAL with an "nvlink" label per link.
	MetricNVLinkCRCFlitPrefix  = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_"
	MetricNVLinkCRCDataPrefix  = "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_"
	MetricNVLinkReplayPrefix   = "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_"
	MetricNVLinkRecoveryPrefix = "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_"
)

// GPUKey identifies a physical GPU in dcgm-exporter's output.
type GPUKey struct {
	// Index is the "gpu" label: DCGM's GPU id, nvidia-smi's index.
	Index int
	// UUID is the "UUID" label ("uuid" with --use-old-namespace,
	// "gpu_uuid" on per-link metrics).
	UUID string
	// PCIBusID is the "pci_bus_id" label normalised (NormalizePCIBusID);
	// empty when the exporter does not label it (older releases).
	PCIBusID string
}

// NVLinkErrors are a GPU's NVLink error counters, summed over its links.
type NVLinkErrors struct {
	CRCFlit  uint64
	CRCData  uint64
	Replay   uint64
	Recovery uint64
}

// PodRef is a container the exporter attributes a GPU to ("pod",
// "namespace", "container"; "pod_name", "pod_namespace", "container_name"
// with --use-old-namespace).
type PodRef struct {
	Namespace string
	Name      string
	Container string
}

// GPUHealth is what dcgm-exporter says about one GPU's health. Counters the
// exporter does not export read as zero; Reported lists the ones it did.
type GPUHealth struct {
	Device        string // "device" label, e.g. nvidia3
	ModelName     string
	Hostname      string
	DriverVersion string
	// LastXID is the value of DCGM_FI_DEV_XID_ERRORS: the last XID the GPU
	// reported (0: none). The exporter keeps it until it restarts.
	LastXID int
	// XIDCounts is DCGM_EXP_XID_ERRORS_COUNT by XID, when enabled.
	XIDCounts map[int]uint64
	// Uncorrectable (double-bit) and correctable (single-bit) ECC errors,
	// volatile (since the driver loaded or the GPU was reset) and aggregate
	// (over the GPU's life).
	UncorrectableECCVolatile  uint64
	CorrectableECCVolatile    uint64
	UncorrectableECCAggregate uint64
	CorrectableECCAggregate   uint64
	// Rows remapped for uncorrectable/correctable errors (Ampere and newer),
	// whether a remap failed and whether one waits for a GPU reset.
	UncorrectableRemappedRows uint64
	CorrectableRemappedRows   uint64
	RowRemapFailure           bool
	RowRemapPending           bool
	// Pages retired for double/single-bit errors and pages pending
	// retirement (Volta and older).
	RetiredPagesDBE     uint64
	RetiredPagesSBE     uint64
	RetiredPagesPending uint64
	NVLink              NVLinkErrors
	// Pods the exporter attributes to the GPU, sorted.
	Pods []PodRef
	// Reported lists the health metrics the exporter reported for the GPU,
	// sorted.
	Reported []string
}

// DCGMStats counts what ParseDCGMMetrics read.
type DCGMStats struct {
	// Lines is the number of sample lines (not comments or blank lines).
	Lines int
	// Used is the number of samples that went into a GPU's health or
	// presence.
	Used int
	// Unreadable is the number of lines the text format parser rejects,
	// samples whose value is not a finite non-negative number and samples
	// with an unreadable gpu label; they are skipped.
	Unreadable int
	// NotGPU is the number of samples of other entities (NVSwitch, CPU) or
	// other exporters; they are skipped.
	NotGPU int
	// TooLong is the number of lines longer than MaxLineBytes, skipped.
	TooLong int
}

// ParseDCGMMetrics reads dcgm-exporter's Prometheus text exposition and
// returns each GPU's health. Every sample line is parsed on its own (by
// Prometheus's text format parser), so a line it cannot read is counted and
// skipped and the rest still count. A GPU appears once whatever its MIG
// instances: device-level values repeated per instance are taken once (the
// largest). Only a read error of r is returned as an error.
func ParseDCGMMetrics(r io.Reader) (map[GPUKey]GPUHealth, DCGMStats, error) {
	var st DCGMStats
	acc := map[string]*gpuAcc{}
	lines := lineReader{r: r, buf: make([]byte, 2*MaxLineBytes)}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	var in bytes.Buffer
	for {
		raw, ok := lines.next()
		if !ok {
			break
		}
		line := bytes.TrimSpace(raw)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		st.Lines++
		in.Reset()
		in.Write(line)
		in.WriteByte('\n')
		families, err := parser.TextToMetricFamilies(&in)
		if err != nil || len(families) != 1 {
			st.Unreadable++
			continue
		}
		for name, mf := range families {
			for _, m := range mf.GetMetric() {
				switch addSample(acc, name, m) {
				case sampleUsed:
					st.Used++
				case sampleNotGPU:
					st.NotGPU++
				default:
					st.Unreadable++
				}
			}
		}
	}
	st.TooLong = lines.tooLong
	out := finish(acc)
	if lines.err != nil && !errors.Is(lines.err, io.EOF) {
		return out, st, lines.err
	}
	return out, st, nil
}

type sampleResult int

const (
	sampleUsed sampleResult = iota
	sampleNotGPU
	sampleUnreadable
)

// gpuAcc gathers one GPU's samples.
type gpuAcc struct {
	key                                 GPUKey
	h                                   GPUHealth
	reported                            map[string]bool
	pods                                map[PodRef]bool
	nvlink                              [len(nvlinkPrefixes)]nvlinkCount
	lastXID, remapFailure, remapPending uint64
}

func addSample(acc map[string]*gpuAcc, name string, m *dto.Metric) sampleResult {
	labels := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		if _, dup := labels[lp.GetName()]; dup {
			return sampleUnreadable // Prometheus rejects such a sample too
		}
		labels[lp.GetName()] = lp.GetValue()
	}
	index, hasIndex := labels["gpu"]
	uuid := firstLabel(labels, "UUID", "uuid", "gpu_uuid")
	bus, _ := NormalizePCIBusID(labels["pci_bus_id"])
	if !strings.HasPrefix(name, "DCGM_") || strings.HasPrefix(name, "DCGM_FI_DEV_CPU_") ||
		!hasIndex || uuid == "" && bus == "" {
		return sampleNotGPU
	}
	idx, err := strconv.Atoi(index)
	if err != nil || idx < 0 {
		return sampleUnreadable
	}
	v, ok := sampleValue(m)
	if !ok {
		return sampleUnreadable
	}
	id := "uuid:" + uuid
	if uuid == "" {
		id = "pci:" + bus
	}
	a := acc[id]
	if a == nil {
		a = &gpuAcc{key: GPUKey{Index: idx, UUID: uuid, PCIBusID: bus}, reported: map[string]bool{}, pods: map[PodRef]bool{}}
		acc[id] = a
	}
	if a.key.PCIBusID == "" {
		a.key.PCIBusID = bus
	}
	a.setLabels(labels)
	a.add(name, labels, v)
	return sampleUsed
}

func firstLabel(labels map[string]string, names ...string) string {
	for _, n := range names {
		if v := labels[n]; v != "" {
			return v
		}
	}
	return ""
}

// sampleValue returns the sample as a count: finite and not negative.
func sampleValue(m *dto.Metric) (uint64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false
	}
	if v >= math.MaxUint64 {
		return math.MaxUint64, true
	}
	return uint64(v), true
}

func (a *gpuAcc) setLabels(l map[string]string) {
	set := func(dst *string, v string) {
		if *dst == "" {
			*dst = v
		}
	}
	set(&a.h.Device, l["device"])
	set(&a.h.ModelName, firstLabel(l, "modelName", "model_name"))
	set(&a.h.Hostname, firstLabel(l, "Hostname", "hostname"))
	set(&a.h.DriverVersion, l["DCGM_FI_DRIVER_VERSION"])
	pod := PodRef{Namespace: firstLabel(l, "namespace", "pod_namespace"), Name: firstLabel(l, "pod", "pod_name"),
		Container: firstLabel(l, "container", "container_name")}
	if pod.Name != "" && len(a.pods) < 256 {
		a.pods[pod] = true
	}
}

func (a *gpuAcc) add(name string, labels map[string]string, v uint64) {
	h := &a.h
	maxInto := func(dst *uint64) { *dst = max(*dst, v) }
	switch name {
	case MetricXID:
		maxInto(&a.lastXID)
	case MetricXIDCount:
		code, err := strconv.Atoi(labels["xid"])
		if err != nil || code <= 0 || code > maxXIDCode {
			return
		}
		if h.XIDCounts == nil {
			h.XIDCounts = map[int]uint64{}
		}
		h.XIDCounts[code] = max(h.XIDCounts[code], v)
	case MetricECCDBEVolatile:
		maxInto(&h.UncorrectableECCVolatile)
	case MetricECCSBEVolatile:
		maxInto(&h.CorrectableECCVolatile)
	case MetricECCDBEAggregate:
		maxInto(&h.UncorrectableECCAggregate)
	case MetricECCSBEAggregate:
		maxInto(&h.CorrectableECCAggregate)
	case MetricUncorrectableRemappedRows:
		maxInto(&h.UncorrectableRemappedRows)
	case MetricCorrectableRemappedRows:
		maxInto(&h.CorrectableRemappedRows)
	case MetricRowRemapFailure:
		maxInto(&a.remapFailure)
	case MetricRowRemapPending:
		maxInto(&a.remapPending)
	case MetricRetiredDBE:
		maxInto(&h.RetiredPagesDBE)
	case MetricRetiredSBE:
		maxInto(&h.RetiredPagesSBE)
	case MetricRetiredPending:
		maxInto(&h.RetiredPagesPending)
	default:
		family, ok := a.addNVLink(name, labels, v)
		if !ok {
			return // presence only
		}
		name = family
	}
	a.reported[name] = true
}

// nvlinkPrefixes are the NVLink error counters, in NVLinkErrors' order.
var nvlinkPrefixes = [...]string{MetricNVLinkCRCFlitPrefix, MetricNVLinkCRCDataPrefix, MetricNVLinkReplayPrefix, MetricNVLinkRecoveryPrefix}

// nvlinkCount gathers one NVLink error counter of a GPU: its per-GPU total
// if the exporter gives one, else the sum over lanes or links.
type nvlinkCount struct {
	total, parts uint64
	hasTotal     bool
}

func (c nvlinkCount) value() uint64 {
	if c.hasTotal {
		return c.total
	}
	return c.parts
}

func (c *nvlinkCount) merge(o nvlinkCount) {
	c.total, c.hasTotal = max(c.total, o.total), c.hasTotal || o.hasTotal
	c.parts = saturatingAdd(c.parts, o.parts)
}

// addNVLink adds a sample of an NVLink error counter and returns the
// counter's per-GPU name; ok is false for other metrics.
func (a *gpuAcc) addNVLink(name string, labels map[string]string, v uint64) (string, bool) {
	for i, prefix := range nvlinkPrefixes {
		suffix, found := strings.CutPrefix(name, prefix)
		if !found {
			continue
		}
		c := &a.nvlink[i]
		_, perLink := labels["nvlink"]
		switch {
		case suffix == "TOTAL" && !perLink:
			c.total, c.hasTotal = max(c.total, v), true
		case suffix == "TOTAL" || len(suffix) > 1 && suffix[0] == 'L' && isAllDigits(suffix[1:]):
			c.parts = saturatingAdd(c.parts, v)
		default:
			return "", false
		}
		return prefix + "TOTAL", true
	}
	return "", false
}

func isAllDigits(s string) bool {
	_, ok := parseDecimal(s)
	return ok
}

func saturatingAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// finish merges what was gathered under a PCI address only into the GPU with
// that address and a UUID, and builds the result.
func finish(acc map[string]*gpuAcc) map[GPUKey]GPUHealth {
	for id, a := range acc {
		if a.key.UUID != "" {
			continue
		}
		for _, b := range acc {
			if b.key.UUID != "" && b.key.PCIBusID == a.key.PCIBusID {
				b.merge(a)
				delete(acc, id)
				break
			}
		}
	}
	out := make(map[GPUKey]GPUHealth, len(acc))
	for _, a := range acc {
		h := a.h
		h.LastXID = int(min(a.lastXID, maxXIDCode))
		h.RowRemapFailure, h.RowRemapPending = a.remapFailure > 0, a.remapPending > 0
		h.NVLink = NVLinkErrors{CRCFlit: a.nvlink[0].value(), CRCData: a.nvlink[1].value(),
			Replay: a.nvlink[2].value(), Recovery: a.nvlink[3].value()}
		for p := range a.pods {
			h.Pods = append(h.Pods, p)
		}
		sort.Slice(h.Pods, func(i, j int) bool {
			x, y := h.Pods[i], h.Pods[j]
			if x.Namespace != y.Namespace {
				return x.Namespace < y.Namespace
			}
			if x.Name != y.Name {
				return x.Name < y.Name
			}
			return x.Container < y.Container
		})
		for n := range a.reported {
			h.Reported = append(h.Reported, n)
		}
		sort.Strings(h.Reported)
		out[a.key] = h
	}
	return out
}

// merge adds b's samples (gathered under its address only) to a.
func (a *gpuAcc) merge(b *gpuAcc) {
	mx := func(x *uint64, y uint64) { *x = max(*x, y) }
	ah, bh := &a.h, &b.h
	mx(&a.lastXID, b.lastXID)
	mx(&a.remapFailure, b.remapFailure)
	mx(&a.remapPending, b.remapPending)
	mx(&ah.UncorrectableECCVolatile, bh.UncorrectableECCVolatile)
	mx(&ah.CorrectableECCVolatile, bh.CorrectableECCVolatile)
	mx(&ah.UncorrectableECCAggregate, bh.UncorrectableECCAggregate)
	mx(&ah.CorrectableECCAggregate, bh.CorrectableECCAggregate)
	mx(&ah.UncorrectableRemappedRows, bh.UncorrectableRemappedRows)
	mx(&ah.CorrectableRemappedRows, bh.CorrectableRemappedRows)
	mx(&ah.RetiredPagesDBE, bh.RetiredPagesDBE)
	mx(&ah.RetiredPagesSBE, bh.RetiredPagesSBE)
	mx(&ah.RetiredPagesPending, bh.RetiredPagesPending)
	for code, n := range bh.XIDCounts {
		if ah.XIDCounts == nil {
			ah.XIDCounts = map[int]uint64{}
		}
		ah.XIDCounts[code] = max(ah.XIDCounts[code], n)
	}
	for i := range a.nvlink {
		a.nvlink[i].merge(b.nvlink[i])
	}
	for n := range b.reported {
		a.reported[n] = true
	}
	for p := range b.pods {
		a.pods[p] = true
	}
	for _, s := range []struct {
		dst *string
		v   string
	}{
		{&ah.Device, bh.Device}, {&ah.ModelName, bh.ModelName}, {&ah.Hostname, bh.Hostname}, {&ah.DriverVersion, bh.DriverVersion},
	} {
		if *s.dst == "" {
			*s.dst = s.v
		}
	}
}
