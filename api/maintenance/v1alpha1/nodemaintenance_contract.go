package v1alpha1

import (
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The NodeMaintenance contract, in one place: what the phase of an object
// is, whether it holds its node, and whether its requestor may act. The
// maintenance controllers, the GPU stack's driver upgrades and auto-repair
// all read objects through these methods, so a new phase or condition
// changes every reader at once.

// Phase returns the object's phase: the Ready condition's reason, Pending
// when there is none yet.
func (nm *NodeMaintenance) Phase() Phase {
	c := meta.FindStatusCondition(nm.Status.Conditions, ConditionTypeReady)
	if c == nil || c.Reason == "" {
		return PhasePending
	}
	return Phase(c.Reason)
}

// InProgress reports whether the object holds its node: any phase after
// Pending, until the object is gone (a deleted object holds its node until
// its finalizer has released it).
func (nm *NodeMaintenance) InProgress() bool {
	return nm.Phase() != PhasePending
}

// Active reports whether the object holds its node and is not being
// deleted: its requestor is working on the node, or about to.
func (nm *NodeMaintenance) Active() bool {
	return nm.InProgress() && nm.DeletionTimestamp == nil
}

// IsReady reports whether the node is ready for the requestor's work
// (Ready=True, only in phase Ready).
func (nm *NodeMaintenance) IsReady() bool {
	return meta.IsStatusConditionTrue(nm.Status.Conditions, ConditionTypeReady)
}

// DrainTimedOut reports whether the drain has passed its timeout with pods
// still on the node (the DrainBlocked condition names them): the only case
// in which a requestor may go on without a finished drain. A drain that
// kubectl's rules refuse is not a timeout until its timeout has passed.
func (nm *NodeMaintenance) DrainTimedOut() bool {
	c := meta.FindStatusCondition(nm.Status.Conditions, ConditionTypeDrainBlocked)
	return c != nil && c.Status == metav1.ConditionTrue && c.Reason == DrainBlockedReasonTimedOut
}

// DrainHeld reports whether the drain does not finish, refused or past its
// timeout, and why (the DrainBlocked condition's message).
func (nm *NodeMaintenance) DrainHeld() (bool, string) {
	c := meta.FindStatusCondition(nm.Status.Conditions, ConditionTypeDrainBlocked)
	if c == nil || c.Status != metav1.ConditionTrue {
		return false, ""
	}
	return true, c.Message
}

// RequestorFailure reports whether a requestor set RequestorFailed=True,
// and its message.
func (nm *NodeMaintenance) RequestorFailure() (bool, string) {
	c := meta.FindStatusCondition(nm.Status.Conditions, ConditionTypeRequestorFailed)
	if c == nil || c.Status != metav1.ConditionTrue {
		return false, ""
	}
	return true, c.Message
}

// CordonRequested reports whether the node is to be cordoned (default true).
func (nm *NodeMaintenance) CordonRequested() bool {
	return nm.Spec.Cordon == nil || *nm.Spec.Cordon
}

// CordonedTheNode reports whether this object cordoned its node: it holds
// the node, asked for a cordon, and recorded that the node was schedulable
// before. Only then does releasing the object uncordon the node (the
// lifecycle controller's finalizer, and gpufleet uninstall).
func (nm *NodeMaintenance) CordonedTheNode() bool {
	before := nm.NodeUnschedulableBefore()
	return nm.InProgress() && nm.CordonRequested() && before != nil && !*before
}

// NodeUnschedulableBefore returns whether the node was already
// unschedulable before this maintenance touched it, nil when that is not
// recorded yet: the Maintenance Operator's annotation when it is set (it
// is written before the cordon, by that operator and by gpufleet), else
// gpufleet's status field (written by its scheduler).
func (nm *NodeMaintenance) NodeUnschedulableBefore() *bool {
	if v, ok := nm.Annotations[AnnotationNodeInitialUnschedulable]; ok {
		if b, err := strconv.ParseBool(v); err == nil {
			return &b
		}
	}
	return nm.Status.NodeUnschedulableBefore
}

// WaitForCompletionStart returns when waiting for pod completion began,
// zero if it has not: gpufleet's status field, else the Maintenance
// Operator's annotation (an object taken over from it).
func (nm *NodeMaintenance) WaitForCompletionStart() time.Time {
	if t := nm.Status.WaitForCompletionStartTime; t != nil {
		return t.Time
	}
	if v, ok := nm.Annotations[AnnotationWaitPodCompletionStart]; ok {
		if t, err := time.Parse(time.RFC3339, v); err == nil {
			return t
		}
	}
	return time.Time{}
}

// HasFinalizer reports whether the maintenance finalizer is set: the
// lifecycle controller has taken the object over and will clean up.
func (nm *NodeMaintenance) HasFinalizer() bool {
	return slices.Contains(nm.Finalizers, Finalizer)
}

// RequestedBy reports whether requestor is the object's requestor or one of
// its additional requestors.
func (nm *NodeMaintenance) RequestedBy(requestor string) bool {
	return nm.Spec.RequestorID == requestor || slices.Contains(nm.Spec.AdditionalRequestors, requestor)
}
