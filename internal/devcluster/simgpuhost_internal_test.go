package devcluster

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/gpufault"
)

var (
	simCreated = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	simT       = time.Date(2026, 12, 3, 10, 0, 0, 250_000_000, time.UTC)
)

// simHostCluster is a Cluster on a fake clientset with one simulated node
// of 8 GPUs, created at simCreated; the simulated kernel's clock is simT.
func simHostCluster(t *testing.T) (*Cluster, *fake.Clientset) {
	t.Helper()
	n := NodeSpec{Name: "gpu-003", GPUs: 8}.Node()
	n.CreationTimestamp = metav1.NewTime(simCreated)
	n.Status.NodeInfo.BootID = "boot-1"
	cs := fake.NewClientset(n)
	return &Cluster{Client: cs, simClock: func() time.Time { return simT }}, cs
}

func simNode(t *testing.T, c *Cluster) *corev1.Node {
	t.Helper()
	n, err := c.Client.CoreV1().Nodes().Get(t.Context(), "gpu-003", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func patches(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "patch" {
			n++
		}
	}
	return n
}

// TestInjectXIDKmsgRoundTrip: an injected XID is a /dev/kmsg record in the
// driver's wording that the real parser reads back (after the driver's
// UUID line), dated from the boot; each injection is one patch.
func TestInjectXIDKmsgRoundTrip(t *testing.T) {
	c, cs := simHostCluster(t)
	if err := c.InjectXID(t.Context(), "gpu-003", 3, 48); err != nil {
		t.Fatal(err)
	}
	if err := c.InjectXID(t.Context(), "gpu-003", 3, 13); err != nil {
		t.Fatal(err)
	}
	if n := patches(cs); n != 2 {
		t.Errorf("%d patches for two injections, want 2", n)
	}
	node := simNode(t, c)
	gpu := SimGPU("gpu-003", 3)
	usec := simT.Sub(simCreated).Microseconds()
	want := []string{
		"4,1," + itoa(usec) + ",-;NVRM: GPU at PCI:" + strings.TrimSuffix(gpu.PCIBusID, ".0") + ": " + gpu.UUID,
		"4,2," + itoa(usec) + ",-;NVRM: Xid (PCI:" + strings.TrimSuffix(gpu.PCIBusID, ".0") + "): 48, pid=40002, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
		"4,3," + itoa(usec) + ",-;NVRM: Xid (PCI:" + strings.TrimSuffix(gpu.PCIBusID, ".0") + "): 13, pid=40003, name=python3, Graphics SM Warp Exception on (GPC 2, TPC 4, SM 1): Out Of Range Address",
	}
	if diff := cmp.Diff(want, strings.Split(node.Annotations[AnnotationKmsg], "\n")); diff != "" {
		t.Errorf("kernel log (-want +got):\n%s", diff)
	}
	ev, ok := gpufault.ParseKmsgXID(strings.Split(node.Annotations[AnnotationKmsg], "\n")[1])
	if !ok || ev.Code != 48 || ev.PCIBusID != gpu.PCIBusID || ev.KernelTimeUsec != usec || ev.PID != 40002 || ev.FromUserspace {
		t.Errorf("parsed back: %+v, %t", ev, ok)
	}
	h, err := ReadSimGPUHost(node)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := h.Observe()
	if err != nil {
		t.Fatal(err)
	}
	if len(obs.XIDs) != 2 || obs.XIDs[0].Event.UUID != gpu.UUID || !obs.XIDs[0].Time.Equal(simT.Truncate(time.Microsecond)) {
		t.Errorf("observed XIDs %+v, want 48 and 13 of %s at %v", obs.XIDs, gpu.UUID, simT)
	}
	if err := c.InjectXID(t.Context(), "gpu-003", 8, 48); err == nil {
		t.Errorf("an XID of GPU 8 of an 8-GPU node: want an error")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestKmsgXIDWording: every code has a record the real parser reads, and
// 79 adds the driver's "fallen off the bus" line.
func TestKmsgXIDWording(t *testing.T) {
	gpu := SimGPU("n", 0)
	for _, code := range []int{13, 31, 43, 45, 48, 63, 64, 79, 94, 95, 109, 119, 154, 999} {
		lines := KmsgXID(7, 1000, gpu, code)
		ev, ok := gpufault.ParseKmsgXID(lines[0])
		if !ok || ev.Code != code || ev.PCIBusID != gpu.PCIBusID || ev.Seq != 7 {
			t.Errorf("XID %d: %q parses as %+v, %t", code, lines[0], ev, ok)
		}
	}
	events, _, err := gpufault.ScanKmsg(strings.NewReader(strings.Join(KmsgXID(7, 1000, gpu, 79), "\n")))
	if err != nil || len(events) != 1 || events[0].Code != 79 {
		t.Errorf("XID 79 with its second line: %+v, %v; want one event", events, err)
	}
}

// TestSimExporterParsedByTheRealParser: the simulated exporter's text for
// the GPU state is what gpufault.ParseDCGMMetrics reads: every GPU but the
// missing one, with the SimGPU identities and the counters.
func TestSimExporterParsedByTheRealParser(t *testing.T) {
	c, _ := simHostCluster(t)
	if err := c.SetGPUState(t.Context(), "gpu-003", 3, func(s *SimGPUState) { s.VolatileDBE = 2 }); err != nil {
		t.Fatal(err)
	}
	if err := c.SetGPUState(t.Context(), "gpu-003", 5, func(s *SimGPUState) { s.Missing = true }); err != nil {
		t.Fatal(err)
	}
	if err := c.SetGPUState(t.Context(), "gpu-003", 6, func(s *SimGPUState) { s.RowRemapFailure, s.RowRemapPending = true, true }); err != nil {
		t.Fatal(err)
	}
	if err := c.InjectXID(t.Context(), "gpu-003", 1, 13); err != nil {
		t.Fatal(err)
	}
	node := simNode(t, c)
	if got := node.Annotations[AnnotationGPUState]; got != `{"3":{"volatileDBE":2},"5":{"missing":true},"6":{"rowRemapFailure":true,"rowRemapPending":true}}` {
		t.Errorf("gpu-state annotation %s", got)
	}
	h, err := ReadSimGPUHost(node)
	if err != nil {
		t.Fatal(err)
	}
	health, stats, err := gpufault.ParseDCGMMetrics(strings.NewReader(h.DCGMMetrics()))
	if err != nil || stats.Unreadable != 0 || stats.NotGPU != 0 {
		t.Fatalf("parse: %+v, %v", stats, err)
	}
	byIndex := map[int]gpufault.GPUHealth{}
	for k, v := range health {
		g := SimGPU("gpu-003", k.Index)
		if k.UUID != g.UUID || k.PCIBusID != g.PCIBusID {
			t.Errorf("GPU %d: key %+v, want %s %s", k.Index, k, g.UUID, g.PCIBusID)
		}
		byIndex[k.Index] = v
	}
	if _, ok := byIndex[5]; ok || len(byIndex) != 7 {
		t.Errorf("GPUs reported %d (GPU 5 there: %t), want 7 without the missing one", len(byIndex), ok)
	}
	if g := byIndex[3]; g.UncorrectableECCVolatile != 2 || g.ModelName == "" || g.Hostname != "gpu-003" || g.DriverVersion == "" {
		t.Errorf("GPU 3: %+v", g)
	}
	if g := byIndex[6]; !g.RowRemapFailure || !g.RowRemapPending {
		t.Errorf("GPU 6: %+v", g)
	}
	if g := byIndex[1]; g.LastXID != 13 {
		t.Errorf("GPU 1: last XID %d, want 13", g.LastXID)
	}
	var got []string
	for _, f := range gpufault.Assess(health, 8) {
		got = append(got, string(f.Class)+" "+f.Counter)
	}
	want := []string{"Reboot GPUMissing", "Application DCGM_FI_DEV_XID_ERRORS", "ResetGPU DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
		"Replace DCGM_FI_DEV_ROW_REMAP_FAILURE", "Informational DCGM_FI_DEV_ROW_REMAP_PENDING"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("faults the real assessment finds (-want +got):\n%s", diff)
	}
}

// TestSimGPUHostAfterAReboot: a new boot ID empties the kernel log and
// clears every GPU's state but a broken one's; the next injection starts
// the new boot's log.
func TestSimGPUHostAfterAReboot(t *testing.T) {
	c, _ := simHostCluster(t)
	ctx := t.Context()
	for _, err := range []error{
		c.InjectXID(ctx, "gpu-003", 3, 48),
		c.SetGPUState(ctx, "gpu-003", 3, func(s *SimGPUState) { s.VolatileDBE = 1 }),
		c.SetGPUState(ctx, "gpu-003", 5, func(s *SimGPUState) { s.Missing, s.ResetFails = true, true }),
		c.SetGPUState(ctx, "gpu-003", 6, func(s *SimGPUState) { s.VolatileDBE, s.Broken = 4, true }),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	node := simNode(t, c)
	node.Status.NodeInfo.BootID = "boot-2"
	if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h, err := ReadSimGPUHost(simNode(t, c))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(SimGPUHost{Node: "gpu-003", GPUs: 8, Boot: SimBoot{BootID: "boot-2"},
		State: map[int]SimGPUState{6: {VolatileDBE: 4, Broken: true}}}, h); diff != "" {
		t.Errorf("host after the reboot (-want +got):\n%s", diff)
	}
	obs, err := h.Observe()
	if err != nil || len(obs.XIDs) != 0 || len(obs.DCGM) != 8 {
		t.Errorf("observed after the reboot: %d XIDs, %d GPUs, %v; want none, 8", len(obs.XIDs), len(obs.DCGM), err)
	}
	c.simClock = func() time.Time { return simT.Add(time.Hour) }
	if err := c.InjectXID(ctx, "gpu-003", 2, 79); err != nil {
		t.Fatal(err)
	}
	n := simNode(t, c)
	if got := n.Annotations[AnnotationKmsgBoot]; got != `{"bootID":"boot-2","time":"2026-12-03T11:00:00Z"}` {
		t.Errorf("boot annotation %s", got)
	}
	if lines := strings.Split(n.Annotations[AnnotationKmsg], "\n"); len(lines) != 3 || !strings.HasPrefix(lines[1], "3,2,250000,-;NVRM: Xid (PCI:0000:20:00): 79") {
		t.Errorf("the new boot's log: %q", lines)
	}
}

// TestSimKmsgKeepsTheLastLines: the log keeps its last SimKmsgLines
// records (seq 72: 70 XIDs, the UUID line, and the UUID line again once the
// first one has left the log, so that the GPU stays named).
func TestSimKmsgKeepsTheLastLines(t *testing.T) {
	c, _ := simHostCluster(t)
	for range 70 {
		if err := c.InjectXID(t.Context(), "gpu-003", 0, 13); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(simNode(t, c).Annotations[AnnotationKmsg], "\n")
	if len(lines) != SimKmsgLines || !strings.HasPrefix(lines[len(lines)-1], "4,72,") {
		t.Errorf("%d lines, last %q; want the last %d", len(lines), lines[len(lines)-1], SimKmsgLines)
	}
}

func TestSimExecutorResetGPU(t *testing.T) {
	gpu := func(i int) repairv1.GPURef { return SimGPU("gpu-003", i) }
	tests := map[string]struct {
		state     map[int]SimGPUState
		gpus      []repairv1.GPURef
		wantState string
		wantError string
	}{
		"the counters of the reset GPUs clear": {
			state: map[int]SimGPUState{3: {VolatileDBE: 2, RowRemapPending: true}, 4: {VolatileDBE: 1}},
			gpus:  []repairv1.GPURef{gpu(3)}, wantState: `{"4":{"volatileDBE":1}}`,
		},
		"by index when no address is given": {
			state: map[int]SimGPUState{3: {VolatileDBE: 2}},
			gpus:  []repairv1.GPURef{{Index: ptr.To[int32](3)}},
		},
		"a missing GPU: the reset fails": {
			state: map[int]SimGPUState{5: {Missing: true}, 3: {VolatileDBE: 1}},
			gpus:  []repairv1.GPURef{gpu(5), gpu(3)}, wantState: `{"5":{"missing":true}}`,
			wantError: "nvidia-smi --gpu-reset (simulated): GPU 0000:38:00.0: not found (it fell off the bus)",
		},
		"a reset that fails": {
			state: map[int]SimGPUState{3: {VolatileDBE: 1, ResetFails: true}},
			gpus:  []repairv1.GPURef{gpu(3)}, wantState: `{"3":{"volatileDBE":1,"resetFails":true}}`,
			wantError: "nvidia-smi --gpu-reset (simulated): GPU 0000:28:00.0: the reset failed",
		},
		"a broken GPU: the reset works, the fault stays": {
			state: map[int]SimGPUState{3: {VolatileDBE: 1, Broken: true}},
			gpus:  []repairv1.GPURef{gpu(3)}, wantState: `{"3":{"volatileDBE":1,"broken":true}}`,
		},
		"a GPU the node does not have": {
			gpus:      []repairv1.GPURef{{PCIBusID: "0000:ff:00.0"}},
			wantError: "nvidia-smi --gpu-reset (simulated): GPU 0000:ff:00.0: no such GPU on node gpu-003",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, _ := simHostCluster(t)
			for i, st := range tc.state {
				if err := c.SetGPUState(t.Context(), "gpu-003", i, func(s *SimGPUState) { *s = st }); err != nil {
					t.Fatal(err)
				}
			}
			err := SimExecutor{Cluster: c}.Execute(context.Background(), simNode(t, c), repairv1.ActionResetGPU, tc.gpus)
			if got := errString(err); got != tc.wantError {
				t.Errorf("error %q, want %q", got, tc.wantError)
			}
			if got := simNode(t, c).Annotations[AnnotationGPUState]; got != tc.wantState {
				t.Errorf("gpu-state %s, want %s", got, tc.wantState)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestReadSimGPUHostRejectsBadAnnotations(t *testing.T) {
	for k, v := range map[string]string{AnnotationGPUState: `{"x":{}}`, AnnotationKmsgBoot: `not json`} {
		n := NodeSpec{Name: "n", GPUs: 1}.Node()
		n.Annotations[k] = v
		if _, err := (SimExecutor{}).ObserveGPUs(context.Background(), n); err == nil {
			t.Errorf("%s=%s: want an error", k, v)
		}
	}
}

// TestSimHostThroughTheAgentCore: what the simulated host shows, through
// the agent's core, is one record per faulty GPU with the SimGPU identity.
func TestSimHostThroughTheAgentCore(t *testing.T) {
	c, _ := simHostCluster(t)
	if err := c.InjectXID(t.Context(), "gpu-003", 3, 48); err != nil {
		t.Fatal(err)
	}
	if err := c.SetGPUState(t.Context(), "gpu-003", 5, func(s *SimGPUState) { s.Missing = true }); err != nil {
		t.Fatal(err)
	}
	node := simNode(t, c)
	obs, err := SimExecutor{}.ObserveGPUs(t.Context(), node)
	if err != nil {
		t.Fatal(err)
	}
	writes := agent.DetectGPUFaults(agent.GPUState{Node: node.Name, BootID: "boot-1", Capacity: 8, Observed: obs}, simT)
	var got []string
	for _, w := range writes {
		got = append(got, w.Name+" "+w.Spec.GPU.Describe()+" "+string(w.Status.Class))
	}
	g3, g5 := SimGPU("gpu-003", 3), SimGPU("gpu-003", 5)
	want := []string{"gpu-003-0000-28-00-0 GPU 3 (" + g3.UUID + ", 0000:28:00.0) ResetGPU",
		"gpu-003-0000-38-00-0 GPU 5 (" + g5.UUID + ", 0000:38:00.0) Reboot"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

func TestClearSimGPUs(t *testing.T) {
	c, _ := simHostCluster(t)
	if err := c.InjectXID(t.Context(), "gpu-003", 3, 48); err != nil {
		t.Fatal(err)
	}
	if err := c.SetGPUState(t.Context(), "gpu-003", 3, func(s *SimGPUState) { s.Broken = true }); err != nil {
		t.Fatal(err)
	}
	if err := c.ClearSimGPUs(t.Context(), "gpu-003"); err != nil {
		t.Fatal(err)
	}
	n := simNode(t, c)
	for _, k := range []string{AnnotationKmsg, AnnotationKmsgBoot, AnnotationGPUState} {
		if v, ok := n.Annotations[k]; ok {
			t.Errorf("%s=%s left", k, v)
		}
	}
	if n.Annotations["node.alpha.kubernetes.io/ttl"] != "0" {
		t.Errorf("other annotations removed: %v", n.Annotations)
	}
}

func TestSimGPUPods(t *testing.T) {
	node := NodeSpec{Name: "gpu-003", GPUs: 8}.Node()
	gpuPod := func(name, gpus string, mut func(*corev1.Pod)) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, Annotations: map[string]string{AnnotationGPUs: gpus}},
			Spec: corev1.PodSpec{NodeName: "gpu-003"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if mut != nil {
			mut(&p)
		}
		return p
	}
	uuid := func(i int) string { return SimGPU("gpu-003", i).UUID }
	tests := map[string]struct {
		pods []corev1.Pod
		want []agent.DeviceAllocation
	}{
		"one GPU": {
			pods: []corev1.Pod{gpuPod("train", "3", nil)},
			want: []agent.DeviceAllocation{{Pod: repairv1.PodRef{Namespace: "ml", Name: "train"}, Resource: "nvidia.com/gpu", DeviceIDs: []string{uuid(3)}}},
		},
		"several GPUs, spaces allowed": {
			pods: []corev1.Pod{gpuPod("train", "0, 1", nil)},
			want: []agent.DeviceAllocation{{Pod: repairv1.PodRef{Namespace: "ml", Name: "train"}, Resource: "nvidia.com/gpu", DeviceIDs: []string{uuid(0), uuid(1)}}},
		},
		"indices the node does not have, or not numbers, are left out": {
			pods: []corev1.Pod{gpuPod("a", "8", nil), gpuPod("b", "-1,x", nil), gpuPod("c", "x,7", nil)},
			want: []agent.DeviceAllocation{{Pod: repairv1.PodRef{Namespace: "ml", Name: "c"}, Resource: "nvidia.com/gpu", DeviceIDs: []string{uuid(7)}}},
		},
		"finished pods, pods of other nodes and pods without the annotation hold nothing": {
			pods: []corev1.Pod{
				gpuPod("done", "1", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
				gpuPod("failed", "1", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
				gpuPod("elsewhere", "1", func(p *corev1.Pod) { p.Spec.NodeName = "gpu-004" }),
				gpuPod("plain", "", nil),
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, SimGPUPods(node, tc.pods)); diff != "" {
				t.Errorf("allocations (-want +got):\n%s", diff)
			}
		})
	}

	// The simulated agent's source reads the node's pods from the API.
	c, cs := simHostCluster(t)
	p := gpuPod("train", "3", nil)
	if _, err := cs.CoreV1().Pods("ml").Create(t.Context(), &p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var src agent.GPUPodsSource = SimExecutor{Cluster: c}
	got, err := src.GPUPods(t.Context(), simNode(t, c))
	if err != nil || len(got) != 1 || got[0].DeviceIDs[0] != uuid(3) {
		t.Errorf("SimExecutor.GPUPods: %+v, %v", got, err)
	}
}
