package v1alpha1

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// nm builds a NodeMaintenance with a Ready condition (reason "" = none)
// and the given extra conditions.
func nm(readyReason string, ready metav1.ConditionStatus, extra ...metav1.Condition) *NodeMaintenance {
	o := &NodeMaintenance{Spec: NodeMaintenanceSpec{RequestorID: "a.example.com", NodeName: "n"}}
	if readyReason != "" || ready != "" {
		o.Status.Conditions = append(o.Status.Conditions, metav1.Condition{Type: ConditionTypeReady, Status: ready, Reason: readyReason})
	}
	o.Status.Conditions = append(o.Status.Conditions, extra...)
	return o
}

func TestContract(t *testing.T) {
	deleting := nm(string(PhaseDraining), metav1.ConditionFalse)
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	blocked := metav1.Condition{Type: ConditionTypeDrainBlocked, Status: metav1.ConditionTrue, Reason: "DrainBlocked"}
	unblocked := metav1.Condition{Type: ConditionTypeDrainBlocked, Status: metav1.ConditionFalse, Reason: "DrainBlocked"}
	refused := metav1.Condition{Type: ConditionTypeDrainBlocked, Status: metav1.ConditionTrue, Reason: "DrainFailed"}
	tests := map[string]struct {
		obj                                  *NodeMaintenance
		phase                                Phase
		inProgress, active, ready, drainStop bool
		drainHeld                            bool
	}{
		"new: no condition is Pending":          {obj: nm("", ""), phase: PhasePending},
		"empty reason is Pending":               {obj: nm("", metav1.ConditionFalse), phase: PhasePending},
		"waiting with a reason":                 {obj: nm(string(PhasePending), metav1.ConditionFalse), phase: PhasePending},
		"scheduled holds the node":              {obj: nm(string(PhaseScheduled), metav1.ConditionFalse), phase: PhaseScheduled, inProgress: true, active: true},
		"draining":                              {obj: nm(string(PhaseDraining), metav1.ConditionFalse), phase: PhaseDraining, inProgress: true, active: true},
		"draining past its timeout":             {obj: nm(string(PhaseDraining), metav1.ConditionFalse, blocked), phase: PhaseDraining, inProgress: true, active: true, drainStop: true, drainHeld: true},
		"a refused drain is not a timeout":      {obj: nm(string(PhaseDraining), metav1.ConditionFalse, refused), phase: PhaseDraining, inProgress: true, active: true, drainHeld: true},
		"a cleared DrainBlocked does not count": {obj: nm(string(PhaseDraining), metav1.ConditionFalse, unblocked), phase: PhaseDraining, inProgress: true, active: true},
		"ready":                                 {obj: nm(string(PhaseReady), metav1.ConditionTrue), phase: PhaseReady, inProgress: true, active: true, ready: true},
		"requestor failed holds the node":       {obj: nm(string(PhaseRequestorFailed), metav1.ConditionFalse), phase: PhaseRequestorFailed, inProgress: true, active: true},
		"being deleted still holds, not active": {obj: deleting, phase: PhaseDraining, inProgress: true},
		"an unknown phase written by another":   {obj: nm("Frobnicating", metav1.ConditionFalse), phase: "Frobnicating", inProgress: true, active: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := tc.obj
			if got := o.Phase(); got != tc.phase {
				t.Errorf("Phase() = %s, want %s", got, tc.phase)
			}
			if got := o.InProgress(); got != tc.inProgress {
				t.Errorf("InProgress() = %t, want %t", got, tc.inProgress)
			}
			if got := o.Active(); got != tc.active {
				t.Errorf("Active() = %t, want %t", got, tc.active)
			}
			if got := o.IsReady(); got != tc.ready {
				t.Errorf("IsReady() = %t, want %t", got, tc.ready)
			}
			if got := o.DrainTimedOut(); got != tc.drainStop {
				t.Errorf("DrainTimedOut() = %t, want %t", got, tc.drainStop)
			}
			if got, _ := o.DrainHeld(); got != tc.drainHeld {
				t.Errorf("DrainHeld() = %t, want %t", got, tc.drainHeld)
			}
		})
	}
}

func TestRequestorFailure(t *testing.T) {
	failed := metav1.Condition{Type: ConditionTypeRequestorFailed, Status: metav1.ConditionTrue, Reason: "Failed", Message: "firmware flash failed"}
	withdrawn := failed
	withdrawn.Status = metav1.ConditionFalse
	if ok, msg := nm(string(PhaseReady), metav1.ConditionTrue, failed).RequestorFailure(); !ok || msg != "firmware flash failed" {
		t.Errorf("RequestorFailure() = %t %q, want true and the message", ok, msg)
	}
	if ok, _ := nm(string(PhaseReady), metav1.ConditionTrue, withdrawn).RequestorFailure(); ok {
		t.Errorf("a withdrawn failure (False) still counts")
	}
	if ok, _ := nm(string(PhaseReady), metav1.ConditionTrue).RequestorFailure(); ok {
		t.Errorf("no condition counts as a failure")
	}
}

func TestSpecAccessors(t *testing.T) {
	o := nm("", "")
	if !o.CordonRequested() {
		t.Errorf("cordon unset: want the API's default, true")
	}
	o.Spec.Cordon = ptr.To(false)
	if o.CordonRequested() {
		t.Errorf("cordon: false must be honoured")
	}
	if o.HasFinalizer() {
		t.Errorf("no finalizer yet")
	}
	o.Finalizers = []string{"other/finalizer", Finalizer}
	if !o.HasFinalizer() {
		t.Errorf("finalizer %s not seen among %v", Finalizer, o.Finalizers)
	}
	o.Spec.AdditionalRequestors = []string{"b.example.com"}
	for requestor, want := range map[string]bool{"a.example.com": true, "b.example.com": true, "c.example.com": false, "": false} {
		if got := o.RequestedBy(requestor); got != want {
			t.Errorf("RequestedBy(%q) = %t, want %t", requestor, got, want)
		}
	}
}

func TestNodeUnschedulableBefore(t *testing.T) {
	tests := map[string]struct {
		annotation   *string
		status       *bool
		want         *bool
		wantCordoned bool
	}{
		"nothing recorded":                    {},
		"gpufleet status only":                {status: ptr.To(false), want: ptr.To(false), wantCordoned: true},
		"reference annotation false":          {annotation: ptr.To("false"), want: ptr.To(false), wantCordoned: true},
		"reference annotation true (admin)":   {annotation: ptr.To("true"), want: ptr.To(true)},
		"annotation wins over status":         {annotation: ptr.To("true"), status: ptr.To(false), want: ptr.To(true)},
		"unparsable annotation: status":       {annotation: ptr.To("yes"), status: ptr.To(true), want: ptr.To(true)},
		"unparsable annotation and no status": {annotation: ptr.To("")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := nm(string(PhaseDraining), metav1.ConditionFalse)
			if tc.annotation != nil {
				o.Annotations = map[string]string{AnnotationNodeInitialUnschedulable: *tc.annotation}
			}
			o.Status.NodeUnschedulableBefore = tc.status
			got := o.NodeUnschedulableBefore()
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Errorf("NodeUnschedulableBefore() = %v, want %v", ptr.Deref(got, false), ptr.Deref(tc.want, false))
			}
			if o.CordonedTheNode() != tc.wantCordoned {
				t.Errorf("CordonedTheNode() = %t, want %t", o.CordonedTheNode(), tc.wantCordoned)
			}
		})
	}
}

func TestWaitForCompletionStart(t *testing.T) {
	at := time.Date(2026, 7, 1, 10, 0, 0, 0, time.UTC)
	tests := map[string]struct {
		annotation string
		status     *metav1.Time
		want       time.Time
	}{
		"none":                        {},
		"reference annotation":        {annotation: "2026-07-01T10:00:00Z", want: at},
		"status wins":                 {annotation: "2026-07-01T09:00:00Z", status: &metav1.Time{Time: at}, want: at},
		"unparsable annotation: zero": {annotation: "yesterday"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := nm(string(PhaseWaitForPodCompletion), metav1.ConditionFalse)
			if tc.annotation != "" {
				o.Annotations = map[string]string{AnnotationWaitPodCompletionStart: tc.annotation}
			}
			o.Status.WaitForCompletionStartTime = tc.status
			if got := o.WaitForCompletionStart(); !got.Equal(tc.want) {
				t.Errorf("WaitForCompletionStart() = %s, want %s", got, tc.want)
			}
		})
	}
}
