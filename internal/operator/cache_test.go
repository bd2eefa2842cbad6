package operator

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestStripNodeDropsImagesAndManagedFields(t *testing.T) {
	node := func(images []corev1.ContainerImage, managed []metav1.ManagedFieldsEntry) *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{"nvidia.com/gpu.present": "true"}, ManagedFields: managed},
			Spec:       corev1.NodeSpec{Unschedulable: true},
			Status: corev1.NodeStatus{
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
				NodeInfo:   corev1.NodeSystemInfo{BootID: "b", ContainerRuntimeVersion: "containerd://2.1"},
				Images:     images,
			},
		}
	}
	got, err := stripNode(node([]corev1.ContainerImage{{Names: []string{"nvcr.io/nvidia/driver:570"}, SizeBytes: 1 << 30}},
		[]metav1.ManagedFieldsEntry{{Manager: "kubelet"}}))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(node(nil, nil), got); diff != "" {
		t.Errorf("stripped node (-want +got):\n%s", diff)
	}
	if other, _ := stripNode("not a node"); other != "not a node" {
		t.Errorf("non-nodes must pass through")
	}
}
