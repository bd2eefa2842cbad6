package operator

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// stripPods returns the cache transform of pods: it keeps only what
// gpufleet reads from cached pods (node, owner, labels, phase, the Ready
// condition, deletion state, grace period; container images only of the
// GPU stack's pods in the operator's namespace), so that a cluster's pods
// cost a fraction of their full size in the operator's memory. The drain
// reads pods live, through the drain library. The freshly decoded pod is
// trimmed in place: no second copy is allocated.
func stripPods(namespace string) toolscache.TransformFunc {
	return func(obj any) (any, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		p.ObjectMeta = metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp,
			DeletionGracePeriodSeconds: p.DeletionGracePeriodSeconds,
			Labels:                     p.Labels, OwnerReferences: p.OwnerReferences,
			Annotations: mirrorAnnotation(p.Annotations),
		}
		var containers []corev1.Container
		if p.Namespace == namespace {
			// The GPU stack compares its pods' images with the policy's.
			containers = make([]corev1.Container, len(p.Spec.Containers))
			for i, c := range p.Spec.Containers {
				containers[i] = corev1.Container{Name: c.Name, Image: c.Image}
			}
		}
		// The grace period sizes a repair's drain timeout.
		p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName, TerminationGracePeriodSeconds: p.Spec.TerminationGracePeriodSeconds, Containers: containers}
		var ready []corev1.PodCondition
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				ready = []corev1.PodCondition{{Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime}}
			}
		}
		p.Status = corev1.PodStatus{Phase: p.Status.Phase, Conditions: ready}
		return p, nil
	}
}

// mirrorAnnotation keeps only the mirror-pod annotation (the drain skips
// mirror pods).
func mirrorAnnotation(a map[string]string) map[string]string {
	if v, ok := a[corev1.MirrorPodAnnotationKey]; ok {
		return map[string]string{corev1.MirrorPodAnnotationKey: v}
	}
	return nil
}
