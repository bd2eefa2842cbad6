package devcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/gpufault"
)

// The simulated GPU host of a kwok node keeps its state in the node's
// annotations, so that faults can be injected with kubectl (or
// InjectXID / SetGPUState) and another process — the node agent of the
// simulation — sees them:
//
//	sim.gpufleet.dev/kmsg       the kernel log of the current boot, /dev/kmsg records one a line
//	                            ("4,<seq>,<usec since boot>,-;NVRM: Xid (PCI:0000:28:00): 48, pid=…, …"),
//	                            the last SimKmsgLines
//	sim.gpufleet.dev/kmsg-boot  {"bootID":"…","time":"<RFC 3339>"}: the boot the log and the
//	                            GPU state belong to, and when it began (the log's usec count from it);
//	                            absent: the node's boot ID, booted when the node was created
//	sim.gpufleet.dev/gpu-state  {"<GPU index>":{"volatileDBE":2,"rowRemapFailure":true,
//	                            "rowRemapPending":true,"missing":true,"resetFails":true,"broken":true}}
//
// A reboot (a new boot ID on the node, e.g. Cluster.Reboot) empties the
// kernel log and clears every GPU's state except a broken GPU's: no reset
// or reboot fixes that one. The simulated exporter renders gpu-state as
// dcgm-exporter's metrics for the node's nvidia.com/gpu GPUs (SimGPU
// identities); a missing GPU is not in them.
const (
	AnnotationKmsg     = "sim.gpufleet.dev/kmsg"
	AnnotationKmsgBoot = "sim.gpufleet.dev/kmsg-boot"
	AnnotationGPUState = "sim.gpufleet.dev/gpu-state"
	// SimKmsgLines is how many kernel log records the node keeps.
	SimKmsgLines = 64
)

// SimGPUState is the health of one simulated GPU.
type SimGPUState struct {
	// VolatileDBE is the uncorrectable ECC error count since the last
	// reset (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL).
	VolatileDBE uint64 `json:"volatileDBE,omitempty"`
	// RowRemapFailure and RowRemapPending are DCGM's row remapping flags.
	RowRemapFailure bool `json:"rowRemapFailure,omitempty"`
	RowRemapPending bool `json:"rowRemapPending,omitempty"`
	// Missing: the GPU fell off the bus; the exporter no longer shows it
	// and a reset cannot reach it.
	Missing bool `json:"missing,omitempty"`
	// ResetFails makes a reset of the GPU fail.
	ResetFails bool `json:"resetFails,omitempty"`
	// Broken: neither a reset nor a reboot clears the GPU's state.
	Broken bool `json:"broken,omitempty"`
	// FailsValidation: the GPU's reset succeeds, but it fails its
	// validation (a check nvidia-smi or DCGM would fail) until the node
	// reboots.
	FailsValidation bool `json:"failsValidation,omitempty"`
	// ResetSeq is the kernel log's last sequence number when the GPU was
	// last reset: the simulated validation counts only XIDs after it.
	ResetSeq int64 `json:"resetSeq,omitempty"`
}

// SimBoot is the boot a simulated node's kernel log belongs to.
type SimBoot struct {
	BootID string    `json:"bootID"`
	Time   time.Time `json:"time"`
}

// SimGPUHost is a simulated node's GPU host in the node's current boot.
type SimGPUHost struct {
	Node string
	// GPUs is the node's nvidia.com/gpu capacity.
	GPUs int
	Boot SimBoot
	// Kmsg are the kernel log records of the boot.
	Kmsg []string
	// State is the GPUs' health by index (healthy GPUs are absent).
	State map[int]SimGPUState
}

// simNow is the simulated kernel's clock: the wall clock, or the
// cluster's own (simClock, set by tests; per cluster, so that a test's
// clock never reaches another cluster's simulation loops).
func (c *Cluster) simNow() time.Time {
	if c != nil && c.simClock != nil {
		return c.simClock()
	}
	return time.Now()
}

// ReadSimGPUHost reads a node's simulated GPU host from its annotations.
// When the node has rebooted since they were written, it is the host of
// the new boot: an empty kernel log, only broken GPUs' state, the boot's
// time not known yet (zero).
func ReadSimGPUHost(node *corev1.Node) (SimGPUHost, error) {
	h := SimGPUHost{Node: node.Name, GPUs: simGPUCount(node), State: map[int]SimGPUState{},
		Boot: SimBoot{BootID: node.Status.NodeInfo.BootID, Time: node.CreationTimestamp.Time}}
	a := node.Annotations
	if v := a[AnnotationKmsgBoot]; v != "" {
		if err := json.Unmarshal([]byte(v), &h.Boot); err != nil {
			return h, fmt.Errorf("node %s: annotation %s: %w", node.Name, AnnotationKmsgBoot, err)
		}
	}
	if v := a[AnnotationGPUState]; v != "" {
		var byIndex map[string]SimGPUState
		if err := json.Unmarshal([]byte(v), &byIndex); err != nil {
			return h, fmt.Errorf("node %s: annotation %s: %w", node.Name, AnnotationGPUState, err)
		}
		for k, st := range byIndex {
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 {
				return h, fmt.Errorf("node %s: annotation %s: GPU index %q", node.Name, AnnotationGPUState, k)
			}
			h.State[i] = st
		}
	}
	if v := a[AnnotationKmsg]; v != "" {
		h.Kmsg = strings.Split(strings.TrimRight(v, "\n"), "\n")
	}
	if h.Boot.BootID != node.Status.NodeInfo.BootID {
		h.Boot = SimBoot{BootID: node.Status.NodeInfo.BootID}
		h.Kmsg = nil
		for i, st := range h.State {
			if !st.Broken {
				delete(h.State, i)
			}
		}
	}
	return h, nil
}

func simGPUCount(node *corev1.Node) int {
	q, ok := node.Status.Capacity[ResourceGPU]
	if !ok {
		return 0
	}
	return int(min(max(q.Value(), 0), 64))
}

// annotations renders the host as the node's annotations (nil: remove).
func (h SimGPUHost) annotations() (map[string]any, error) {
	boot, err := json.Marshal(h.Boot)
	if err != nil {
		return nil, err
	}
	out := map[string]any{AnnotationKmsgBoot: string(boot), AnnotationKmsg: nil, AnnotationGPUState: nil}
	if n := len(h.Kmsg); n > 0 {
		out[AnnotationKmsg] = strings.Join(h.Kmsg[max(0, n-SimKmsgLines):], "\n")
	}
	byIndex := map[string]SimGPUState{}
	for i, st := range h.State {
		if st != (SimGPUState{}) {
			byIndex[strconv.Itoa(i)] = st
		}
	}
	if len(byIndex) > 0 {
		data, err := json.Marshal(byIndex)
		if err != nil {
			return nil, err
		}
		out[AnnotationGPUState] = string(data)
	}
	return out, nil
}

// xidText is the driver's text after the code, by XID, in its wording
// (see internal/gpufault's testdata); pid and name come first where the
// driver prints them.
var xidText = map[int]string{
	13:  "pid=%d, name=python3, Graphics SM Warp Exception on (GPC 2, TPC 4, SM 1): Out Of Range Address",
	31:  "pid=%d, name=python3, channel 0x00000009, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC3 GPCCLIENT_T1_1 faulted @ 0x7f3a_12345000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
	43:  "pid=%d, name=python3, Ch 00000008",
	45:  "pid=%d, name=python3, Ch 00000010",
	48:  "pid=%d, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
	63:  "pid='<unknown>', name=<unknown>, Row Remapper: New row (0x00000000000a3f20) marked for remapping, reset gpu to activate.",
	79:  "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
	94:  "pid=%d, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
	109: "pid=%d, name=python3, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
	119: "pid=%d, name=python3, Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).",
	154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}

// KmsgXID returns the /dev/kmsg records the driver writes for an XID of
// gpu: the XID line (and, for 79, the "fallen off the bus" line after it).
func KmsgXID(seq, usec int64, gpu repairv1.GPURef, code int) []string {
	addr := strings.TrimSuffix(gpu.PCIBusID, ".0")
	text, ok := xidText[code]
	if !ok {
		text = "pid='<unknown>', name=<unknown>, " + gpufault.Classify(code, nil).Mnemonic
	}
	if strings.Contains(text, "%d") {
		text = fmt.Sprintf(text, 40000+seq)
	}
	level := 4 // KERN_WARNING, as the driver logs XIDs
	if code == 79 {
		level = 3
	}
	lines := []string{fmt.Sprintf("%d,%d,%d,-;NVRM: Xid (PCI:%s): %d, %s", level, seq, usec, addr, code, text)}
	if code == 79 {
		lines = append(lines, fmt.Sprintf("3,%d,%d,-;NVRM: GPU %s: GPU has fallen off the bus.", seq+1, usec, gpu.PCIBusID))
	}
	return lines
}

// addXID appends an XID of GPU i to the kernel log, at now; the driver
// names the GPU's UUID before its first XID of the boot.
func (h *SimGPUHost) addXID(i, code int, now time.Time) {
	if h.Boot.Time.IsZero() {
		h.Boot.Time = now.UTC().Truncate(time.Second)
	}
	usec := max(now.Sub(h.Boot.Time).Microseconds(), 0)
	seq := h.nextSeq()
	gpu := SimGPU(h.Node, i)
	uuidLine := fmt.Sprintf("NVRM: GPU at PCI:%s: %s", strings.TrimSuffix(gpu.PCIBusID, ".0"), gpu.UUID)
	named := false
	for _, l := range h.Kmsg {
		named = named || strings.HasSuffix(l, uuidLine)
	}
	if !named {
		h.Kmsg = append(h.Kmsg, fmt.Sprintf("4,%d,%d,-;%s", seq, usec, uuidLine))
		seq++
	}
	h.Kmsg = append(h.Kmsg, KmsgXID(seq, usec, gpu, code)...)
	if n := len(h.Kmsg); n > SimKmsgLines {
		h.Kmsg = h.Kmsg[n-SimKmsgLines:]
	}
}

func (h *SimGPUHost) nextSeq() int64 {
	if n := len(h.Kmsg); n > 0 {
		if f := strings.SplitN(h.Kmsg[n-1], ",", 3); len(f) == 3 {
			if s, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				return s + 1
			}
		}
		return int64(n)
	}
	return 1
}

// DCGMMetrics renders dcgm-exporter's metrics for the host's GPUs, as the
// exporter writes them (labels, HELP and TYPE lines); a missing GPU is
// left out. DCGM_FI_DEV_XID_ERRORS is the last XID of the GPU in the
// kernel log of the boot.
func (h SimGPUHost) DCGMMetrics() string {
	last := map[string]int{}
	if events, _, err := gpufault.ScanKmsg(strings.NewReader(strings.Join(h.Kmsg, "\n"))); err == nil {
		for _, ev := range events {
			last[ev.PCIBusID] = ev.Code
		}
	}
	type family struct {
		name, typ, help string
		value           func(i int, st SimGPUState) uint64
	}
	b2u := func(b bool) uint64 {
		if b {
			return 1
		}
		return 0
	}
	families := []family{
		{"DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", func(i int, _ SimGPUState) uint64 { return uint64(30 + i) }},
		{gpufault.MetricXID, "gauge", "Value of the last XID error encountered.", func(i int, _ SimGPUState) uint64 {
			return uint64(last[SimGPU(h.Node, i).PCIBusID])
		}},
		{gpufault.MetricECCSBEVolatile, "counter", "Total number of single-bit volatile ECC errors.", func(int, SimGPUState) uint64 { return 0 }},
		{gpufault.MetricECCDBEVolatile, "counter", "Total number of double-bit volatile ECC errors.", func(_ int, st SimGPUState) uint64 { return st.VolatileDBE }},
		{gpufault.MetricRowRemapFailure, "gauge", "Whether remapping of rows has failed", func(_ int, st SimGPUState) uint64 { return b2u(st.RowRemapFailure) }},
		{gpufault.MetricRowRemapPending, "gauge", "Whether remapping of rows is pending", func(_ int, st SimGPUState) uint64 { return b2u(st.RowRemapPending) }},
	}
	var b strings.Builder
	for _, f := range families {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.typ)
		for i := range h.GPUs {
			st := h.State[i]
			if st.Missing {
				continue
			}
			g := SimGPU(h.Node, i)
			fmt.Fprintf(&b, "%s{gpu=\"%d\",UUID=\"%s\",pci_bus_id=\"%s\",device=\"nvidia%d\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"%s\",DCGM_FI_DRIVER_VERSION=\"570.124.06\"} %d\n",
				f.name, i, g.UUID, "0000"+strings.ToUpper(g.PCIBusID), i, h.Node, f.value(i, st))
		}
	}
	return b.String()
}

// Observe is what the node agent's sources would show on this host: the
// kernel log's XIDs dated from the boot, and the exporter's metrics read
// by the real parser.
func (h SimGPUHost) Observe() (agent.GPUObservation, error) {
	var obs agent.GPUObservation
	if len(h.Kmsg) > 0 {
		events, _, err := gpufault.ScanKmsg(strings.NewReader(strings.Join(h.Kmsg, "\n")))
		if err != nil {
			return obs, err
		}
		for _, ev := range events {
			at := h.Boot.Time
			if ev.KernelTimeUsec != gpufault.Unknown {
				at = at.Add(time.Duration(ev.KernelTimeUsec) * time.Microsecond)
			}
			obs.XIDs = append(obs.XIDs, agent.XIDObservation{Event: ev, Time: at})
		}
	}
	if h.GPUs == 0 {
		return obs, nil
	}
	health, _, err := gpufault.ParseDCGMMetrics(strings.NewReader(h.DCGMMetrics()))
	if err != nil {
		return obs, err
	}
	obs.DCGM = health
	for i := range h.GPUs {
		obs.KnownGPUs = append(obs.KnownGPUs, SimGPU(h.Node, i))
	}
	return obs, nil
}

// InjectXID makes the driver of node report XID code for GPU gpu now (one
// patch of the node's annotations).
func (c *Cluster) InjectXID(ctx context.Context, node string, gpu, code int) error {
	return c.updateSimGPUHost(ctx, node, func(h *SimGPUHost) error {
		if gpu < 0 || gpu >= h.GPUs {
			return fmt.Errorf("node %s has no GPU %d (%d GPUs)", node, gpu, h.GPUs)
		}
		h.addXID(gpu, code, c.simNow())
		return nil
	})
}

// SetGPUState changes the health of GPU gpu of node (one patch of the
// node's annotations), e.g. SetGPUState(ctx, "gpu-003", 5, func(s
// *SimGPUState) { s.Missing = true }).
func (c *Cluster) SetGPUState(ctx context.Context, node string, gpu int, fn func(*SimGPUState)) error {
	return c.updateSimGPUHost(ctx, node, func(h *SimGPUHost) error {
		if gpu < 0 || gpu >= h.GPUs {
			return fmt.Errorf("node %s has no GPU %d (%d GPUs)", node, gpu, h.GPUs)
		}
		st := h.State[gpu]
		fn(&st)
		h.State[gpu] = st
		return nil
	})
}

// ClearSimGPUs removes node's simulated kernel log and GPU state (one
// patch): a healthy GPU host, e.g. at the end of a test. GPUFault records
// stay; the agent sees healthy GPUs, and XIDs it counted stay as they are
// until a reset or reboot.
func (c *Cluster) ClearSimGPUs(ctx context.Context, node string) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null,%q:null,%q:null}}}`, AnnotationKmsg, AnnotationKmsgBoot, AnnotationGPUState)
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("clearing the simulated GPU host of node %s: %w", node, err)
	}
	return nil
}

// resetGPUs resets GPUs of node as nvidia-smi would: it fails for a GPU
// that is missing or whose reset fails; it clears the counters of the
// others except a broken one's (the reset "works", the fault stays).
func (c *Cluster) resetGPUs(ctx context.Context, node string, gpus []repairv1.GPURef) error {
	var failed []string
	err := c.updateSimGPUHost(ctx, node, func(h *SimGPUHost) error {
		failed = eachGPU(h, gpus, func(i int, st SimGPUState) string {
			switch {
			case st.Missing:
				return "not found (it fell off the bus)"
			case st.ResetFails:
				return "the reset failed"
			case st.Broken:
			default:
				st.VolatileDBE, st.RowRemapFailure, st.RowRemapPending = 0, false, false
				st.ResetSeq = h.nextSeq() - 1
				h.State[i] = st
			}
			return ""
		})
		return nil
	})
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("nvidia-smi --gpu-reset (simulated): %s", strings.Join(failed, "; "))
	}
	return nil
}

// validateGPUs is the simulated validation of gpus (what the node agent's
// Health and Diagnostic levels check on a real host): the GPU answers (on
// the bus), no uncorrectable ECC error since its reset, no failed row
// remap, no XID the driver reported since its reset (the device plugin's
// view), and not marked FailsValidation or Broken. Read-only.
func (c *Cluster) validateGPUs(ctx context.Context, node string, gpus []repairv1.GPURef, level repairv1.GPUValidationLevel) error {
	n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	h, err := ReadSimGPUHost(n)
	if err != nil {
		return err
	}
	unhealthy := simXIDSinceReset(h)
	failed := eachGPU(&h, gpus, func(i int, st SimGPUState) string {
		switch {
		case st.Missing:
			return "the driver does not answer for it (it fell off the bus)"
		case st.Broken || st.FailsValidation:
			if level == repairv1.GPUValidationDiagnostic {
				return "DCGM's diagnostic (dcgmi diag -r 1) failed"
			}
			return "nvidia-smi reports it unhealthy"
		case st.VolatileDBE > 0:
			return fmt.Sprintf("uncorrectable ECC errors since the reset: %d", st.VolatileDBE)
		case st.RowRemapFailure:
			return "a row remap failed"
		case unhealthy[i]:
			return "an XID since its reset"
		}
		return ""
	})
	if len(failed) > 0 {
		return fmt.Errorf("%s validation (simulated): %s", level, strings.Join(failed, "; "))
	}
	return nil
}

// eachGPU runs check on each of gpus (its index and state; check may
// change h.State) and returns the failures: "GPU <address>: <what check
// said>", or that the host has no such GPU.
func eachGPU(h *SimGPUHost, gpus []repairv1.GPURef, check func(i int, st SimGPUState) string) []string {
	var failed []string
	for _, g := range gpus {
		i, ok := h.index(g)
		if !ok {
			failed = append(failed, fmt.Sprintf("GPU %s: no such GPU on node %s", g.PCIBusID, h.Node))
			continue
		}
		if msg := check(i, h.State[i]); msg != "" {
			failed = append(failed, fmt.Sprintf("GPU %s: %s", g.PCIBusID, msg))
		}
	}
	return failed
}

// index finds a GPU of the host by its PCI address, else its index.
func (h SimGPUHost) index(g repairv1.GPURef) (int, bool) {
	if bus, ok := gpufault.NormalizePCIBusID(g.PCIBusID); ok {
		for i := range h.GPUs {
			if SimGPU(h.Node, i).PCIBusID == bus {
				return i, true
			}
		}
		return 0, false
	}
	if g.Index != nil && int(*g.Index) < h.GPUs && *g.Index >= 0 {
		return int(*g.Index), true
	}
	return 0, false
}

// updateSimGPUHost reads the node's GPU host, changes it with fn and writes
// it back: one merge patch of the annotations, on the version read (a
// conflict reads again).
func (c *Cluster) updateSimGPUHost(ctx context.Context, node string, fn func(*SimGPUHost) error) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading node %s: %w", node, err)
		}
		h, err := ReadSimGPUHost(n)
		if err != nil {
			return err
		}
		if err := fn(&h); err != nil {
			return err
		}
		if h.Boot.Time.IsZero() {
			h.Boot.Time = c.simNow().UTC().Truncate(time.Second)
		}
		ann, err := h.annotations()
		if err != nil {
			return err
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": n.ResourceVersion, "annotations": ann}})
		if err != nil {
			return err
		}
		if _, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("writing the simulated GPU host of node %s: %w", node, err)
		}
		return nil
	})
}

// ObserveGPUs implements the node agent's GPUSource for simulated nodes:
// what the node's annotations show (ReadSimGPUHost, Observe).
func (s SimExecutor) ObserveGPUs(_ context.Context, node *corev1.Node) (agent.GPUObservation, error) {
	h, err := ReadSimGPUHost(node)
	if err != nil {
		return agent.GPUObservation{}, err
	}
	return h.Observe()
}

// AnnotationGPUs on a pod of a simulated node names the GPUs the device
// plugin gave it, by index ("3", or "0,1"): kwok runs no device plugin, so
// a test or `gpufleet dev` says which GPU each nvidia.com/gpu pod holds, and
// the simulated agent reports it as the kubelet's pod-resources API would
// (device IDs = the GPUs' UUIDs).
const AnnotationGPUs = "sim.gpufleet.dev/gpus"

// SimGPUPods is what the kubelet's pod-resources API of node would report
// for its pods: the GPUs each running pod's AnnotationGPUs names, as
// nvidia.com/gpu device IDs (UUIDs). Finished pods hold nothing; an index
// the node does not have, or that is not a number, is left out.
func SimGPUPods(node *corev1.Node, pods []corev1.Pod) []agent.DeviceAllocation {
	n := simGPUCount(node)
	var out []agent.DeviceAllocation
	for i := range pods {
		p := &pods[i]
		v := p.Annotations[AnnotationGPUs]
		if v == "" || p.Spec.NodeName != node.Name || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		var ids []string
		for f := range strings.SplitSeq(v, ",") {
			idx, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || idx < 0 || idx >= n {
				continue
			}
			ids = append(ids, SimGPU(node.Name, idx).UUID)
		}
		if len(ids) > 0 {
			out = append(out, agent.DeviceAllocation{Pod: repairv1.PodRef{Namespace: p.Namespace, Name: p.Name},
				Resource: string(ResourceGPU), DeviceIDs: ids})
		}
	}
	return out
}

// GPUPods implements the agent's GPUPodsSource for simulated nodes: the
// node's pods (read from the API server) and their AnnotationGPUs.
func (s SimExecutor) GPUPods(ctx context.Context, node *corev1.Node) ([]agent.DeviceAllocation, error) {
	pods, err := s.Cluster.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of node %s: %w", node.Name, err)
	}
	return SimGPUPods(node, pods.Items), nil
}
