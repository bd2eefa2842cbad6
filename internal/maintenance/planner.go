// Package maintenance implements NodeMaintenance: the scheduler that admits
// requests under the cluster's limits (planner.go, pure), and the lifecycle
// controller that cordons, waits for pods, drains, reports Ready and cleans up.
package maintenance

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// PlanNode is what the planner needs to know about a node.
type PlanNode struct {
	Name          string
	Unschedulable bool
	Ready         bool
	// Pools names the config's pools the node belongs to.
	Pools []string
	// Domain names the node's NVLink domain ("": none); used only when
	// Limits.Domains is set.
	Domain string
	// ComputeDomain names the ComputeDomain whose workload runs on the
	// node ("": none): its domain is busy (preferred last, named in wait
	// reasons). Used only when Limits.Domains is set.
	ComputeDomain string
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
	// Urgent objects rank first and may pass a closed maintenance window
	// (see Limits.UrgentScope).
	Urgent bool
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
	// Pools have their own limits, on top of the cluster-wide ones; they
	// are checked in this order.
	Pools []PoolLimits
	// Calendar says when new maintenance may start (zero: always).
	Calendar Calendar
	// UrgentScope says which urgent objects pass a closed calendar ("":
	// UnavailableNodes).
	UrgentScope maintenancev1.UrgentMaintenanceScope
	// Domains: nil when spec.domains is not set.
	Domains *DomainLimits
}

// PoolLimits are one pool's limits (nil: no pool limit).
type PoolLimits struct {
	Name                                  string
	MaxParallelOperations, MaxUnavailable *intstr.IntOrString
}

// PoolPlan is one pool's resolved limits and use, before the plan.
type PoolPlan struct {
	Name  string
	Nodes int
	// MaxParallel and MaxUnavailable are -1 when the pool has no such limit.
	MaxParallel, MaxUnavailable int
	InProgress, Unavailable     int
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
	// AvailableSlots and CanBecomeUnavailable are steps 1 and 2 of the
	// scheduling algorithm, requirement M4 in docs/requirements.md
	// (CanBecomeUnavailable is -1 when unlimited).
	AvailableSlots, CanBecomeUnavailable int
	// Pools: each configured pool, in the config's order.
	Pools []PoolPlan
	// Window is the calendar at the time of the plan; the scheduler wakes
	// at Window.NextChange.
	Window CalendarState
	// TotalDomains counts the nodes' domains (0 without spec.domains).
	TotalDomains int
	// MaxDisruptedDomains is resolved against TotalDomains; -1 when unlimited.
	MaxDisruptedDomains int
	// DisruptedDomains counts domains with a node in maintenance, before
	// this plan.
	DisruptedDomains int
	// NextDomainStart is when the first domain whose requests are being
	// collected may start (zero: none); the scheduler looks again then.
	NextDomainStart time.Time
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
	if n < 0 || (v.Type == intstr.String && strings.HasPrefix(v.StrVal, "-")) {
		return 0, fmt.Errorf("must not be negative, got %s", v.String())
	}
	if v.Type == intstr.String && n > total {
		return 0, fmt.Errorf("percentage above 100%%: %s", v.String())
	}
	return n, nil
}

// MakePlan runs the scheduling algorithm (requirement M4 in
// docs/requirements.md; for users, docs/maintenance.md and
// docs/concepts.md) on a snapshot at now, with gpufleet's additions:
// maintenance windows (a closed calendar holds back everything but urgent
// objects of unavailable nodes), per-pool limits (on top of the
// cluster-wide ones) and urgency (urgent objects rank first).
// With domains (Limits.Domains), the domain budget applies and the pending
// requests of a disrupted domain are co-scheduled (domains.go).
// Without windows, pools, domains and urgent objects it is exactly the
// algorithm of requirement M4 in docs/requirements.md.
func MakePlan(s Snapshot, l Limits, now time.Time) (Plan, error) {
	nodes := make(map[string]PlanNode, len(s.Nodes))
	for _, n := range s.Nodes {
		nodes[n.Name] = n
	}
	p := Plan{TotalNodes: len(nodes), Waiting: map[string]string{}, Window: l.Calendar.At(now)}
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
	pools, err := planPools(l.Pools, nodes, busy)
	if err != nil {
		return Plan{}, err
	}
	p.Pools = pools
	domains, err := newDomainUse(l.Domains, nodes, busy, s.Objects, &p)
	if err != nil {
		return Plan{}, err
	}

	// Steps 3 and 4: candidate objects are Pending objects on nodes that no
	// in-progress object holds. Rank keys are computed once.
	type candidate struct {
		PlanObject
		key     string
		active  bool
		pending int
	}
	urgentScope := l.UrgentScope
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
		if a.Urgent != b.Urgent {
			if a.Urgent {
				return -1
			}
			return 1
		}
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

	// Step 6: walk the ranked list (with co-scheduling, in the order of
	// domainUse.visitOrder). A candidate that does not fit the
	// unavailability budget is skipped without using a slot, so a later
	// candidate on an already-unavailable node can still be scheduled.
	slots, budget, newlyUnavailable := p.AvailableSlots, p.CanBecomeUnavailable, 0
	poolUse := newPoolUse(p.Pools)
	claimed := make(map[string]string, len(candidates)) // node -> best-ranked candidate's key
	var slotsMsg, budgetMsg string                      // built once: they no longer change when used
	// limited: candidates of a domain that wait for a limit; if their
	// domain is disrupted after the walk, the reason says they will join it.
	var limited []int
	wait := func(i int, why string) {
		p.Waiting[candidates[i].key] = why
		if domains != nil && domains.coSchedule && domains.domainOf(nodes[candidates[i].NodeName]) != "" {
			limited = append(limited, i)
		}
	}
	visit := func(i int) {
		c := &candidates[i]
		if winner, ok := claimed[c.NodeName]; ok {
			p.Waiting[c.key] = "another request for node " + c.NodeName + " ranks higher (" + winner + ")"
			return
		}
		claimed[c.NodeName] = c.key
		n, exists := nodes[c.NodeName]
		if !exists {
			p.Waiting[c.key] = "node " + c.NodeName + " does not exist"
			return
		}
		if !p.Window.Open && !passesClosedWindow(c.PlanObject, n, urgentScope) {
			wait(i, windowMessage(p.Window, c.PlanObject, urgentScope))
			return
		}
		if why := domains.blocks(n); why != "" {
			p.Waiting[c.key] = why
			return
		}
		if !c.Urgent {
			if why, until := domains.collecting(domains.domainOf(n), now); why != "" {
				p.Waiting[c.key] = why
				if p.NextDomainStart.IsZero() || until.Before(p.NextDomainStart) {
					p.NextDomainStart = until
				}
				return
			}
		}
		switch {
		case slots == 0:
			if slotsMsg == "" {
				slotsMsg = p.slotsMessage()
			}
			wait(i, slotsMsg)
		case n.available() && budget == 0:
			if budgetMsg == "" {
				budgetMsg = fmt.Sprintf("maxUnavailable budget exhausted: %d/%d nodes unavailable",
					p.Unavailable+newlyUnavailable, p.MaxUnavailable)
			}
			wait(i, budgetMsg)
		default:
			if why := poolUse.blocks(n); why != "" {
				wait(i, why)
				return
			}
			p.Schedule = append(p.Schedule, c.PlanObject)
			poolUse.take(n)
			domains.take(n)
			slots--
			if n.available() {
				newlyUnavailable++
				if budget > 0 {
					budget--
				}
			}
		}
	}
	domains.visitOrder(len(candidates),
		func(i int) bool { return candidates[i].Urgent },
		func(i int) string { return domains.domainOf(nodes[candidates[i].NodeName]) },
		visit)
	for _, i := range limited {
		c := candidates[i]
		if d := domains.domainOf(nodes[c.NodeName]); domains.isDisrupted(d) {
			p.Waiting[c.key] = domains.coScheduleReason(d, p.Waiting[c.key])
		}
	}
	for i := range candidates {
		c := &candidates[i]
		if why, ok := p.Waiting[c.key]; ok {
			p.Waiting[c.key] = why + domains.busyNote(domains.domainOf(nodes[c.NodeName]))
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

// passesClosedWindow: an urgent object of an unavailable node (or any
// urgent object, when the config allows) is not held back by the calendar.
func passesClosedWindow(o PlanObject, n PlanNode, scope maintenancev1.UrgentMaintenanceScope) bool {
	return o.Urgent && (scope == maintenancev1.UrgentAllNodes || !n.available())
}

func windowMessage(w CalendarState, o PlanObject, scope maintenancev1.UrgentMaintenanceScope) string {
	if o.Urgent && scope != maintenancev1.UrgentAllNodes {
		return w.Reason + " (urgent, but its node is available: urgent requests pass a closed window only for nodes that are already unavailable)"
	}
	return w.Reason
}

// planPools resolves each pool's limits against its own nodes and counts
// its in-progress and unavailable nodes.
func planPools(limits []PoolLimits, nodes map[string]PlanNode, busy map[string]string) ([]PoolPlan, error) {
	if len(limits) == 0 {
		return nil, nil
	}
	index := make(map[string]int, len(limits))
	out := make([]PoolPlan, len(limits))
	for i, l := range limits {
		index[l.Name] = i
		out[i] = PoolPlan{Name: l.Name}
	}
	for name, n := range nodes {
		_, held := busy[name]
		for _, pool := range n.Pools {
			i, ok := index[pool]
			if !ok {
				continue
			}
			out[i].Nodes++
			if held {
				out[i].InProgress++
			}
			if held || !n.available() {
				out[i].Unavailable++
			}
		}
	}
	for i, l := range limits {
		out[i].MaxParallel, out[i].MaxUnavailable = -1, -1
		var err error
		if l.MaxParallelOperations != nil {
			if out[i].MaxParallel, err = scaled(*l.MaxParallelOperations, out[i].Nodes, true); err != nil {
				return nil, fmt.Errorf("pool %s: maxParallelOperations: %w", l.Name, err)
			}
		}
		if l.MaxUnavailable != nil {
			if out[i].MaxUnavailable, err = scaled(*l.MaxUnavailable, out[i].Nodes, false); err != nil {
				return nil, fmt.Errorf("pool %s: maxUnavailable: %w", l.Name, err)
			}
		}
	}
	return out, nil
}

// poolUse tracks the pools' remaining slots and budgets during one plan.
type poolUse struct {
	pools []PoolPlan
	index map[string]int
	// started and newlyUnavailable count this plan's decisions per pool.
	started, newlyUnavailable []int
}

func newPoolUse(pools []PoolPlan) *poolUse {
	u := &poolUse{pools: pools, index: make(map[string]int, len(pools)),
		started: make([]int, len(pools)), newlyUnavailable: make([]int, len(pools))}
	for i, p := range pools {
		u.index[p.Name] = i
	}
	return u
}

// blocks says why a pool of n has no room for one more node ("" if all do).
func (u *poolUse) blocks(n PlanNode) string {
	for _, name := range n.Pools {
		i, ok := u.index[name]
		if !ok {
			continue
		}
		p := u.pools[i]
		switch {
		case p.MaxParallel == 0:
			return fmt.Sprintf("pool %s: maxParallelOperations is 0: no new maintenance is scheduled in it", p.Name)
		case p.MaxParallel > 0 && p.InProgress+u.started[i] >= p.MaxParallel:
			return fmt.Sprintf("pool %s: maxParallelOperations reached: %d/%d nodes in maintenance", p.Name, p.InProgress+u.started[i], p.MaxParallel)
		case n.available() && p.MaxUnavailable >= 0 && p.Unavailable+u.newlyUnavailable[i] >= p.MaxUnavailable:
			return fmt.Sprintf("pool %s: maxUnavailable budget exhausted: %d/%d nodes unavailable", p.Name, p.Unavailable+u.newlyUnavailable[i], p.MaxUnavailable)
		}
	}
	return ""
}

// take records that n starts maintenance.
func (u *poolUse) take(n PlanNode) {
	for _, name := range n.Pools {
		if i, ok := u.index[name]; ok {
			u.started[i]++
			if n.available() {
				u.newlyUnavailable[i]++
			}
		}
	}
}
