package repair

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

// gpuNode is a node of pool "a" whose agent reports GPUProblem=True with
// reason class, seen by gpufleet since `since`.
func gpuNode(name string, class repairv1.GPUFaultClass, since time.Time) corev1.Node {
	n := *testobj.Node(name, testobj.Pool("a"),
		testobj.Condition(corev1.NodeCondition{Type: repairv1.ConditionGPUProblem, Status: corev1.ConditionTrue, Reason: string(class)}))
	rule := map[repairv1.GPUFaultClass]string{repairv1.GPUClassResetGPU: "gpu-reset", repairv1.GPUClassReboot: "gpu-reboot", repairv1.GPUClassReplace: "gpu-replace"}[class]
	data, _ := json.Marshal(map[string]string{rule: since.Format(time.RFC3339)})
	n.Annotations = map[string]string{annotationFaults: string(data)}
	return n
}

func gpuRecord(node string, index int32, class repairv1.GPUFaultClass, occurrences ...time.Time) repairv1.GPUFault {
	g := repairv1.GPUFault{ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu"},
		Spec:   repairv1.GPUFaultSpec{NodeName: node, GPU: repairv1.GPURef{Index: ptr.To(index), UUID: "GPU-" + node, PCIBusID: "0000:18:00.0"}},
		Status: repairv1.GPUFaultStatus{Class: class, Summary: "Xid 48 (DBE ECC)"}}
	for _, t := range occurrences {
		g.Status.Occurrences = append(g.Status.Occurrences, metav1.NewTime(t))
	}
	return g
}

func TestDetectGPUFaults(t *testing.T) {
	since := t0.Add(-time.Minute)
	defaults := func(mut func(*repairv1.NodeRepairPolicySpec)) *repairv1.NodeRepairPolicy {
		return testPolicy(func(s *repairv1.NodeRepairPolicySpec) {
			s.Rules = nil
			if mut != nil {
				mut(s)
			}
		})
	}
	type want struct {
		Node           string
		Actions        []repairv1.Action
		GPUs           []string
		Recommendation string
		DryRun         bool
		IgnoreReason   string
	}
	held := maintenancev1.NodeMaintenance{Spec: maintenancev1.NodeMaintenanceSpec{NodeName: "a-0", RequestorID: "human.example.com"}}
	held.Status.Conditions = []metav1.Condition{{Type: maintenancev1.ConditionTypeReady, Reason: string(maintenancev1.PhaseDraining)}}
	tests := map[string]struct {
		policy       *repairv1.NodeRepairPolicy
		nodes        []corev1.Node
		gpus         []repairv1.GPUFault
		repairs      []repairv1.NodeRepair
		maintenances []maintenancev1.NodeMaintenance
		want         []want
		blocked      string
	}{
		"a dry run records the GPU repair it would run": {
			policy: defaults(func(s *repairv1.NodeRepairPolicySpec) { s.DryRun = true }),
			nodes:  []corev1.Node{gpuNode("a-0", repairv1.GPUClassResetGPU, since)},
			gpus:   []repairv1.GPUFault{gpuRecord("a-0", 3, repairv1.GPUClassResetGPU, since)},
			want:   []want{{Node: "a-0", Actions: []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot}, GPUs: []string{"0000:18:00.0"}, DryRun: true}},
		},
		"a node held by another requestor gets an ignore record": {
			policy:       defaults(nil),
			nodes:        []corev1.Node{gpuNode("a-0", repairv1.GPUClassResetGPU, since)},
			gpus:         []repairv1.GPUFault{gpuRecord("a-0", 3, repairv1.GPUClassResetGPU, since)},
			maintenances: []maintenancev1.NodeMaintenance{held},
			want:         []want{{Node: "a-0", Actions: []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot}, IgnoreReason: "node is in planned maintenance by human.example.com"}},
		},
		"a GPU needing a reset: reset it, then reboot": {
			policy: defaults(nil),
			nodes:  []corev1.Node{gpuNode("a-0", repairv1.GPUClassResetGPU, since)},
			gpus:   []repairv1.GPUFault{gpuRecord("a-0", 3, repairv1.GPUClassResetGPU, since)},
			want:   []want{{Node: "a-0", Actions: []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot}, GPUs: []string{"0000:18:00.0"}}},
		},
		"without reboots, the reset only": {
			policy: defaults(func(s *repairv1.NodeRepairPolicySpec) { s.AllowReboot = false }),
			nodes:  []corev1.Node{gpuNode("a-0", repairv1.GPUClassResetGPU, since)},
			gpus:   []repairv1.GPUFault{gpuRecord("a-0", 3, repairv1.GPUClassResetGPU, since)},
			want:   []want{{Node: "a-0", Actions: []repairv1.Action{repairv1.ActionResetGPU}, GPUs: []string{"0000:18:00.0"}}},
		},
		"a GPU out of service for the third time in a day is reported for replacement": {
			policy: defaults(nil),
			nodes:  []corev1.Node{gpuNode("a-0", repairv1.GPUClassResetGPU, since)},
			gpus:   []repairv1.GPUFault{gpuRecord("a-0", 3, repairv1.GPUClassResetGPU, t0.Add(-20*time.Hour), t0.Add(-2*time.Hour), since)},
			want: []want{{Node: "a-0", GPUs: []string{"0000:18:00.0"},
				Recommendation: "replace GPU 3 (GPU-a-0, 0000:18:00.0): out of service 3 times within 24h0m0s (replaceAfter 3)"}},
		},
		"occurrences older than the window do not count": {
			policy: defaults(nil),
			nodes:  []corev1.Node{gpuNode("a-0", repairv1.GPUClassResetGPU, since)},
			gpus:   []repairv1.GPUFault{gpuRecord("a-0", 3, repairv1.GPUClassResetGPU, t0.Add(-30*time.Hour), t0.Add(-25*time.Hour), since)},
			want:   []want{{Node: "a-0", Actions: []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot}, GPUs: []string{"0000:18:00.0"}}},
		},
		"the policy's replaceAfter counts": {
			policy: defaults(func(s *repairv1.NodeRepairPolicySpec) {
				s.GPU.ReplaceAfter = &repairv1.RepeatLimit{Count: 2, WindowSeconds: 3600}
			}),
			nodes: []corev1.Node{gpuNode("a-0", repairv1.GPUClassResetGPU, since)},
			gpus:  []repairv1.GPUFault{gpuRecord("a-0", 3, repairv1.GPUClassResetGPU, t0.Add(-30*time.Minute), since)},
			want: []want{{Node: "a-0", GPUs: []string{"0000:18:00.0"},
				Recommendation: "replace GPU 3 (GPU-a-0, 0000:18:00.0): out of service 2 times within 1h0m0s (replaceAfter 2)"}},
		},
		"a fault that calls for replacement is reported, not repaired": {
			policy: defaults(nil),
			nodes:  []corev1.Node{gpuNode("a-0", repairv1.GPUClassReplace, since)},
			gpus:   []repairv1.GPUFault{gpuRecord("a-0", 3, repairv1.GPUClassReplace, since)},
			want:   []want{{Node: "a-0", GPUs: []string{"0000:18:00.0"}, Recommendation: "replace GPU 3 (GPU-a-0, 0000:18:00.0): Xid 48 (DBE ECC)"}},
		},
		"the condition without the records waits for them": {
			policy:  defaults(nil),
			nodes:   []corev1.Node{gpuNode("a-0", repairv1.GPUClassResetGPU, since)},
			blocked: "a-0: waiting for the node agent's GPUFault records",
		},
		"a GPU of another node does not count": {
			policy:  defaults(nil),
			nodes:   []corev1.Node{gpuNode("a-0", repairv1.GPUClassResetGPU, since)},
			gpus:    []repairv1.GPUFault{gpuRecord("b-0", 3, repairv1.GPUClassResetGPU, since)},
			blocked: "a-0: waiting for the node agent's GPUFault records",
		},
		"one GPU repair per pool, like any repair": {
			policy: defaults(nil),
			nodes:  []corev1.Node{gpuNode("a-0", repairv1.GPUClassResetGPU, since), gpuNode("a-1", repairv1.GPUClassReboot, since)},
			gpus:   []repairv1.GPUFault{gpuRecord("a-0", 3, repairv1.GPUClassResetGPU, since), gpuRecord("a-1", 5, repairv1.GPUClassReboot, since)},
			want:   []want{{Node: "a-0", Actions: []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot}, GPUs: []string{"0000:18:00.0"}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := Detect(DetectInput{Policy: tc.policy, Nodes: tc.nodes, GPUFaults: tc.gpus, Repairs: tc.repairs, Maintenances: tc.maintenances, Now: t0})
			var got []want
			for _, r := range d.Create {
				w := want{Node: r.Spec.NodeName, Actions: r.Spec.Actions, Recommendation: r.Spec.Recommendation, DryRun: r.Spec.DryRun, IgnoreReason: r.Spec.IgnoreReason}
				for _, g := range r.Spec.GPUs {
					w.GPUs = append(w.GPUs, g.PCIBusID)
				}
				got = append(got, w)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("created (-want +got):\n%s", diff)
			}
			if tc.blocked != "" {
				c := findCondition(d.Status.Conditions, conditionBusy)
				if c == nil || c.Message != tc.blocked {
					t.Errorf("RepairsBlocked = %+v, want message %q", c, tc.blocked)
				}
			}
		})
	}
}

func TestDetectReplaceRecommendationDoesNotSuspendThePool(t *testing.T) {
	since := t0.Add(-time.Minute)
	failed := record("a-0", since, func(r *repairv1.NodeRepair) {
		r.Spec.Fault.Rule = "gpu-replace"
		r.Spec.Recommendation = "replace GPU 3"
		r.Status.Phase = repairv1.PhaseRecoveryFailed
	})
	d := Detect(DetectInput{
		Policy:    testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.Rules = nil }),
		Nodes:     []corev1.Node{gpuNode("a-0", repairv1.GPUClassReplace, since), faultyNode("a-1", "a", since)},
		GPUFaults: []repairv1.GPUFault{gpuRecord("a-0", 3, repairv1.GPUClassReplace, since)},
		Repairs:   []repairv1.NodeRepair{failed},
		Now:       t0,
	})
	if len(d.Status.SuspendedPools) != 0 {
		t.Errorf("suspended pools = %+v, want none", d.Status.SuspendedPools)
	}
	for _, r := range d.Create {
		if r.Spec.NodeName == "a-0" {
			t.Errorf("a GPU reported for replacement got another repair: %+v", r.Spec)
		}
	}
}

func findCondition(cs []metav1.Condition, t string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

func TestDeviceOf(t *testing.T) {
	str := func(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: ptr.To(s)} }
	num := func(i int64) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{IntValue: ptr.To(i)} }
	slice := func(driver, node string, devs ...resourcev1.Device) resourcev1.ResourceSlice {
		return resourcev1.ResourceSlice{Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node),
			Pool: resourcev1.ResourcePool{Name: node}, Devices: devs}}
	}
	dev := func(name string, attrs map[resourcev1.QualifiedName]resourcev1.DeviceAttribute) resourcev1.Device {
		return resourcev1.Device{Name: name, Attributes: attrs}
	}
	slices := []resourcev1.ResourceSlice{
		slice("gpu.nvidia.com", "n1",
			dev("gpu-0", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"index": num(0), "uuid": str("GPU-aaa"), "pcieBusID": str("0000:18:00.0")}),
			dev("gpu-1", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"gpu.nvidia.com/uuid": str("GPU-BBB"), "resource.kubernetes.io/pciBusID": str("0000:20:00.0")})),
		slice("gpu.nvidia.com", "n2", dev("gpu-0", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"index": num(0), "uuid": str("GPU-zzz")})),
		slice("other.example.com", "n1", dev("gpu-9", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": str("GPU-ccc")})),
	}
	tests := map[string]struct {
		node   string
		gpu    repairv1.GPURef
		want   string
		wantOK bool
	}{
		"by UUID":                          {"n1", repairv1.GPURef{UUID: "GPU-aaa", PCIBusID: "0000:99:00.0"}, "gpu-0", true},
		"by a qualified UUID, any case":    {"n1", repairv1.GPURef{UUID: "gpu-bbb"}, "gpu-1", true},
		"by PCI bus ID in the short form":  {"n1", repairv1.GPURef{PCIBusID: "00000000:20:00.0"}, "gpu-1", true},
		"by index, from the device name":   {"n1", repairv1.GPURef{Index: ptr.To[int32](1), PCIBusID: "0000:77:00.0"}, "gpu-1", true},
		"by an older index attribute":      {"n1", repairv1.GPURef{Index: ptr.To[int32](0), PCIBusID: "0000:77:00.0"}, "gpu-0", true},
		"by an older pcieBusID attribute":  {"n1", repairv1.GPURef{PCIBusID: "0000:18:00.0"}, "gpu-0", true},
		"UUID wins over a stale index":     {"n1", repairv1.GPURef{Index: ptr.To[int32](1), UUID: "GPU-aaa"}, "gpu-0", true},
		"another node's slice is not used": {"n1", repairv1.GPURef{UUID: "GPU-zzz"}, "", false},
		"another driver is not used":       {"n1", repairv1.GPURef{UUID: "GPU-ccc"}, "", false},
		"not published (device plugin)":    {"n3", repairv1.GPURef{UUID: "GPU-aaa"}, "", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := DeviceOf(slices, "gpu.nvidia.com", tc.node, tc.gpu)
			if ok != tc.wantOK || got.Name != tc.want {
				t.Errorf("DeviceOf = %+v, %t; want %q, %t", got, ok, tc.want, tc.wantOK)
			}
			if ok && (got.Driver != "gpu.nvidia.com" || got.Pool != tc.node) {
				t.Errorf("DeviceOf = %+v, want driver gpu.nvidia.com and pool %s", got, tc.node)
			}
		})
	}
}

func TestPodsUsingDevices(t *testing.T) {
	claim := func(devs ...string) *resourcev1.ResourceClaim {
		c := &resourcev1.ResourceClaim{}
		if devs == nil {
			return c
		}
		c.Status.Allocation = &resourcev1.AllocationResult{}
		for _, d := range devs {
			c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
				resourcev1.DeviceRequestAllocationResult{Request: "gpu", Driver: "gpu.nvidia.com", Pool: "n1", Device: d})
		}
		return c
	}
	faulty := []Device{{Driver: "gpu.nvidia.com", Pool: "n1", Name: "gpu-3"}}
	for name, tc := range map[string]struct {
		claim *resourcev1.ResourceClaim
		want  bool
	}{
		"allocated the faulty GPU":  {claim("gpu-3"), true},
		"allocated it among others": {claim("gpu-2", "gpu-3"), true},
		"allocated a sibling":       {claim("gpu-2"), false},
		"not allocated":             {claim(), false},
		"same device name, another pool": {func() *resourcev1.ResourceClaim {
			c := claim("gpu-3")
			c.Status.Allocation.Devices.Results[0].Pool = "n2"
			return c
		}(), false},
		"same device name, another driver": {func() *resourcev1.ResourceClaim {
			c := claim("gpu-3")
			c.Status.Allocation.Devices.Results[0].Driver = "x"
			return c
		}(), false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := usesDevice(tc.claim, faulty); got != tc.want {
				t.Errorf("usesDevice = %t, want %t", got, tc.want)
			}
		})
	}
	p := &corev1.Pod{Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "a", ResourceClaimName: ptr.To("shared")}, {Name: "b", ResourceClaimTemplateName: ptr.To("t")}}},
		Status: corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "b", ResourceClaimName: ptr.To("pod-b-xyz")}}}}
	if diff := cmp.Diff([]string{"shared", "pod-b-xyz"}, claimNames(p)); diff != "" {
		t.Errorf("claimNames (-want +got):\n%s", diff)
	}
}

func TestGPUsInService(t *testing.T) {
	three := gpuRecord("n1", 3, repairv1.GPUClassResetGPU)
	back := gpuRecord("n1", 3, "")
	other := gpuRecord("n1", 5, repairv1.GPUClassResetGPU)
	other.Spec.GPU.PCIBusID = "0000:40:00.0"
	ref := three.Spec.GPU
	for name, tc := range map[string]struct {
		faults []repairv1.GPUFault
		want   bool
	}{
		"still out of service":                   {[]repairv1.GPUFault{three}, false},
		"back in service":                        {[]repairv1.GPUFault{back}, true},
		"another GPU failing is another repair":  {[]repairv1.GPUFault{back, other}, true},
		"a record that is gone counts as in use": {nil, true},
	} {
		t.Run(name, func(t *testing.T) {
			if got := gpusInService([]repairv1.GPURef{ref}, "n1", tc.faults); got != tc.want {
				t.Errorf("gpusInService = %t, want %t", got, tc.want)
			}
		})
	}
}

func TestAllocatedPods(t *testing.T) {
	pod := func(name string) repairv1.PodRef { return repairv1.PodRef{Namespace: "ml", Name: name} }
	withPods := func(g repairv1.GPUFault, pods ...repairv1.PodRef) repairv1.GPUFault {
		g.Status.Allocation = &repairv1.GPUAllocation{Resource: "nvidia.com/gpu", Pods: pods}
		return g
	}
	three := gpuRecord("n1", 3, repairv1.GPUClassResetGPU)
	five := gpuRecord("n1", 5, repairv1.GPUClassResetGPU)
	five.Name, five.Spec.GPU.PCIBusID = "n1-gpu5", "0000:40:00.0"
	elsewhere := withPods(gpuRecord("n2", 3, repairv1.GPUClassResetGPU), pod("other"))
	for name, tc := range map[string]struct {
		gpus      []repairv1.GPURef
		faults    []repairv1.GPUFault
		wantPods  []repairv1.PodRef
		wantKnown bool
	}{
		"the pods the record names": {
			gpus: []repairv1.GPURef{three.Spec.GPU}, faults: []repairv1.GPUFault{withPods(three, pod("b"), pod("a")), elsewhere},
			wantPods: []repairv1.PodRef{pod("a"), pod("b")}, wantKnown: true,
		},
		"several GPUs: each pod once": {
			gpus:     []repairv1.GPURef{three.Spec.GPU, five.Spec.GPU},
			faults:   []repairv1.GPUFault{withPods(three, pod("a")), withPods(five, pod("a"), pod("c"))},
			wantPods: []repairv1.PodRef{pod("a"), pod("c")}, wantKnown: true,
		},
		"no pod holds it: known, none": {
			gpus: []repairv1.GPURef{three.Spec.GPU}, faults: []repairv1.GPUFault{withPods(three)}, wantKnown: true,
		},
		"a record that does not say: not known": {
			gpus: []repairv1.GPURef{three.Spec.GPU, five.Spec.GPU}, faults: []repairv1.GPUFault{withPods(three, pod("a")), five},
		},
		"no record (another node's does not count): not known": {
			gpus: []repairv1.GPURef{three.Spec.GPU}, faults: []repairv1.GPUFault{elsewhere},
		},
		"an unidentified GPU: not known": {
			gpus: []repairv1.GPURef{{}}, faults: []repairv1.GPUFault{withPods(three, pod("a"))},
		},
	} {
		t.Run(name, func(t *testing.T) {
			pods, known := allocatedPods(tc.gpus, "n1", tc.faults)
			if diff := cmp.Diff(tc.wantPods, pods); diff != "" || known != tc.wantKnown {
				t.Errorf("known %t (want %t), pods (-want +got):\n%s", known, tc.wantKnown, diff)
			}
		})
	}
}

func TestWholeNode(t *testing.T) {
	node := func(gpus string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
		if gpus != "" {
			n.Status.Capacity = corev1.ResourceList{gpuResource: resource.MustParse(gpus)}
		}
		return n
	}
	faulty := func(n int) []*repairv1.GPUFault {
		out := make([]*repairv1.GPUFault, n)
		for i := range out {
			g := gpuRecord("n1", int32(i), repairv1.GPUClassResetGPU)
			out[i] = &g
		}
		return out
	}
	published := []resourcev1.ResourceSlice{{Spec: resourcev1.ResourceSliceSpec{Driver: DefaultDRADriver, NodeName: ptr.To("n1"),
		Devices: []resourcev1.Device{{Name: "gpu-0"}}}}}
	otherDriver := []resourcev1.ResourceSlice{{Spec: resourcev1.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: ptr.To("n1"),
		Devices: []resourcev1.Device{{Name: "gpu-0"}}}}}
	threshold := func(v intstr.IntOrString) *repairv1.NodeRepairPolicySpec {
		return &repairv1.NodeRepairPolicySpec{GPU: repairv1.GPUSpec{WholeNodeAfter: &v}}
	}
	for name, tc := range map[string]struct {
		node   *corev1.Node
		faulty int
		slices []resourcev1.ResourceSlice
		spec   *repairv1.NodeRepairPolicySpec
		want   string
	}{
		"3 of 8: per GPU":                     {node: node("8"), faulty: 3},
		"4 of 8: half, the whole node":        {node: node("8"), faulty: 4, want: "4 of the node's 8 GPUs out of service (gpu.wholeNodeAfter 50%: 4)"},
		"1 of 1: the node's only GPU":         {node: node("1"), faulty: 1, want: "1 of the node's 1 GPUs out of service (gpu.wholeNodeAfter 50%: 1)"},
		"3 of 5: 50% rounds up to 3":          {node: node("5"), faulty: 3, want: "3 of the node's 5 GPUs out of service (gpu.wholeNodeAfter 50%: 3)"},
		"2 of 5: below":                       {node: node("5"), faulty: 2},
		"a count: 2":                          {node: node("8"), faulty: 2, spec: threshold(intstr.FromInt32(2)), want: "2 of the node's 8 GPUs out of service (gpu.wholeNodeAfter 2: 2)"},
		"100%: only when every GPU is faulty": {node: node("8"), faulty: 7, spec: threshold(intstr.FromString("100%"))},
		"a DRA node keeps the per-GPU path":   {node: node("8"), faulty: 8, slices: published},
		"another driver's slices do not make it a DRA node": {node: node("8"), faulty: 4, slices: otherDriver,
			want: "4 of the node's 8 GPUs out of service (gpu.wholeNodeAfter 50%: 4)"},
		"no nvidia.com/gpu capacity: not a device-plugin node": {node: node(""), faulty: 8},
	} {
		t.Run(name, func(t *testing.T) {
			spec := tc.spec
			if spec == nil {
				spec = &repairv1.NodeRepairPolicySpec{}
			}
			got := wholeNode(tc.node, faulty(tc.faulty), tc.slices, spec)
			if !strings.HasPrefix(got, tc.want) || (tc.want == "") != (got == "") {
				t.Errorf("wholeNode = %q, want %q…", got, tc.want)
			}
		})
	}
}

// TestDetectEscalatesADevicePluginNodeWithTooManyFaultyGPUs: half of a
// device-plugin node's GPUs out of service: the repair reboots the whole
// node (no reset), and says why; without reboots the per-GPU path stays;
// a DRA node keeps it too.
func TestDetectEscalatesADevicePluginNodeWithTooManyFaultyGPUs(t *testing.T) {
	since := t0.Add(-time.Minute)
	n := gpuNode("a-0", repairv1.GPUClassResetGPU, since)
	n.Status.Capacity = corev1.ResourceList{gpuResource: resource.MustParse("4")}
	var gpus []repairv1.GPUFault
	for i := range 2 {
		g := gpuRecord("a-0", int32(i), repairv1.GPUClassResetGPU, since)
		g.Name, g.Spec.GPU.PCIBusID = fmt.Sprintf("a-0-gpu%d", i), fmt.Sprintf("0000:%02x:00.0", 0x18+i)
		gpus = append(gpus, g)
	}
	dra := []resourcev1.ResourceSlice{{Spec: resourcev1.ResourceSliceSpec{Driver: DefaultDRADriver, NodeName: ptr.To("a-0"), Devices: []resourcev1.Device{{Name: "gpu-0"}}}}}
	for name, tc := range map[string]struct {
		allowReboot    bool
		slices         []resourcev1.ResourceSlice
		wantActions    []repairv1.Action
		wantEscalation bool
	}{
		"device plugin, reboots allowed: the whole node": {allowReboot: true, wantActions: []repairv1.Action{repairv1.ActionReboot}, wantEscalation: true},
		"device plugin, no reboots: per GPU":             {wantActions: []repairv1.Action{repairv1.ActionResetGPU}},
		"DRA: per GPU":                                   {allowReboot: true, slices: dra, wantActions: []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot}},
	} {
		t.Run(name, func(t *testing.T) {
			p := testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.Rules, s.AllowReboot = nil, tc.allowReboot })
			d := Detect(DetectInput{Policy: p, Nodes: []corev1.Node{n}, GPUFaults: gpus, Slices: tc.slices, Now: t0})
			if len(d.Create) != 1 {
				t.Fatalf("created %v", created(d))
			}
			r := d.Create[0]
			if diff := cmp.Diff(tc.wantActions, r.Spec.Actions); diff != "" || (r.Spec.Escalation != "") != tc.wantEscalation || len(r.Spec.GPUs) != 2 {
				t.Errorf("actions (-want +got):\n%s\nescalation %q, GPUs %d", diff, r.Spec.Escalation, len(r.Spec.GPUs))
			}
		})
	}
}
