package devcluster_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// wantSimGPU is device i of node as NVIDIA's DRA driver publishes a full
// H100, spelled out here so that a renamed attribute fails the test.
func wantSimGPU(node string, i int) resourcev1.Device {
	gpu := devcluster.SimGPU(node, i)
	str := func(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: ptr.To(s)} }
	ver := func(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{VersionValue: ptr.To(s)} }
	return resourcev1.Device{
		Name: fmt.Sprintf("gpu-%d", i),
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"type":                            str("gpu"),
			"uuid":                            str(gpu.UUID),
			"productName":                     str("NVIDIA H100 80GB HBM3"),
			"brand":                           str("Nvidia"),
			"architecture":                    str("Hopper"),
			"cudaComputeCapability":           ver("9.0.0"),
			"driverVersion":                   ver("570.133.20"),
			"cudaDriverVersion":               ver("12.8.0"),
			"resource.kubernetes.io/pciBusID": str(gpu.PCIBusID),
		},
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
			"memory": {Value: *resource.NewQuantity(85520809984, resource.BinarySI)},
		},
	}
}

func TestNodeSpecResourceSlice(t *testing.T) {
	uid := types.UID("6a1f3a52-0f6e-4c43-9b8e-0d7c1b2a9e11")
	slice := func(node string, gpus int) *resourcev1.ResourceSlice {
		devices := make([]resourcev1.Device, gpus)
		for i := range devices {
			devices[i] = wantSimGPU(node, i)
		}
		return &resourcev1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name:            node + "-gpu.nvidia.com",
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: uid, Controller: ptr.To(true)}},
			},
			Spec: resourcev1.ResourceSliceSpec{
				Driver:   "gpu.nvidia.com",
				Pool:     resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
				NodeName: ptr.To(node),
				Devices:  devices,
			},
		}
	}
	tests := map[string]struct {
		spec devcluster.NodeSpec
		want *resourcev1.ResourceSlice
	}{
		"CPU node publishes nothing": {spec: devcluster.NodeSpec{Name: "cpu-000", Pool: "cpu"}, want: nil},
		"one GPU":                    {spec: devcluster.NodeSpec{Name: "gpu-a", GPUs: 1}, want: slice("gpu-a", 1)},
		"GPUNodes default, 8 GPUs":   {spec: devcluster.GPUNodes(1, 1)[0], want: slice("gpu-000", 8)},
		"labels and OS do not matter": {
			spec: devcluster.NodeSpec{Name: "gpu-rhel", GPUs: 4, OSID: "rhel", OSVersion: "9.4", Labels: map[string]string{"x": "y"}},
			want: slice("gpu-rhel", 4),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := tc.spec.ResourceSlice(uid)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ResourceSlice (-want +got):\n%s", diff)
			}
			if got == nil {
				return
			}
			seen := map[string]bool{}
			for _, d := range got.Spec.Devices {
				for _, attr := range []resourcev1.QualifiedName{"uuid", "resource.kubernetes.io/pciBusID"} {
					v := *d.Attributes[attr].StringValue
					if seen[v] {
						t.Errorf("device %s: %s %q is not unique on the node", d.Name, attr, v)
					}
					seen[v] = true
				}
			}
		})
	}
}

func TestResourceAPIServesDeviceTaintRules(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	list, err := cluster.Client.Discovery().ServerResourcesForGroupVersion("resource.k8s.io/v1")
	if err != nil {
		t.Fatalf("discovery of resource.k8s.io/v1: %v", err)
	}
	served := map[string]bool{}
	for _, r := range list.APIResources {
		served[r.Name] = true
	}
	for _, want := range []string{"devicetaintrules", "devicetaintrules/status", "resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates"} {
		if !served[want] {
			t.Errorf("resource.k8s.io/v1 does not serve %s (serves %v)", want, slices.Sorted(maps.Keys(served)))
		}
	}
	// The API server validates and would store one (dry run).
	rule := isolationRule("probe", "no-such-node", "gpu-0")
	if _, err := cluster.Client.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("creating a DeviceTaintRule (dry run): %v", err)
	}
}

func TestGPUNodesPublishResourceSlices(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	if _, err := cluster.Client.ResourceV1().DeviceClasses().Get(ctx, devcluster.GPUDeviceClassName, metav1.GetOptions{}); err != nil {
		t.Errorf("DeviceClass %s: %v", devcluster.GPUDeviceClassName, err)
	}
	sliceList, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byNode := map[string]resourcev1.ResourceSlice{}
	for _, s := range sliceList.Items {
		byNode[ptr.Deref(s.Spec.NodeName, "")] = s
	}
	for _, spec := range append(devcluster.GPUNodes(gpuNodes, 2), devcluster.NodeSpec{Name: "cpu-000"}) {
		node, err := cluster.Client.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, ok := byNode[spec.Name]
		if spec.GPUs == 0 {
			if ok {
				t.Errorf("CPU node %s has a ResourceSlice %s", spec.Name, got.Name)
			}
			continue
		}
		if !ok {
			t.Errorf("node %s has no ResourceSlice", spec.Name)
			continue
		}
		want := spec.ResourceSlice(node.UID)
		if diff := cmp.Diff(want.Spec, got.Spec); diff != "" {
			t.Errorf("slice of %s as stored (-built +stored):\n%s", spec.Name, diff)
		}
		if !metav1.IsControlledBy(&got, node) {
			t.Errorf("slice of %s not owned by its Node: %+v", spec.Name, got.OwnerReferences)
		}
	}
}

// TestDeviceTaintRuleIsolatesOneGPU: a NoSchedule DeviceTaintRule on one
// device makes the real scheduler allocate every other GPU of the node but
// not that one, and it is allocated again once the rule is gone.
func TestDeviceTaintRuleIsolatesOneGPU(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	const node, ns, faulty = "dra-gpu-000", "dra-isolation", "gpu-3"
	if err := cluster.AddNodes(ctx, devcluster.NodeSpec{Name: node, Pool: "dra", GPUs: 8}); err != nil {
		t.Fatal(err)
	}
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, ns); err != nil {
		t.Fatal(err)
	}
	rules := cluster.Client.ResourceV1().DeviceTaintRules()
	rule := isolationRule("isolate-"+node+"-"+faulty, node, faulty)
	t.Cleanup(func() {
		ctx := context.Background()
		_ = rules.Delete(ctx, rule.Name, metav1.DeleteOptions{})
		_ = cluster.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		_ = cluster.Client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
	})

	created := time.Now()
	if _, err := rules.Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating DeviceTaintRule: %v", err)
	}
	var pods []string
	for i := range 7 {
		name := fmt.Sprintf("gpu-job-%d", i)
		if _, err := cluster.CreateGPUClaimPod(ctx, ns, name, node); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, name)
	}
	// A figure, not an assertion: how soon after the rule the first claim
	// was allocated (which the checks below require to avoid the device).
	first := waitFirstAllocation(t, ns, pods)
	t.Logf("first claim allocated %s after the DeviceTaintRule was created (pods created right after it)", time.Since(created).Round(time.Millisecond))
	if first == faulty {
		t.Fatalf("the first claim allocated after the rule got the tainted %s", faulty)
	}

	waitPodsRunning(t, ns, pods...)
	var allocated []string
	for _, p := range pods {
		got, err := cluster.AllocatedDevices(ctx, ns, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 {
			t.Errorf("pod %s has devices %v, want one", p, got)
		}
		allocated = append(allocated, got...)
	}
	slices.Sort(allocated)
	want := []string{"gpu-0", "gpu-1", "gpu-2", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}
	if diff := cmp.Diff(want, allocated); diff != "" {
		t.Fatalf("devices of the 7 running pods (-want +got):\n%s", diff)
	}

	// The eighth pod could only have the tainted GPU: the scheduler refuses.
	const eighth = "gpu-job-7"
	if _, err := cluster.CreateGPUClaimPod(ctx, ns, eighth, node); err != nil {
		t.Fatal(err)
	}
	cond := waitUnschedulable(t, ns, eighth)
	t.Logf("eighth pod: %s: %s", cond.Reason, cond.Message)
	if !strings.Contains(cond.Message, "cannot allocate all claims") {
		t.Errorf("scheduler message %q, want it to say the claim cannot be allocated", cond.Message)
	}
	if got, err := cluster.AllocatedDevices(ctx, ns, eighth); err != nil || len(got) != 0 {
		t.Errorf("unschedulable pod has devices %v (%v), want none", got, err)
	}

	// Lifting the isolation lets the scheduler allocate it.
	if err := rules.Delete(ctx, rule.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting DeviceTaintRule: %v", err)
	}
	waitPodsRunning(t, ns, eighth)
	if got, err := cluster.AllocatedDevices(ctx, ns, eighth); err != nil || !slices.Equal(got, []string{faulty}) {
		t.Errorf("pod scheduled after the rule was deleted has devices %v (%v), want [%s]", got, err, faulty)
	}

	// The node's slice goes with the node (owner reference).
	for _, p := range append(pods, eighth) {
		if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, p, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cluster.Client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.ResourceV1().ResourceSlices().Get(ctx, node+"-"+devcluster.DRADriver, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("ResourceSlice of deleted node %s was not garbage-collected within a minute: %v", node, err)
	}
}

// isolationRule taints one device of a node's pool NoSchedule, as gpufleet
// isolates a faulty GPU.
func isolationRule(name, node, device string) *resourcev1.DeviceTaintRule {
	return &resourcev1.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.DeviceTaintRuleSpec{
			DeviceSelector: &resourcev1.DeviceTaintSelector{
				Driver: ptr.To(devcluster.DRADriver), Pool: ptr.To(node), Device: ptr.To(device),
			},
			Taint: resourcev1.DeviceTaint{Key: "gpufleet.dev/gpu-fault", Value: "xid-79", Effect: resourcev1.DeviceTaintEffectNoSchedule},
		},
	}
}

// waitFirstAllocation returns the device of the first of the pods' claims
// to be allocated.
func waitFirstAllocation(t *testing.T, ns string, pods []string) string {
	t.Helper()
	var device string
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		claims, err := cluster.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // transient; keep polling
		}
		for _, c := range claims.Items {
			if c.Status.Allocation != nil && len(c.Status.Allocation.Devices.Results) > 0 {
				device = c.Status.Allocation.Devices.Results[0].Device
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no claim of pods %v was allocated within a minute: %v", pods, err)
	}
	return device
}

func waitPodsRunning(t *testing.T, ns string, pods ...string) {
	t.Helper()
	state := map[string]string{}
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		running := 0
		for _, name := range pods {
			p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				state[name] = err.Error()
				continue
			}
			state[name] = describePod(p)
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == len(pods), nil
	})
	if err != nil {
		t.Fatalf("pods not all Running within 90s: %v: %v", state, err)
	}
}

func waitUnschedulable(t *testing.T, ns, pod string) corev1.PodCondition {
	t.Helper()
	var got corev1.PodCondition
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // transient; keep polling
		}
		last = describePod(p)
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s was scheduled to %s", pod, p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				got = c
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s not reported Unschedulable by the scheduler within a minute (last: %s): %v", pod, last, err)
	}
	return got
}

func describePod(p *corev1.Pod) string {
	s := fmt.Sprintf("%s on %q", p.Status.Phase, p.Spec.NodeName)
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
			s += fmt.Sprintf(" (%s: %s)", c.Reason, c.Message)
		}
	}
	return s
}

// TestReAddedNodeGetsItsOwnSlice: a node deleted and added again at once
// gets a slice owned by the new Node, not the old one's left to the
// garbage collector (which would then delete it).
func TestReAddedNodeGetsItsOwnSlice(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	spec := devcluster.NodeSpec{Name: "dra-readded", Pool: "dra", GPUs: 2}
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), spec.Name, metav1.DeleteOptions{})
	})
	if err := cluster.AddNodes(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Client.CoreV1().Nodes().Delete(ctx, spec.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.AddNodes(ctx, spec); err != nil {
		t.Fatal(err)
	}
	node, err := cluster.Client.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice, err := cluster.Client.ResourceV1().ResourceSlices().Get(ctx, spec.Name+"-"+devcluster.DRADriver, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("slice of the re-added node: %v", err)
	}
	if !metav1.IsControlledBy(slice, node) {
		t.Errorf("slice owned by %+v, want the new node %s", slice.OwnerReferences, node.UID)
	}
}
