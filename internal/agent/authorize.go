package agent

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Disruptive reports whether an action stops what runs on the node or on a
// GPU: the agent runs it only inside a NodeMaintenance that holds the node
// (Authorize).
func Disruptive(a repairv1.Action) bool {
	return a == repairv1.ActionReboot || a == repairv1.ActionResetGPU
}

// Verdict is what the agent does with a repair's pending action.
type Verdict int

// Verdicts.
const (
	// Run the action now.
	Run Verdict = iota
	// Wait: the object that is to hold the node does not hold it at this
	// moment (it drains again after an outside uncordon, or the node is
	// schedulable although the object cordons it); looked at again with
	// backoff, bounded by the repair controller's own timeout.
	Wait
	// Refuse: no object can ever authorize it; the refusal is recorded.
	Refuse
)

// Authorize decides whether the agent of node runs the repair's pending
// disruptive action, from the node's NodeMaintenance objects (pure). The
// agent does not trust the NodeRepair alone (any agent may write NodeRepair
// status): a reboot needs the object the repair names as holding the node
// (status.maintenanceName, of gpufleet's repair requestor, or
// spec.maintenance, the object of the controller that asked for the
// reboot, and of that controller's requestor, spec.requestor) for this
// node, not being deleted, Ready (cordoned and drained)
// or past its drain timeout (DrainTimedOut: the requestor reboots anyway;
// a drain refused at once does not count), and the node cordoned when
// that object cordons it; a GPU reset needs the repair's GPU drain object
// (status.gpuMaintenanceName, of gpufleet's repair requestor) in the same
// state. namespace, when known, is where those objects must be (the
// operator's). It returns the verdict and why it is not Run.
func Authorize(nr *repairv1.NodeRepair, node *corev1.Node, namespace string, nms []maintenancev1.NodeMaintenance) (Verdict, string) {
	p := nr.Status.Pending
	if p == nil || !Disruptive(p.Action) {
		return Run, ""
	}
	type want struct{ name, requestor string }
	var wants []want
	switch p.Action {
	case repairv1.ActionReboot:
		if nr.Status.MaintenanceName != "" {
			wants = append(wants, want{nr.Status.MaintenanceName, repairv1.RequestorID})
		}
		if nr.Spec.Maintenance != "" && nr.Spec.Requestor != "" {
			wants = append(wants, want{nr.Spec.Maintenance, nr.Spec.Requestor})
		}
	case repairv1.ActionResetGPU:
		if nr.Status.GPUMaintenanceName != "" {
			wants = append(wants, want{nr.Status.GPUMaintenanceName, repairv1.RequestorID})
		}
	}
	if len(wants) == 0 {
		return Refuse, fmt.Sprintf("refused: %s needs a NodeMaintenance holding node %s, and the NodeRepair names none", p.Action, node.Name)
	}
	verdict, why := Refuse, ""
	for _, w := range wants {
		for i := range nms {
			nm := &nms[i]
			if nm.Name != w.name || (namespace != "" && nm.Namespace != namespace) {
				continue
			}
			ref := fmt.Sprintf("NodeMaintenance %s/%s", nm.Namespace, nm.Name)
			v, reason := Refuse, ""
			switch {
			case nm.Spec.NodeName != node.Name:
				reason = fmt.Sprintf("%s holds node %s, not %s", ref, nm.Spec.NodeName, node.Name)
			case w.requestor != "" && nm.Spec.RequestorID != w.requestor:
				reason = fmt.Sprintf("%s is requestor %s's, not %s's", ref, nm.Spec.RequestorID, w.requestor)
			case nm.DeletionTimestamp != nil:
				reason = ref + " is being deleted"
			case !nm.IsReady() && !nm.DrainTimedOut():
				v, reason = Wait, fmt.Sprintf("%s does not hold the node at this moment (phase %s)", ref, nm.Phase())
			case nm.CordonRequested() && !node.Spec.Unschedulable:
				v, reason = Wait, fmt.Sprintf("node %s is schedulable although %s cordons it (uncordoned from outside?); waiting for the cordon", node.Name, ref)
			default:
				return Run, ""
			}
			if verdict != Wait { // a reason to wait outweighs one to refuse
				verdict, why = v, reason
			}
		}
	}
	if why == "" {
		why = fmt.Sprintf("NodeMaintenance %s not found for node %s", wants[0].name, node.Name)
	}
	if verdict == Wait {
		return Wait, fmt.Sprintf("waiting: %s only runs inside a NodeMaintenance that holds the node; %s", p.Action, why)
	}
	return Refuse, fmt.Sprintf("refused: %s only runs inside a NodeMaintenance that holds the node; %s", p.Action, why)
}
