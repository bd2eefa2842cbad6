package fleet

import (
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Trim drops from an object what the view never reads, in place, before
// the view keeps it (the browser view's cache transform; the pages of
// Load's largest lists): managed fields everywhere; of a node its annotations and
// all of its status but conditions (without their heartbeat times),
// capacity and allocatable; of a
// ResourceSlice all but its driver, node, pool and device names; of a pod
// all but its node, labels, container requests, phase and conditions. It
// keeps the process small with thousands of nodes and pods.
func Trim(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	switch o := obj.(type) {
	case *corev1.Node:
		o.Annotations = nil
		o.OwnerReferences = nil
		// The kubelet rewrites every condition's heartbeat time; with
		// them gone a heartbeat changes nothing the browser view keeps.
		for i := range o.Status.Conditions {
			o.Status.Conditions[i].LastHeartbeatTime = metav1.Time{}
		}
		o.Status = corev1.NodeStatus{Capacity: o.Status.Capacity, Allocatable: o.Status.Allocatable, Conditions: o.Status.Conditions}
	case *resourcev1.ResourceSlice:
		// Only the number of devices counts.
		devices := make([]resourcev1.Device, len(o.Spec.Devices))
		for i := range o.Spec.Devices {
			devices[i].Name = o.Spec.Devices[i].Name
		}
		o.Spec = resourcev1.ResourceSliceSpec{Driver: o.Spec.Driver, NodeName: o.Spec.NodeName, Pool: o.Spec.Pool, Devices: devices}
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
