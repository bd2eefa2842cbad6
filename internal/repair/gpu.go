package repair

import (
	"fmt"
	"sort"
	"strings"
	"time"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Defaults of a policy's gpu.replaceAfter.
const (
	defaultReplaceCount  = 3
	defaultReplaceWindow = 24 * time.Hour
)

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
