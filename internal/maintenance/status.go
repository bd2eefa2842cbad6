package maintenance

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// PhaseOf returns the object's phase: the Ready condition's reason, Pending
// when there is none yet.
func PhaseOf(nm *maintenancev1.NodeMaintenance) maintenancev1.Phase {
	c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady)
	if c == nil || c.Reason == "" {
		return maintenancev1.PhasePending
	}
	return maintenancev1.Phase(c.Reason)
}

// InProgress reports whether the object holds its node: any phase after Pending.
func InProgress(nm *maintenancev1.NodeMaintenance) bool {
	return PhaseOf(nm) != maintenancev1.PhasePending
}

// setPhase sets the Ready condition: True only in phase Ready, reason = phase.
func setPhase(nm *maintenancev1.NodeMaintenance, phase maintenancev1.Phase, message string, now time.Time) {
	status := metav1.ConditionFalse
	if phase == maintenancev1.PhaseReady {
		status = metav1.ConditionTrue
	}
	setCondition(nm, maintenancev1.ConditionTypeReady, status, string(phase), message, now)
}

func setCondition(nm *maintenancev1.NodeMaintenance, typ string, status metav1.ConditionStatus, reason, message string, now time.Time) {
	meta.SetStatusCondition(&nm.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: message,
		ObservedGeneration: nm.Generation, LastTransitionTime: metav1.NewTime(now),
	})
}

func clearCondition(nm *maintenancev1.NodeMaintenance, typ string) {
	meta.RemoveStatusCondition(&nm.Status.Conditions, typ)
}

// requestorFailed reports whether a requestor set RequestorFailed=True.
func requestorFailed(nm *maintenancev1.NodeMaintenance) (bool, string) {
	c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeRequestorFailed)
	if c == nil || c.Status != metav1.ConditionTrue {
		return false, ""
	}
	return true, c.Message
}

func hasFinalizer(nm *maintenancev1.NodeMaintenance) bool {
	return slices.Contains(nm.Finalizers, maintenancev1.Finalizer)
}

func cordonRequested(nm *maintenancev1.NodeMaintenance) bool {
	return nm.Spec.Cordon == nil || *nm.Spec.Cordon
}

// phaseAfterCordon is the phase that follows Cordon for this spec.
func phaseAfterCordon(nm *maintenancev1.NodeMaintenance) maintenancev1.Phase {
	switch {
	case nm.Spec.WaitForPodCompletion != nil:
		return maintenancev1.PhaseWaitForPodCompletion
	case nm.Spec.DrainSpec != nil:
		return maintenancev1.PhaseDraining
	default:
		return maintenancev1.PhaseReady
	}
}

func seconds(p *int32, def int32) time.Duration {
	if p == nil {
		return time.Duration(def) * time.Second
	}
	return time.Duration(*p) * time.Second
}
