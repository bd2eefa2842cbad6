package maintenance

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// patchStatus writes after's status as a merge patch from before, with
// before's resourceVersion as a precondition (optimistic lock): if the
// object changed meanwhile the write fails with a conflict instead of
// overwriting a decision made by someone else.
func patchStatus(ctx context.Context, c client.Client, before, after *maintenancev1.NodeMaintenance) error {
	return c.Status().Patch(ctx, after, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
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

func seconds(p *int32, def int32) time.Duration {
	if p == nil {
		return time.Duration(def) * time.Second
	}
	return time.Duration(*p) * time.Second
}
