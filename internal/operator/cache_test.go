package operator

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestStripPodKeepsWhatControllersRead(t *testing.T) {
	now := metav1.Now()
	full := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "p", Namespace: "ns", UID: "u", ResourceVersion: "7", CreationTimestamp: now, DeletionTimestamp: &now,
			DeletionGracePeriodSeconds: ptr.To[int64](30),
			Labels:                     map[string]string{"app": "x"},
			Annotations:                map[string]string{corev1.MirrorPodAnnotationKey: "m", "big": "noise"},
			OwnerReferences:            []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: ptr.To(true)}},
			ManagedFields:              []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
		},
		Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Image: "img:1", Args: []string{"a"},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now, Message: "m"}}},
	}
	got, err := stripPod(full)
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "p", Namespace: "ns", UID: "u", ResourceVersion: "7", CreationTimestamp: now, DeletionTimestamp: &now,
			DeletionGracePeriodSeconds: ptr.To[int64](30),
			Labels:                     map[string]string{"app": "x"},
			Annotations:                map[string]string{corev1.MirrorPodAnnotationKey: "m"},
			OwnerReferences:            []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: ptr.To(true)}},
		},
		Spec:   corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Image: "img:1"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stripped pod (-want +got):\n%s", diff)
	}
	if other, _ := stripPod("not a pod"); other != "not a pod" {
		t.Errorf("non-pods must pass through")
	}
}
