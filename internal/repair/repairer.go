package repair

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/maintenance/requestor"
	"github.com/gpufleet/gpufleet/internal/pendingevents"
)

// Defaults of the ladder's bounds (the policy's fields override them).
const (
	defaultVerificationSeconds = 60
	defaultActionTimeout       = 600 * time.Second
	defaultRebootTimeout       = 1200 * time.Second
	defaultMaintenanceTimeout  = 3600 * time.Second
)

// Repairer walks one NodeRepair up the ladder, one step per reconcile:
// component actions (run by the node agent), verification, then — if
// allowed — cordon and drain through NodeMaintenance, reboot, and release.
// All progress is in the NodeRepair's status; every wait has a bound.
type Repairer struct {
	Client client.Client
	// Live reads what the operator does not cache: the pods of the node
	// to drain, listed once per reboot.
	Live      client.Reader
	Namespace string
	Clock     clock.PassiveClock
	Recorder  events.EventRecorder
	// DRA: the API server serves ResourceSlices and DeviceTaintRules (the
	// slices are cached and indexed by node).
	DRA bool
}

// ladder is one reconcile's view of a repair.
type ladder struct {
	nr     *repairv1.NodeRepair
	policy *repairv1.NodeRepairPolicy
	node   *corev1.Node
	now    time.Time
	events *pendingevents.Recorder
	// final is the phase the repair ends in this step ("" = not yet).
	final repairv1.Phase
}

// Reconcile advances one NodeRepair by one step and writes its status once;
// events follow the write.
func (r *Repairer) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nr := &repairv1.NodeRepair{}
	if err := r.Client.Get(ctx, req.NamespacedName, nr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if nr.Status.Phase != "" && nr.Status.Phase != repairv1.PhaseRepairing {
		return reconcile.Result{}, nil
	}
	l := &ladder{nr: nr.DeepCopy(), now: r.Clock.Now(), events: pendingevents.New(r.Recorder)}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("node", nr.Spec.NodeName, "rule", nr.Spec.Fault.Rule))
	res, err := r.advance(ctx, l)
	if err != nil {
		return reconcile.Result{}, err
	}
	if equality.Semantic.DeepEqual(&nr.Status, &l.nr.Status) {
		return res, nil
	}
	if err := r.Client.Status().Patch(ctx, l.nr, client.MergeFromWithOptions(nr, client.MergeFromWithOptimisticLock{})); err != nil {
		switch {
		case apierrors.IsConflict(err) && l.final != "":
			// The repair ended, and its NodeMaintenance objects are
			// released already: the end is written on the stored version,
			// or the next pass would find them gone and say so instead.
			if err := r.writeEnd(ctx, nr, l); err != nil || l.final == "" {
				return reconcile.Result{}, err
			}
		case apierrors.IsConflict(err):
			// Changed meanwhile (the agent recorded an outcome): its event
			// brings the new version; nothing of this step happened.
			return reconcile.Result{}, nil
		default:
			return reconcile.Result{}, fmt.Errorf("updating NodeRepair status: %w", err)
		}
	}
	l.events.Flush()
	if l.final != "" {
		return res, r.finished(ctx, l)
	}
	return res, nil
}

// advance reads what the step needs and takes it.
func (r *Repairer) advance(ctx context.Context, l *ladder) (reconcile.Result, error) {
	if l.nr.Recorded() {
		// A dry-run or ignored record: complete when created, never acted on.
		msg := l.nr.Spec.IgnoreReason
		if l.nr.Spec.DryRun {
			msg = fmt.Sprintf("dry run: would run %v", l.nr.Spec.Actions)
		}
		l.nr.Status.Phase, l.nr.Status.Message = repairv1.PhaseIgnored, msg
		l.record("Done", string(repairv1.PhaseIgnored), msg)
		return reconcile.Result{}, nil
	}
	l.policy = &repairv1.NodeRepairPolicy{}
	if l.nr.Requested() {
		// Asked for by another gpufleet controller: the default bounds apply.
	} else if err := r.Client.Get(ctx, types.NamespacedName{Name: l.nr.Spec.Policy}, l.policy); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseIgnored, fmt.Sprintf("policy %s was deleted", l.nr.Spec.Policy))
		}
		return reconcile.Result{}, fmt.Errorf("reading policy %s: %w", l.nr.Spec.Policy, err)
	}
	l.node = &corev1.Node{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: l.nr.Spec.NodeName}, l.node); err != nil {
		if apierrors.IsNotFound(err) {
			l.node = nil
			return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseIgnored, "node was deleted")
		}
		return reconcile.Result{}, fmt.Errorf("reading node %s: %w", l.nr.Spec.NodeName, err)
	}
	return r.step(ctx, l)
}

func (r *Repairer) step(ctx context.Context, l *ladder) (reconcile.Result, error) {
	nr, policy, node, now := l.nr, l.policy, l.node, l.now
	if nr.Status.Phase == "" {
		nr.Status.Phase = repairv1.PhaseRepairing
		msg := fmt.Sprintf("%s on %s since %s", nr.Spec.Fault.Rule, nr.Spec.Fault.ConditionType, nr.Spec.Fault.Since.Format(time.RFC3339))
		if nr.Spec.Escalation != "" {
			msg += "; " + nr.Spec.Escalation
		}
		if nr.Requested() {
			msg = fmt.Sprintf("%s asked for a reboot: %s", nr.Spec.Requestor, nr.Spec.Fault.Message)
		}
		l.record("Start", "Started", msg)
		return reconcile.Result{}, nil
	}
	if p := nr.Status.Pending; p != nil {
		// The agent's status update brings us back; a reboot is bounded
		// by its own timeout below, any other action by this one.
		if p.Action == repairv1.ActionReboot {
			return r.awaitReboot(ctx, l)
		}
		limit := seconds(policy.Spec.ActionTimeoutSeconds, defaultActionTimeout)
		if p.Action == repairv1.ActionValidateGPU {
			// The agent bounds the validation itself; a minute more for it
			// to record the result.
			limit = max(limit, time.Duration(nr.Spec.Validation.Timeout())*time.Second+time.Minute)
		}
		if waited := now.Sub(p.RequestedAt.Time); waited < limit {
			return reconcile.Result{RequeueAfter: limit - waited}, nil
		}
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed,
			fmt.Sprintf("the node agent did not run %s within %s (is gpufleet's agent running on node %s?)", p.Action, limit, node.Name))
	}
	if nr.Status.BootIDBefore != "" {
		return r.awaitReboot(ctx, l)
	}
	if last := nr.LastEntry(); last != nil && last.Outcome == repairv1.OutcomeRefused {
		// Not held by its GPU drain, or an action the agent cannot use:
		// nothing bigger (a reboot) instead, and never the same again.
		if last.Step == string(repairv1.ActionResetGPU) {
			return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed, "the node agent did not reset the GPUs: "+last.Message)
		}
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed, fmt.Sprintf("the node agent did not run %s: %s", last.Step, last.Message))
	}
	if nr.Requested() {
		return r.heldReboot(ctx, l)
	}
	if nr.Spec.Recommendation != "" {
		// Nothing automatic can help: report it to a person, on the node too.
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed, nr.Spec.Recommendation)
	}
	rule := ruleNamed(policy, nr.Spec.Fault.Rule)
	faulty, err := r.stillFaulty(ctx, l, rule)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !faulty {
		msg := "fault cleared"
		if len(nr.Spec.GPUs) > 0 {
			res, note, done, err := r.stackReturn(ctx, l)
			if err != nil || !done {
				return res, err
			}
			msg = "back in service: " + gpuNames(nr.Spec.GPUs) + validatedSuffix(nr) + note
		}
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseSucceeded, msg)
	}
	if nr.Validates() {
		// A reset GPU returns to service only once it passed its
		// validation; a failed one goes up the ladder.
		switch last := nr.LastEntry(); {
		case last != nil && last.Step == string(repairv1.ActionResetGPU) && last.Outcome == repairv1.OutcomeSucceeded,
			revalidate(nr, last):
			r.request(l, repairv1.ActionValidateGPU)
			return reconcile.Result{}, nil
		case last != nil && last.Step == string(repairv1.ActionValidateGPU) && last.Outcome != repairv1.OutcomeSucceeded:
			l.events.Eventf(node, nr, corev1.EventTypeWarning, ReasonValidationFailed, actionRepair,
				"Node %s: %s failed its validation after the reset, not returned to service: %s", node.Name, gpuNames(nr.Spec.GPUs), last.Message)
			l.record("Validate", "Failed", "not returned to service; up the ladder")
		}
	}
	idx := int(nr.Status.NextAction)
	if idx < 0 || idx > len(nr.Spec.Actions) {
		// The schema refuses it; written by hand under an older one.
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed,
			fmt.Sprintf("status.nextAction %d is outside spec.actions (%d actions): not acting on it", idx, len(nr.Spec.Actions)))
	}
	if idx < len(nr.Spec.Actions) && nr.Spec.Actions[idx] != repairv1.ActionReboot {
		if nr.Spec.Actions[idx] == repairv1.ActionResetGPU {
			if res, drained, err := r.gpuDrainRung(ctx, l); err != nil || !drained {
				return res, err
			}
		}
		if a := nr.Spec.Actions[idx]; !a.AgentRuns() {
			r.runStackRestart(ctx, l, a)
			return reconcile.Result{}, nil
		}
		r.request(l, nr.Spec.Actions[idx])
		return reconcile.Result{}, nil
	}
	// Component actions done and the fault persists: give it the
	// verification window, then the next rung.
	if nr.Status.VerifyUntil == nil {
		window := seconds(policy.Spec.VerificationSeconds, defaultVerificationSeconds*time.Second)
		t := metav1.NewTime(now.Add(window))
		nr.Status.VerifyUntil = &t
		l.record("Verify", "Waiting", fmt.Sprintf("fault must clear within %s", window))
		return reconcile.Result{RequeueAfter: window}, nil
	}
	if now.Before(nr.Status.VerifyUntil.Time) {
		return reconcile.Result{RequeueAfter: nr.Status.VerifyUntil.Sub(now)}, nil
	}
	if idx >= len(nr.Spec.Actions) {
		msg := "fault persists after the component actions"
		if !policy.Spec.AllowReboot && rule != nil && slices.Contains(rule.Actions, repairv1.ActionReboot) {
			msg += "; reboots are not allowed by the policy"
		}
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed, msg)
	}
	return r.rebootRung(ctx, l)
}

// rebootRung holds the node through NodeMaintenance (cordon + drain), then
// asks the agent to reboot. A drain that times out does not stop it.
func (r *Repairer) rebootRung(ctx context.Context, l *ladder) (reconcile.Result, error) {
	nr := l.nr
	if nr.Status.GPUMaintenanceName != "" {
		// The GPUs' drain held the node schedulable; the reboot needs the
		// whole node: release it first, then ask for the node.
		if err := requestor.Release(ctx, r.Client, r.Namespace, nr.Status.GPUMaintenanceName); err != nil {
			return reconcile.Result{}, err
		}
		l.record("Maintenance", "Released", fmt.Sprintf("NodeMaintenance %s/%s (GPU drain): the reboot needs the whole node", r.Namespace, nr.Status.GPUMaintenanceName))
		nr.Status.GPUMaintenanceName = ""
		return reconcile.Result{}, nil
	}
	if nr.Status.MaintenanceName == "" {
		req, err := r.maintenanceRequest(ctx, l)
		if err != nil {
			return reconcile.Result{}, err
		}
		if _, err := requestor.Ensure(ctx, r.Client, req); err != nil {
			return reconcile.Result{}, err
		}
		nr.Status.MaintenanceName = req.Name
		nr.Status.MaintenanceRequestedAt = ptr.To(metav1.NewTime(l.now))
		l.record("Maintenance", "Requested", fmt.Sprintf("NodeMaintenance %s/%s: cordon and drain", req.Namespace, req.Name))
		return reconcile.Result{}, nil
	}
	nm, res, err := r.awaitHold(ctx, l, nr.Status.MaintenanceName)
	if err != nil || nm == nil {
		return res, err
	}
	if !nm.IsReady() {
		_, why := nm.DrainHeld()
		l.record("Maintenance", "DrainTimedOut", "drain did not finish within its timeout; rebooting anyway: "+why)
	}
	t := metav1.NewTime(l.now)
	nr.Status.BootIDBefore = l.node.Status.NodeInfo.BootID
	nr.Status.RebootRequestedAt = &t
	r.request(l, repairv1.ActionReboot)
	return reconcile.Result{RequeueAfter: seconds(l.policy.Spec.RebootTimeoutSeconds, defaultRebootTimeout)}, nil
}

// heldReboot reboots a node inside the NodeMaintenance of the controller
// that asked for it (spec.maintenance): that object already holds the node
// (cordoned and drained as its requestor chose), counts against the
// cluster's limits, and is released by its requestor, not by the repair.
// The reboot waits for nothing else: an object that does not hold the node
// ends the repair at once, with the reason.
func (r *Repairer) heldReboot(ctx context.Context, l *ladder) (reconcile.Result, error) {
	nr, node := l.nr, l.node
	nm, err := requestor.Get(ctx, r.Client, r.Namespace, nr.Spec.Maintenance)
	if err != nil {
		return reconcile.Result{}, err
	}
	switch {
	case nm == nil || nm.DeletionTimestamp != nil:
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed,
			fmt.Sprintf("NodeMaintenance %s/%s, which was to hold the node, is gone; not rebooting", r.Namespace, nr.Spec.Maintenance))
	case nm.Spec.NodeName != node.Name:
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed,
			fmt.Sprintf("NodeMaintenance %s/%s holds node %s, not %s; not rebooting", r.Namespace, nm.Name, nm.Spec.NodeName, node.Name))
	case nm.Spec.RequestorID != nr.Spec.Requestor:
		// Whoever can create a NodeRepair must not borrow another
		// requestor's hold on a node to reboot it.
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed,
			fmt.Sprintf("NodeMaintenance %s/%s is requestor %s's, not %s's (the repair's requestor); not rebooting", r.Namespace, nm.Name, nm.Spec.RequestorID, nr.Spec.Requestor))
	case !nm.IsReady() && !nm.DrainTimedOut():
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed,
			fmt.Sprintf("NodeMaintenance %s/%s does not hold the node yet (%s); not rebooting", r.Namespace, nm.Name, maintenanceWait(nm)))
	}
	var pods corev1.PodList
	if err := r.Live.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing pods on node %s: %w", node.Name, err)
	}
	if left := rebootEnds(pods.Items); len(left) > 0 && !nm.DrainTimedOut() {
		// The requestor's maintenance did not drain them (a driver
		// upgrade drains GPU pods only until it needs a reboot): the
		// reboot waits for them, bounded, rather than ending them without
		// their grace period and budgets.
		limit := seconds(l.policy.Spec.ActionTimeoutSeconds, defaultActionTimeout)
		waited := l.now.Sub(nr.CreationTimestamp.Time)
		what := fmt.Sprintf("%d pod(s) on node %s that the reboot would end are still running and NodeMaintenance %s/%s did not drain them: %s",
			len(left), node.Name, r.Namespace, nm.Name, summarize(left, 5))
		if waited >= limit {
			return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed, fmt.Sprintf("not rebooting after %s: %s", limit, what))
		}
		nr.Status.Message = "waiting before the reboot: " + what
		return reconcile.Result{RequeueAfter: limit - waited}, nil // the NodeMaintenance's events bring us back sooner
	}
	nr.Status.Message = ""
	msg := fmt.Sprintf("rebooting inside NodeMaintenance %s/%s of %s", r.Namespace, nm.Name, nm.Spec.RequestorID)
	if !nm.IsReady() {
		_, why := nm.DrainHeld()
		msg += "; its drain did not finish within its timeout: " + why
	}
	l.record("Maintenance", "Held", msg)
	t := metav1.NewTime(l.now)
	nr.Status.BootIDBefore = node.Status.NodeInfo.BootID
	nr.Status.RebootRequestedAt = &t
	r.request(l, repairv1.ActionReboot)
	return reconcile.Result{RequeueAfter: seconds(l.policy.Spec.RebootTimeoutSeconds, defaultRebootTimeout)}, nil
}

// verifyingSinceReboot reports whether the repair's verification window was
// set after its reboot was asked for (the window before the reboot rung
// ends at or before that). Without the time of the ask (written by an older
// version) any window counts, so the wait stays bounded.
func verifyingSinceReboot(nr *repairv1.NodeRepair) bool {
	v, asked := nr.Status.VerifyUntil, nr.Status.RebootRequestedAt
	return v != nil && (asked == nil || v.After(asked.Time))
}

// awaitReboot waits for the new boot ID and Ready, then releases the node;
// past the reboot timeout the repair fails instead of holding the node.
func (r *Repairer) awaitReboot(ctx context.Context, l *ladder) (reconcile.Result, error) {
	nr, node := l.nr, l.node
	if last := nr.LastEntry(); nr.Status.Pending == nil && last != nil && last.Step == string(repairv1.ActionReboot) &&
		(last.Outcome == repairv1.OutcomeRefused || last.Outcome == repairv1.OutcomeFailed) {
		// Refused, or the reboot command failed: the node is not coming
		// back with a new boot, and nothing is to wait for. Reboot is the
		// last rung: the repair ends (the node released).
		verb := "did not reboot"
		if last.Outcome == repairv1.OutcomeFailed {
			verb = "could not reboot"
		}
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed, fmt.Sprintf("the node agent %s node %s: %s", verb, node.Name, last.Message))
	}
	rebooted := nr.Status.Pending == nil && node.Status.NodeInfo.BootID != nr.Status.BootIDBefore && nodeReady(node)
	if rebooted && strings.HasPrefix(nr.Status.Message, "waiting for node "+node.Name+" to come back from the reboot") {
		nr.Status.Message = ""
	}
	if rebooted && nr.Validates() {
		// The node stays held (cordoned) until its GPUs pass their
		// validation after the reboot.
		switch v := lastAfter(nr, string(repairv1.ActionValidateGPU), string(repairv1.ActionReboot)); {
		case v == nil, revalidate(nr, v):
			r.request(l, repairv1.ActionValidateGPU)
			return reconcile.Result{}, nil
		case v.Outcome != repairv1.OutcomeSucceeded:
			l.events.Eventf(node, nr, corev1.EventTypeWarning, ReasonValidationFailed, actionRepair,
				"Node %s: %s failed its validation after the reboot: %s", node.Name, gpuNames(nr.Spec.GPUs), v.Message)
			held, err := r.holdForReplacement(ctx, l)
			if err != nil {
				return reconcile.Result{}, err
			}
			if held == "" {
				held = "; it stays isolated"
			}
			return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed,
				fmt.Sprintf("%s failed its validation after the reboot (%s): replace it%s", gpuNames(nr.Spec.GPUs), v.Message, held))
		}
	}
	if rebooted {
		faulty, err := r.stillFaulty(ctx, l, ruleNamed(l.policy, nr.Spec.Fault.Rule))
		if err != nil {
			return reconcile.Result{}, err
		}
		if faulty {
			// The node's problem detector starts after the kubelet and
			// rewrites its conditions only then: the condition seen now
			// may be the one from before the reboot. The fault gets the
			// verification window, counted from the first look after
			// the reboot; node events bring us back sooner.
			window := seconds(l.policy.Spec.VerificationSeconds, defaultVerificationSeconds*time.Second)
			if !verifyingSinceReboot(nr) {
				t := metav1.NewTime(l.now.Add(window))
				nr.Status.VerifyUntil = &t
				l.record("Verify", "Waiting", fmt.Sprintf("node back from the reboot; the fault must clear within %s", window))
				return reconcile.Result{RequeueAfter: window}, nil
			}
			if l.now.Before(nr.Status.VerifyUntil.Time) {
				return reconcile.Result{RequeueAfter: nr.Status.VerifyUntil.Sub(l.now)}, nil
			}
			held, err := r.holdForReplacement(ctx, l)
			if err != nil {
				return reconcile.Result{}, err
			}
			return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed,
				fmt.Sprintf("fault persists after the reboot (%s after the node came back)%s", window, held))
		}
		return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseSucceeded, "node rebooted (new boot ID) and the fault cleared"+validatedSuffix(nr))
	}
	limit := seconds(l.policy.Spec.RebootTimeoutSeconds, defaultRebootTimeout)
	started := nr.Status.RebootRequestedAt
	if started == nil && nr.Status.Pending != nil {
		started = &nr.Status.Pending.RequestedAt
	}
	if started == nil {
		started = &metav1.Time{Time: l.now} // written by an older version: the bound counts from now
		nr.Status.RebootRequestedAt = started
	}
	why, now := "its boot ID did not change", "its boot ID has not changed yet"
	if node.Status.NodeInfo.BootID != nr.Status.BootIDBefore {
		why, now = "it did not become Ready", "back with a new boot ID, not Ready yet"
	}
	if nr.Status.Pending != nil {
		why, now = "the node agent did not run the reboot", "the node agent has not run the reboot yet"
	}
	if waited := l.now.Sub(started.Time); waited < limit {
		// Said on the repair while it lasts; it changes only with the
		// node's state, so it is written once, not on every look.
		nr.Status.Message = fmt.Sprintf("waiting for node %s to come back from the reboot: %s (at most %s, until %s)",
			node.Name, now, limit, started.Add(limit).UTC().Format(time.RFC3339))
		return reconcile.Result{RequeueAfter: limit - waited}, nil // node events bring us back sooner
	}
	nr.Status.Pending = nil
	return reconcile.Result{}, r.end(ctx, l, repairv1.PhaseRecoveryFailed,
		fmt.Sprintf("node %s did not come back from the reboot within %s: %s", node.Name, limit, why))
}

// stackRestartWait bounds the wait for the GPU stack's restarted pods to
// give a repaired GPU out again.
const stackRestartWait = 3 * time.Minute

// runStackRestart runs RestartGPUStackPods as a rung of the ladder: the
// operator restarts the node's GPU stack pods itself, records the outcome
// and goes on to the next rung (none found is a failed rung, not the end).
func (r *Repairer) runStackRestart(ctx context.Context, l *ladder, a repairv1.Action) {
	l.nr.Status.NextAction++
	actionsRequested.WithLabelValues(string(a)).Inc()
	names, err := r.restartStackPods(ctx, l)
	switch {
	case err != nil && len(names) == 0:
		l.record(string(a), repairv1.OutcomeFailed, err.Error())
	case len(names) == 0:
		l.record(string(a), repairv1.OutcomeFailed, "no pod of the GPU stack on the node (gpu.stackPods)")
	default:
		l.record(string(a), repairv1.OutcomeSucceeded, "restarted "+strings.Join(names, ", "))
		l.events.Eventf(l.node, l.nr, corev1.EventTypeNormal, ReasonAction, actionRepair, "Node %s: %s: %s", l.node.Name, a, strings.Join(names, ", "))
	}
}

// stackReturn is the last step of a GPU repair whose GPUs are back in
// service by their records: when the node's device plugin or DRA driver
// still holds one out of service (StackHolds), it restarts their pods
// once and waits, at most stackRestartWait, for them to give the GPU out
// again. done: the repair may end (note: what the user must know); a
// restart that did not help ends it RecoveryFailed.
func (r *Repairer) stackReturn(ctx context.Context, l *ladder) (res reconcile.Result, note string, done bool, err error) {
	nr := l.nr
	var faults repairv1.GPUFaultList
	if err := r.Client.List(ctx, &faults, client.MatchingFields{indexGPUNode: l.node.Name}); err != nil {
		return res, "", false, fmt.Errorf("listing the GPUFaults of node %s: %w", l.node.Name, err)
	}
	var slices resourcev1.ResourceSliceList
	if r.DRA {
		if err := r.Client.List(ctx, &slices, client.MatchingFields{indexSliceNode: l.node.Name}); err != nil {
			return res, "", false, fmt.Errorf("listing ResourceSlices of node %s: %w", l.node.Name, err)
		}
	}
	isolated := func(f *repairv1.GPUFault) bool {
		var rule resourcev1.DeviceTaintRule
		return r.DRA && r.Client.Get(ctx, types.NamespacedName{Name: ruleName(f)}, &rule) == nil
	}
	hold := StackHolds(l.node, nr.Spec.GPUs, faults.Items, slices.Items, draDriver(&l.policy.Spec), isolated)
	restarted := lastAfter(nr, string(repairv1.ActionRestartGPUStackPods), string(repairv1.ActionValidateGPU))
	switch {
	case hold.Held == "":
		return res, "", true, nil
	case hold.Blocked != "":
		return res, "; the GPU stack still holds it (" + hold.Held + "): " + hold.Blocked, true, nil
	case restarted == nil:
		names, err := r.restartStackPods(ctx, l)
		if err != nil {
			// Refused (a PodDisruptionBudget, permissions): no retry loop;
			// the user restarts it.
			l.record(string(repairv1.ActionRestartGPUStackPods), repairv1.OutcomeFailed, err.Error())
			return res, "", false, r.end(ctx, l, repairv1.PhaseRecoveryFailed, fmt.Sprintf(
				"%s passed its validation, but %s and gpufleet could not restart the GPU stack's pods (%v): restart the node's device plugin or DRA kubelet plugin",
				gpuNames(nr.Spec.GPUs), hold.Held, err))
		}
		if len(names) == 0 {
			return res, "; the GPU stack still holds it (" + hold.Held + ") and no pod of the GPU stack on the node matches gpu.stackPods: restart the device plugin or DRA kubelet plugin of the node", true, nil
		}
		l.record(string(repairv1.ActionRestartGPUStackPods), repairv1.OutcomeSucceeded,
			fmt.Sprintf("%s; restarted %s", hold.Held, strings.Join(names, ", ")))
		l.events.Eventf(l.node, nr, corev1.EventTypeNormal, ReasonAction, actionRepair, "Node %s: %s: %s (%s)",
			l.node.Name, repairv1.ActionRestartGPUStackPods, strings.Join(names, ", "), hold.Held)
		return reconcile.Result{RequeueAfter: stackRestartWait}, "", false, nil
	}
	if waited := l.now.Sub(restarted.Time.Time); waited < stackRestartWait {
		return reconcile.Result{RequeueAfter: stackRestartWait - waited}, "", false, nil
	}
	return res, "", false, r.end(ctx, l, repairv1.PhaseRecoveryFailed, fmt.Sprintf(
		"%s passed its validation, but %s after gpufleet restarted the GPU stack's pods %s ago: check the node's device plugin or DRA kubelet plugin",
		gpuNames(nr.Spec.GPUs), hold.Held, stackRestartWait))
}

// lastAfter is the last timeline entry of step after the last entry of
// step since (nil: none since).
func lastAfter(nr *repairv1.NodeRepair, step, since string) *repairv1.TimelineEntry {
	for i := len(nr.Status.Timeline) - 1; i >= 0; i-- {
		e := &nr.Status.Timeline[i]
		switch e.Step {
		case step:
			if e.Outcome != repairv1.OutcomeRequested && e.Outcome != repairv1.OutcomeStarted {
				return e
			}
		case since:
			return nil
		}
	}
	return nil
}

// revalidate: the last validation was interrupted (the agent restarted
// while it ran); it is read-only, so it is asked for again, at most three
// times in a repair.
func revalidate(nr *repairv1.NodeRepair, last *repairv1.TimelineEntry) bool {
	if last == nil || last.Step != string(repairv1.ActionValidateGPU) || last.Outcome != repairv1.OutcomeInterrupted {
		return false
	}
	n := 0
	for _, e := range nr.Status.Timeline {
		if e.Step == string(repairv1.ActionValidateGPU) && e.Outcome == repairv1.OutcomeInterrupted {
			n++
		}
	}
	return n <= 3
}

// validatedSuffix says that the GPUs passed their validation, when the
// last thing the agent did was that.
func validatedSuffix(nr *repairv1.NodeRepair) string {
	if v := lastAfter(nr, string(repairv1.ActionValidateGPU), "Start"); v != nil && v.Outcome == repairv1.OutcomeSucceeded && nr.Validates() {
		return " (validated: " + string(nr.Spec.Validation.LevelOf()) + ")"
	}
	return ""
}

// maintenanceRequest is the repair's request to hold its node: cordon, and
// drain with the policy's settings and a timeout from the node's pods.
func (r *Repairer) maintenanceRequest(ctx context.Context, l *ladder) (requestor.Request, error) {
	var pods corev1.PodList
	if err := r.Live.List(ctx, &pods, client.MatchingFields{"spec.nodeName": l.node.Name}); err != nil {
		return requestor.Request{}, fmt.Errorf("listing pods on node %s: %w", l.node.Name, err)
	}
	d := l.policy.Spec.Drain
	timeout := int32(DrainTimeout(&d, pods.Items) / time.Second)
	force, emptyDir := DrainFlags(&d)
	return requestor.Request{
		RequestorID: Requestor, Namespace: r.Namespace, Name: "repair-" + l.nr.Name, NodeName: l.node.Name, Owner: l.nr,
		Cordon: ptr.To(true),
		// A repair is urgent: on a node that is already unavailable (not
		// Ready, or cordoned) it takes nothing more from the cluster and
		// does not wait for a maintenance window. Limits still apply.
		Urgent: true,
		Drain:  &maintenancev1.DrainSpec{Force: force, DeleteEmptyDir: emptyDir, TimeoutSeconds: &timeout},
	}, nil
}

// request hands an action to the node agent.
func (r *Repairer) request(l *ladder, a repairv1.Action) {
	l.nr.Status.Pending = &repairv1.PendingAction{Action: a, RequestedAt: metav1.NewTime(l.now)}
	l.record(string(a), "Requested", "")
	actionsRequested.WithLabelValues(string(a)).Inc()
	l.events.Eventf(l.node, l.nr, corev1.EventTypeNormal, ReasonAction, actionRepair, "Node %s: %s", l.node.Name, a)
}

// end releases the node's maintenance (deleting it uncordons the node
// unless it was cordoned before) and records the final phase; the node's
// state label and the metrics follow the status write (finished). A
// maintenance held for replacement (holdForReplacement) is kept.
func (r *Repairer) end(ctx context.Context, l *ladder, phase repairv1.Phase, msg string) error {
	for _, name := range []string{l.nr.Status.GPUMaintenanceName, l.nr.Status.MaintenanceName} {
		if name == "" || name == l.nr.Status.HeldForReplacement {
			continue
		}
		if err := requestor.Release(ctx, r.Client, r.Namespace, name); err != nil {
			return err
		}
	}
	l.nr.Status.Phase, l.nr.Status.Message, l.final = phase, msg, phase
	l.record("Done", string(phase), msg)
	if l.node == nil {
		return nil
	}
	switch phase {
	case repairv1.PhaseSucceeded:
		l.events.Eventf(l.node, l.nr, corev1.EventTypeNormal, ReasonSucceed, actionRepair, "Node %s repaired: %s", l.node.Name, msg)
	case repairv1.PhaseRecoveryFailed:
		if l.nr.Spec.Recommendation != "" {
			still := ""
			if len(l.nr.Spec.GPUs) > 0 {
				still = "; the GPU stays isolated"
			}
			l.events.Eventf(l.node, l.nr, corev1.EventTypeWarning, ReasonFailed, actionRepair,
				"Node %s needs a person: %s (not repaired automatically%s)", l.node.Name, msg, still)
			break
		}
		if l.nr.Requested() {
			l.events.Eventf(l.node, l.nr, corev1.EventTypeWarning, ReasonFailed, actionRepair,
				"Reboot of node %s asked for by %s failed: %s", l.node.Name, l.nr.Spec.Requestor, msg)
			break
		}
		l.events.Eventf(l.node, l.nr, corev1.EventTypeWarning, ReasonFailed, actionRepair,
			"Repair of node %s failed: %s; its pool %q is suspended until the fault clears", l.node.Name, msg, l.nr.Spec.Pool)
	}
	return nil
}

// finished shows the final state on the node and counts the repair.
func (r *Repairer) finished(ctx context.Context, l *ladder) error {
	repairsFinished.WithLabelValues(l.nr.Spec.Fault.Rule, string(l.final)).Inc()
	repairDuration.WithLabelValues(string(l.final)).Observe(l.now.Sub(l.nr.CreationTimestamp.Time).Seconds())
	ctrl.LoggerFrom(ctx).Info("repair finished", "phase", l.final, "message", l.nr.Status.Message)
	if l.node == nil || l.nr.Requested() {
		return nil // a requested reboot's outcome is shown by its requestor
	}
	var state any // nil removes the label
	if l.final == repairv1.PhaseRecoveryFailed {
		state = string(repairv1.PhaseRecoveryFailed)
	}
	// One write: the state label and the recommendation appear together.
	meta := map[string]any{"labels": map[string]any{LabelState: state}}
	if l.nr.Spec.Recommendation != "" {
		meta["annotations"] = map[string]any{AnnotationRecommendation: l.nr.Spec.Recommendation}
	}
	return patchNodeMeta(ctx, r.Client, l.node.Name, meta)
}

func (l *ladder) record(step, outcome, msg string) {
	l.nr.Status.Timeline = append(l.nr.Status.Timeline, repairv1.TimelineEntry{Time: metav1.NewTime(l.now), Step: step, Outcome: outcome, Message: msg})
}

func seconds(p *int32, def time.Duration) time.Duration {
	if p == nil {
		return def
	}
	return time.Duration(*p) * time.Second
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

// stillFaulty reports whether the repair's fault persists: for a GPU
// repair, whether one of its GPUs is still out of service (another GPU
// failing meanwhile is a repair of its own); otherwise whether the rule
// still matches the node. A rule that is gone counts as cleared.
func (r *Repairer) stillFaulty(ctx context.Context, l *ladder, rule *repairv1.Rule) (bool, error) {
	if len(l.nr.Spec.GPUs) > 0 {
		var list repairv1.GPUFaultList
		if err := r.Client.List(ctx, &list, client.MatchingFields{indexGPUNode: l.node.Name}); err != nil {
			return false, fmt.Errorf("listing the GPUFaults of node %s: %w", l.node.Name, err)
		}
		return !gpusInService(l.nr.Spec.GPUs, l.node.Name, list.Items), nil
	}
	return rule != nil && stillFaulty(l.node, *rule), nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// gpuDrainRung drains, through a NodeMaintenance that does not cordon the
// node, only the pods using the repair's GPUs, so that ResetGPU finds them
// idle while the node's other GPUs keep working; the cluster's maintenance
// limits apply to it like to any other. It reports whether the drain is
// done (or timed out: the agent refuses to reset a GPU still in use).
func (r *Repairer) gpuDrainRung(ctx context.Context, l *ladder) (reconcile.Result, bool, error) {
	nr := l.nr
	if nr.Status.GPUMaintenanceName == "" {
		// Already created, and its record not in this (older) view of the
		// repair — the NodeMaintenance's own event can arrive first, or the
		// operator restarted between the two writes: take it up as it is
		// instead of listing the node's pods again for a create that
		// would be refused.
		name := gpuDrainName(nr)
		if nm, err := requestor.Get(ctx, r.Client, r.Namespace, name); err != nil {
			return reconcile.Result{}, false, err
		} else if nm != nil && metav1.IsControlledBy(nm, nr) {
			nr.Status.GPUMaintenanceName = name
			l.record("Maintenance", "Requested", fmt.Sprintf("NodeMaintenance %s/%s (found: created before this repair recorded it)", r.Namespace, name))
			return reconcile.Result{}, false, nil
		}
		if err := r.isolateFirst(ctx, l); err != nil {
			return reconcile.Result{}, false, err
		}
		req, n, err := r.gpuDrainRequest(ctx, l)
		if err != nil {
			return reconcile.Result{}, false, err
		}
		if _, err := requestor.Ensure(ctx, r.Client, req); err != nil {
			return reconcile.Result{}, false, err
		}
		nr.Status.GPUMaintenanceName = req.Name
		nr.Status.MaintenanceRequestedAt = ptr.To(metav1.NewTime(l.now))
		l.record("Maintenance", "Requested", fmt.Sprintf("NodeMaintenance %s/%s: drain %s using %s (the node stays schedulable)",
			req.Namespace, req.Name, n, gpuNames(nr.Spec.GPUs)))
		return reconcile.Result{}, false, nil
	}
	nm, res, err := r.awaitHold(ctx, l, nr.Status.GPUMaintenanceName)
	if err != nil || nm == nil {
		return res, false, err
	}
	if !nm.IsReady() {
		_, why := nm.DrainHeld()
		l.record("Maintenance", "DrainBlocked", "the GPUs' pods did not all leave within the drain's timeout: "+why+"; resetting anyway (the agent resets only an idle GPU)")
	}
	return reconcile.Result{}, true, nil
}

// isolateFirst isolates the repair's GPUs before their pods are drained,
// when the isolator has not done it yet (its queue is long in a burst of
// faults): otherwise the scheduler could give a faulty GPU to a new pod
// after the drain chose which pods to evict, and the reset would find the
// GPU in use. The isolator's own decision applies (Converge): a GPU that
// DRA does not publish, or a dry-run policy, gets no rule. A rule the API
// server refuses does not hold the repair back (the timeline says so, and
// the isolator goes on trying): the drain and reset still mend the GPU.
func (r *Repairer) isolateFirst(ctx context.Context, l *ladder) error {
	if !r.DRA {
		return nil
	}
	var records repairv1.GPUFaultList
	if err := r.Client.List(ctx, &records, client.MatchingFields{indexGPUNode: l.node.Name}); err != nil {
		return fmt.Errorf("listing the GPUFaults of node %s: %w", l.node.Name, err)
	}
	iso := &Isolator{Client: r.Client, Recorder: r.Recorder}
	for _, gf := range outOfService(l.node.Name, records.Items) {
		if !slices.ContainsFunc(l.nr.Spec.GPUs, func(g repairv1.GPURef) bool { return g.PCIBusID == gf.Spec.GPU.PCIBusID }) {
			continue
		}
		rule, err := iso.Converge(ctx, gf)
		if err != nil {
			l.record("Isolate", repairv1.OutcomeFailed, fmt.Sprintf("%s not isolated before the drain (the isolator goes on trying): %v", gf.Spec.GPU.Describe(), err))
			continue
		}
		if rule != nil {
			l.record("Isolate", "Isolated", fmt.Sprintf("%s isolated before the drain: DeviceTaintRule %s", gf.Spec.GPU.Describe(), rule.Name))
		}
	}
	return nil
}

// gpuDrainName names a repair's GPU drain NodeMaintenance.
func gpuDrainName(nr *repairv1.NodeRepair) string { return "repair-" + nr.Name + "-gpu" }

// gpuDrainRequest marks the pods using the repair's GPUs and builds the
// request that drains exactly them. With DRA, they are the pods whose
// claims were allocated one of the GPUs' devices; on a node whose GPUs are
// not published through DRA (device plugin), the pods the GPUs' records
// name (the node agent read them from the kubelet's pod-resources API) —
// or, when a record does not say, every pod requesting nvidia.com/gpu.
func (r *Repairer) gpuDrainRequest(ctx context.Context, l *ladder) (requestor.Request, string, error) {
	node := l.node.Name
	var pods corev1.PodList
	if err := r.Live.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return requestor.Request{}, "", fmt.Errorf("listing pods on node %s: %w", node, err)
	}
	var published resourcev1.ResourceSliceList
	if err := r.Live.List(ctx, &published, client.MatchingFields{indexSliceNode: node}); err != nil && !meta.IsNoMatchError(err) {
		return requestor.Request{}, "", fmt.Errorf("listing ResourceSlices of node %s: %w", node, err)
	}
	driver := draDriver(&l.policy.Spec)
	var devices []Device
	for _, g := range l.nr.Spec.GPUs {
		if d, ok := DeviceOf(published.Items, driver, node, g); ok {
			devices = append(devices, d)
		}
	}
	var held []repairv1.PodRef
	known := false
	if len(devices) == 0 {
		var records repairv1.GPUFaultList
		if err := r.Client.List(ctx, &records, client.MatchingFields{indexGPUNode: node}); err != nil {
			return requestor.Request{}, "", fmt.Errorf("listing the GPUFaults of node %s: %w", node, err)
		}
		held, known = allocatedPods(l.nr.Spec.GPUs, node, records.Items)
	}
	d := l.policy.Spec.Drain
	force, emptyDir := DrainFlags(&d)
	spec := &maintenancev1.DrainSpec{Force: force, DeleteEmptyDir: emptyDir}
	var using []corev1.Pod
	if len(devices) == 0 && !known {
		spec.PodEvictionFilters = []maintenancev1.PodEvictionFilterEntry{{ByResourceNameRegex: ptr.To(`^nvidia\.com/gpu$`)}}
		for _, p := range pods.Items {
			if requestsGPU(&p) {
				using = append(using, p)
			}
		}
	} else {
		spec.PodSelector = maintenancev1.LabelSelectorString(LabelGPUDrain + "=" + string(l.nr.UID))
		for i := range pods.Items {
			p := &pods.Items[i]
			uses := slices.Contains(held, repairv1.PodRef{Namespace: p.Namespace, Name: p.Name})
			if len(devices) > 0 {
				var err error
				if uses, err = r.podUses(ctx, p, devices); err != nil {
					return requestor.Request{}, "", err
				}
			}
			if !uses {
				continue
			}
			using = append(using, *p)
			if err := r.markForDrain(ctx, p, string(l.nr.UID)); err != nil {
				return requestor.Request{}, "", err
			}
		}
	}
	spec.TimeoutSeconds = ptr.To(int32(DrainTimeout(&d, using) / time.Second))
	what := fmt.Sprintf("the %d pod(s)", len(using))
	switch {
	case len(devices) > 0:
		what += " whose ResourceClaims were allocated them (DRA)"
	case known:
		what += " the kubelet gave them (device plugin, pod-resources API)"
	default:
		what += " requesting nvidia.com/gpu (device plugin: which pod holds which GPU is not known)"
	}
	return requestor.Request{
		RequestorID: Requestor, Namespace: r.Namespace, Name: gpuDrainName(l.nr), NodeName: node, Owner: l.nr,
		Cordon: ptr.To(false), Drain: spec, Urgent: true,
	}, what, nil
}

// podUses reports whether one of the pod's claims was allocated one of devices.
func (r *Repairer) podUses(ctx context.Context, p *corev1.Pod, devices []Device) (bool, error) {
	for _, name := range claimNames(p) {
		claim := &resourcev1.ResourceClaim{}
		if err := r.Live.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: name}, claim); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return false, fmt.Errorf("reading ResourceClaim %s/%s of pod %s: %w", p.Namespace, name, p.Name, err)
		}
		if usesDevice(claim, devices) {
			return true, nil
		}
	}
	return false, nil
}

// markForDrain labels a pod for the GPU drain of a repair.
func (r *Repairer) markForDrain(ctx context.Context, p *corev1.Pod, id string) error {
	if p.Labels[LabelGPUDrain] == id {
		return nil
	}
	patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, LabelGPUDrain, id)))
	if err := r.Client.Patch(ctx, p, patch); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("marking pod %s/%s for the GPU drain: %w", p.Namespace, p.Name, err)
	}
	return nil
}

func requestsGPU(p *corev1.Pod) bool {
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		if _, ok := c.Resources.Limits[gpuResource]; ok {
			return true
		}
		if _, ok := c.Resources.Requests[gpuResource]; ok {
			return true
		}
	}
	return false
}

// maintenanceWait says, on the repair, what its NodeMaintenance waits for:
// a repair held back by the maintenance limits or a closed window, or by
// a drain that is refused (a pod it may not evict), shows why on the
// NodeRepair itself (kubectl get nr -o wide), not only on the
// NodeMaintenance.
func maintenanceWait(nm *maintenancev1.NodeMaintenance) string {
	msg := fmt.Sprintf("waiting for NodeMaintenance %s/%s (%s)", nm.Namespace, nm.Name, nm.Phase())
	if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady); c != nil && c.Message != "" {
		msg += ": " + c.Message
	}
	if held, why := nm.DrainHeld(); held {
		msg += "; " + why
	}
	return msg
}
