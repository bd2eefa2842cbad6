package gpustack

import (
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func fullPod(namespace, name string, now metav1.Time) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace, UID: "u", ResourceVersion: "7", CreationTimestamp: now, DeletionTimestamp: &now,
			DeletionGracePeriodSeconds: ptr.To[int64](30), GenerateName: "p-",
			Labels:          map[string]string{"app": "x"},
			Annotations:     map[string]string{corev1.MirrorPodAnnotationKey: "m", "big": "noise"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: ptr.To(true)}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
		},
		Spec: corev1.PodSpec{NodeName: "n", TerminationGracePeriodSeconds: ptr.To[int64](900), Containers: []corev1.Container{{Name: "c", Image: "img:1", Args: []string{"a"},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}},
			Volumes: []corev1.Volume{{Name: "v"}}, Tolerations: []corev1.Toleration{{Key: "k"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1",
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now, Message: "m"},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Ready: true, Image: "img:1", ImageID: "sha256:abc"}}},
	}
}

func TestStripPodKeepsWhatTheControllerReads(t *testing.T) {
	now := metav1.Now()
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "p", Namespace: "gpufleet-system", UID: "u", ResourceVersion: "7", CreationTimestamp: now, DeletionTimestamp: &now,
			Labels: map[string]string{"app": "x"},
		},
		Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Image: "img:1"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}},
	}
	got, err := stripPod(fullPod("gpufleet-system", "p", now))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stripped pod (-want +got):\n%s", diff)
	}
	if other, _ := stripPod("not a pod"); other != "not a pod" {
		t.Errorf("non-pods must pass through")
	}
}

// BenchmarkStrippedPodMemory reports the heap a cached stack pod keeps
// after the transform; pods are decoded from protobuf as the informer does,
// so every string is its own allocation.
func BenchmarkStrippedPodMemory(b *testing.B) {
	const n = 20000
	now := metav1.Now()
	p := fullPod("gpufleet-system", "nvidia-device-plugin-daemonset-x2k9p", now)
	p.Labels = map[string]string{LabelComponent: "nvidia-device-plugin-daemonset", LabelManagedBy: managedBy, "controller-revision-hash": "5d8f9c7b6d"}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "nvidia-device-plugin-daemonset", UID: "0d3c1f0e-1b7a-4a57-9b0e-3c1f0e1b7a4a", Controller: ptr.To(true)}}
	wire, err := p.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		kept := make([]any, n)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range kept {
			var decoded corev1.Pod
			if err := decoded.Unmarshal(wire); err != nil {
				b.Fatal(err)
			}
			kept[i], _ = stripPod(&decoded)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/cached-pod")
		runtime.KeepAlive(kept)
	}
}
