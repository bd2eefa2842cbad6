package operator

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

func TestStripPodsKeepsWhatControllersRead(t *testing.T) {
	now := metav1.Now()
	strip := stripPods("gpufleet-system")
	want := func(namespace string, containers []corev1.Container) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name: "p", Namespace: namespace, UID: "u", ResourceVersion: "7", CreationTimestamp: now, DeletionTimestamp: &now,
				DeletionGracePeriodSeconds: ptr.To[int64](30),
				Labels:                     map[string]string{"app": "x"},
				Annotations:                map[string]string{corev1.MirrorPodAnnotationKey: "m"},
				OwnerReferences:            []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: ptr.To(true)}},
			},
			Spec: corev1.PodSpec{NodeName: "n", TerminationGracePeriodSeconds: ptr.To[int64](900), Containers: containers},
			Status: corev1.PodStatus{Phase: corev1.PodRunning,
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}},
		}
	}
	cases := []struct {
		namespace string
		want      *corev1.Pod
	}{
		// The GPU stack's own pods keep their images.
		{"gpufleet-system", want("gpufleet-system", []corev1.Container{{Name: "c", Image: "img:1"}})},
		// Everyone else's pods need no containers.
		{"default", want("default", nil)},
	}
	for _, c := range cases {
		got, err := strip(fullPod(c.namespace, "p", now))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%s: stripped pod (-want +got):\n%s", c.namespace, diff)
		}
	}
	if other, _ := strip("not a pod"); other != "not a pod" {
		t.Errorf("non-pods must pass through")
	}
}

// BenchmarkStrippedPodMemory reports the heap a cached workload pod keeps
// after the transform; pods are decoded from protobuf as the informer does,
// so every string is its own allocation.
func BenchmarkStrippedPodMemory(b *testing.B) {
	const n = 20000
	now := metav1.Now()
	strip := stripPods("gpufleet-system")
	p := fullPod("default", "train-5d8f9c7b6d-x2k9p", now)
	p.Annotations = map[string]string{"example.com/owner": "team-a"}
	p.Labels = map[string]string{"app": "train", "pod-template-hash": "5d8f9c7b6d"}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "train-5d8f9c7b6d", UID: "0d3c1f0e-1b7a-4a57-9b0e-3c1f0e1b7a4a", Controller: ptr.To(true)}}
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
			kept[i], _ = strip(&decoded)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/cached-pod")
		runtime.KeepAlive(kept)
	}
}
