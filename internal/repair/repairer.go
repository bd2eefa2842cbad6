package repair

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Repairer walks one NodeRepair up the ladder, one step per reconcile:
// component actions (run by the node agent), verification, then — if
// allowed — cordon and drain through NodeMaintenance, reboot, and release.
// All progress is in the NodeRepair's status.
type Repairer struct {
	Client client.Client
	// Live reads what the operator does not cache: the pods of the node
	// to drain, listed once per reboot.
	Live      client.Reader
	Namespace string
	Clock     clock.PassiveClock
	Recorder  events.EventRecorder
}

// Reconcile advances one NodeRepair.
func (r *Repairer) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nr := &repairv1.NodeRepair{}
	if err := r.Client.Get(ctx, req.NamespacedName, nr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if nr.Status.Phase != "" && nr.Status.Phase != repairv1.PhaseRepairing {
		return reconcile.Result{}, nil
	}
	policy := &repairv1.NodeRepairPolicy{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: nr.Spec.Policy}, policy); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: nr.Spec.NodeName}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, r.finish(ctx, nr, nil, repairv1.PhaseIgnored, "node was deleted")
		}
		return reconcile.Result{}, err
	}
	orig := nr.Status.DeepCopy()
	res, done, err := r.step(ctx, nr, policy, node)
	if err != nil || done {
		return res, err
	}
	if !equality.Semantic.DeepEqual(orig, &nr.Status) {
		if err := r.Client.Status().Update(ctx, nr); err != nil {
			return reconcile.Result{}, fmt.Errorf("updating NodeRepair status: %w", err)
		}
	}
	return res, nil
}

func (r *Repairer) step(ctx context.Context, nr *repairv1.NodeRepair, policy *repairv1.NodeRepairPolicy, node *corev1.Node) (reconcile.Result, bool, error) {
	now := r.Clock.Now()
	if nr.Status.Phase == "" {
		nr.Status.Phase = repairv1.PhaseRepairing
		r.record(nr, "Start", "Started", fmt.Sprintf("%s on %s since %s", nr.Spec.Fault.Rule, nr.Spec.Fault.ConditionType, nr.Spec.Fault.Since.Format(time.RFC3339)))
		return reconcile.Result{}, false, nil
	}
	if nr.Spec.DryRun {
		return reconcile.Result{}, true, r.finish(ctx, nr, node, repairv1.PhaseIgnored, fmt.Sprintf("dry run: would run %v", nr.Spec.Actions))
	}
	if nr.Status.Pending != nil {
		return reconcile.Result{}, false, nil // the agent's status update brings us back
	}
	rule := ruleNamed(policy, nr.Spec.Fault.Rule)
	faulty := rule != nil && stillFaulty(node, *rule)
	// A reboot in progress: wait for the new boot ID and Ready, then release.
	if nr.Status.BootIDBefore != "" {
		if node.Status.NodeInfo.BootID == nr.Status.BootIDBefore || !nodeReady(node) {
			return reconcile.Result{RequeueAfter: 5 * time.Second}, false, nil
		}
		if err := r.release(ctx, nr); err != nil {
			return reconcile.Result{}, false, err
		}
		if faulty {
			return reconcile.Result{}, true, r.finish(ctx, nr, node, repairv1.PhaseRecoveryFailed, "fault persists after the reboot")
		}
		return reconcile.Result{}, true, r.finish(ctx, nr, node, repairv1.PhaseSucceeded, "node rebooted (new boot ID) and the fault cleared")
	}
	if !faulty {
		return reconcile.Result{}, true, r.finish(ctx, nr, node, repairv1.PhaseSucceeded, "fault cleared")
	}
	idx := int(nr.Status.NextAction)
	if idx < len(nr.Spec.Actions) && nr.Spec.Actions[idx] != repairv1.ActionReboot {
		r.request(nr, node, nr.Spec.Actions[idx])
		return reconcile.Result{}, false, nil
	}
	// Component actions done and the fault persists: give it the
	// verification window, then the next rung.
	if nr.Status.VerifyUntil == nil {
		window := time.Duration(ptr.Deref(policy.Spec.VerificationSeconds, 60)) * time.Second
		t := metav1.NewTime(now.Add(window))
		nr.Status.VerifyUntil = &t
		r.record(nr, "Verify", "Waiting", fmt.Sprintf("fault must clear within %s", window))
		return reconcile.Result{RequeueAfter: window}, false, nil
	}
	if now.Before(nr.Status.VerifyUntil.Time) {
		return reconcile.Result{RequeueAfter: nr.Status.VerifyUntil.Sub(now)}, false, nil
	}
	if idx >= len(nr.Spec.Actions) {
		msg := "fault persists after the component actions"
		if !policy.Spec.AllowReboot && rule != nil && containsReboot(rule.Actions) {
			msg += "; reboots are not allowed by the policy"
		}
		return reconcile.Result{}, true, r.finish(ctx, nr, node, repairv1.PhaseRecoveryFailed, msg)
	}
	return r.rebootRung(ctx, nr, node)
}

// rebootRung holds the node through NodeMaintenance (cordon + drain), then
// asks the agent to reboot. A drain that times out does not stop it.
func (r *Repairer) rebootRung(ctx context.Context, nr *repairv1.NodeRepair, node *corev1.Node) (reconcile.Result, bool, error) {
	if nr.Status.MaintenanceName == "" {
		nm, err := r.maintenance(ctx, nr, node)
		if err != nil {
			return reconcile.Result{}, false, err
		}
		nr.Status.MaintenanceName = nm.Name
		r.record(nr, "Maintenance", "Requested", fmt.Sprintf("NodeMaintenance %s/%s: cordon and drain", nm.Namespace, nm.Name))
		return reconcile.Result{}, false, nil
	}
	nm := &maintenancev1.NodeMaintenance{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: nr.Status.MaintenanceName}, nm); err != nil {
		return reconcile.Result{}, false, client.IgnoreNotFound(err)
	}
	ready := meta.IsStatusConditionTrue(nm.Status.Conditions, maintenancev1.ConditionTypeReady)
	drainGaveUp := meta.IsStatusConditionTrue(nm.Status.Conditions, maintenancev1.ConditionTypeDrainBlocked)
	if !ready && !drainGaveUp {
		return reconcile.Result{}, false, nil // the NodeMaintenance watch brings us back
	}
	if drainGaveUp {
		r.record(nr, "Maintenance", "DrainTimedOut", "drain did not finish in time; rebooting anyway")
	}
	nr.Status.BootIDBefore = node.Status.NodeInfo.BootID
	r.request(nr, node, repairv1.ActionReboot)
	return reconcile.Result{}, false, nil
}

func (r *Repairer) maintenance(ctx context.Context, nr *repairv1.NodeRepair, node *corev1.Node) (*maintenancev1.NodeMaintenance, error) {
	var pods corev1.PodList
	if err := r.Live.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node.Name}); err != nil {
		return nil, fmt.Errorf("listing pods on node %s: %w", node.Name, err)
	}
	policy := &repairv1.NodeRepairPolicy{}
	_ = r.Client.Get(ctx, types.NamespacedName{Name: nr.Spec.Policy}, policy)
	timeout := int32(DrainTimeout(&policy.Spec.Drain, pods.Items) / time.Second)
	nm := &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: "repair-" + nr.Name},
		Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: Requestor, NodeName: node.Name, Cordon: ptr.To(true),
			DrainSpec: &maintenancev1.DrainSpec{Force: policy.Spec.Drain.Force, DeleteEmptyDir: policy.Spec.Drain.DeleteEmptyDir, TimeoutSeconds: &timeout}},
	}
	if err := r.Client.Create(ctx, nm); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("requesting maintenance of %s: %w", node.Name, err)
	}
	return nm, nil
}

// release deletes the repair's NodeMaintenance (which uncordons the node
// unless it was cordoned before).
func (r *Repairer) release(ctx context.Context, nr *repairv1.NodeRepair) error {
	if nr.Status.MaintenanceName == "" {
		return nil
	}
	nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: nr.Status.MaintenanceName}}
	if err := r.Client.Delete(ctx, nm); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("releasing node %s: %w", nr.Spec.NodeName, err)
	}
	return nil
}

// request hands an action to the node agent.
func (r *Repairer) request(nr *repairv1.NodeRepair, node *corev1.Node, a repairv1.Action) {
	nr.Status.Pending = &repairv1.PendingAction{Action: a, RequestedAt: metav1.NewTime(r.Clock.Now())}
	r.record(nr, string(a), "Requested", "")
	r.Recorder.Eventf(node, nr, corev1.EventTypeNormal, ReasonAction, actionRepair, "Node %s: %s", node.Name, a)
}

// finish writes the final phase, releases the node and reports it.
func (r *Repairer) finish(ctx context.Context, nr *repairv1.NodeRepair, node *corev1.Node, phase repairv1.Phase, msg string) error {
	if phase != repairv1.PhaseSucceeded || nr.Status.MaintenanceName != "" {
		if err := r.release(ctx, nr); err != nil {
			return err
		}
	}
	nr.Status.Phase, nr.Status.Message = phase, msg
	r.record(nr, "Done", string(phase), msg)
	if err := r.Client.Status().Update(ctx, nr); err != nil {
		return fmt.Errorf("updating NodeRepair status: %w", err)
	}
	if node == nil {
		return nil
	}
	switch phase {
	case repairv1.PhaseSucceeded:
		r.Recorder.Eventf(node, nr, corev1.EventTypeNormal, ReasonSucceed, actionRepair, "Node %s repaired: %s", node.Name, msg)
		return patchMeta(ctx, r.Client, node.Name, "labels", map[string]any{LabelState: nil})
	case repairv1.PhaseRecoveryFailed:
		r.Recorder.Eventf(node, nr, corev1.EventTypeWarning, ReasonFailed, actionRepair, "Repair of node %s failed: %s; its pool is suspended until the fault clears", node.Name, msg)
		return patchMeta(ctx, r.Client, node.Name, "labels", map[string]any{LabelState: string(repairv1.PhaseRecoveryFailed)})
	default:
		return patchMeta(ctx, r.Client, node.Name, "labels", map[string]any{LabelState: nil})
	}
}

func (r *Repairer) record(nr *repairv1.NodeRepair, step, outcome, msg string) {
	nr.Status.Timeline = append(nr.Status.Timeline, repairv1.TimelineEntry{Time: metav1.NewTime(r.Clock.Now()), Step: step, Outcome: outcome, Message: msg})
}

func ruleNamed(p *repairv1.NodeRepairPolicy, name string) *repairv1.Rule {
	for _, r := range RulesOf(&p.Spec) {
		if r.Name == name {
			return &r
		}
	}
	return nil
}

func stillFaulty(node *corev1.Node, rule repairv1.Rule) bool {
	_, ok := matching(node, rule)
	return ok
}

func containsReboot(actions []repairv1.Action) bool {
	for _, a := range actions {
		if a == repairv1.ActionReboot {
			return true
		}
	}
	return false
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
