package agent

import (
	"fmt"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Disruptive reports whether an action stops what runs on the node or on a
// GPU: the agent runs it only inside a NodeMaintenance that holds the node
// (Authorize).
func Disruptive(a repairv1.Action) bool {
	return a == repairv1.ActionReboot || a == repairv1.ActionResetGPU
}

// Authorize decides whether the agent of node runs the repair's pending
// disruptive action, from the node's NodeMaintenance objects (pure). The
// agent does not trust the NodeRepair alone (any agent may write NodeRepair
// status): a reboot needs the object the repair names as holding the node
// (status.maintenanceName, of gpufleet's repair requestor, or
// spec.maintenance, the object of the controller that asked for the
// reboot) for this node, not being deleted, and Ready (cordoned and
// drained) or past its drain timeout (DrainBlocked: the requestor reboots
// anyway); a GPU reset needs the repair's GPU drain object
// (status.gpuMaintenanceName, of gpufleet's repair requestor) in the same
// state. namespace, when known, is where those objects must be (the
// operator's). It returns whether to run it, and why not.
func Authorize(nr *repairv1.NodeRepair, node, namespace string, nms []maintenancev1.NodeMaintenance) (bool, string) {
	p := nr.Status.Pending
	if p == nil || !Disruptive(p.Action) {
		return true, ""
	}
	type want struct{ name, requestor string }
	var wants []want
	switch p.Action {
	case repairv1.ActionReboot:
		if nr.Status.MaintenanceName != "" {
			wants = append(wants, want{nr.Status.MaintenanceName, repairv1.RequestorID})
		}
		if nr.Spec.Maintenance != "" {
			wants = append(wants, want{nr.Spec.Maintenance, ""})
		}
	case repairv1.ActionResetGPU:
		if nr.Status.GPUMaintenanceName != "" {
			wants = append(wants, want{nr.Status.GPUMaintenanceName, repairv1.RequestorID})
		}
	}
	if len(wants) == 0 {
		return false, fmt.Sprintf("refused: %s needs a NodeMaintenance holding node %s, and the NodeRepair names none", p.Action, node)
	}
	why := ""
	for _, w := range wants {
		for i := range nms {
			nm := &nms[i]
			if nm.Name != w.name || (namespace != "" && nm.Namespace != namespace) {
				continue
			}
			ref := fmt.Sprintf("NodeMaintenance %s/%s", nm.Namespace, nm.Name)
			switch {
			case nm.Spec.NodeName != node:
				why = fmt.Sprintf("%s holds node %s, not %s", ref, nm.Spec.NodeName, node)
			case w.requestor != "" && nm.Spec.RequestorID != w.requestor:
				why = fmt.Sprintf("%s is requestor %s's, not %s's", ref, nm.Spec.RequestorID, w.requestor)
			case nm.DeletionTimestamp != nil:
				why = ref + " is being deleted"
			case !nm.IsReady() && !nm.DrainBlocked():
				why = fmt.Sprintf("%s does not hold the node yet (phase %s)", ref, nm.Phase())
			default:
				return true, ""
			}
		}
	}
	if why == "" {
		why = fmt.Sprintf("NodeMaintenance %s not found for node %s", wants[0].name, node)
	}
	return false, fmt.Sprintf("refused: %s only runs inside a NodeMaintenance that holds the node; %s", p.Action, why)
}
