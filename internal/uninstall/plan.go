// Package uninstall removes gpufleet from a cluster without leaving a node
// cordoned or an object stuck behind a finalizer: it stops the operator,
// then releases every NodeMaintenance the way the lifecycle controller's
// finalizer would (uncordon what a maintenance cordoned, remove the
// finalizer), so the release no longer depends on an operator that is
// about to be deleted. The plan is a pure function; Run executes it one
// idempotent step at a time, so an interrupted uninstall is finished by
// running it again.
package uninstall

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// Plan is what releasing every NodeMaintenance does.
type Plan struct {
	// Delete: objects not yet being deleted.
	Delete []client.ObjectKey
	// Uncordon: nodes that a maintenance cordoned and that are still
	// unschedulable.
	Uncordon []string
	// LeftCordoned: unschedulable nodes of a maintenance that did not
	// cordon them, and why they stay cordoned.
	LeftCordoned map[string]string
	// Finalize: objects whose maintenance finalizer is removed (after the
	// uncordons, so an interrupted run still finds them).
	Finalize []client.ObjectKey
	// InProgress names, per node, the objects that held it (for the
	// report: their requestors lose the node).
	InProgress map[string][]string
}

// Empty reports whether there is nothing to release.
func (p Plan) Empty() bool {
	return len(p.Delete) == 0 && len(p.Uncordon) == 0 && len(p.Finalize) == 0
}

// MakePlan decides the release of nms on nodes (by name; a node missing
// from the map was deleted). A node is uncordoned when it is unschedulable
// and one of its in-progress objects cordoned it (it was schedulable when
// that maintenance began); every object holding it is released at once,
// since nothing will hold a node once the operator is gone. A node cordoned
// before its maintenance, or by someone else, stays cordoned.
func MakePlan(nms []maintenancev1.NodeMaintenance, nodes map[string]*corev1.Node) Plan {
	p := Plan{LeftCordoned: map[string]string{}, InProgress: map[string][]string{}}
	cordonedBy := map[string]bool{}
	for i := range nms {
		nm := &nms[i]
		key := client.ObjectKeyFromObject(nm)
		if nm.DeletionTimestamp == nil {
			p.Delete = append(p.Delete, key)
		}
		if nm.HasFinalizer() {
			p.Finalize = append(p.Finalize, key)
		}
		node := nm.Spec.NodeName
		if !nm.InProgress() {
			continue
		}
		p.InProgress[node] = append(p.InProgress[node], fmt.Sprintf("%s (%s, %s)", key, nm.Spec.RequestorID, nm.Phase()))
		if nm.CordonedTheNode() {
			cordonedBy[node] = true
		}
	}
	for node, objs := range p.InProgress {
		sort.Strings(objs)
		n, ok := nodes[node]
		switch {
		case !ok || !n.Spec.Unschedulable:
		case cordonedBy[node]:
			p.Uncordon = append(p.Uncordon, node)
		default:
			p.LeftCordoned[node] = "cordoned before its maintenance, or not by one"
		}
	}
	slices.Sort(p.Uncordon)
	sortKeys(p.Delete)
	sortKeys(p.Finalize)
	return p
}

func sortKeys(keys []client.ObjectKey) {
	slices.SortFunc(keys, func(a, b client.ObjectKey) int { return strings.Compare(a.String(), b.String()) })
}

// Describe is the plan for people, one line per action.
func (p Plan) Describe() []string {
	if p.Empty() {
		return []string{"no NodeMaintenance to release"}
	}
	var out []string
	nodes := make([]string, 0, len(p.InProgress))
	for n := range p.InProgress {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		out = append(out, fmt.Sprintf("node %s is held by %s", n, strings.Join(p.InProgress[n], ", ")))
	}
	for _, n := range p.Uncordon {
		out = append(out, "uncordon node "+n+" (its maintenance cordoned it)")
	}
	left := make([]string, 0, len(p.LeftCordoned))
	for n := range p.LeftCordoned {
		left = append(left, n)
	}
	sort.Strings(left)
	for _, n := range left {
		out = append(out, fmt.Sprintf("leave node %s cordoned (%s)", n, p.LeftCordoned[n]))
	}
	out = append(out, fmt.Sprintf("delete %d NodeMaintenance objects, remove the finalizer of %d", len(p.Delete), len(p.Finalize)))
	return out
}
