package repair

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// DetectInput is what the detector knows when it evaluates one policy.
type DetectInput struct {
	Policy *repairv1.NodeRepairPolicy
	// Nodes selected by the policy.
	Nodes []corev1.Node
	// Repairs: every NodeRepair.
	Repairs []repairv1.NodeRepair
	// Maintenances: every NodeMaintenance.
	Maintenances []maintenancev1.NodeMaintenance
	// GPUFaults: every GPUFault record (the node agents' view of the GPUs).
	GPUFaults []repairv1.GPUFault
	// Slices: the ResourceSlices of the nodes with out-of-service GPUs
	// (whether a node's GPUs are published through DRA).
	Slices []resourcev1.ResourceSlice
	Now    time.Time
}

// Detection is what the detector writes for one pass; Detect computes it
// without a client.
type Detection struct {
	// Tracked holds, per node whose fault clock changed, the new clock
	// (nil: remove it).
	Tracked map[string]map[string]time.Time
	// Resolved: RecoveryFailed repairs whose fault cleared; their node
	// loses its RecoveryFailed state and their pool is no longer suspended.
	Resolved []*repairv1.NodeRepair
	// Create: NodeRepairs to create, complete. A repair to run has no
	// DryRun and no IgnoreReason; the others are records only.
	Create []*repairv1.NodeRepair
	// Prune: finished NodeRepairs of the policy past its historyLimit.
	Prune []*repairv1.NodeRepair
	// Status is the policy's new status.
	Status repairv1.NodeRepairPolicyStatus
	// Next is when a fault will cross its threshold (0: none).
	Next time.Duration
}

// occurrence identifies one fault of one node: a fault that clears and comes
// back is a new occurrence (gpufleet's clock starts again).
func occurrence(node, rule string, since time.Time) string {
	return node + "/" + rule + "/" + since.UTC().Format(time.RFC3339)
}

// Detect evaluates every node of a policy: it advances the fault clocks,
// lifts suspensions whose fault cleared, and decides under the blast-radius
// limits which faults start a repair, which are recorded only (dry run;
// ignored nodes) and which wait. Each occurrence of a fault is recorded at
// most once.
func Detect(in DetectInput) Detection {
	spec := &in.Policy.Spec
	rules := RulesOf(spec)
	poolLabel := spec.PoolLabel
	if poolLabel == "" {
		poolLabel = DefaultPoolLabel
	}
	out := Detection{Tracked: map[string]map[string]time.Time{}}
	active, failed := map[string]bool{}, map[string]*repairv1.NodeRepair{}
	recorded := map[string]bool{} // occurrences with a dry-run or ignore record, by kind
	for i := range in.Repairs {
		r := &in.Repairs[i]
		switch {
		case r.Recorded():
			kind := "ignore"
			if r.Spec.DryRun {
				kind = "dryrun"
			}
			recorded[kind+":"+occurrence(r.Spec.NodeName, r.Spec.Fault.Rule, r.Spec.Fault.Since.Time)] = true
		case r.Status.Phase == repairv1.PhaseRepairing || r.Status.Phase == "":
			active[r.Spec.NodeName] = true
		case r.Status.Phase == repairv1.PhaseRecoveryFailed && r.Labels[labelResolved] != "true" && !r.Requested():
			// (A reboot another controller asked for that failed is that
			// controller's failure to report, not a suspect pool.)
			failed[r.Spec.NodeName] = r
		}
	}
	otherMaintenance := map[string]string{}
	for i := range in.Maintenances {
		if nm := &in.Maintenances[i]; nm.Spec.RequestorID != Requestor && nm.Active() {
			otherMaintenance[nm.Spec.NodeName] = nm.Spec.RequestorID
		}
	}
	status := in.Policy.Status.DeepCopy()
	meta.RemoveStatusCondition(&status.Conditions, conditionInvalid)
	pools := map[string]PoolState{}
	var cands []Candidate
	faults := map[string]*Match{}
	nodePool := map[string]string{}
	nodes := map[string]*corev1.Node{}
	for i := range in.Nodes {
		n := &in.Nodes[i]
		nodes[n.Name] = n
		pool := n.Labels[poolLabel]
		nodePool[n.Name] = pool
		ps := pools[pool]
		ps.Size++
		tracked := trackedOf(n)
		ev := Evaluate(n, rules, tracked, in.Now)
		if !sameTracked(tracked, ev.Tracked) {
			out.Tracked[n.Name] = ev.Tracked
		}
		if ev.NextCheck > 0 && (out.Next == 0 || ev.NextCheck < out.Next) {
			out.Next = ev.NextCheck
		}
		ps.Repairing = ps.Repairing || active[n.Name]
		if f := failed[n.Name]; f != nil && ev.Fault == nil && !matchesRule(ev, f.Spec.Fault.Rule) {
			out.Resolved = append(out.Resolved, f)
			status.SuspendedPools = withoutPool(status.SuspendedPools, pool, n.Name)
			delete(failed, n.Name)
		}
		if len(ev.Matches) > 0 {
			// A fault counts for storm protection from the moment it is
			// seen, not only past its threshold: faults that start
			// within one threshold window count together.
			ps.Unhealthy++
		}
		if f := ev.Fault; f != nil && !active[n.Name] && (!spec.DryRun || !recorded["dryrun:"+occurrence(n.Name, f.Rule.Name, f.Since)]) {
			faults[n.Name] = f
			fr := failed[n.Name]
			cands = append(cands, Candidate{Node: n.Name, Pool: pool, Deleting: n.DeletionTimestamp != nil,
				OtherMaintenance: otherMaintenance[n.Name], RecoveryFailed: fr != nil && fr.Spec.Fault.Rule == f.Rule.Name})
		}
		pools[pool] = ps
	}
	for _, r := range failed {
		if r.Spec.Recommendation != "" {
			// A report for a person (e.g. replace a GPU, which stays
			// isolated): no repair failed, nothing about the pool is suspect.
			continue
		}
		status.SuspendedPools = withPool(status.SuspendedPools, repairv1.SuspendedPool{Pool: r.Spec.Pool, Node: r.Spec.NodeName, Reason: r.Status.Message})
	}
	for _, sp := range status.SuspendedPools {
		if ps := pools[sp.Pool]; ps.Suspended == "" {
			ps.Suspended = fmt.Sprintf("repair of %s failed", sp.Node)
			pools[sp.Pool] = ps
		}
	}
	var blocked []string
	for _, dec := range Admit(cands, pools, spec) {
		f := faults[dec.Node]
		switch {
		case (dec.Start || dec.Ignore) && isGPURule(f.Rule) && len(outOfService(dec.Node, in.GPUFaults)) == 0:
			// The condition is there but not yet the records naming the
			// GPUs (they are written first; the cache may lag).
			blocked = append(blocked, dec.Node+": waiting for the node agent's GPUFault records")
		case dec.Start:
			r := newRepair(in.Policy, dec.Node, nodePool[dec.Node], f, in.Now)
			r.Spec.Actions = PlannedActions(f.Rule, spec.AllowReboot)
			if !isGPURule(f.Rule) {
				if why := recurring(in.Repairs, dec.Node, f.Rule.Name, spec.RepairAfter, in.Now); why != "" {
					r.Spec.Recommendation, r.Spec.Actions = why, nil
				}
			}
			if isGPURule(f.Rule) {
				gpus := outOfService(dec.Node, in.GPUFaults)
				gpuRepair(r, gpus, spec.GPU.ReplaceAfter, in.Now)
				// The validation the GPUs pass before they return to
				// service, as the policy says now (the agent reads it here).
				r.Spec.Validation = &repairv1.GPUValidation{Level: spec.GPU.Validation.LevelOf(), TimeoutSeconds: spec.GPU.Validation.Timeout()}
				switch {
				case r.Spec.Recommendation != "":
					r.Spec.Actions = nil
				case spec.AllowReboot:
					// Too many faulty GPUs of a device-plugin node: the
					// whole node (without reboots, the per-GPU path stays).
					if why := wholeNode(nodes[dec.Node], gpus, in.Slices, spec); why != "" {
						r.Spec.Escalation = why
						r.Spec.Actions = []repairv1.Action{repairv1.ActionReboot}
					}
				}
			}
			if spec.DryRun {
				r.Spec.DryRun = true
				r.Name += "-dryrun"
			}
			out.Create = append(out.Create, r)
		case dec.Ignore:
			if !recorded["ignore:"+occurrence(dec.Node, f.Rule.Name, f.Since)] {
				r := newRepair(in.Policy, dec.Node, nodePool[dec.Node], f, in.Now)
				r.Spec.IgnoreReason = dec.Reason
				r.Name += "-ignored"
				out.Create = append(out.Create, r)
			}
		default:
			blocked = append(blocked, dec.Node+": "+dec.Reason)
		}
	}
	setBlocked(in.Policy, status, blocked, in.Now)
	out.Status = *status
	out.Prune = prune(in.Policy, in.Repairs, in.Now)
	return out
}

// repairAfter resolves a policy's repairAfter (default 3 within 24 h, as
// gpu.replaceAfter).
func repairAfter(limit *repairv1.RepeatLimit) (int, time.Duration) {
	if limit == nil {
		return defaultReplaceCount, defaultReplaceWindow
	}
	return int(limit.Count), time.Duration(limit.WindowSeconds) * time.Second
}

// counts reports whether a repair counts for repairAfter: one that ran
// (not a dry-run or ignore record, not a reboot another controller asked for).
func counts(r *repairv1.NodeRepair) bool {
	return !r.Recorded() && !r.Requested()
}

// recurring says why a node condition fault of rule on node is not
// repaired again ("" when it is): it comes back for the count-th time
// within the window (the repairs of it that ran, and this one).
func recurring(repairs []repairv1.NodeRepair, node, rule string, limit *repairv1.RepeatLimit, now time.Time) string {
	count, window := repairAfter(limit)
	n := 1 // this occurrence
	for i := range repairs {
		r := &repairs[i]
		if r.Spec.NodeName == node && r.Spec.Fault.Rule == rule && counts(r) && !r.CreationTimestamp.Time.Before(now.Add(-window)) {
			n++
		}
	}
	if n < count {
		return ""
	}
	return truncate(fmt.Sprintf("fault %s came back %d times within %s on node %s (repairAfter %d): not repaired again; replace or investigate the node (its repairs did not last)",
		rule, n, window, node, count), 1024)
}

// defaultHistoryLimit is historyLimit's default.
const defaultHistoryLimit = 10

// prune picks the policy's finished NodeRepairs to delete: per node, all
// but the newest historyLimit. Never a repair in progress, a failed one
// whose fault has not cleared (it suspends its pool, and may hold its
// node for a person), or one repairAfter still counts.
func prune(policy *repairv1.NodeRepairPolicy, repairs []repairv1.NodeRepair, now time.Time) []*repairv1.NodeRepair {
	limit := defaultHistoryLimit
	if l := policy.Spec.HistoryLimit; l != nil && *l > 0 {
		limit = int(*l)
	}
	_, window := repairAfter(policy.Spec.RepairAfter)
	byNode := map[string][]*repairv1.NodeRepair{}
	for i := range repairs {
		r := &repairs[i]
		if r.Spec.Policy != policy.Name {
			continue
		}
		switch r.Status.Phase {
		case "", repairv1.PhaseRepairing:
			continue
		case repairv1.PhaseRecoveryFailed:
			if r.Labels[labelResolved] != "true" {
				continue
			}
		}
		if counts(r) && !r.CreationTimestamp.Time.Before(now.Add(-window)) {
			continue
		}
		byNode[r.Spec.NodeName] = append(byNode[r.Spec.NodeName], r)
	}
	var out []*repairv1.NodeRepair
	for _, list := range byNode {
		if len(list) <= limit {
			continue
		}
		sort.Slice(list, func(i, j int) bool {
			if !list[i].CreationTimestamp.Equal(&list[j].CreationTimestamp) {
				return list[j].CreationTimestamp.Before(&list[i].CreationTimestamp)
			}
			return list[i].Name > list[j].Name
		})
		out = append(out, list[limit:]...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// setBlocked sets the RepairsBlocked condition from the waiting repairs.
func setBlocked(policy *repairv1.NodeRepairPolicy, status *repairv1.NodeRepairPolicyStatus, blocked []string, now time.Time) {
	c := metav1.Condition{Type: conditionBusy, Status: metav1.ConditionFalse, Reason: "NoneBlocked",
		LastTransitionTime: metav1.NewTime(now), ObservedGeneration: policy.Generation}
	if len(blocked) > 0 {
		sort.Strings(blocked)
		c.Status, c.Reason = metav1.ConditionTrue, "RepairsWaiting"
		c.Message = strings.Join(blocked[:min(len(blocked), 5)], "; ")
		if len(blocked) > 5 {
			c.Message += fmt.Sprintf("; and %d more", len(blocked)-5)
		}
	}
	meta.SetStatusCondition(&status.Conditions, c)
	status.ObservedGeneration = policy.Generation
}

func newRepair(policy *repairv1.NodeRepairPolicy, node, pool string, f *Match, now time.Time) *repairv1.NodeRepair {
	return &repairv1.NodeRepair{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + strconv.FormatInt(now.Unix(), 10), Labels: map[string]string{labelNode: node}},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Pool: pool, Policy: policy.Name,
			Actions: f.Rule.Actions,
			Fault: repairv1.Fault{Rule: f.Rule.Name, ConditionType: string(f.Condition.Type), Status: string(f.Condition.Status),
				Reason: f.Condition.Reason, Message: f.Condition.Message, Since: metav1.NewTime(f.Since)}},
	}
}

func matchesRule(ev Evaluation, rule string) bool {
	for _, m := range ev.Matches {
		if m.Rule.Name == rule {
			return true
		}
	}
	return false
}

// sameTracked compares fault clocks at the second (their stored precision).
func sameTracked(old, tracked map[string]time.Time) bool {
	if len(old) != len(tracked) {
		return false
	}
	for k, v := range tracked {
		if !old[k].Equal(v.Truncate(time.Second)) {
			return false
		}
	}
	return true
}

func withPool(list []repairv1.SuspendedPool, sp repairv1.SuspendedPool) []repairv1.SuspendedPool {
	for _, x := range list {
		if x.Pool == sp.Pool {
			return list
		}
	}
	return append(list, sp)
}

func withoutPool(list []repairv1.SuspendedPool, pool, node string) []repairv1.SuspendedPool {
	var out []repairv1.SuspendedPool
	for _, x := range list {
		if x.Pool != pool || x.Node != node {
			out = append(out, x)
		}
	}
	return out
}
