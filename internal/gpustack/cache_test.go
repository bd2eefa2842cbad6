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

func fullPod(name string, now metav1.Time) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "gpufleet-system", UID: "u", ResourceVersion: "7", CreationTimestamp: now, DeletionTimestamp: &now,
			DeletionGracePeriodSeconds: ptr.To[int64](30), GenerateName: "p-",
			Labels:          map[string]string{"app": "x", LabelManagedBy: managedBy, LabelComponent: DevicePlugin},
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
			Labels: map[string]string{"app": "x", LabelManagedBy: managedBy, LabelComponent: DevicePlugin},
		},
		Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Image: "img:1"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}},
	}
	got, err := stripPod(fullPod("p", now))
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

// Regression: the transform dropped container statuses, so the upgrade
// never saw a driver report that the old kernel module is in use and failed
// the node instead of rebooting it.
func TestStripPodKeepsADriversModuleInUseLine(t *testing.T) {
	now := metav1.Now()
	p := fullPod("drv", now)
	p.Labels = map[string]string{LabelManagedBy: managedBy, LabelComponent: Driver}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "nvidia-driver-ctr", RestartCount: 3,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1,
			Message: "Unloading NVIDIA driver kernel modules...\nnvidia 56807424 113\nCould not unload NVIDIA driver kernel modules, driver is in use\n"}}}}
	want := ModuleInUse(p)
	got, err := stripPod(p)
	if err != nil {
		t.Fatal(err)
	}
	if m := ModuleInUse(got.(*corev1.Pod)); m != want || m == "" {
		t.Errorf("after the transform: %q, want %q", m, want)
	}
	other := fullPod("dp", now)
	other.Labels = map[string]string{LabelManagedBy: managedBy, LabelComponent: DevicePlugin}
	other.Status.ContainerStatuses = p.Status.ContainerStatuses
	if got, _ := stripPod(other); len(got.(*corev1.Pod).Status.ContainerStatuses) != 0 {
		t.Errorf("another component's container statuses were kept")
	}
}

// BenchmarkStrippedPodMemory reports the heap a cached stack pod keeps
// after the transform; pods are decoded from protobuf as the informer does,
// so every string is its own allocation.
func BenchmarkStrippedPodMemory(b *testing.B) {
	const n = 20000
	now := metav1.Now()
	p := fullPod("nvidia-device-plugin-daemonset-x2k9p", now)
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

func TestStripPodCutsPodsOutsideTheStack(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpufleet-agent-x", Namespace: "ns", Labels: map[string]string{"app.kubernetes.io/name": "gpufleet-agent"}},
		Spec:   corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "agent", Image: "i"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	out, err := stripPod(p)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Pod)
	if got.Spec.NodeName != "" || len(got.Spec.Containers) != 0 || got.Status.Phase != "" || got.Name != "gpufleet-agent-x" {
		t.Errorf("a pod outside the stack keeps more than its name and labels: %+v", got)
	}
	// The GPU Operator's pods of an adopted DaemonSet are the stack's.
	op := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "d", Labels: map[string]string{"app": "nvidia-device-plugin-daemonset"}},
		Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	out, _ = stripPod(op)
	if out.(*corev1.Pod).Spec.NodeName != "n" {
		t.Errorf("an adopted DaemonSet's pod was cut")
	}
}
