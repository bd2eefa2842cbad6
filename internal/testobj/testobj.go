// Package testobj builds the objects that the tests of many packages
// share: a NodeMaintenance and a node, each from its name and functional
// options, instead of one builder per package. It is for tests only:
// .golangci.yml's depguard rule test-builders-in-tests-only keeps it out of
// every non-test file.
//
// Past a NodeMaintenance's namespace and requestor, a builder sets only
// what its options ask for, so a test's object says in its options what
// the test depends on. A package's own options are plain functions of the
// same type (an option is a func(*T)).
//
// It imports the API types and nothing of gpufleet besides, so that the
// tests of every package can import it (internal/devcluster, for one,
// imports internal/agent). api/maintenance/v1alpha1's own tests keep their
// builder: that package cannot import one that imports it.
package testobj

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// NMOption sets a field of a NodeMaintenance.
type NMOption func(*maintenancev1.NodeMaintenance)

// NodeMaintenance returns the NodeMaintenance name, in namespace "default",
// of node, requested by "test.example", with no status and no finalizer (a
// new object) unless opts say otherwise.
func NodeMaintenance(name, node string, opts ...NMOption) *maintenancev1.NodeMaintenance {
	m := &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "test.example", NodeName: node},
	}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Requestor sets the requestor ID.
func Requestor(id string) NMOption {
	return func(m *maintenancev1.NodeMaintenance) { m.Spec.RequestorID = id }
}

// Phase sets the phase as the API carries it: the Ready condition, reason
// p, True only in phase Ready (api/maintenance/v1alpha1, Phase and
// IsReady), with no message and no transition time. It replaces a Ready
// condition already set and keeps the others.
func Phase(p maintenancev1.Phase) NMOption {
	return func(m *maintenancev1.NodeMaintenance) {
		c := metav1.Condition{Type: maintenancev1.ConditionTypeReady, Status: metav1.ConditionFalse, Reason: string(p)}
		if p == maintenancev1.PhaseReady {
			c.Status = metav1.ConditionTrue
		}
		for i := range m.Status.Conditions {
			if m.Status.Conditions[i].Type == c.Type {
				m.Status.Conditions[i] = c
				return
			}
		}
		m.Status.Conditions = append(m.Status.Conditions, c)
	}
}

// Finalizer sets the maintenance finalizer: the lifecycle controller has
// taken the object over.
func Finalizer() NMOption {
	return func(m *maintenancev1.NodeMaintenance) { m.Finalizers = []string{maintenancev1.Finalizer} }
}

// NoFinalizer removes the finalizers (after Finalizer, or a package's own
// default).
func NoFinalizer() NMOption {
	return func(m *maintenancev1.NodeMaintenance) { m.Finalizers = nil }
}

// Created sets the creation time.
func Created(at time.Time) NMOption {
	return func(m *maintenancev1.NodeMaintenance) { m.CreationTimestamp = metav1.NewTime(at) }
}

// Deleting sets the deletion time: the object is being deleted.
func Deleting(at time.Time) NMOption {
	return func(m *maintenancev1.NodeMaintenance) { m.DeletionTimestamp = ptr.To(metav1.NewTime(at)) }
}

// Drain asks for a drain.
func Drain(spec maintenancev1.DrainSpec) NMOption {
	return func(m *maintenancev1.NodeMaintenance) { m.Spec.DrainSpec = &spec }
}

// NoCordon asks for no cordon (spec.cordon false).
func NoCordon() NMOption {
	return func(m *maintenancev1.NodeMaintenance) { m.Spec.Cordon = ptr.To(false) }
}

// UnschedulableBefore records in the status whether the node was
// unschedulable before the maintenance cordoned it.
func UnschedulableBefore(unschedulable bool) NMOption {
	return func(m *maintenancev1.NodeMaintenance) { m.Status.NodeUnschedulableBefore = ptr.To(unschedulable) }
}

// NodeOption sets a field of a node.
type NodeOption func(*corev1.Node)

// Node returns the node name, bare (no labels, no status) unless opts say
// otherwise.
func Node(name string, opts ...NodeOption) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, o := range opts {
		o(n)
	}
	return n
}

// poolLabel names a node's pool: internal/devcluster's LabelPool, the
// default pool label of auto-repair, the allocation metrics and the fleet
// view (TestNamesAreThoseThePackagesRead holds them equal; importing them
// would close an import cycle).
const poolLabel = "gpufleet.dev/pool"

// Pool sets the pool label (to "" too).
func Pool(pool string) NodeOption {
	return Labels(map[string]string{poolLabel: pool})
}

// Labels sets labels, over those already set.
func Labels(labels map[string]string) NodeOption {
	return func(n *corev1.Node) {
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		for k, v := range labels {
			n.Labels[k] = v
		}
	}
}

// NodeCreated sets the node's creation time.
func NodeCreated(at time.Time) NodeOption {
	return func(n *corev1.Node) { n.CreationTimestamp = metav1.NewTime(at) }
}

// resourceGPU is the extended resource of NVIDIA's device plugin (the
// same test holds it equal to the packages' ResourceGPU).
const resourceGPU corev1.ResourceName = "nvidia.com/gpu"

// GPUs sets the node's capacity and allocatable GPUs (nvidia.com/gpu).
func GPUs(capacity, allocatable int64) NodeOption {
	return func(n *corev1.Node) {
		GPUCapacity(capacity)(n)
		n.Status.Allocatable = corev1.ResourceList{resourceGPU: *resource.NewQuantity(allocatable, resource.DecimalSI)}
	}
}

// GPUCapacity sets the node's capacity of GPUs (nvidia.com/gpu) alone, no
// allocatable.
func GPUCapacity(capacity int64) NodeOption {
	return func(n *corev1.Node) {
		n.Status.Capacity = corev1.ResourceList{resourceGPU: *resource.NewQuantity(capacity, resource.DecimalSI)}
	}
}

// Unschedulable cordons the node.
func Unschedulable() NodeOption {
	return func(n *corev1.Node) { n.Spec.Unschedulable = true }
}

// Ready sets the Ready condition True (the kubelet's reason) since since.
func Ready(since time.Time) NodeOption {
	return Condition(corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: metav1.NewTime(since)})
}

// NotReady sets the Ready condition False (the kubelet's reason) since
// since.
func NotReady(since time.Time) NodeOption {
	return Condition(corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", LastTransitionTime: metav1.NewTime(since)})
}

// Condition sets a condition, in place of one of its type already set.
func Condition(c corev1.NodeCondition) NodeOption {
	return func(n *corev1.Node) {
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == c.Type {
				n.Status.Conditions[i] = c
				return
			}
		}
		n.Status.Conditions = append(n.Status.Conditions, c)
	}
}

// RuntimeVersion sets the container runtime the kubelet reports
// (runtime://version).
func RuntimeVersion(v string) NodeOption {
	return func(n *corev1.Node) { n.Status.NodeInfo.ContainerRuntimeVersion = v }
}

// BootID sets the boot ID the kubelet reports (it changes at a reboot).
func BootID(id string) NodeOption {
	return func(n *corev1.Node) { n.Status.NodeInfo.BootID = id }
}
