package repair

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// TestStackHolds: after a validated repair, what the node's GPU stack still
// holds against the repaired GPU, and whether restarting its pods would
// give out another faulty GPU.
func TestStackHolds(t *testing.T) {
	gpu := func(i int) repairv1.GPURef {
		return repairv1.GPURef{Index: ptr.To(int32(i)), PCIBusID: "0000:1" + string(rune('0'+i)) + ":00.0"}
	}
	node := func(capacity, allocatable int64) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
		if capacity > 0 {
			n.Status.Capacity = corev1.ResourceList{gpuResource: *resource.NewQuantity(capacity, resource.DecimalSI)}
			n.Status.Allocatable = corev1.ResourceList{gpuResource: *resource.NewQuantity(allocatable, resource.DecimalSI)}
		}
		return n
	}
	fault := func(i int, class repairv1.GPUFaultClass) repairv1.GPUFault {
		return repairv1.GPUFault{ObjectMeta: metav1.ObjectMeta{Name: "n-" + gpu(i).PCIBusID}, Spec: repairv1.GPUFaultSpec{NodeName: "n", GPU: gpu(i)},
			Status: repairv1.GPUFaultStatus{Class: class}}
	}
	slice := func(taints map[int][]resourcev1.DeviceTaint) []resourcev1.ResourceSlice {
		s := resourcev1.ResourceSlice{Spec: resourcev1.ResourceSliceSpec{Driver: DefaultDRADriver, NodeName: ptr.To("n"), Pool: resourcev1.ResourcePool{Name: "n"}}}
		for i := range 8 {
			s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: "gpu-" + string(rune('0'+i)), Taints: taints[i],
				Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"resource.kubernetes.io/pciBusID": {StringValue: ptr.To(gpu(i).PCIBusID)}}})
		}
		return []resourcev1.ResourceSlice{s}
	}
	xid := resourcev1.DeviceTaint{Key: "gpu.nvidia.com/xid", Value: "48", Effect: resourcev1.DeviceTaintEffectNoSchedule}
	info := resourcev1.DeviceTaint{Key: "gpu.nvidia.com/xid", Value: "13", Effect: resourcev1.DeviceTaintEffectNone}
	isolatedAll := func(*repairv1.GPUFault) bool { return true }
	isolatedNone := func(*repairv1.GPUFault) bool { return false }
	repaired := []repairv1.GPURef{gpu(3)}
	for name, tc := range map[string]struct {
		node     *corev1.Node
		faults   []repairv1.GPUFault
		slices   []resourcev1.ResourceSlice
		isolated func(*repairv1.GPUFault) bool
		held     string // substring; "" nothing held
		blocked  string // substring; "" not blocked
	}{
		"device plugin gives all GPUs out":       {node: node(8, 8), faults: []repairv1.GPUFault{fault(3, "")}, isolated: isolatedAll},
		"device plugin still holds the GPU":      {node: node(8, 7), faults: []repairv1.GPUFault{fault(3, "")}, isolated: isolatedAll, held: "gives out 7 of the node's 8 GPUs"},
		"another GPU out: 6 of 8 is expected":    {node: node(8, 7), faults: []repairv1.GPUFault{fault(3, ""), fault(5, repairv1.GPUClassResetGPU)}, isolated: isolatedAll, blocked: "GPU 5"},
		"another GPU out and ours still held":    {node: node(8, 6), faults: []repairv1.GPUFault{fault(3, ""), fault(5, repairv1.GPUClassResetGPU)}, isolated: isolatedAll, held: "6 of the node's 8", blocked: "would give it out again"},
		"no GPU capacity: nothing to tell":       {node: node(0, 0), isolated: isolatedAll},
		"DRA: no taint":                          {node: node(8, 8), slices: slice(nil), isolated: isolatedAll},
		"DRA: the driver's taint stays":          {node: node(8, 8), slices: slice(map[int][]resourcev1.DeviceTaint{3: {xid}}), isolated: isolatedAll, held: "gpu.nvidia.com/xid=48 NoSchedule"},
		"DRA: an informational taint keeps none": {node: node(8, 8), slices: slice(map[int][]resourcev1.DeviceTaint{3: {info}}), isolated: isolatedAll},
		"DRA: another GPU isolated by gpufleet": {node: node(8, 8), faults: []repairv1.GPUFault{fault(5, repairv1.GPUClassReboot)},
			slices: slice(map[int][]resourcev1.DeviceTaint{3: {xid}, 5: {xid}}), isolated: isolatedAll, held: "device gpu-3"},
		"DRA: another GPU not isolated yet": {node: node(8, 8), faults: []repairv1.GPUFault{fault(5, repairv1.GPUClassReboot)},
			slices: slice(map[int][]resourcev1.DeviceTaint{3: {xid}, 5: {xid}}), isolated: isolatedNone, held: "device gpu-3", blocked: "not isolated yet"},
	} {
		t.Run(name, func(t *testing.T) {
			h := StackHolds(tc.node, repaired, tc.faults, tc.slices, DefaultDRADriver, tc.isolated)
			if (h.Held == "") != (tc.held == "") || !strings.Contains(h.Held, tc.held) {
				t.Errorf("held %q, want %q", h.Held, tc.held)
			}
			if (h.Blocked == "") != (tc.blocked == "") || !strings.Contains(h.Blocked, tc.blocked) {
				t.Errorf("blocked %q, want %q", h.Blocked, tc.blocked)
			}
		})
	}
}

// TestStackPods: the node's pods any selector matches, terminating ones
// left out; a selector that matches every pod is refused. Whatever a
// selector matches, only the GPU stack's own DaemonSet pods are chosen:
// never a bare pod or a workload's, never one using a GPU or a claim,
// never the driver.
func TestStackPods(t *testing.T) {
	ds := []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "u", Controller: ptr.To(true)}}
	rs := []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "v", Controller: ptr.To(true)}}
	pod := func(name string, labels map[string]string, terminating bool, owners ...metav1.OwnerReference) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels, OwnerReferences: owners}}
		if terminating {
			p.DeletionTimestamp = ptr.To(metav1.Now())
		}
		return p
	}
	gpuUser := pod("gpu-ds-user", map[string]string{"app": "nvidia-device-plugin-daemonset"}, false, ds...)
	gpuUser.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpuResource: resource.MustParse("1")}}}}
	claimUser := pod("claim-ds-user", map[string]string{"app": "nvidia-device-plugin-daemonset"}, false, ds...)
	claimUser.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu"}}
	pods := []corev1.Pod{
		pod("gpu-operator-dp", map[string]string{"app": "nvidia-device-plugin-daemonset"}, false, ds...),
		pod("dra-plugin", map[string]string{"dra-driver-nvidia-gpu-component": "kubelet-plugin"}, false, ds...),
		pod("old-dra-plugin", map[string]string{"nvidia-dra-driver-gpu-component": "kubelet-plugin"}, true, ds...),
		pod("chart-dp", map[string]string{"app.kubernetes.io/name": "nvidia-device-plugin"}, false, ds...),
		pod("training", map[string]string{"app": "train"}, false, rs...),
		pod("dra-controller", map[string]string{"dra-driver-nvidia-gpu-component": "controller"}, false, ds...),
		pod("bare-lookalike", map[string]string{"app": "nvidia-device-plugin-daemonset"}, false),
		pod("driver", map[string]string{"app": "nvidia-driver-daemonset"}, false, ds...),
		gpuUser, claimUser,
	}
	got, err := StackPods(pods, repairv1.DefaultGPUStackPods())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, p.Name)
	}
	if strings.Join(names, ",") != "chart-dp,dra-plugin,gpu-operator-dp" {
		t.Errorf("stack pods %v", names)
	}
	// A selector as broad as a user may write: still only the stack's own
	// DaemonSet pods, without the driver.
	broad := []metav1.LabelSelector{{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}}}
	got, err = StackPods(pods, broad)
	if err != nil {
		t.Fatal(err)
	}
	names = nil
	for _, p := range got {
		names = append(names, p.Name)
	}
	if strings.Join(names, ",") != "gpu-operator-dp" {
		t.Errorf("a broad selector chose %v; want only the device plugin's DaemonSet pod", names)
	}
	if _, err := StackPods(pods, []metav1.LabelSelector{{}}); err == nil || !strings.Contains(err.Error(), "selects every pod") {
		t.Errorf("an empty selector: %v", err)
	}
	bad := []metav1.LabelSelector{{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Near"}}}}
	if _, err := StackPods(pods, bad); err == nil {
		t.Errorf("an invalid selector was accepted")
	}
}
