package gpustack

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// CacheObjects restricts the manager's cache of the kinds the stack is made
// of to the objects it manages (labelled managed-by gpufleet; pods only in
// the operator's namespace, stripped to what the controller reads): a
// cluster's other pods, DaemonSets, Services, ServiceAccounts and RBAC
// objects are never held in the operator's memory. The namespaced kinds are
// watched in the operator's namespace only, where the stack lives: the
// operator's namespaced Role is all it needs for them (no cluster-wide
// list of DaemonSets, Services or ServiceAccounts).
func CacheObjects(namespace string) map[client.Object]cache.ByObject {
	managed := labels.SelectorFromSet(labels.Set{LabelManagedBy: managedBy})
	inNamespace := map[string]cache.Config{namespace: {}}
	out := map[client.Object]cache.ByObject{
		// Every pod of the namespace: the pods of DaemonSets adopted from
		// another operator keep that operator's labels (nvidiav1.PodComponent);
		// the namespace's other pods are cut to their name and labels.
		&corev1.Pod{}: {Namespaces: inNamespace, Transform: stripPod},
	}
	for _, o := range []client.Object{&appsv1.DaemonSet{}, &corev1.Service{}, &corev1.ServiceAccount{}} {
		out[o] = cache.ByObject{Namespaces: inNamespace, Label: managed}
	}
	for _, o := range []client.Object{&rbacv1.ClusterRole{}, &rbacv1.ClusterRoleBinding{}} {
		out[o] = cache.ByObject{Label: managed}
	}
	// One CRD: whether ServiceMonitors can be created (read by name; the
	// operator may read no other CRD).
	out[&apiextensionsv1.CustomResourceDefinition{}] = cache.ByObject{
		Field: fields.OneTermEqualSelector("metadata.name", ServiceMonitorCRD), Transform: stripCRD}
	return out
}

// stripCRD is the cache transform of CRDs: what tells whether a CRD serves
// a version (its versions' names and served flags, its conditions), not
// its schema (the ServiceMonitor CRD's is hundreds of kilobytes).
var stripCRD toolscache.TransformFunc = func(obj any) (any, error) {
	crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
	if !ok {
		return obj, nil
	}
	crd.ObjectMeta = metav1.ObjectMeta{Name: crd.Name, UID: crd.UID, ResourceVersion: crd.ResourceVersion, Generation: crd.Generation,
		CreationTimestamp: crd.CreationTimestamp, DeletionTimestamp: crd.DeletionTimestamp}
	versions := make([]apiextensionsv1.CustomResourceDefinitionVersion, len(crd.Spec.Versions))
	for i, v := range crd.Spec.Versions {
		versions[i] = apiextensionsv1.CustomResourceDefinitionVersion{Name: v.Name, Served: v.Served, Storage: v.Storage}
	}
	crd.Spec = apiextensionsv1.CustomResourceDefinitionSpec{Group: crd.Spec.Group, Names: crd.Spec.Names, Scope: crd.Spec.Scope, Versions: versions}
	crd.Status = apiextensionsv1.CustomResourceDefinitionStatus{Conditions: crd.Status.Conditions}
	return crd, nil
}

// stripPod is the cache transform of the stack's pods: it keeps only what
// the controller reads (node, component label, containers' images, phase,
// the Ready and Initialized conditions, creation and deletion, for a pod not yet
// scheduled its node affinity and the scheduler's reason, and for a driver
// pod the line saying that the old kernel module is in use), so a thousand GPU nodes'
// stack pods cost a fraction of their full size. The freshly decoded pod is
// trimmed in place: no second copy is allocated.
var stripPod toolscache.TransformFunc = func(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	p.ObjectMeta = metav1.ObjectMeta{
		Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
		CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp, Labels: p.Labels,
	}
	if nvidiav1.PodComponent(p.Labels) == "" {
		// Not a pod of the stack (the operator's, the agents'): nothing
		// of it is read.
		p.Spec, p.Status = corev1.PodSpec{}, corev1.PodStatus{}
		return p, nil
	}
	containers := make([]corev1.Container, len(p.Spec.Containers))
	for i, c := range p.Spec.Containers {
		containers[i] = corev1.Container{Name: c.Name, Image: c.Image}
	}
	spec := corev1.PodSpec{NodeName: p.Spec.NodeName, Containers: containers}
	if p.Spec.NodeName == "" {
		// Not scheduled: keep the node the DaemonSet made it for.
		spec.Affinity = p.Spec.Affinity
	}
	p.Spec = spec
	var conditions []corev1.PodCondition
	for _, c := range p.Status.Conditions {
		switch {
		case c.Type == corev1.PodReady || c.Type == corev1.PodInitialized:
			conditions = append(conditions, corev1.PodCondition{Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime})
		case c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse:
			// Why the scheduler cannot place it (for Degraded).
			conditions = append(conditions, corev1.PodCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message})
		}
	}
	var statuses []corev1.ContainerStatus
	if nvidiav1.PodComponent(p.Labels) == Driver {
		// A driver that cannot load while the old module is in use (the
		// upgrade reboots the node): only the line that says so.
		if name, line := moduleInUseStatus(p); line != "" {
			statuses = []corev1.ContainerStatus{{Name: name,
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: line}}}}
		}
	}
	p.Status = corev1.PodStatus{Phase: p.Status.Phase, Conditions: conditions, ContainerStatuses: statuses}
	return p, nil
}
