package repair

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Match is a rule whose condition a node shows now.
type Match struct {
	Rule      repairv1.Rule
	Condition corev1.NodeCondition
	// Since is when gpufleet first saw this rule match (its own clock).
	Since time.Time
}

// Evaluation is the outcome of Evaluate.
type Evaluation struct {
	// Fault is the first rule (in rule order) matched for at least its
	// threshold; nil when none.
	Fault *Match
	// Matches are all rules matching now.
	Matches []Match
	// Tracked is the new "first seen" time of every matching rule; rules
	// that no longer match are dropped. The caller persists it.
	Tracked map[string]time.Time
	// NextCheck is when a matching rule will cross its threshold (0: none).
	NextCheck time.Duration
}

// Evaluate matches a node's conditions against the rules. tracked holds
// when gpufleet first saw each rule match: a fault counts from that moment,
// not from the condition's own timestamps, so a detector restart (new
// lastTransitionTime) or a changed reason neither resets nor fakes the
// clock.
func Evaluate(node *corev1.Node, rules []repairv1.Rule, tracked map[string]time.Time, now time.Time) Evaluation {
	ev := Evaluation{Tracked: map[string]time.Time{}}
	for _, r := range rules {
		c, ok := matching(node, r)
		if !ok {
			continue
		}
		since, seen := tracked[r.Name]
		if !seen || since.After(now) {
			since = now
		}
		ev.Tracked[r.Name] = since
		m := Match{Rule: r, Condition: c, Since: since}
		ev.Matches = append(ev.Matches, m)
		threshold := time.Duration(r.ThresholdSeconds) * time.Second
		if left := since.Add(threshold).Sub(now); left <= 0 {
			if ev.Fault == nil {
				ev.Fault = &m
			}
		} else if ev.NextCheck == 0 || left < ev.NextCheck {
			ev.NextCheck = left
		}
	}
	return ev
}

func matching(node *corev1.Node, r repairv1.Rule) (corev1.NodeCondition, bool) {
	for _, c := range node.Status.Conditions {
		if string(c.Type) != r.ConditionType {
			continue
		}
		if string(c.Status) != r.Status {
			return c, false
		}
		if r.Reason != "" && !strings.EqualFold(c.Reason, r.Reason) {
			return c, false
		}
		if r.MessageContains != "" && !strings.Contains(strings.ToLower(c.Message), strings.ToLower(r.MessageContains)) {
			return c, false
		}
		return c, true
	}
	return corev1.NodeCondition{}, false
}

// Candidate is a node with a fault past its threshold.
type Candidate struct {
	Node string
	Pool string
	// Deleting, OtherMaintenance (held by another requestor's
	// NodeMaintenance) and RecoveryFailed (an earlier repair of the same
	// fault failed) make the node ineligible.
	Deleting         bool
	OtherMaintenance string
	RecoveryFailed   bool
}

// PoolState is what admission needs to know about a pool.
type PoolState struct {
	Size      int
	Unhealthy int // nodes with a fault (a rule matching), past its threshold or not
	Repairing bool
	Suspended string // why the pool is suspended, "" if not
}

// Decision says what happens to one candidate.
type Decision struct {
	Node string
	// Start: begin a repair. Ignore: record a NodeRepair in phase Ignored
	// (the node cannot be repaired now). Otherwise it waits with Reason.
	Start, Ignore bool
	Reason        string
}

// Admit decides which candidates start a repair: at most one repair per
// pool and at most maxParallelPools pools repairing; none in a suspended
// pool, none in a pool with more unhealthy nodes than maxUnhealthy allows
// (storm protection), none while paused.
func Admit(cands []Candidate, pools map[string]PoolState, spec *repairv1.NodeRepairPolicySpec) []Decision {
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].Pool != cands[j].Pool {
			return cands[i].Pool < cands[j].Pool
		}
		return cands[i].Node < cands[j].Node
	})
	maxPools := 1
	if spec.MaxParallelPools != nil {
		maxPools = int(*spec.MaxParallelPools)
	}
	repairing := map[string]bool{}
	for name, p := range pools {
		if p.Repairing {
			repairing[name] = true
		}
	}
	var out []Decision
	for _, c := range cands {
		d := Decision{Node: c.Node}
		p := pools[c.Pool]
		switch {
		case c.Deleting:
			d.Ignore, d.Reason = true, "node is being deleted"
		case c.OtherMaintenance != "":
			d.Ignore, d.Reason = true, "node is in planned maintenance by "+c.OtherMaintenance
		case c.RecoveryFailed:
			d.Reason = "an earlier repair of this fault failed; waiting for the fault to clear"
		case spec.Paused:
			d.Reason = "repairs are paused by the policy"
		case p.Suspended != "":
			d.Reason = fmt.Sprintf("pool %s is suspended: %s", c.Pool, p.Suspended)
		case tooUnhealthy(p, spec.MaxUnhealthy):
			d.Reason = fmt.Sprintf("storm protection: %d of %d nodes in pool %s are unhealthy (maxUnhealthy %s)", p.Unhealthy, p.Size, c.Pool, spec.MaxUnhealthy.String())
		case repairing[c.Pool]:
			d.Reason = fmt.Sprintf("pool %s already has a repair in progress", c.Pool)
		case len(repairing) >= maxPools:
			d.Reason = fmt.Sprintf("%d pool(s) already repairing (maxParallelPools %d)", len(repairing), maxPools)
		default:
			d.Start = true
			repairing[c.Pool] = true
		}
		out = append(out, d)
	}
	return out
}

func tooUnhealthy(p PoolState, limit *intstr.IntOrString) bool {
	if limit == nil {
		return false
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(limit, p.Size, false)
	if err != nil {
		return true // the schema rejects this; refuse rather than guess
	}
	return p.Unhealthy > n
}

// PlannedActions drops Reboot when reboots are not allowed.
func PlannedActions(r repairv1.Rule, allowReboot bool) []repairv1.Action {
	var out []repairv1.Action
	for _, a := range r.Actions {
		if a == repairv1.ActionReboot && !allowReboot {
			continue
		}
		out = append(out, a)
	}
	return out
}

// DrainFlags are the force and deleteEmptyDir of a repair's drains:
// unset, both true (a reboot ends bare pods and loses emptyDir data
// anyway; an eviction gives them their grace period and PodDisruption
// Budgets).
func DrainFlags(spec *repairv1.DrainSpec) (force, deleteEmptyDir bool) {
	if spec == nil {
		return true, true
	}
	return ptr.Deref(spec.Force, true), ptr.Deref(spec.DeleteEmptyDir, true)
}

// DrainTimeout is max(10 min, the largest terminationGracePeriodSeconds of
// the node's pods), at most 30 min; an explicit timeout wins.
func DrainTimeout(spec *repairv1.DrainSpec, pods []corev1.Pod) time.Duration {
	if spec != nil && spec.TimeoutSeconds != nil {
		return time.Duration(*spec.TimeoutSeconds) * time.Second
	}
	d := 10 * time.Minute
	for _, p := range pods {
		if g := p.Spec.TerminationGracePeriodSeconds; g != nil && time.Duration(*g)*time.Second > d {
			d = time.Duration(*g) * time.Second
		}
	}
	return min(d, 30*time.Minute)
}
