package fleet

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var now = time.Date(2026, 12, 3, 18, 0, 0, 0, time.UTC)

func ago(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }

// Builders.

// node is a GPU node of pool, Ready, with 8 GPUs and opts.
func node(name, pool string, opts ...testobj.NodeOption) *corev1.Node {
	return testobj.Node(name, append([]testobj.NodeOption{testobj.Pool(pool), testobj.NodeCreated(now.Add(-48 * time.Hour)),
		testobj.GPUs(8, 8), testobj.Ready(now.Add(-47 * time.Hour))}, opts...)...)
}

var (
	notReady = testobj.NotReady(now.Add(-3 * time.Minute))
	cordoned = testobj.Unschedulable()
)

// stack deploys the first k components of the GPU stack on the node.
func stack(k int) testobj.NodeOption {
	return func(n *corev1.Node) {
		for _, c := range nvidiav1.Components[:k] {
			n.Labels[c.DeployLabel] = "true"
		}
	}
}

func stackPodOn(node, component string, ready bool, since time.Duration) *corev1.Pod {
	p := gpuPod("gpufleet-system", node+"-"+component, node, 0)
	p.Labels = map[string]string{nvidiav1.LabelManagedBy: "gpufleet", nvidiav1.LabelComponent: component}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: ago(since)}}
	return p
}

func gpuPod(ns, name, node string, gpus int64) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: ago(time.Hour)},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if gpus > 0 {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{ResourceGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}
	}
	return p
}

func finished(p *corev1.Pod) *corev1.Pod {
	p.Status.Phase = corev1.PodSucceeded
	return p
}

func claim(node string, devices int) *resourcev1.ResourceClaim {
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "claim-" + node}}
	a := &resourcev1.AllocationResult{NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}}
	for i := range devices {
		a.Devices.Results = append(a.Devices.Results, resourcev1.DeviceRequestAllocationResult{Driver: DRADriver, Pool: node, Device: fmt.Sprintf("gpu-%d", i)})
	}
	c.Status.Allocation = a
	return c
}

func nm(name, node, requestor string, phase maintenancev1.Phase, message string, created time.Duration) *maintenancev1.NodeMaintenance {
	m := testobj.NodeMaintenance(name, node, testobj.Requestor(requestor), testobj.Created(now.Add(-created)), testobj.Finalizer(),
		testobj.Drain(maintenancev1.DrainSpec{}), testobj.Phase(phase))
	m.Status.Conditions[0].Message, m.Status.Conditions[0].LastTransitionTime = message, ago(created-time.Minute)
	if phase != maintenancev1.PhasePending {
		m.Status.ScheduledTime = ptr.To(ago(created - 30*time.Second))
	}
	if phase == maintenancev1.PhaseDraining {
		m.Status.Drain = &maintenancev1.DrainStatus{TotalPods: 10, EvictionPods: 4, DrainProgress: 50, StartTime: ptr.To(ago(created - time.Minute))}
	}
	return m
}

func repair(name, node string, phase repairv1.Phase, since time.Duration) *repairv1.NodeRepair {
	return &repairv1.NodeRepair{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: ago(since - time.Minute)},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Pool: "pool-b", Policy: "default", Actions: []repairv1.Action{repairv1.ActionRestartKubelet, repairv1.ActionReboot},
			Fault: repairv1.Fault{Rule: "kubelet-down", ConditionType: "Ready", Status: "Unknown", Reason: "NodeStatusUnknown", Since: ago(since)}},
		Status: repairv1.NodeRepairStatus{Phase: phase, Timeline: []repairv1.TimelineEntry{
			{Time: ago(since - 2*time.Minute), Step: "RestartKubelet", Outcome: "Failed", Message: "node still NotReady"},
			{Time: ago(since - 3*time.Minute), Step: "Reboot", Outcome: "Requested"},
		}},
	}
}

func fault(name, node string, class repairv1.GPUFaultClass) *repairv1.GPUFault {
	return &repairv1.GPUFault{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       repairv1.GPUFaultSpec{NodeName: node, GPU: repairv1.GPURef{Index: ptr.To[int32](3), PCIBusID: "0000:1b:00.0"}},
		Status: repairv1.GPUFaultStatus{Class: class, Faults: []repairv1.GPUFaultEntry{{
			Code: 48, Class: class, Meaning: "double bit ECC error", FirstSeen: ago(20 * time.Minute), LastSeen: ago(10 * time.Minute), Count: 2, Active: true,
		}}},
	}
}

// fleetSnapshot is a small fleet with one node in each state.
func fleetSnapshot() *Snapshot {
	return &Snapshot{
		Nodes: []*corev1.Node{
			node("gpu-000", "pool-a", stack(4)),
			node("gpu-001", "pool-a", stack(4), cordoned),
			node("gpu-002", "pool-a", stack(3), cordoned),
			node("gpu-003", "pool-b", stack(4), notReady),
			node("gpu-004", "pool-b", stack(4), notReady),
			node("gpu-005", "pool-b", stack(2)),
			node("gpu-006", "pool-b", stack(4), testobj.Labels(map[string]string{nvidiav1.LabelUpgradeState: "failed"})),
			node("gpu-007", "pool-c", notReady),
			node("gpu-008", "pool-c", stack(4), cordoned),
			node("cpu-000", "", func(n *corev1.Node) { n.Status.Capacity, n.Status.Allocatable = nil, nil }),
		},
		Pods: []*corev1.Pod{
			gpuPod("ml", "train-0", "gpu-000", 4), gpuPod("ml", "train-1", "gpu-000", 2), finished(gpuPod("ml", "done", "gpu-000", 8)),
			stackPodOn("gpu-000", nvidiav1.Driver, true, time.Hour), stackPodOn("gpu-000", nvidiav1.ContainerToolkit, true, time.Hour),
			stackPodOn("gpu-000", nvidiav1.DevicePlugin, true, time.Hour), stackPodOn("gpu-000", nvidiav1.Validator, true, time.Hour),
			stackPodOn("gpu-005", nvidiav1.Driver, true, time.Hour), stackPodOn("gpu-005", nvidiav1.ContainerToolkit, false, 30*time.Minute),
			stackPodOn("gpu-002", nvidiav1.Driver, true, time.Hour), stackPodOn("gpu-002", nvidiav1.ContainerToolkit, true, time.Hour),
			stackPodOn("gpu-002", nvidiav1.DevicePlugin, false, time.Minute),
		},
		Claims: []*resourcev1.ResourceClaim{claim("gpu-001", 2)},
		Maintenances: []*maintenancev1.NodeMaintenance{
			nm("upgrade-1", "gpu-001", "gpu-operator.gpufleet.dev", maintenancev1.PhaseReady, "", 20*time.Minute),
			nm("upgrade-2", "gpu-002", "gpu-operator.gpufleet.dev", maintenancev1.PhaseDraining, "", 5*time.Minute),
			nm("human-2", "gpu-002", "alice.example.com", maintenancev1.PhasePending, "maxParallelOperations budget exhausted: 2/2 in progress", 4*time.Minute),
			nm("human-5", "gpu-005", "alice.example.com", maintenancev1.PhasePending, "maxUnavailable budget exhausted: 3/3 nodes unavailable", 2*time.Minute),
		},
		Repairs: []*repairv1.NodeRepair{
			repair("gpu-003-kubelet-down", "gpu-003", repairv1.PhaseRepairing, 7*time.Minute),
			repair("gpu-004-kubelet-down", "gpu-004", repairv1.PhaseRecoveryFailed, 2*time.Hour),
			repair("gpu-000-old", "gpu-000", repairv1.PhaseSucceeded, 30*time.Hour),
		},
		Faults: []*repairv1.GPUFault{
			fault("gpu-000-gpu3", "gpu-000", repairv1.GPUClassInformational),
			fault("gpu-006-gpu3", "gpu-006", repairv1.GPUClassResetGPU),
		},
		Unavailable: map[Kind]string{},
	}
}

func TestBuildStates(t *testing.T) {
	f := Build(fleetSnapshot(), now)
	got := map[string]State{}
	for _, r := range f.Rows {
		got[r.Node] = r.State
	}
	want := map[string]State{
		"gpu-000": StateReady, "gpu-001": StateInMaintenance, "gpu-002": StateDraining, "gpu-003": StateRepairing,
		"gpu-004": StateRecoveryFailed, "gpu-005": StateDegradedStack, "gpu-006": StateDegradedStack, "gpu-007": StateNotReady,
		"gpu-008": StateCordoned, "cpu-000": StateReady,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("states (-want +got):\n%s", d)
	}
	wantSum := Summary{Nodes: 10, ReadyForWork: 2, InMaintenance: 2, Draining: 1, Repairing: 2, RecoveryFailed: 1, Degraded: 3, NotReady: 1,
		DegradedStack: 2, Cordoned: 1, GPUs: 72, GPUsInUse: 8, GPUsFaulty: 1,
		Pools: map[string]int{"": 1, "pool-a": 3, "pool-b": 4, "pool-c": 2}}
	if d := cmp.Diff(wantSum, f.Summary); d != "" {
		t.Errorf("summary (-want +got):\n%s", d)
	}
}

func TestBuildRow(t *testing.T) {
	tests := map[string]struct {
		snap            *Snapshot
		node            string
		wantInUse       *int64
		wantFaulty      *int64
		wantStack       string
		wantMaintenance string
		wantRepair      string
	}{
		"pods' GPU requests count, finished pods do not": {
			snap: fleetSnapshot(), node: "gpu-000", wantInUse: ptr.To[int64](6), wantFaulty: ptr.To[int64](0),
			wantStack: "driver ✓ toolkit ✓ plugin ✓ validator ✓", wantMaintenance: "-", wantRepair: "-",
		},
		"DRA claims count on the node they are allocated on": {
			snap: fleetSnapshot(), node: "gpu-001", wantInUse: ptr.To[int64](2), wantFaulty: ptr.To[int64](0),
			wantStack: "driver … toolkit … plugin … validator …", wantMaintenance: "gpu-operator.gpufleet.dev Ready", wantRepair: "-",
		},
		"the maintenance in progress wins over a pending one": {
			snap: fleetSnapshot(), node: "gpu-002", wantInUse: ptr.To[int64](0), wantFaulty: ptr.To[int64](0),
			wantStack: "driver ✓ toolkit ✓ plugin … validator -", wantMaintenance: "gpu-operator.gpufleet.dev Draining 50% +1", wantRepair: "-",
		},
		"a pending maintenance says why it waits; a stack pod not Ready for 30m is stuck": {
			snap: fleetSnapshot(), node: "gpu-005", wantInUse: ptr.To[int64](0), wantFaulty: ptr.To[int64](0),
			wantStack:       "driver ✓ toolkit ✗ plugin - validator -",
			wantMaintenance: "alice.example.com Pending: maxUnavailable budget exhausted: 3/3 nodes unavailable", wantRepair: "-",
		},
		"an open repair, not the succeeded one": {
			snap: fleetSnapshot(), node: "gpu-004", wantInUse: ptr.To[int64](0), wantFaulty: ptr.To[int64](0),
			wantStack: "driver … toolkit … plugin … validator …", wantMaintenance: "-", wantRepair: "RecoveryFailed kubelet-down for 2h",
		},
		"a GPU that needs repair is faulty; a failed driver upgrade shows": {
			snap: fleetSnapshot(), node: "gpu-006", wantInUse: ptr.To[int64](0), wantFaulty: ptr.To[int64](1),
			wantStack: "driver ✗ toolkit … plugin … validator …", wantMaintenance: "-", wantRepair: "-",
		},
		"kinds that cannot be read are unknown, not zero": {
			snap: func() *Snapshot {
				s := fleetSnapshot()
				s.Unavailable = map[Kind]string{KindPod: "forbidden", KindGPUFault: "not installed"}
				s.Pods, s.Faults = nil, nil
				return s
			}(),
			node: "gpu-000", wantStack: "driver … toolkit … plugin … validator …", wantMaintenance: "-", wantRepair: "-",
		},
		"a node without a GPU stack": {
			snap: fleetSnapshot(), node: "gpu-007", wantInUse: ptr.To[int64](0), wantFaulty: ptr.To[int64](0),
			wantStack: "-", wantMaintenance: "-", wantRepair: "-",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := Build(tc.snap, now)
			var r *Row
			for i := range f.Rows {
				if f.Rows[i].Node == tc.node {
					r = &f.Rows[i]
				}
			}
			if r == nil {
				t.Fatalf("no row for %s", tc.node)
			}
			if d := cmp.Diff(tc.wantInUse, r.GPUs.InUse); d != "" {
				t.Errorf("in use (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantFaulty, r.GPUs.Faulty); d != "" {
				t.Errorf("faulty (-want +got):\n%s", d)
			}
			if got := StackCell(r.Stack, false); got != tc.wantStack {
				t.Errorf("stack %q, want %q", got, tc.wantStack)
			}
			if got := MaintenanceCell(r.Maintenance); got != tc.wantMaintenance {
				t.Errorf("maintenance %q, want %q", got, tc.wantMaintenance)
			}
			if got := RepairCell(r.Repair, now); got != tc.wantRepair {
				t.Errorf("repair %q, want %q", got, tc.wantRepair)
			}
		})
	}
}

func TestFilter(t *testing.T) {
	tests := map[string]struct {
		filter  Filter
		want    []string
		wantErr bool
	}{
		"all, by name":                       {filter: Filter{}, want: []string{"cpu-000", "gpu-000", "gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-005", "gpu-006", "gpu-007", "gpu-008"}},
		"one pool":                           {filter: Filter{Pools: []string{"pool-c"}}, want: []string{"gpu-007", "gpu-008"}},
		"problems, by state":                 {filter: Filter{Problems: true, SortBy: SortByState}, want: []string{"gpu-004", "gpu-003", "gpu-002", "gpu-001", "gpu-007", "gpu-005", "gpu-006", "gpu-008"}},
		"pools, by pool":                     {filter: Filter{Pools: []string{"pool-b", "pool-a"}, SortBy: SortByPool}, want: []string{"gpu-000", "gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-005", "gpu-006"}},
		"an unknown order":                   {filter: Filter{SortBy: "age"}, wantErr: true},
		"ready nodes with problems are kept": {filter: Filter{Problems: true, Pools: []string{"pool-a"}}, want: []string{"gpu-001", "gpu-002"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := Build(fleetSnapshot(), now)
			err := tc.filter.Apply(f)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %t", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			var got []string
			for _, r := range f.Rows {
				got = append(got, r.Node)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("rows (-want +got):\n%s", d)
			}
			if f.Summary.Nodes != len(got) {
				t.Errorf("summary counts %d nodes, %d shown", f.Summary.Nodes, len(got))
			}
		})
	}
}

func TestOutputFormats(t *testing.T) {
	f := Build(fleetSnapshot(), now)
	for _, o := range []string{"json", "yaml"} {
		var out bytes.Buffer
		if err := Write(&out, &out, f, o, now); err != nil {
			t.Fatalf("-o %s: %v", o, err)
		}
		if !bytes.Contains(out.Bytes(), []byte("FleetStatus")) || !bytes.Contains(out.Bytes(), []byte("gpu-004")) {
			t.Errorf("-o %s lacks the kind or a node:\n%s", o, out.String())
		}
	}
	if err := Write(&bytes.Buffer{}, &bytes.Buffer{}, f, "xml", now); err == nil {
		t.Error("-o xml must be refused")
	}
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/fleet -run %s -update to write it)", err, t.Name())
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("%s differs (-want +got; -update rewrites it):\n%s", path, d)
	}
}

func TestTableGolden(t *testing.T) {
	for name, wide := range map[string]bool{"status.golden": false, "status-wide.golden": true} {
		t.Run(name, func(t *testing.T) {
			s := fleetSnapshot()
			s.Unavailable = map[Kind]string{KindNodeRepair: "not installed in the cluster (no such API); shown as -"}
			s.Repairs = nil
			f := Build(s, now)
			var out bytes.Buffer
			output := OutputTable
			if wide {
				output = OutputWide
			}
			if err := Write(&out, &out, f, output, now); err != nil {
				t.Fatal(err)
			}
			golden(t, name, out.Bytes())
		})
	}
	t.Run("status-all.golden", func(t *testing.T) {
		var out bytes.Buffer
		if err := Write(&out, &out, Build(fleetSnapshot(), now), OutputTable, now); err != nil {
			t.Fatal(err)
		}
		golden(t, "status-all.golden", out.Bytes())
	})
}

// BenchmarkBuild builds and prints the view of 1,000, 3,000 and 10,000
// GPU nodes with 8 pods each (4 GPU stack, 4 workload), a NodeMaintenance
// on a tenth, a repair on a fiftieth and a GPU fault on a twentieth of
// them: the time should grow linearly with the nodes.
func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{1000, 3000, 10000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { benchmarkBuild(b, n) })
	}
}

func benchmarkBuild(b *testing.B, n int) {
	s := &Snapshot{Unavailable: map[Kind]string{}}
	for i := range n {
		name := fmt.Sprintf("gpu-%03d", i)
		s.Nodes = append(s.Nodes, node(name, fmt.Sprintf("pool-%d", i%8), stack(4)))
		for _, c := range nvidiav1.Components[:4] {
			s.Pods = append(s.Pods, stackPodOn(name, c.Key, true, time.Hour))
		}
		for j := range 4 {
			s.Pods = append(s.Pods, gpuPod("ml", fmt.Sprintf("%s-%d", name, j), name, 2))
		}
		if i%10 == 0 {
			s.Maintenances = append(s.Maintenances, nm("m-"+name, name, "gpu-operator.gpufleet.dev", maintenancev1.PhaseDraining, "", time.Minute))
		}
		if i%50 == 0 {
			s.Repairs = append(s.Repairs, repair("r-"+name, name, repairv1.PhaseRepairing, time.Minute))
		}
		if i%20 == 0 {
			s.Faults = append(s.Faults, fault("f-"+name, name, repairv1.GPUClassResetGPU))
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		f := Build(s, now)
		var out bytes.Buffer
		if err := WriteTable(&out, f, false, now); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStackOfWaitingIsNotStuck: every component starts at once and waits
// for the ones it needs; only the first one that fails is Stuck, those
// behind it are Pending however long they wait. A dependency the host
// provides (deploy label false) is not waited for.
func TestStackOfWaitingIsNotStuck(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	old := now.Add(-2 * StackStuckAfter)
	labels := map[string]string{}
	for _, c := range nvidiav1.Components[:3] { // driver, toolkit, device plugin
		labels[c.DeployLabel] = "true"
	}
	statusOf := func(out []Component, key string) ComponentStatus {
		for _, c := range out {
			if c.Name == stackNames[key] {
				return c.Status
			}
		}
		return ""
	}
	tests := map[string]struct {
		hostDriver  bool
		pods        map[string]stackPod
		want        map[string]ComponentStatus
		wantRecheck time.Time
	}{
		"driver starting: Pending, Stuck once it has been not Ready for StackStuckAfter": {
			pods:        map[string]stackPod{nvidiav1.Driver: {since: now.Add(-time.Minute)}},
			want:        map[string]ComponentStatus{nvidiav1.Driver: ComponentPending, nvidiav1.ContainerToolkit: ComponentPending},
			wantRecheck: now.Add(-time.Minute + StackStuckAfter),
		},
		"driver stuck, the rest wait behind it": {
			pods: map[string]stackPod{nvidiav1.Driver: {since: old}, nvidiav1.ContainerToolkit: {since: old}, nvidiav1.DevicePlugin: {since: old}},
			want: map[string]ComponentStatus{nvidiav1.Driver: ComponentStuck, nvidiav1.ContainerToolkit: ComponentPending, nvidiav1.DevicePlugin: ComponentPending},
		},
		"driver ready, toolkit stuck": {
			pods: map[string]stackPod{nvidiav1.Driver: {ready: true}, nvidiav1.ContainerToolkit: {since: old}, nvidiav1.DevicePlugin: {since: old}},
			want: map[string]ComponentStatus{nvidiav1.Driver: ComponentReady, nvidiav1.ContainerToolkit: ComponentStuck, nvidiav1.DevicePlugin: ComponentPending},
		},
		"host driver: the toolkit waits for nothing": {
			hostDriver: true,
			pods:       map[string]stackPod{nvidiav1.ContainerToolkit: {since: old}},
			want:       map[string]ComponentStatus{nvidiav1.Driver: ComponentOff, nvidiav1.ContainerToolkit: ComponentStuck},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			l := map[string]string{}
			for k, v := range labels {
				l[k] = v
			}
			if tt.hostDriver {
				l[nvidiav1.Components[0].DeployLabel] = "false"
			}
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: l}}
			out, recheck := stackOf(n, tt.pods, now)
			for key, want := range tt.want {
				if got := statusOf(out, key); got != want {
					t.Errorf("%s: %s, want %s", key, got, want)
				}
			}
			if !recheck.Equal(tt.wantRecheck) {
				t.Errorf("recheck at %s, want %s", recheck, tt.wantRecheck)
			}
			if !recheck.IsZero() {
				// At that time the pod is Stuck, and nothing is left to recheck.
				if later, again := stackOf(n, tt.pods, recheck.Add(time.Nanosecond)); statusOf(later, nvidiav1.Driver) != ComponentStuck || !again.IsZero() {
					t.Errorf("at the recheck: driver %s, recheck %s; want Stuck and none", statusOf(later, nvidiav1.Driver), again)
				}
			}
		})
	}
}
