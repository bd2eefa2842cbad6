package devcluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// TestSimulatedDevicePluginGivesOutGPUs: on a device-plugin node, pods that
// request nvidia.com/gpu are given GPUs by the simulated device plugin
// (annotation sim.gpufleet.dev/gpus), the lowest free ones; a GPU with an
// XID the plugin sees is not given out until it is reset; the node agent's
// view of the kubelet (SimGPUPods) reports the allocations.
func TestSimulatedDevicePluginGivesOutGPUs(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	const node = "dpsim-000"
	if err := cluster.AddNodes(ctx, devcluster.NodeSpec{Name: node, Pool: "dpsim", GPUs: 8, DevicePluginOnly: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels[devcluster.LabelDevicePluginOnly] != "true" {
		t.Errorf("node labels %v lack %s", n.Labels, devcluster.LabelDevicePluginOnly)
	}
	pod := func(name string) string {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{"kubernetes.io/hostname": node},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers: []corev1.Container{{Name: "c", Image: "busybox",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{devcluster.ResourceGPU: resource.MustParse("1")}}}}}}
		if _, err := cluster.Client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Client.CoreV1().Pods("default").Delete(context.Background(), name, *metav1.NewDeleteOptions(0))
		})
		var gpus string
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := cluster.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil //nolint:nilerr // keep polling
			}
			gpus = got.Annotations[devcluster.AnnotationGPUs]
			return gpus != "", nil
		})
		if err != nil {
			t.Fatalf("pod %s was given no GPU within 30s", name)
		}
		return gpus
	}
	for i := range 3 {
		if got, want := pod(fmt.Sprintf("dpsim-%d", i)), fmt.Sprint(i); got != want {
			t.Errorf("pod dpsim-%d given GPU %s, want %s", i, got, want)
		}
	}
	if err := cluster.InjectXID(ctx, node, 3, 48); err != nil {
		t.Fatal(err)
	}
	if got := pod("dpsim-3"); got != "4" {
		t.Errorf("with an XID 48 on GPU 3, the next pod was given GPU %s, want 4", got)
	}
	waitAllocatable(t, node, 7) // the kubelet's view of the plugin's health: 7 of 8
	n, err = cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := (devcluster.SimExecutor{Cluster: cluster}).Execute(ctx, n, repairv1.ActionResetGPU, []repairv1.GPURef{devcluster.SimGPU(node, 3)}); err != nil {
		t.Fatal(err)
	}
	// Like NVIDIA's plugin, it does not mark the GPU healthy again after
	// the reset; its restart (a new pod of its DaemonSet) does.
	waitAllocatable(t, node, 7)
	plugins, err := cluster.Client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=nvidia-device-plugin", FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(plugins.Items) != 1 {
		t.Fatalf("the simulated device plugin's pods on %s: %v (%v)", node, plugins, err)
	}
	if err := cluster.Client.CoreV1().Pods(metav1.NamespaceSystem).Delete(ctx, plugins.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAllocatable(t, node, 8)
	if got := pod("dpsim-4"); got != "3" {
		t.Errorf("after GPU 3's reset and the plugin's restart, the next pod was given GPU %s, want 3", got)
	}
	pods, err := cluster.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	if allocs := devcluster.SimGPUPods(n, pods.Items); len(allocs) != 5 {
		t.Errorf("pod-resources view of %s: %+v, want 5 pods with one GPU each", node, allocs)
	}
}

// waitAllocatable waits until node advertises want nvidia.com/gpu (its
// capacity staying 8).
func waitAllocatable(t *testing.T, node string, want int64) {
	t.Helper()
	var got, capacity resource.Quantity
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		got, capacity = n.Status.Allocatable[devcluster.ResourceGPU], n.Status.Capacity[devcluster.ResourceGPU]
		return got.Value() == want && capacity.Value() == 8, nil
	})
	if err != nil {
		var plugins []string
		if pods, err := cluster.Client.CoreV1().Pods(metav1.NamespaceSystem).List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node}); err == nil {
			for _, p := range pods.Items {
				plugins = append(plugins, fmt.Sprintf("%s created %s deleting %v", p.Name, p.CreationTimestamp.UTC().Format(time.RFC3339), p.DeletionTimestamp))
			}
		}
		n, _ := cluster.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		t.Fatalf("%s: nvidia.com/gpu allocatable %s of %s, want %d of 8; kube-system pods %q; kernel log boot %s:\n%s", node, got.String(), capacity.String(), want,
			plugins, n.Annotations[devcluster.AnnotationKmsgBoot], n.Annotations[devcluster.AnnotationKmsg])
	}
}
