package repair

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Defaults of a policy's gpu.replaceAfter.
const (
	defaultReplaceCount  = 3
	defaultReplaceWindow = 24 * time.Hour
)

// defaultWholeNodeAfter is gpu.wholeNodeAfter's default: half of the
// node's GPUs.
var defaultWholeNodeAfter = intstr.FromString("50%")

// wholeNode says why a GPU repair of node takes the whole node rather than
// resetting its GPUs one by one ("" when it does not): on a node whose GPUs
// the policy's DRA driver does not publish (the device plugin gives them
// out, and cannot be told which to skip), once the out-of-service GPUs
// reach gpu.wholeNodeAfter of the node's nvidia.com/gpu capacity. A DRA
// node keeps the per-GPU path: each faulty device is tainted.
func wholeNode(node *corev1.Node, gpus []*repairv1.GPUFault, slices []resourcev1.ResourceSlice, spec *repairv1.NodeRepairPolicySpec) string {
	capacity := node.Status.Capacity[gpuResource]
	total := int(min(max(capacity.Value(), 0), 1<<16))
	if total == 0 || len(gpus) == 0 || publishesNode(slices, draDriver(spec), node.Name) {
		return ""
	}
	threshold := defaultWholeNodeAfter
	if spec.GPU.WholeNodeAfter != nil {
		threshold = *spec.GPU.WholeNodeAfter
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(&threshold, total, true)
	if err != nil {
		return "" // the schema rejects such a value
	}
	n = max(n, 1)
	if len(gpus) < n {
		return ""
	}
	return fmt.Sprintf("%d of the node's %d GPUs out of service (gpu.wholeNodeAfter %s: %d) on a device-plugin node: the whole node is cordoned, drained and rebooted",
		len(gpus), total, threshold.String(), n)
}

// publishesNode reports whether driver publishes devices of node.
func publishesNode(slices []resourcev1.ResourceSlice, driver, node string) bool {
	for i := range slices {
		if s := &slices[i]; s.Spec.Driver == driver && s.Spec.NodeName != nil && *s.Spec.NodeName == node && len(s.Spec.Devices) > 0 {
			return true
		}
	}
	return false
}

// isGPURule reports whether a rule matches the node agent's GPU condition:
// its repairs are about the node's out-of-service GPUs.
func isGPURule(r repairv1.Rule) bool {
	return strings.EqualFold(r.ConditionType, repairv1.ConditionGPUProblem)
}

// outOfService returns the GPUFault records of node whose GPU is out of
// service, ordered by PCI bus ID.
func outOfService(node string, faults []repairv1.GPUFault) []*repairv1.GPUFault {
	var out []*repairv1.GPUFault
	for i := range faults {
		if f := &faults[i]; f.Spec.NodeName == node && !f.InService() {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.GPU.PCIBusID < out[j].Spec.GPU.PCIBusID })
	return out
}

// gpuRepair fills a GPU repair from the node's out-of-service GPUs: which
// GPUs it is about and, when no automatic action can help, what a person
// has to do — a GPU whose fault calls for replacement, or one taken out of
// service limit.Count times within the window (no endless reset loop).
func gpuRepair(r *repairv1.NodeRepair, gpus []*repairv1.GPUFault, limit *repairv1.RepeatLimit, now time.Time) {
	count, window := int32(defaultReplaceCount), defaultReplaceWindow
	if limit != nil {
		count, window = limit.Count, time.Duration(limit.WindowSeconds)*time.Second
	}
	var replace []string
	for _, g := range gpus {
		r.Spec.GPUs = append(r.Spec.GPUs, g.Spec.GPU)
		switch n := occurrencesSince(g, now.Add(-window)); {
		case g.Status.Class == repairv1.GPUClassReplace:
			replace = append(replace, fmt.Sprintf("%s: %s", g.Spec.GPU.Describe(), g.Status.Summary))
		case n >= int(count):
			replace = append(replace, fmt.Sprintf("%s: out of service %d times within %s (replaceAfter %d)", g.Spec.GPU.Describe(), n, window, count))
		}
	}
	if len(replace) > 0 {
		r.Spec.Recommendation = truncate("replace "+strings.Join(replace, "; replace "), 1024)
	}
}

func occurrencesSince(g *repairv1.GPUFault, from time.Time) int {
	n := 0
	for _, t := range g.Status.Occurrences {
		if !t.Time.Before(from) {
			n++
		}
	}
	return n
}

// gpuNames lists GPUs for people.
func gpuNames(gpus []repairv1.GPURef) string {
	names := make([]string, len(gpus))
	for i, g := range gpus {
		names[i] = g.Describe()
	}
	return strings.Join(names, ", ")
}

// gpusInService reports whether every GPU of a repair is back in service:
// its record shows no fault that takes it out of service (a record that is
// gone counts as in service).
func gpusInService(gpus []repairv1.GPURef, node string, faults []repairv1.GPUFault) bool {
	for _, f := range outOfService(node, faults) {
		for _, g := range gpus {
			if f.Spec.GPU.PCIBusID == g.PCIBusID {
				return false
			}
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n-len("…")], "") + "…"
}

// allocatedPods returns the pods holding the GPUs of a repair, as their
// records say (device plugin: the node agent read them from the kubelet's
// pod-resources API), in order and without repeats. known is false when
// the record of one of the GPUs does not say (no record, or no
// allocation): which pods hold it is not known.
func allocatedPods(gpus []repairv1.GPURef, node string, faults []repairv1.GPUFault) (pods []repairv1.PodRef, known bool) {
	seen := map[repairv1.PodRef]bool{}
	for _, g := range gpus {
		var rec *repairv1.GPUFault
		for i := range faults {
			if f := &faults[i]; f.Spec.NodeName == node && g.PCIBusID != "" && f.Spec.GPU.PCIBusID == g.PCIBusID {
				rec = f
			}
		}
		if rec == nil || rec.Status.Allocation == nil {
			return nil, false
		}
		for _, p := range rec.Status.Allocation.Pods {
			if !seen[p] {
				seen[p] = true
				pods = append(pods, p)
			}
		}
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].String() < pods[j].String() })
	return pods, true
}
