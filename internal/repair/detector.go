package repair

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Node labels, annotations and event reasons of auto-repair.
const (
	// LabelState shows Repairing or RecoveryFailed on the node.
	LabelState = "repair.gpufleet.dev/state"
	// annotationFaults holds when gpufleet first saw each rule match
	// (JSON: rule -> RFC3339), so its clock survives operator restarts.
	annotationFaults = "repair.gpufleet.dev/faults-since"
	// Requestor of the NodeMaintenance a rebooting repair uses.
	Requestor = "repair.gpufleet.dev"

	ReasonStart   = "NodeRepairStart"
	ReasonAction  = "NodeRepairAction"
	ReasonSucceed = "NodeRepairSucceed"
	ReasonFailed  = "NodeRepairFailed" // Warning
	ReasonIgnore  = "NodeRepairIgnore"
	ReasonBlocked = "NodeRepairBlocked"
	actionRepair  = "Repair"
	conditionBusy = "RepairsBlocked"
	// labelResolved marks a RecoveryFailed NodeRepair whose fault cleared.
	labelResolved = "repair.gpufleet.dev/resolved"
)

// Detector watches node conditions for the policy's rules and starts
// repairs under the blast-radius limits.
type Detector struct {
	Client    client.Client
	Namespace string
	Clock     clock.PassiveClock
	Recorder  events.EventRecorder
}

// Reconcile evaluates every node of one NodeRepairPolicy.
func (d *Detector) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	policy := &repairv1.NodeRepairPolicy{}
	if err := d.Client.Get(ctx, req.NamespacedName, policy); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	sel := labels.Everything()
	if policy.Spec.NodeSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(policy.Spec.NodeSelector)
		if err != nil {
			return reconcile.Result{}, nil // the schema validates selectors; nothing to do with a broken one
		}
		sel = s
	}
	var nodes corev1.NodeList
	if err := d.Client.List(ctx, &nodes, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing nodes: %w", err)
	}
	var repairs repairv1.NodeRepairList
	if err := d.Client.List(ctx, &repairs); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing NodeRepairs: %w", err)
	}
	var nms maintenancev1.NodeMaintenanceList
	if err := d.Client.List(ctx, &nms); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing NodeMaintenance: %w", err)
	}
	now := d.Clock.Now()
	rules := RulesOf(&policy.Spec)
	poolLabel := policy.Spec.PoolLabel
	if poolLabel == "" {
		poolLabel = "gpufleet.dev/pool"
	}
	active, failed := map[string]*repairv1.NodeRepair{}, map[string]*repairv1.NodeRepair{}
	ignored := map[string]bool{}
	for i := range repairs.Items {
		r := &repairs.Items[i]
		switch r.Status.Phase {
		case repairv1.PhaseRepairing, "":
			active[r.Spec.NodeName] = r
		case repairv1.PhaseRecoveryFailed:
			if r.Labels[labelResolved] != "true" {
				failed[r.Spec.NodeName] = r
			}
		case repairv1.PhaseIgnored:
			ignored[r.Spec.NodeName+"/"+r.Spec.Fault.Rule+"/"+r.Spec.Fault.Since.UTC().Format(time.RFC3339)] = true
		}
	}
	otherMaintenance := map[string]string{}
	for i := range nms.Items {
		if nm := &nms.Items[i]; nm.Spec.RequestorID != Requestor && maintenanceInProgress(nm) {
			otherMaintenance[nm.Spec.NodeName] = nm.Spec.RequestorID
		}
	}
	status := policy.Status.DeepCopy()
	pools := map[string]PoolState{}
	for _, sp := range status.SuspendedPools {
		pools[sp.Pool] = PoolState{Suspended: fmt.Sprintf("repair of %s failed: %s", sp.Node, sp.Reason)}
	}
	var cands []Candidate
	faults := map[string]*Match{}
	var next time.Duration
	for i := range nodes.Items {
		n := &nodes.Items[i]
		pool := n.Labels[poolLabel]
		ps := pools[pool]
		ps.Size++
		ev := Evaluate(n, rules, trackedOf(n), now)
		if err := d.saveTracked(ctx, n, ev.Tracked); err != nil {
			return reconcile.Result{}, err
		}
		if ev.NextCheck > 0 && (next == 0 || ev.NextCheck < next) {
			next = ev.NextCheck
		}
		if active[n.Name] != nil {
			ps.Repairing = true
		}
		if f := failed[n.Name]; f != nil && ev.Fault == nil && !matchesRule(ev, f.Spec.Fault.Rule) {
			// The fault of a failed repair is gone: lift the suspension.
			status.SuspendedPools = withoutPool(status.SuspendedPools, pool, n.Name)
			if err := d.setState(ctx, n, ""); err != nil {
				return reconcile.Result{}, err
			}
			patch := client.MergeFrom(f.DeepCopy())
			if f.Labels == nil {
				f.Labels = map[string]string{}
			}
			f.Labels[labelResolved] = "true"
			if err := d.Client.Patch(ctx, f, patch); err != nil {
				return reconcile.Result{}, fmt.Errorf("marking %s resolved: %w", f.Name, err)
			}
			delete(failed, n.Name)
		}
		if len(ev.Matches) > 0 {
			// A fault counts for storm protection from the moment it is
			// seen, not only past its threshold: faults that start
			// within one threshold window count together.
			ps.Unhealthy++
		}
		if ev.Fault != nil {
			faults[n.Name] = ev.Fault
			if active[n.Name] == nil {
				f := failed[n.Name]
				cands = append(cands, Candidate{Node: n.Name, Pool: pool, Deleting: n.DeletionTimestamp != nil,
					OtherMaintenance: otherMaintenance[n.Name], RecoveryFailed: f != nil && f.Spec.Fault.Rule == ev.Fault.Rule.Name})
			}
		}
		pools[pool] = ps
	}
	for _, r := range failed {
		status.SuspendedPools = withPool(status.SuspendedPools, repairv1.SuspendedPool{Pool: r.Spec.Pool, Node: r.Spec.NodeName, Reason: r.Status.Message})
	}
	for pool, ps := range pools {
		for _, sp := range status.SuspendedPools {
			if sp.Pool == pool && ps.Suspended == "" {
				ps.Suspended = fmt.Sprintf("repair of %s failed", sp.Node)
			}
		}
		pools[pool] = ps
	}
	var blocked []string
	for _, dec := range Admit(cands, pools, &policy.Spec) {
		f := faults[dec.Node]
		switch {
		case dec.Start:
			if err := d.start(ctx, policy, dec.Node, poolOf(&nodes, dec.Node, poolLabel), f); err != nil {
				return reconcile.Result{}, err
			}
		case dec.Ignore:
			key := dec.Node + "/" + f.Rule.Name + "/" + f.Since.UTC().Format(time.RFC3339)
			if !ignored[key] {
				if err := d.ignore(ctx, policy, dec.Node, poolOf(&nodes, dec.Node, poolLabel), f, dec.Reason); err != nil {
					return reconcile.Result{}, err
				}
			}
		default:
			blocked = append(blocked, dec.Node+": "+dec.Reason)
		}
	}
	d.setBlocked(policy, status, blocked)
	if !equality.Semantic.DeepEqual(&policy.Status, status) {
		p := policy.DeepCopy()
		p.Status = *status
		if err := d.Client.Status().Update(ctx, p); err != nil {
			return reconcile.Result{}, fmt.Errorf("updating NodeRepairPolicy status: %w", err)
		}
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

func matchesRule(ev Evaluation, rule string) bool {
	for _, m := range ev.Matches {
		if m.Rule.Name == rule {
			return true
		}
	}
	return false
}

func poolOf(nodes *corev1.NodeList, name, label string) string {
	for i := range nodes.Items {
		if nodes.Items[i].Name == name {
			return nodes.Items[i].Labels[label]
		}
	}
	return ""
}

func (d *Detector) setBlocked(policy *repairv1.NodeRepairPolicy, status *repairv1.NodeRepairPolicyStatus, blocked []string) {
	now := metav1.NewTime(d.Clock.Now())
	c := metav1.Condition{Type: conditionBusy, Status: metav1.ConditionFalse, Reason: "NoneBlocked", LastTransitionTime: now, ObservedGeneration: policy.Generation}
	if len(blocked) > 0 {
		c.Status, c.Reason = metav1.ConditionTrue, "RepairsWaiting"
		c.Message = strings.Join(blocked[:min(len(blocked), 5)], "; ")
		if old := meta.FindStatusCondition(policy.Status.Conditions, conditionBusy); old == nil || old.Message != c.Message {
			d.Recorder.Eventf(policy, nil, corev1.EventTypeNormal, ReasonBlocked, actionRepair, "%s", c.Message)
		}
	}
	meta.SetStatusCondition(&status.Conditions, c)
	status.ObservedGeneration = policy.Generation
}

func (d *Detector) start(ctx context.Context, policy *repairv1.NodeRepairPolicy, node, pool string, f *Match) error {
	r := newRepair(policy, node, pool, f, d.Clock.Now())
	r.Spec.Actions = PlannedActions(f.Rule, policy.Spec.AllowReboot)
	if err := d.Client.Create(ctx, r); err != nil {
		return fmt.Errorf("creating NodeRepair for %s: %w", node, err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	d.Recorder.Eventf(n, r, corev1.EventTypeNormal, ReasonStart, actionRepair, "Repairing node %s: %s (%s) for %s; actions %v",
		node, f.Rule.Name, f.Condition.Type, d.Clock.Since(f.Since).Round(time.Second), r.Spec.Actions)
	if policy.Spec.DryRun {
		return nil
	}
	return d.setState(ctx, n, string(repairv1.PhaseRepairing))
}

func (d *Detector) ignore(ctx context.Context, policy *repairv1.NodeRepairPolicy, node, pool string, f *Match, reason string) error {
	r := newRepair(policy, node, pool, f, d.Clock.Now())
	if err := d.Client.Create(ctx, r); err != nil {
		return fmt.Errorf("recording the ignored repair of %s: %w", node, err)
	}
	r.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseIgnored, Message: reason,
		Timeline: []repairv1.TimelineEntry{{Time: metav1.NewTime(d.Clock.Now()), Step: "Start", Outcome: "Ignored", Message: reason}}}
	if err := d.Client.Status().Update(ctx, r); err != nil {
		return fmt.Errorf("recording the ignored repair of %s: %w", node, err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	d.Recorder.Eventf(n, r, corev1.EventTypeNormal, ReasonIgnore, actionRepair, "Not repairing node %s (%s): %s", node, f.Rule.Name, reason)
	return nil
}

func newRepair(policy *repairv1.NodeRepairPolicy, node, pool string, f *Match, now time.Time) *repairv1.NodeRepair {
	return &repairv1.NodeRepair{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + strconv.FormatInt(now.Unix(), 10), Labels: map[string]string{"repair.gpufleet.dev/node": node}},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Pool: pool, Policy: policy.Name, DryRun: policy.Spec.DryRun,
			Actions: f.Rule.Actions,
			Fault: repairv1.Fault{Rule: f.Rule.Name, ConditionType: string(f.Condition.Type), Status: string(f.Condition.Status),
				Reason: f.Condition.Reason, Message: f.Condition.Message, Since: metav1.NewTime(f.Since)}},
	}
}

func trackedOf(n *corev1.Node) map[string]time.Time {
	raw := n.Annotations[annotationFaults]
	if raw == "" {
		return nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil
	}
	out := map[string]time.Time{}
	for k, v := range m {
		if t, err := time.Parse(time.RFC3339, v); err == nil {
			out[k] = t
		}
	}
	return out
}

// saveTracked writes the fault clock to the node only when it changed.
func (d *Detector) saveTracked(ctx context.Context, n *corev1.Node, tracked map[string]time.Time) error {
	old := trackedOf(n)
	same := len(old) == len(tracked)
	for k, v := range tracked {
		if !old[k].Equal(v.Truncate(time.Second)) {
			same = false
		}
	}
	if same {
		return nil
	}
	var value any
	if len(tracked) > 0 {
		m := map[string]string{}
		for k, v := range tracked {
			m[k] = v.UTC().Format(time.RFC3339)
		}
		data, _ := json.Marshal(m)
		value = string(data)
	}
	return patchMeta(ctx, d.Client, n.Name, "annotations", map[string]any{annotationFaults: value})
}

func (d *Detector) setState(ctx context.Context, n *corev1.Node, state string) error {
	var v any = state
	if state == "" {
		v = nil
	}
	return patchMeta(ctx, d.Client, n.Name, "labels", map[string]any{LabelState: v})
}

// patchMeta merges labels or annotations into a node (nil removes).
func patchMeta(ctx context.Context, c client.Client, node, field string, values map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{field: values}})
	if err != nil {
		return err
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := c.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("patching node %s %s: %w", node, field, err)
	}
	return nil
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

func maintenanceInProgress(nm *maintenancev1.NodeMaintenance) bool {
	c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady)
	return c != nil && c.Reason != "" && c.Reason != string(maintenancev1.PhasePending) && nm.DeletionTimestamp == nil
}
