// Package maintenance implements NodeMaintenance: the scheduler that admits
// requests under the cluster's limits (planner.go, pure), and the lifecycle
// controller that cordons, waits for pods, drains, reports Ready and cleans up.
package maintenance

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// PlanNode is what the planner needs to know about a node.
type PlanNode struct {
	Name          string
	Unschedulable bool
	Ready         bool
}

// available reports whether the node counts as available for maxUnavailable.
func (n PlanNode) available() bool { return n.Ready && !n.Unschedulable }

// PlanObject is what the planner needs to know about a NodeMaintenance.
type PlanObject struct {
	Namespace, Name string
	NodeName        string
	RequestorID     string
	Created         time.Time
	// InProgress is true in every phase after Pending, until the object is gone.
	InProgress bool
	// Deleting objects that are still Pending are never scheduled.
	Deleting bool
}

// Key is namespace/name.
func (o PlanObject) Key() string { return o.Namespace + "/" + o.Name }

// Snapshot is the cluster state one planning pass decides on.
type Snapshot struct {
	Nodes   []PlanNode
	Objects []PlanObject
}

// Limits are the scheduler's settings from MaintenanceOperatorConfig.
type Limits struct {
	// MaxParallelOperations: nil means the default, 1.
	MaxParallelOperations *intstr.IntOrString
	// MaxUnavailable: nil means no limit.
	MaxUnavailable *intstr.IntOrString
}

// Plan is the outcome of one planning pass.
type Plan struct {
	// Schedule lists the objects to move to Scheduled, best-ranked first.
	Schedule []PlanObject
	// Waiting gives, for every Pending object not scheduled now, why it waits
	// (keyed by namespace/name).
	Waiting map[string]string

	TotalNodes int
	// MaxParallel is maxParallelOperations resolved against TotalNodes.
	MaxParallel int
	// MaxUnavailable is resolved against TotalNodes; -1 when unlimited.
	MaxUnavailable int
	// InProgressNodes counts nodes with an in-progress object, before this plan.
	InProgressNodes int
	// Unavailable counts unavailable nodes, before this plan.
	Unavailable int
	// AvailableSlots and CanBecomeUnavailable are M4 steps 1 and 2
	// (CanBecomeUnavailable is -1 when unlimited).
	AvailableSlots, CanBecomeUnavailable int
}

// ResolveLimits turns the int-or-percent limits into node counts:
// maxParallelOperations rounds up, maxUnavailable rounds down (-1 = no limit).
func ResolveLimits(l Limits, totalNodes int) (maxParallel, maxUnavailable int, err error) {
	mpo := intstr.FromInt32(1)
	if l.MaxParallelOperations != nil {
		mpo = *l.MaxParallelOperations
	}
	maxParallel, err = scaled(mpo, totalNodes, true)
	if err != nil {
		return 0, 0, fmt.Errorf("maxParallelOperations: %w", err)
	}
	maxUnavailable = -1
	if l.MaxUnavailable != nil {
		maxUnavailable, err = scaled(*l.MaxUnavailable, totalNodes, false)
		if err != nil {
			return 0, 0, fmt.Errorf("maxUnavailable: %w", err)
		}
	}
	return maxParallel, maxUnavailable, nil
}

func scaled(v intstr.IntOrString, total int, roundUp bool) (int, error) {
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, total, roundUp)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("must not be negative, got %s", v.String())
	}
	if v.Type == intstr.String && n > total {
		return 0, fmt.Errorf("percentage above 100%%: %s", v.String())
	}
	return n, nil
}

// MakePlan runs the scheduling algorithm of SPEC M4 on a snapshot.
func MakePlan(s Snapshot, l Limits) (Plan, error) {
	nodes := make(map[string]PlanNode, len(s.Nodes))
	for _, n := range s.Nodes {
		nodes[n.Name] = n
	}
	p := Plan{TotalNodes: len(nodes), Waiting: map[string]string{}}
	var err error
	if p.MaxParallel, p.MaxUnavailable, err = ResolveLimits(l, p.TotalNodes); err != nil {
		return Plan{}, err
	}

	// Nodes held by in-progress objects (the smallest key names the holder,
	// so the output does not depend on input order), and requestors that
	// have one.
	busy := map[string]string{} // node -> key of an in-progress object
	activeRequestors := map[string]bool{}
	pendingPerRequestor := map[string]int{}
	for _, o := range s.Objects {
		switch {
		case o.InProgress:
			if k, ok := busy[o.NodeName]; !ok || o.Key() < k {
				busy[o.NodeName] = o.Key()
			}
			activeRequestors[o.RequestorID] = true
		case !o.Deleting:
			pendingPerRequestor[o.RequestorID]++
		}
	}
	p.InProgressNodes = len(busy)

	// Step 1: availableSlots (never more than there are nodes).
	p.AvailableSlots = min(max(0, p.MaxParallel-p.InProgressNodes), p.TotalNodes)

	// Step 2: canBecomeUnavailable; each node counted once.
	for name, n := range nodes {
		if _, held := busy[name]; held || !n.available() {
			p.Unavailable++
		}
	}
	p.CanBecomeUnavailable = -1
	if p.MaxUnavailable >= 0 {
		p.CanBecomeUnavailable = max(0, p.MaxUnavailable-p.Unavailable)
	}

	// Steps 3 and 4: candidate objects are Pending objects on nodes that no
	// in-progress object holds. Rank keys are computed once.
	type candidate struct {
		PlanObject
		key     string
		active  bool
		pending int
	}
	candidates := make([]candidate, 0, len(s.Objects))
	for _, o := range s.Objects {
		if o.InProgress || o.Deleting {
			continue
		}
		if holder, held := busy[o.NodeName]; held {
			p.Waiting[o.Key()] = "node " + o.NodeName + " is in maintenance for " + holder
			continue
		}
		candidates = append(candidates, candidate{PlanObject: o, key: o.Key(),
			active: activeRequestors[o.RequestorID], pending: pendingPerRequestor[o.RequestorID]})
	}

	// Step 5: rank.
	slices.SortFunc(candidates, func(a, b candidate) int {
		if a.active != b.active {
			if a.active {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(a.pending, b.pending); c != 0 {
			return c
		}
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return cmp.Or(
			cmp.Compare(a.NodeName, b.NodeName),
			cmp.Compare(a.RequestorID, b.RequestorID),
			cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Name, b.Name),
		)
	})

	// Step 6: walk the ranked list. A candidate that does not fit the
	// unavailability budget is skipped without using a slot, so a later
	// candidate on an already-unavailable node can still be scheduled.
	slots, budget, newlyUnavailable := p.AvailableSlots, p.CanBecomeUnavailable, 0
	claimed := make(map[string]string, len(candidates)) // node -> best-ranked candidate's key
	var slotsMsg, budgetMsg string                      // built once: they no longer change when used
	for _, c := range candidates {
		if winner, ok := claimed[c.NodeName]; ok {
			p.Waiting[c.key] = "another request for node " + c.NodeName + " ranks higher (" + winner + ")"
			continue
		}
		claimed[c.NodeName] = c.key
		n, exists := nodes[c.NodeName]
		switch {
		case !exists:
			p.Waiting[c.key] = "node " + c.NodeName + " does not exist"
		case slots == 0:
			if slotsMsg == "" {
				slotsMsg = p.slotsMessage()
			}
			p.Waiting[c.key] = slotsMsg
		case n.available() && budget == 0:
			if budgetMsg == "" {
				budgetMsg = fmt.Sprintf("maxUnavailable budget exhausted: %d/%d nodes unavailable",
					p.Unavailable+newlyUnavailable, p.MaxUnavailable)
			}
			p.Waiting[c.key] = budgetMsg
		default:
			p.Schedule = append(p.Schedule, c.PlanObject)
			slots--
			if n.available() {
				newlyUnavailable++
				if budget > 0 {
					budget--
				}
			}
		}
	}
	return p, nil
}

func (p Plan) slotsMessage() string {
	if p.MaxParallel == 0 {
		return "maxParallelOperations is 0: no new maintenance is scheduled"
	}
	return fmt.Sprintf("maxParallelOperations reached: %d/%d nodes in maintenance", p.InProgressNodes+len(p.Schedule), p.MaxParallel)
}
