package repair

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// The GPU stack's own view of a repaired GPU. NVIDIA's device plugin never
// marks a GPU healthy again once it saw a fatal XID (it leaves it out of
// the node's nvidia.com/gpu allocatable), and NVIDIA's DRA driver keeps its
// device taint (gpu.nvidia.com/xid, gpu.nvidia.com/gpu-lost) in the
// ResourceSlice: both until their pod restarts. A GPU that passed its
// validation is therefore back in service only once they restart.

// StackHold is what the GPU stack still holds against a node's repaired
// GPUs.
type StackHold struct {
	// Held says what keeps a repaired GPU out of service ("" when nothing
	// does).
	Held string
	// Blocked says why the stack's pods must not restart now ("" when they
	// may): a restart forgets every GPU the plugin found unhealthy, so a
	// node GPU still out of service that gpufleet does not isolate itself
	// would be given out again.
	Blocked string
}

// StackHolds decides StackHold for a repair of gpus on node, from the
// node's GPUFault records, the ResourceSlices of the node, the policy's
// DRA driver, and isolated (whether gpufleet's DeviceTaintRule isolates an
// out-of-service GPU).
func StackHolds(node *corev1.Node, gpus []repairv1.GPURef, faults []repairv1.GPUFault, slices []resourcev1.ResourceSlice,
	driver string, isolated func(*repairv1.GPUFault) bool) StackHold {
	repaired := func(f *repairv1.GPUFault) bool {
		for _, g := range gpus {
			if f.Spec.GPU.PCIBusID != "" && f.Spec.GPU.PCIBusID == g.PCIBusID {
				return true
			}
		}
		return false
	}
	var others []*repairv1.GPUFault
	for _, f := range outOfService(node.Name, faults) {
		if !repaired(f) {
			others = append(others, f)
		}
	}
	var h StackHold
	if publishesNode(slices, driver, node.Name) {
		var held []string
		for _, g := range gpus {
			dev, ok := DeviceOf(slices, driver, node.Name, g)
			if !ok {
				continue
			}
			if t := driverTaints(slices, dev); t != "" {
				held = append(held, fmt.Sprintf("%s: device %s tainted by %s (%s)", g.Describe(), dev.Name, dev.Driver, t))
			}
		}
		h.Held = strings.Join(held, "; ")
		var open []string
		for _, f := range others {
			if !isolated(f) {
				open = append(open, f.Spec.GPU.Describe())
			}
		}
		if len(open) > 0 {
			h.Blocked = fmt.Sprintf("%s out of service and not isolated yet: restarting the DRA kubelet plugin would clear its taint", strings.Join(open, ", "))
		}
		return h
	}
	capacity, allocatable := node.Status.Capacity[gpuResource], node.Status.Allocatable[gpuResource]
	if capacity.Value() == 0 {
		return h
	}
	if want := capacity.Value() - int64(len(others)); allocatable.Value() < want {
		h.Held = fmt.Sprintf("the device plugin gives out %d of the node's %d GPUs (%d expected back in service)", allocatable.Value(), capacity.Value(), want)
	}
	if len(others) > 0 {
		names := make([]string, len(others))
		for i, f := range others {
			names[i] = f.Spec.GPU.Describe()
		}
		h.Blocked = fmt.Sprintf("%s still out of service: restarting the device plugin would give it out again (the last repair of the node restarts it)", strings.Join(names, ", "))
	}
	return h
}

// driverTaints lists the taints a device carries in its ResourceSlice that
// keep pods away (NoSchedule, NoExecute): the driver's own.
func driverTaints(slices []resourcev1.ResourceSlice, dev Device) string {
	var out []string
	for i := range slices {
		s := &slices[i]
		if s.Spec.Driver != dev.Driver || s.Spec.Pool.Name != dev.Pool {
			continue
		}
		for _, d := range s.Spec.Devices {
			if d.Name != dev.Name {
				continue
			}
			for _, t := range d.Taints {
				if t.Effect == resourcev1.DeviceTaintEffectNoSchedule || t.Effect == resourcev1.DeviceTaintEffectNoExecute {
					kv := t.Key
					if t.Value != "" {
						kv += "=" + t.Value
					}
					out = append(out, kv+" "+string(t.Effect))
				}
			}
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// StackPods returns the node's pods that selectors choose (a pod matching
// any), ordered by name; a selector that does not parse is an error. Only
// the GPU stack's own DaemonSet pods can be chosen, whatever a selector
// matches: never a workload (a pod without a DaemonSet, or one using GPUs
// or a ResourceClaim), never the driver, whose restart would stop every
// GPU of the node.
func StackPods(pods []corev1.Pod, selectors []metav1.LabelSelector) ([]corev1.Pod, error) {
	sels := make([]labels.Selector, 0, len(selectors))
	for i := range selectors {
		s, err := metav1.LabelSelectorAsSelector(&selectors[i])
		if err != nil {
			return nil, fmt.Errorf("gpu.stackPods[%d]: %w", i, err)
		}
		if s.Empty() {
			return nil, fmt.Errorf("gpu.stackPods[%d] selects every pod of the node", i)
		}
		sels = append(sels, s)
	}
	var out []corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp != nil || !stackPod(&p) {
			continue
		}
		for _, s := range sels {
			if s.Matches(labels.Set(p.Labels)) {
				out = append(out, p)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name })
	return out, nil
}

// stackPod reports whether a pod may be one of the GPU stack's pods that
// RestartGPUStackPods restarts: a DaemonSet's, not the driver's, using no
// GPU and no ResourceClaim.
func stackPod(p *corev1.Pod) bool {
	c := metav1.GetControllerOf(p)
	return c != nil && c.Kind == "DaemonSet" && nvidiav1.PodComponent(p.Labels) != nvidiav1.Driver &&
		!requestsGPU(p) && len(p.Spec.ResourceClaims) == 0
}

// restartStackPods evicts the node's GPU stack pods, which their
// DaemonSets start again (an eviction, as a drain's: the operator needs no
// right to delete pods everywhere, and a PodDisruptionBudget of the stack
// is honoured; each with its UID as a precondition: a pod already replaced
// is left alone). It returns their names; none is not an error.
func (r *Repairer) restartStackPods(ctx context.Context, l *ladder) ([]string, error) {
	var pods corev1.PodList
	if err := r.Live.List(ctx, &pods, client.MatchingFields{"spec.nodeName": l.node.Name}); err != nil {
		return nil, fmt.Errorf("listing pods on node %s: %w", l.node.Name, err)
	}
	stack, err := StackPods(pods.Items, l.policy.Spec.GPU.StackPodSelectors())
	if err != nil {
		return nil, err
	}
	var names []string
	for i := range stack {
		p := &stack[i]
		ev := &policyv1.Eviction{DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}}}
		err := r.Client.SubResource("eviction").Create(ctx, p, ev)
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return names, fmt.Errorf("restarting pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		names = append(names, p.Namespace+"/"+p.Name)
	}
	return names, nil
}
