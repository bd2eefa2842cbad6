package ui

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// trim drops from watched objects what the view never reads, before they
// enter the cache: managed fields everywhere, a node's image list and
// annotations, and of a pod everything but its node, labels, container
// requests, phase and conditions. It keeps the process small with
// thousands of nodes and pods.
func trim(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	switch o := obj.(type) {
	case *corev1.Node:
		o.Annotations = nil
		o.Status.Images = nil
		o.Status.VolumesAttached = nil
		o.Status.VolumesInUse = nil
	case *corev1.Pod:
		o.Annotations = nil
		o.OwnerReferences = nil
		spec := corev1.PodSpec{NodeName: o.Spec.NodeName}
		spec.Containers = trimContainers(o.Spec.Containers)
		spec.InitContainers = trimContainers(o.Spec.InitContainers)
		spec.Overhead = o.Spec.Overhead
		spec.Resources = o.Spec.Resources
		o.Spec = spec
		o.Status = corev1.PodStatus{Phase: o.Status.Phase, Conditions: o.Status.Conditions}
	}
	return obj, nil
}

func trimContainers(cs []corev1.Container) []corev1.Container {
	if len(cs) == 0 {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy}
	}
	return out
}
