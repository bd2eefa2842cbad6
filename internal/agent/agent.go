// Package agent is the node agent: it runs the repair actions a NodeRepair
// asks for on its node. Actions are a fixed enumeration; the host side is
// an Executor (systemd on the real host, or the simulation).
package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Executor performs one action on a node's host; gpus are the GPUs the
// repair is about (NodeRepair spec.gpus), which ResetGPU resets.
type Executor interface {
	Execute(ctx context.Context, node *corev1.Node, action repairv1.Action, gpus []repairv1.GPURef) error
}

// Agent runs pending actions of the NodeRepairs of its node (NodeName; empty
// means every node, for the simulation).
type Agent struct {
	Client   API
	NodeName string
	// Namespace is where the NodeMaintenance objects that hold the node
	// are ("": any).
	Namespace string
	Executor  Executor
	Clock     clock.PassiveClock
	// ValidationRetry is the first wait before a GPU that failed its
	// validation after a reboot is tried again (default 2 s, doubling up
	// to 30 s; negative: no retry).
	ValidationRetry time.Duration
}

// Reconcile runs the pending action of one NodeRepair, at most once: it
// records "Started" before running it, and after a restart it does not run
// an action whose start is recorded (the repair controller verifies the
// effect instead). The executor logs the action; the context's logger
// carries the NodeRepair ("repair"). An error is retried with backoff.
func (a *Agent) Reconcile(ctx context.Context, name string) error {
	nr, err := a.Client.NodeRepair(ctx, name)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	p := nr.Status.Pending
	if p == nil || (a.NodeName != "" && nr.Spec.NodeName != a.NodeName) || ended(nr) {
		return nil
	}
	log := crlog.FromContext(ctx).WithValues("repair", klog.KObj(nr))
	ctx = crlog.IntoContext(ctx, log)
	if why := Unusable(nr); why != "" {
		// Never acted on, never a crash loop: the refusal is the outcome.
		// Its index is left as it is (it may be what is wrong).
		log.Info("not running an action the repair cannot describe safely", "node", nr.Spec.NodeName, "action", p.Action, "why", why)
		before := nr.DeepCopy()
		nr.Status.Timeline = append(nr.Status.Timeline, entry(a.Clock, string(p.Action), repairv1.OutcomeRefused, why))
		nr.Status.Pending = nil
		if err := a.Client.PatchNodeRepairStatus(ctx, before, nr); err != nil {
			return fmt.Errorf("recording the refusal of %s: %w", p.Action, err)
		}
		return nil
	}
	outcome, msg := repairv1.OutcomeSucceeded, ""
	if last := nr.LastEntry(); last != nil && last.Step == string(p.Action) && last.Outcome == repairv1.OutcomeStarted {
		outcome, msg = repairv1.OutcomeInterrupted, "the agent restarted while running it; not run again"
		log.Info("not running host action again: its start is recorded but not its outcome",
			"node", nr.Spec.NodeName, "action", p.Action)
	} else {
		// Read the node before recording the start: a start is recorded
		// only when the action is about to run, so a failed read is
		// retried instead of being taken for an interrupted action.
		node, err := a.Client.Node(ctx, nr.Spec.NodeName)
		if err != nil {
			return fmt.Errorf("reading node %s before %s: %w", nr.Spec.NodeName, p.Action, err)
		}
		if Disruptive(p.Action) {
			// The node as the API server has it now: a cordon lifted from
			// outside must be seen before the node or its GPU is stopped.
			if node, err = a.Client.Fresh().Node(ctx, nr.Spec.NodeName); err != nil {
				return fmt.Errorf("reading node %s before %s: %w", nr.Spec.NodeName, p.Action, err)
			}
			nms, err := a.Client.NodeMaintenances(ctx, nr.Spec.NodeName)
			if err != nil {
				return fmt.Errorf("reading the NodeMaintenance objects of node %s before %s: %w", nr.Spec.NodeName, p.Action, err)
			}
			switch verdict, why := Authorize(nr, node, a.Namespace, nms); verdict {
			case Refuse:
				log.Info("not running a disruptive action outside the NodeMaintenance that must hold the node", "node", nr.Spec.NodeName, "action", p.Action, "why", why)
				return a.record(ctx, nr, p.Action, repairv1.OutcomeRefused, why)
			case Wait:
				// Retried with backoff; the repair controller's bound ends
				// the wait (its pending action is then withdrawn).
				return fmt.Errorf("%s", why)
			}
		}
		if p.Action == repairv1.ActionReboot && nr.Validates() {
			// The reboot clears the kernel log's faults: the GPUs stay out
			// of service across it until they pass their validation.
			if err := AwaitValidation(ctx, a.Client, a.Clock, nr.Spec.NodeName, nr.Spec.GPUs); err != nil {
				return fmt.Errorf("keeping the GPUs out of service across the reboot: %w", err)
			}
		}
		before := nr.DeepCopy()
		nr.Status.Timeline = append(nr.Status.Timeline, entry(a.Clock, string(p.Action), repairv1.OutcomeStarted, ""))
		if err := a.Client.PatchNodeRepairStatus(ctx, before, nr); err != nil {
			return fmt.Errorf("recording the start of %s: %w", p.Action, err)
		}
		if p.Action == repairv1.ActionValidateGPU {
			outcome, msg = a.validate(ctx, node, nr)
		} else if err := a.Executor.Execute(ctx, node, p.Action, nr.Spec.GPUs); err != nil {
			outcome, msg = repairv1.OutcomeFailed, err.Error()
		} else if p.Action == repairv1.ActionResetGPU {
			// The reset cleared the GPUs' XIDs: without validation they
			// return to service (unless a counter still shows a fault)
			// before the outcome is recorded, so the repair controller sees
			// them back; with it, they stay out until they pass it.
			update := ClearResetGPUs
			if nr.Validates() {
				update = AwaitValidation
			}
			if err := update(ctx, a.Client, a.Clock, nr.Spec.NodeName, nr.Spec.GPUs); err != nil {
				outcome, msg = repairv1.OutcomeFailed, "the GPUs were reset but their fault records could not be updated: "+err.Error()
			}
		}
	}
	return a.record(ctx, nr, p.Action, outcome, msg)
}

// validate runs the validation of each of the repair's GPUs on the host,
// bounded by the repair's timeout, and records each GPU's result on its
// GPUFault record before the outcome: one that passed returns to service,
// one that failed stays out (class Reboot while a reboot is still to come,
// else Replace). After a reboot the driver may still be loading: a GPU
// that fails is tried again (every 2 s, then up to every 30 s) until the
// bound. The outcome is Succeeded when every GPU passed.
func (a *Agent) validate(ctx context.Context, node *corev1.Node, nr *repairv1.NodeRepair) (outcome, msg string) {
	level, limit := nr.Spec.Validation.LevelOf(), time.Duration(nr.Spec.Validation.Timeout())*time.Second
	vctx, cancel := context.WithTimeout(WithValidationLevel(ctx, level), limit)
	defer cancel()
	rebooted := nr.Status.BootIDBefore != ""
	first := a.ValidationRetry
	if first == 0 {
		first = 2 * time.Second
	}
	failedClass := repairv1.GPUClassReboot
	if rebooted || !slices.Contains(nr.Spec.Actions[min(int(nr.Status.NextAction), len(nr.Spec.Actions)):], repairv1.ActionReboot) {
		failedClass = repairv1.GPUClassReplace // rebooted already, or no reboot to come
	}
	var failures []string
	results := make([]GPUValidated, 0, len(nr.Spec.GPUs))
	for _, g := range nr.Spec.GPUs {
		err := a.Executor.Execute(vctx, node, repairv1.ActionValidateGPU, []repairv1.GPURef{g})
		for wait := first; err != nil && rebooted && wait > 0 && vctx.Err() == nil; wait = min(2*wait, 30*time.Second) {
			select {
			case <-vctx.Done():
			case <-time.After(wait):
				err = a.Executor.Execute(vctx, node, repairv1.ActionValidateGPU, []repairv1.GPURef{g})
			}
		}
		result := repairv1.GPUValidationResult{Time: metav1.NewTime(a.Clock.Now()), Level: level, Passed: err == nil,
			Message: fmt.Sprintf("%s validation passed", level)}
		if err != nil {
			if vctx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
				err = fmt.Errorf("not passed within %s: %w", limit, err)
			}
			result.Message = fmt.Sprintf("%s validation failed: %v", level, err)
			failures = append(failures, g.Describe()+": "+result.Message)
		}
		results = append(results, GPUValidated{GPU: g, Result: result})
	}
	if err := RecordValidation(ctx, a.Client, a.Clock, nr.Spec.NodeName, results, failedClass); err != nil {
		failures = append(failures, "the results could not be written on the GPUs' records: "+err.Error())
	}
	if len(failures) > 0 {
		return repairv1.OutcomeFailed, strings.Join(failures, "; ")
	}
	return repairv1.OutcomeSucceeded, fmt.Sprintf("%s validation passed", level)
}

// validationLevelKey carries the validation level to the executor.
type validationLevelKey struct{}

// WithValidationLevel is ctx for an executor's ValidateGPU at level.
func WithValidationLevel(ctx context.Context, level repairv1.GPUValidationLevel) context.Context {
	return context.WithValue(ctx, validationLevelKey{}, level)
}

// ValidationLevel is the level ValidateGPU runs at (default Health).
func ValidationLevel(ctx context.Context) repairv1.GPUValidationLevel {
	if l, ok := ctx.Value(validationLevelKey{}).(repairv1.GPUValidationLevel); ok && l != "" {
		return l
	}
	return repairv1.GPUValidationHealth
}

// record writes the outcome of the pending action: a timeline entry, no
// pending action, the next action of the ladder.
func (a *Agent) record(ctx context.Context, nr *repairv1.NodeRepair, action repairv1.Action, outcome, msg string) error {
	before := nr.DeepCopy()
	nr.Status.Timeline = append(nr.Status.Timeline, entry(a.Clock, string(action), outcome, msg))
	nr.Status.Pending = nil
	if action != repairv1.ActionValidateGPU { // not a rung of the ladder
		nr.Status.NextAction++
	}
	err := a.Client.PatchNodeRepairStatus(ctx, before, nr)
	if apierrors.IsConflict(err) && outcome == repairv1.OutcomeInterrupted {
		// The update event of our own start, read before our outcome
		// reached the cache: the outcome is already recorded.
		return nil
	}
	for try := 0; apierrors.IsConflict(err) && outcome != repairv1.OutcomeRefused && try < 5; try++ {
		// The repair changed while the action ran (the operator wrote its
		// status): the outcome is written on the stored version, or the
		// next pass would take the action for an interrupted one.
		fresh, gerr := a.Client.Fresh().NodeRepair(ctx, nr.Name)
		if gerr != nil {
			return fmt.Errorf("recording the outcome of %s: reading the repair again: %w", action, gerr)
		}
		if !awaitsOutcome(fresh, action) {
			crlog.FromContext(ctx).Info("not recording an outcome the repair no longer waits for", "action", action, "outcome", outcome)
			return nil
		}
		before, nr = fresh.DeepCopy(), fresh
		nr.Status.Timeline = append(nr.Status.Timeline, entry(a.Clock, string(action), outcome, msg))
		nr.Status.Pending = nil
		if action != repairv1.ActionValidateGPU {
			nr.Status.NextAction++
		}
		err = a.Client.PatchNodeRepairStatus(ctx, before, nr)
	}
	if err != nil {
		return fmt.Errorf("recording the outcome of %s: %w", action, err)
	}
	return nil
}

// awaitsOutcome reports whether nr still waits for the outcome of action:
// it is pending, and its last entry of that action is its start.
func awaitsOutcome(nr *repairv1.NodeRepair, action repairv1.Action) bool {
	if nr.Status.Pending == nil || nr.Status.Pending.Action != action || ended(nr) {
		return false
	}
	for i := len(nr.Status.Timeline) - 1; i >= 0; i-- {
		if e := nr.Status.Timeline[i]; e.Step == string(action) {
			return e.Outcome == repairv1.OutcomeStarted
		}
	}
	return false
}

// ended reports whether the repair is over: its pending action is moot.
func ended(nr *repairv1.NodeRepair) bool {
	switch nr.Status.Phase {
	case repairv1.PhaseSucceeded, repairv1.PhaseRecoveryFailed, repairv1.PhaseIgnored:
		return true
	}
	return false
}

func entry(c clock.PassiveClock, step, outcome, msg string) repairv1.TimelineEntry {
	return repairv1.TimelineEntry{Time: metav1.NewTime(c.Now()), Step: step, Outcome: outcome, Message: msg}
}
