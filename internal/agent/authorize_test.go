package agent

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// holding is a NodeMaintenance of requestor for node in phase (Ready:
// the Ready condition True).
func holding(ns, name, requestor, node string, phase maintenancev1.Phase) maintenancev1.NodeMaintenance {
	nm := maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	nm.Spec.NodeName, nm.Spec.RequestorID = node, requestor
	st := metav1.ConditionFalse
	if phase == maintenancev1.PhaseReady {
		st = metav1.ConditionTrue
	}
	nm.Status.Conditions = []metav1.Condition{{Type: maintenancev1.ConditionTypeReady, Status: st, Reason: string(phase)}}
	return nm
}

// TestAuthorize: a reboot or a GPU reset runs only inside the
// NodeMaintenance the repair names, holding this very node, of gpufleet's
// repair requestor (or, for a reboot asked for by another controller, its
// own object), Ready or past its drain timeout; anything else is refused
// with the reason. The other actions need none.
func TestAuthorize(t *testing.T) {
	const node, ns = "gpu-1", "gpufleet-system"
	repair := repairv1.RequestorID
	reboot := func(mut func(*repairv1.NodeRepair)) *repairv1.NodeRepair {
		nr := testRepair(node, repairv1.ActionReboot)
		nr.Status.MaintenanceName = "repair-r"
		if mut != nil {
			mut(nr)
		}
		return nr
	}
	reset := func(mut func(*repairv1.NodeRepair)) *repairv1.NodeRepair {
		nr := testRepair(node, repairv1.ActionResetGPU)
		nr.Status.GPUMaintenanceName = "repair-r-gpu"
		if mut != nil {
			mut(nr)
		}
		return nr
	}
	deleting := holding(ns, "repair-r", repair, node, maintenancev1.PhaseReady)
	deleting.DeletionTimestamp = &metav1.Time{}
	blocked := holding(ns, "repair-r", repair, node, maintenancev1.PhaseDraining)
	blocked.Status.Conditions = append(blocked.Status.Conditions, metav1.Condition{Type: maintenancev1.ConditionTypeDrainBlocked, Status: metav1.ConditionTrue, Reason: "DrainTimeout"})
	for name, tc := range map[string]struct {
		nr        *repairv1.NodeRepair
		namespace string
		nms       []maintenancev1.NodeMaintenance
		ok        bool
		why       string
	}{
		"a kubelet restart needs no NodeMaintenance":                {nr: testRepair(node, repairv1.ActionRestartKubelet), ok: true},
		"reboot inside the repair's Ready object":                   {nr: reboot(nil), namespace: ns, nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r", repair, node, maintenancev1.PhaseReady)}, ok: true},
		"reboot past the drain timeout (the repair reboots anyway)": {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{blocked}, ok: true},
		"reboot asked for by the GPU stack inside its own object": {nr: reboot(func(nr *repairv1.NodeRepair) {
			nr.Status.MaintenanceName, nr.Spec.Maintenance = "", "gpu-upgrade-gpu-1"
		}), nms: []maintenancev1.NodeMaintenance{holding(ns, "gpu-upgrade-gpu-1", "nvidia.gpu-operator", node, maintenancev1.PhaseReady)}, ok: true},
		"reset inside the GPU drain's Ready object": {nr: reset(nil), nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r-gpu", repair, node, maintenancev1.PhaseReady)}, ok: true},

		"reboot without any object":                {nr: reboot(nil), why: "NodeMaintenance repair-r not found for node gpu-1"},
		"a repair that names none (status forged)": {nr: reboot(func(nr *repairv1.NodeRepair) { nr.Status.MaintenanceName = "" }), why: "the NodeRepair names none"},
		"the object is still draining":             {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r", repair, node, maintenancev1.PhaseDraining)}, why: "does not hold the node yet (phase Draining)"},
		"the object holds another node":            {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r", repair, "gpu-2", maintenancev1.PhaseReady)}, why: "holds node gpu-2, not gpu-1"},
		"another requestor's object of that name":  {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r", "someone", node, maintenancev1.PhaseReady)}, why: "is requestor someone's"},
		"the object is being deleted":              {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{deleting}, why: "is being deleted"},
		"an object of that name in another namespace": {nr: reboot(nil), namespace: ns,
			nms: []maintenancev1.NodeMaintenance{holding("default", "repair-r", repair, node, maintenancev1.PhaseReady)}, why: "not found"},
		"reset with the reboot's object only": {nr: reset(func(nr *repairv1.NodeRepair) {
			nr.Status.GPUMaintenanceName, nr.Status.MaintenanceName = "", "repair-r"
		}),
			nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r", repair, node, maintenancev1.PhaseReady)}, why: "names none"},
		"reset while the GPU drain is pending": {nr: reset(nil), nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r-gpu", repair, node, maintenancev1.PhasePending)}, why: "phase Pending"},
	} {
		t.Run(name, func(t *testing.T) {
			ok, why := Authorize(tc.nr, node, tc.namespace, tc.nms)
			if ok != tc.ok || (!ok && !strings.Contains(why, tc.why)) || (!ok && !strings.HasPrefix(why, "refused: ")) {
				t.Errorf("Authorize = %t, %q; want %t, %q", ok, why, tc.ok, tc.why)
			}
		})
	}
}

// FuzzAuthorize: whatever the NodeRepair and the NodeMaintenance objects
// say, Authorize does not panic, never lets a Reboot or a ResetGPU run
// without a Ready (or drain-blocked) object of the right name holding this
// very node, and never refuses an action that is not disruptive.
func FuzzAuthorize(f *testing.F) {
	f.Add("Reboot", "repair-r", "", "", "repair-r", repairv1.RequestorID, "gpu-1", "Ready", true, false)
	f.Add("ResetGPU", "", "", "repair-r-gpu", "repair-r-gpu", repairv1.RequestorID, "gpu-2", "Draining", false, true)
	f.Add("RestartKubelet", "", "", "", "", "", "", "", false, false)
	f.Fuzz(func(t *testing.T, action, statusName, specName, gpuName, nmName, requestor, nmNode, phase string, deleting, drainBlocked bool) {
		const node = "gpu-1"
		nr := testRepair(node, repairv1.Action(action))
		nr.Status.MaintenanceName, nr.Spec.Maintenance, nr.Status.GPUMaintenanceName = statusName, specName, gpuName
		nm := holding("ns", nmName, requestor, nmNode, maintenancev1.Phase(phase))
		if deleting {
			nm.DeletionTimestamp = &metav1.Time{}
		}
		if drainBlocked {
			nm.Status.Conditions = append(nm.Status.Conditions, metav1.Condition{Type: maintenancev1.ConditionTypeDrainBlocked, Status: metav1.ConditionTrue, Reason: "DrainTimeout"})
		}
		ok, why := Authorize(nr, node, "", []maintenancev1.NodeMaintenance{nm})
		if !Disruptive(repairv1.Action(action)) {
			if !ok {
				t.Fatalf("a %q was refused: %s", action, why)
			}
			return
		}
		if !ok {
			if !strings.HasPrefix(why, "refused: ") {
				t.Fatalf("a refusal without its reason: %q", why)
			}
			return
		}
		names := map[string]bool{}
		switch repairv1.Action(action) {
		case repairv1.ActionReboot:
			names[statusName], names[specName] = statusName != "", specName != ""
		case repairv1.ActionResetGPU:
			names[gpuName] = gpuName != ""
		}
		if !names[nmName] || nmNode != node || deleting || (!nm.IsReady() && !nm.DrainBlocked()) {
			t.Fatalf("%s authorized with NodeMaintenance %q of %q on %q (phase %q, deleting %t, blocked %t); repair names %q/%q/%q",
				action, nmName, requestor, nmNode, phase, deleting, drainBlocked, statusName, specName, gpuName)
		}
	})
}
