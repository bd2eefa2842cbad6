package agent

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// holding is a NodeMaintenance of requestor for node in phase (Ready:
// the Ready condition True). One named as a repair's GPU drain (-gpu)
// does not cordon, as the repair asks.
func holding(ns, name, requestor, node string, phase maintenancev1.Phase) maintenancev1.NodeMaintenance {
	nm := maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	nm.Spec.NodeName, nm.Spec.RequestorID = node, requestor
	if strings.HasSuffix(name, "-gpu") {
		nm.Spec.Cordon = ptr.To(false)
	}
	st := metav1.ConditionFalse
	if phase == maintenancev1.PhaseReady {
		st = metav1.ConditionTrue
	}
	nm.Status.Conditions = []metav1.Condition{{Type: maintenancev1.ConditionTypeReady, Status: st, Reason: string(phase)}}
	return nm
}

// nodeNamed is a node, cordoned or not.
func nodeNamed(name string, cordoned bool) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Unschedulable: cordoned}}
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
	blocked.Status.Conditions = append(blocked.Status.Conditions, metav1.Condition{Type: maintenancev1.ConditionTypeDrainBlocked, Status: metav1.ConditionTrue, Reason: maintenancev1.DrainBlockedReasonTimedOut})
	refused := holding(ns, "repair-r", repair, node, maintenancev1.PhaseDraining)
	refused.Status.Conditions = append(refused.Status.Conditions, metav1.Condition{Type: maintenancev1.ConditionTypeDrainBlocked, Status: metav1.ConditionTrue, Reason: maintenancev1.DrainBlockedReasonRefused})
	gpuDrain := holding(ns, "repair-r-gpu", repair, node, maintenancev1.PhaseReady)
	for name, tc := range map[string]struct {
		nr          *repairv1.NodeRepair
		namespace   string
		nms         []maintenancev1.NodeMaintenance
		schedulable bool
		verdict     Verdict
		why         string
	}{
		"a kubelet restart needs no NodeMaintenance":                {nr: testRepair(node, repairv1.ActionRestartKubelet), verdict: Run},
		"reboot inside the repair's Ready object":                   {nr: reboot(nil), namespace: ns, nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r", repair, node, maintenancev1.PhaseReady)}, verdict: Run},
		"reboot past the drain timeout (the repair reboots anyway)": {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{blocked}, verdict: Run},
		"reboot asked for by the GPU stack inside its own object": {nr: reboot(func(nr *repairv1.NodeRepair) {
			nr.Status.MaintenanceName, nr.Spec.Maintenance, nr.Spec.Requestor = "", "gpu-upgrade-gpu-1", "nvidia.gpu-operator"
		}), nms: []maintenancev1.NodeMaintenance{holding(ns, "gpu-upgrade-gpu-1", "nvidia.gpu-operator", node, maintenancev1.PhaseReady)}, verdict: Run},
		"a requested reboot inside another requestor's object": {nr: reboot(func(nr *repairv1.NodeRepair) {
			nr.Status.MaintenanceName, nr.Spec.Maintenance, nr.Spec.Requestor = "", "someone-elses", "driver-upgrade.gpufleet.nvidia.com"
		}), nms: []maintenancev1.NodeMaintenance{holding(ns, "someone-elses", "network.operator.nvidia.com", node, maintenancev1.PhaseReady)},
			verdict: Refuse, why: "is requestor network.operator.nvidia.com's, not driver-upgrade.gpufleet.nvidia.com's"},
		"reset inside the GPU drain's Ready object":                   {nr: reset(nil), nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r-gpu", repair, node, maintenancev1.PhaseReady)}, verdict: Run},
		"reset on a schedulable node (the GPU drain does not cordon)": {nr: reset(nil), nms: []maintenancev1.NodeMaintenance{gpuDrain}, schedulable: true, verdict: Run},

		"a drain refused at once is not a timeout": {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{refused}, verdict: Wait, why: "does not hold the node at this moment (phase Draining)"},
		"the node was uncordoned from outside": {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r", repair, node, maintenancev1.PhaseReady)},
			schedulable: true, verdict: Wait, why: "node gpu-1 is schedulable although NodeMaintenance gpufleet-system/repair-r cordons it"},
		"the object is still draining":         {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r", repair, node, maintenancev1.PhaseDraining)}, verdict: Wait, why: "does not hold the node at this moment (phase Draining)"},
		"reset while the GPU drain is pending": {nr: reset(nil), nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r-gpu", repair, node, maintenancev1.PhasePending)}, verdict: Wait, why: "phase Pending"},

		"reboot without any object":                {nr: reboot(nil), verdict: Refuse, why: "NodeMaintenance repair-r not found for node gpu-1"},
		"a repair that names none (status forged)": {nr: reboot(func(nr *repairv1.NodeRepair) { nr.Status.MaintenanceName = "" }), verdict: Refuse, why: "the NodeRepair names none"},
		"the object holds another node":            {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r", repair, "gpu-2", maintenancev1.PhaseReady)}, verdict: Refuse, why: "holds node gpu-2, not gpu-1"},
		"another requestor's object of that name":  {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r", "someone", node, maintenancev1.PhaseReady)}, verdict: Refuse, why: "is requestor someone's"},
		"the object is being deleted":              {nr: reboot(nil), nms: []maintenancev1.NodeMaintenance{deleting}, verdict: Refuse, why: "is being deleted"},
		"an object of that name in another namespace": {nr: reboot(nil), namespace: ns,
			nms: []maintenancev1.NodeMaintenance{holding("default", "repair-r", repair, node, maintenancev1.PhaseReady)}, verdict: Refuse, why: "not found"},
		"reset with the reboot's object only": {nr: reset(func(nr *repairv1.NodeRepair) {
			nr.Status.GPUMaintenanceName, nr.Status.MaintenanceName = "", "repair-r"
		}),
			nms: []maintenancev1.NodeMaintenance{holding(ns, "repair-r", repair, node, maintenancev1.PhaseReady)}, verdict: Refuse, why: "names none"},
	} {
		t.Run(name, func(t *testing.T) {
			verdict, why := Authorize(tc.nr, nodeNamed(node, !tc.schedulable), tc.namespace, tc.nms)
			prefix := map[Verdict]string{Wait: "waiting: ", Refuse: "refused: "}[verdict]
			if verdict != tc.verdict || (verdict != Run && (!strings.Contains(why, tc.why) || !strings.HasPrefix(why, prefix))) {
				t.Errorf("Authorize = %d, %q; want %d, %q", verdict, why, tc.verdict, tc.why)
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
		schedulable := len(nmName)%2 == 1 // both cases, from the corpus
		const node = "gpu-1"
		nr := testRepair(node, repairv1.Action(action))
		nr.Status.MaintenanceName, nr.Spec.Maintenance, nr.Status.GPUMaintenanceName = statusName, specName, gpuName
		if specName != "" {
			nr.Spec.Requestor = "driver-upgrade.gpufleet.nvidia.com"
		}
		nm := holding("ns", nmName, requestor, nmNode, maintenancev1.Phase(phase))
		if deleting {
			nm.DeletionTimestamp = &metav1.Time{}
		}
		if drainBlocked {
			reason := maintenancev1.DrainBlockedReasonTimedOut
			if len(phase)%2 == 1 {
				reason = maintenancev1.DrainBlockedReasonRefused
			}
			nm.Status.Conditions = append(nm.Status.Conditions, metav1.Condition{Type: maintenancev1.ConditionTypeDrainBlocked, Status: metav1.ConditionTrue, Reason: reason})
		}
		verdict, why := Authorize(nr, nodeNamed(node, !schedulable), "", []maintenancev1.NodeMaintenance{nm})
		if !Disruptive(repairv1.Action(action)) {
			if verdict != Run {
				t.Fatalf("a %q was not run: %s", action, why)
			}
			return
		}
		if verdict != Run {
			if !strings.HasPrefix(why, "refused: ") && !strings.HasPrefix(why, "waiting: ") {
				t.Fatalf("a refusal without its reason: %q", why)
			}
			return
		}
		names := map[string]bool{}
		switch repairv1.Action(action) {
		case repairv1.ActionReboot:
			names[statusName], names[specName] = statusName != "", specName != "" && requestor == nr.Spec.Requestor
		case repairv1.ActionResetGPU:
			names[gpuName] = gpuName != ""
		}
		if !names[nmName] || nmNode != node || deleting || (!nm.IsReady() && !nm.DrainTimedOut()) || (schedulable && nm.CordonRequested()) {
			t.Fatalf("%s authorized with NodeMaintenance %q of %q on %q (phase %q, deleting %t, blocked %t, node schedulable %t); repair names %q/%q/%q",
				action, nmName, requestor, nmNode, phase, deleting, drainBlocked, schedulable, statusName, specName, gpuName)
		}
	})
}
