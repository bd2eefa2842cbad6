package repair_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/maintenance/requestor"
	"github.com/gpufleet/gpufleet/internal/repair"
)

// The tests in this file drive the Repairer's Reconcile directly against
// the real API server (no operator running): they set a NodeRepair up in a
// given state, reconcile it once with a fake clock, and check what was
// written.

type direct struct {
	t     *testing.T
	clock *clocktesting.FakeClock
	rec   *events.FakeRecorder
	r     *repair.Repairer
}

func newDirect(t *testing.T) *direct {
	t.Helper()
	devtest.NeedCluster(t)
	policy(t, true, roRule, ntpRule)
	d := &direct{t: t, clock: clocktesting.NewFakeClock(time.Now().Truncate(time.Second)), rec: events.NewFakeRecorder(100)}
	d.r = &repair.Repairer{Client: env.Kube, Live: env.Kube, Namespace: ns, Clock: d.clock, Recorder: d.rec}
	return d
}

// repair creates a NodeRepair of node for rule and sets its status.
func (d *direct) repair(name, node string, rule repairv1.Rule, mut func(*repairv1.NodeRepair)) *repairv1.NodeRepair {
	d.t.Helper()
	nr := &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Pool: "a", Policy: "test", Actions: rule.Actions,
			Fault: repairv1.Fault{Rule: rule.Name, ConditionType: rule.ConditionType, Status: rule.Status, Since: metav1.NewTime(d.clock.Now().Add(-time.Hour))}}}
	if err := env.Kube.Create(d.t.Context(), nr); err != nil {
		d.t.Fatal(err)
	}
	if mut != nil {
		mut(nr)
		if err := env.Kube.Status().Update(d.t.Context(), nr); err != nil {
			d.t.Fatal(err)
		}
	}
	return nr
}

func (d *direct) reconcile(name string) (reconcile.Result, *repairv1.NodeRepair) {
	d.t.Helper()
	res, err := d.r.Reconcile(d.t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
	if err != nil {
		d.t.Fatalf("reconcile %s: %v", name, err)
	}
	got := &repairv1.NodeRepair{}
	if err := env.Kube.Get(d.t.Context(), types.NamespacedName{Name: name}, got); err != nil {
		d.t.Fatal(err)
	}
	return res, got
}

func (d *direct) events() []string { return drain(d.rec) }

func nodeLabel(t *testing.T, node string) string {
	t.Helper()
	n, err := env.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels[repair.LabelState]
}

// holdNode creates the repair's NodeMaintenance as the reboot rung does.
func holdNode(t *testing.T, nr *repairv1.NodeRepair) string {
	t.Helper()
	req := requestor.Request{RequestorID: repair.Requestor, Namespace: ns, Name: "repair-" + nr.Name, NodeName: nr.Spec.NodeName, Owner: nr}
	if _, err := requestor.Ensure(t.Context(), env.Kube, req); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = requestor.Release(context.Background(), env.Kube, ns, req.Name) })
	return req.Name
}

func TestRebootThatNeverCompletesFailsTheRepairAndReleasesTheNode(t *testing.T) {
	d := newDirect(t)
	if err := env.SetNodeCondition(t.Context(), "a-2", corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Reason: "Injected"}); err != nil {
		t.Fatal(err)
	}
	node, err := env.Client.CoreV1().Nodes().Get(t.Context(), "a-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nr := d.repair("a-2-reboot", "a-2", roRule, nil)
	hold := holdNode(t, nr)
	requested := metav1.NewTime(d.clock.Now())
	nr.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, NextAction: 1, MaintenanceName: hold,
		BootIDBefore: node.Status.NodeInfo.BootID, RebootRequestedAt: &requested} // the agent ran Reboot; the boot ID never changed
	if err := env.Kube.Status().Update(t.Context(), nr); err != nil {
		t.Fatal(err)
	}

	// Within the bound: it waits, and says when it will look again.
	d.clock.Step(19 * time.Minute)
	res, got := d.reconcile(nr.Name)
	if got.Status.Phase != repairv1.PhaseRepairing || res.RequeueAfter != time.Minute {
		t.Fatalf("19 minutes into a 20-minute reboot bound: phase %s, requeue %s; want Repairing, 1m", got.Status.Phase, res.RequeueAfter)
	}
	// The wait is said on the repair, once: another look writes nothing.
	if !strings.Contains(got.Status.Message, "waiting for node a-2 to come back from the reboot: its boot ID has not changed yet (at most 20m0s") {
		t.Errorf("while waiting for the reboot: message %q", got.Status.Message)
	}
	waiting := got.ResourceVersion
	if _, again := d.reconcile(nr.Name); again.ResourceVersion != waiting {
		t.Errorf("another look during the reboot wait wrote the repair again: %q", again.Status.Message)
	}
	// Past it: RecoveryFailed, the node is released and labelled, a
	// Warning names the node.
	d.clock.Step(time.Minute)
	_, got = d.reconcile(nr.Name)
	if got.Status.Phase != repairv1.PhaseRecoveryFailed || !strings.Contains(got.Status.Message, "did not come back from the reboot within 20m0s") {
		t.Fatalf("past the reboot bound: phase %s, message %q", got.Status.Phase, got.Status.Message)
	}
	if nm, err := requestor.Get(t.Context(), env.Kube, ns, hold); err != nil || (nm != nil && nm.DeletionTimestamp == nil) {
		t.Errorf("the node's NodeMaintenance %s is still held: %v", hold, err)
	}
	if l := nodeLabel(t, "a-2"); l != string(repairv1.PhaseRecoveryFailed) {
		t.Errorf("node label %q, want RecoveryFailed", l)
	}
	evs := strings.Join(d.events(), "\n")
	if !strings.Contains(evs, "Warning "+repair.ReasonFailed) || !strings.Contains(evs, "a-2") {
		t.Errorf("events %q: want a %s Warning naming a-2", evs, repair.ReasonFailed)
	}
	// Done: another reconcile writes nothing.
	before := got.ResourceVersion
	if _, again := d.reconcile(nr.Name); again.ResourceVersion != before {
		t.Errorf("a finished repair was written again")
	}
}

// TestAFaultGetsTheVerificationWindowAfterTheReboot: the node is Ready with
// a new boot ID while its problem detector has not yet rewritten the
// condition from before the reboot. The repair waits the policy's
// verification window (2 s here) from its first look after the reboot: a
// fault that clears within it ends Succeeded, one that stays ends
// RecoveryFailed at the window's end, not at the first look.
func TestAFaultGetsTheVerificationWindowAfterTheReboot(t *testing.T) {
	d := newDirect(t)
	for _, tc := range []struct {
		node   string
		clears bool
	}{{"a-1", true}, {"a-2", false}} {
		t.Run(fmt.Sprintf("%s clears %v", tc.node, tc.clears), func(t *testing.T) {
			ro := corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Reason: "Injected"}
			if err := env.SetNodeCondition(t.Context(), tc.node, ro); err != nil {
				t.Fatal(err)
			}
			node, err := env.Client.CoreV1().Nodes().Get(t.Context(), tc.node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			nr := d.repair(tc.node+"-after-reboot", tc.node, roRule, nil)
			hold := holdNode(t, nr)
			asked := metav1.NewTime(d.clock.Now())
			nr.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, NextAction: 1, MaintenanceName: hold,
				VerifyUntil:  &asked, // the window before the reboot rung ended when the reboot was asked for
				BootIDBefore: node.Status.NodeInfo.BootID, RebootRequestedAt: &asked}
			if err := env.Kube.Status().Update(t.Context(), nr); err != nil {
				t.Fatal(err)
			}
			// The agent rebooted the node; the condition is still the old one.
			// The simulated kubelet reports Ready again at its next status
			// update, after Reboot returns.
			if err := env.Reboot(t.Context(), tc.node, 0); err != nil {
				t.Fatal(err)
			}
			if err := env.WaitNodesReady(t.Context(), tc.node); err != nil {
				t.Fatal(err)
			}
			d.clock.Step(10 * time.Second)
			res, got := d.reconcile(nr.Name)
			if got.Status.Phase != repairv1.PhaseRepairing || res.RequeueAfter != 2*time.Second {
				t.Fatalf("first look after the reboot: phase %s (%q), requeue %s; want Repairing, 2s", got.Status.Phase, got.Status.Message, res.RequeueAfter)
			}
			if steps := timelineSteps(got); !strings.Contains(steps, "Verify:Waiting") {
				t.Errorf("timeline %q does not say the repair waits for the fault to clear", steps)
			}
			// The operator restarts: a second look inside the window keeps it.
			d.clock.Step(time.Second)
			if res, got = d.reconcile(nr.Name); got.Status.Phase != repairv1.PhaseRepairing || res.RequeueAfter != time.Second {
				t.Fatalf("inside the window: phase %s, requeue %s; want Repairing, 1s", got.Status.Phase, res.RequeueAfter)
			}
			if tc.clears {
				if err := env.ClearNodeCondition(t.Context(), tc.node, ro.Type); err != nil {
					t.Fatal(err)
				}
				if _, got = d.reconcile(nr.Name); got.Status.Phase != repairv1.PhaseSucceeded {
					t.Fatalf("the fault cleared inside the window: phase %s, message %q", got.Status.Phase, got.Status.Message)
				}
				return
			}
			d.clock.Step(time.Second)
			if _, got = d.reconcile(nr.Name); got.Status.Phase != repairv1.PhaseRecoveryFailed || !strings.Contains(got.Status.Message, "fault persists after the reboot") {
				t.Fatalf("past the window: phase %s, message %q", got.Status.Phase, got.Status.Message)
			}
		})
	}
}

func TestAgentThatNeverRunsAnActionFailsTheRepair(t *testing.T) {
	d := newDirect(t)
	if err := env.SetNodeCondition(t.Context(), "a-1", corev1.NodeCondition{Type: "NTPProblem", Status: corev1.ConditionTrue, Reason: "Injected"}); err != nil {
		t.Fatal(err)
	}
	nr := d.repair("a-1-ntp", "a-1", ntpRule, func(nr *repairv1.NodeRepair) {
		nr.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing,
			Pending: &repairv1.PendingAction{Action: repairv1.ActionRestartNTP, RequestedAt: metav1.NewTime(d.clock.Now())}}
	})
	d.clock.Step(599 * time.Second)
	if res, got := d.reconcile(nr.Name); got.Status.Phase != repairv1.PhaseRepairing || res.RequeueAfter != time.Second {
		t.Fatalf("within the action bound: phase %s, requeue %s", got.Status.Phase, res.RequeueAfter)
	}
	d.clock.Step(time.Second)
	_, got := d.reconcile(nr.Name)
	if got.Status.Phase != repairv1.PhaseRecoveryFailed || !strings.Contains(got.Status.Message, "did not run RestartNTP within 10m0s") {
		t.Fatalf("past the action bound: phase %s, message %q", got.Status.Phase, got.Status.Message)
	}
}

func TestRecordsAreNeverActedOn(t *testing.T) {
	d := newDirect(t)
	for _, node := range []string{"b-0", "b-1"} {
		if err := env.SetNodeCondition(t.Context(), node, corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Reason: "Injected"}); err != nil {
			t.Fatal(err)
		}
	}
	ignored := d.repair("b-0-ignored", "b-0", roRule, nil)
	ignored.Spec.IgnoreReason = "node is in planned maintenance by human.example.com"
	dry := d.repair("b-1-dryrun", "b-1", roRule, nil)
	dry.Spec.DryRun = true
	for _, nr := range []*repairv1.NodeRepair{ignored, dry} {
		// The spec is complete when the detector creates it; here it is
		// set after the create, before any reconcile.
		if err := env.Kube.Update(t.Context(), nr); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{ignored.Name, dry.Name} {
		_, got := d.reconcile(name)
		if got.Status.Phase != repairv1.PhaseIgnored || got.Status.Pending != nil || got.Status.MaintenanceName != "" {
			t.Errorf("%s: phase %s pending %v maintenance %q; want Ignored and nothing requested", name, got.Status.Phase, got.Status.Pending, got.Status.MaintenanceName)
		}
	}
	if evs := d.events(); len(evs) != 0 {
		t.Errorf("the repairer reported records it must not act on: %v", evs)
	}
	var nms maintenancev1.NodeMaintenanceList
	if err := env.Kube.List(t.Context(), &nms, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, nm := range nms.Items {
		if nm.Spec.NodeName == "b-0" || nm.Spec.NodeName == "b-1" {
			t.Errorf("NodeMaintenance %s requested for a record", nm.Name)
		}
	}
	for _, node := range []string{"b-0", "b-1"} {
		if l := nodeLabel(t, node); l != "" {
			t.Errorf("node %s labelled %q by a record", node, l)
		}
	}
}

// TestCrashBetweenTheMaintenanceRequestAndItsRecord: the repairer created
// the NodeMaintenance but stopped before recording it; the next reconcile
// adopts it (no second object, no error).
func TestCrashBetweenTheMaintenanceRequestAndItsRecord(t *testing.T) {
	d := newDirect(t)
	if err := env.SetNodeCondition(t.Context(), "b-2", corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Reason: "Injected"}); err != nil {
		t.Fatal(err)
	}
	past := metav1.NewTime(d.clock.Now().Add(-time.Second))
	nr := d.repair("b-2-crash", "b-2", roRule, func(nr *repairv1.NodeRepair) {
		nr.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, VerifyUntil: &past}
	})
	hold := holdNode(t, nr) // created before the crash
	_, got := d.reconcile(nr.Name)
	if got.Status.MaintenanceName != hold {
		t.Fatalf("maintenance %q recorded, want the existing %s", got.Status.MaintenanceName, hold)
	}
	var nms maintenancev1.NodeMaintenanceList
	if err := env.Kube.List(t.Context(), &nms, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, nm := range nms.Items {
		if nm.Spec.NodeName == "b-2" && nm.DeletionTimestamp == nil {
			n++
			if requestor.OwnerOf(&nm, "NodeRepair") != nr.Name {
				t.Errorf("NodeMaintenance %s owned by %v, want NodeRepair %s", nm.Name, nm.OwnerReferences, nr.Name)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d NodeMaintenance objects for b-2, want 1", n)
	}
	// Deleting the repair releases the node (owner reference → garbage
	// collector → the maintenance finalizer).
	if err := env.Kube.Delete(t.Context(), got, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		nm := &maintenancev1.NodeMaintenance{}
		err := env.Kube.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: hold}, nm)
		if apierrors.IsNotFound(err) || (err == nil && nm.DeletionTimestamp != nil) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("NodeMaintenance %s not deleted with its NodeRepair: %v", hold, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestRuleActionsValidation: the schema rejects a Reboot anywhere but last.
func TestRuleActionsValidation(t *testing.T) {
	devtest.NeedCluster(t)
	a := func(actions ...repairv1.Action) []repairv1.Action { return actions }
	k, r, n, rb := repairv1.ActionRestartKubelet, repairv1.ActionRestartContainerRuntime, repairv1.ActionRestartNTP, repairv1.ActionReboot
	tests := map[string]struct {
		actions []repairv1.Action
		wantErr string
	}{
		"reboot alone":                    {a(rb), ""},
		"reboot last":                     {a(k, r, rb), ""},
		"no reboot":                       {a(k, n), ""},
		"reboot in the middle and last":   {a(k, rb, n, rb), "Reboot may appear once, as the last action"},
		"reboot first":                    {a(rb, k), "Reboot may appear once, as the last action"},
		"reboot twice at the end":         {a(k, rb, rb), "Reboot may appear once, as the last action"},
		"an action outside the fixed set": {a(k, "RunScript"), "Unsupported value"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"},
				Spec: repairv1.NodeRepairPolicySpec{Rules: []repairv1.Rule{{Name: "r", ConditionType: "X", Status: "True", ThresholdSeconds: 1, Actions: tc.actions}}}}
			err := env.Kube.Create(t.Context(), p, client.DryRunAll)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("rejected: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	// The ladder's bounds have defaults and limits.
	p := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"}}
	if err := env.Kube.Create(t.Context(), p, client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(p.Spec.RebootTimeoutSeconds, 0) != 1200 || ptr.Deref(p.Spec.ActionTimeoutSeconds, 0) != 600 {
		t.Errorf("defaults: rebootTimeoutSeconds %v actionTimeoutSeconds %v, want 1200 and 600", p.Spec.RebootTimeoutSeconds, p.Spec.ActionTimeoutSeconds)
	}
	p = &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"}, Spec: repairv1.NodeRepairPolicySpec{RebootTimeoutSeconds: ptr.To[int32](0)}}
	if err := env.Kube.Create(t.Context(), p, client.DryRunAll); err == nil || !strings.Contains(err.Error(), "rebootTimeoutSeconds") {
		t.Errorf("rebootTimeoutSeconds 0: error %v, want a rejection", err)
	}
}

// TestWholeNodeAfterValidation: the schema (CEL) takes a count of at least
// one or a percentage from 1% to 100% for gpu.wholeNodeAfter, and rejects
// anything else with its message, before the detector could read it.
// TestStackPodsValidation: the API server refuses a gpu.stackPods selector
// that would select every pod of a node.
func TestStackPodsValidation(t *testing.T) {
	devtest.NeedCluster(t)
	for name, tc := range map[string]struct {
		sel     metav1.LabelSelector
		wantErr string
	}{
		"labels":       {sel: metav1.LabelSelector{MatchLabels: map[string]string{"app": "nvidia-device-plugin-daemonset"}}},
		"expressions":  {sel: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}}},
		"empty":        {sel: metav1.LabelSelector{}, wantErr: "a stackPods selector must not be empty"},
		"empty labels": {sel: metav1.LabelSelector{MatchLabels: map[string]string{}}, wantErr: "a stackPods selector must not be empty"},
	} {
		t.Run(name, func(t *testing.T) {
			p := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"},
				Spec: repairv1.NodeRepairPolicySpec{GPU: repairv1.GPUSpec{StackPods: []metav1.LabelSelector{tc.sel}}}}
			err := env.Kube.Create(t.Context(), p, client.DryRunAll)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("rejected: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestWholeNodeAfterValidation(t *testing.T) {
	devtest.NeedCluster(t)
	const msg = "wholeNodeAfter must be a count of at least 1 or a percentage from 1% to 100%"
	tests := map[string]struct {
		value   intstr.IntOrString
		wantErr string
	}{
		"a count of 1":                  {value: intstr.FromInt32(1)},
		"a count of 4":                  {value: intstr.FromInt32(4)},
		"a count above any node's GPUs": {value: intstr.FromInt32(1000)},
		"1%":                            {value: intstr.FromString("1%")},
		"50%":                           {value: intstr.FromString("50%")},
		"99%":                           {value: intstr.FromString("99%")},
		"100%":                          {value: intstr.FromString("100%")},
		"a count of 0":                  {value: intstr.FromInt32(0), wantErr: msg},
		"a negative count":              {value: intstr.FromInt32(-1), wantErr: msg},
		"0%":                            {value: intstr.FromString("0%"), wantErr: msg},
		"101%":                          {value: intstr.FromString("101%"), wantErr: msg},
		"150%":                          {value: intstr.FromString("150%"), wantErr: msg},
		"a count written as a string":   {value: intstr.FromString("4"), wantErr: msg},
		"a fraction":                    {value: intstr.FromString("12.5%"), wantErr: msg},
		"a leading zero":                {value: intstr.FromString("05%"), wantErr: msg},
		"a space":                       {value: intstr.FromString(" 50%"), wantErr: msg},
		"a negative percentage":         {value: intstr.FromString("-50%"), wantErr: msg},
		"words":                         {value: intstr.FromString("half"), wantErr: msg},
		"empty":                         {value: intstr.FromString(""), wantErr: msg},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"},
				Spec: repairv1.NodeRepairPolicySpec{GPU: repairv1.GPUSpec{WholeNodeAfter: ptr.To(tc.value)}}}
			err := env.Kube.Create(t.Context(), p, client.DryRunAll)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("wholeNodeAfter %s rejected: %v", tc.value.String(), err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "spec.gpu.wholeNodeAfter")):
				t.Errorf("wholeNodeAfter %q: error %v, want one on spec.gpu.wholeNodeAfter containing %q", tc.value.String(), err, tc.wantErr)
			}
		})
	}
	// Unset stays unset (the default, 50%, is the detector's).
	p := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"}}
	if err := env.Kube.Create(t.Context(), p, client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	if p.Spec.GPU.WholeNodeAfter != nil {
		t.Errorf("wholeNodeAfter defaulted to %s by the schema", p.Spec.GPU.WholeNodeAfter.String())
	}
}

// TestDetectorReportsAnUnusableNodeSelector: a selector the schema lets
// through but that is no selector (an unknown operator) repairs nothing and
// says so in an InvalidSpec condition, instead of failing silently.
func TestDetectorReportsAnUnusableNodeSelector(t *testing.T) {
	devtest.NeedCluster(t)
	p := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bad-selector"},
		Spec: repairv1.NodeRepairPolicySpec{Rules: []repairv1.Rule{ntpRule}, NodeSelector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pool", Operator: "Near", Values: []string{"a"}}}}}}
	if err := env.Kube.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), p) })
	rec := events.NewFakeRecorder(10)
	d := &repair.Detector{Client: env.Kube, Clock: clocktesting.NewFakeClock(time.Now()), Recorder: rec}
	if _, err := d.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	got := &repairv1.NodeRepairPolicy{}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Name: p.Name}, got); err != nil {
		t.Fatal(err)
	}
	var cond *metav1.Condition
	for i := range got.Status.Conditions {
		if got.Status.Conditions[i].Type == "InvalidSpec" {
			cond = &got.Status.Conditions[i]
		}
	}
	if cond == nil || cond.Status != metav1.ConditionTrue || !strings.Contains(cond.Message, "no node is repaired") {
		t.Errorf("conditions %+v: want InvalidSpec=True saying no node is repaired", got.Status.Conditions)
	}
	// Fixed: the condition goes away.
	got.Spec.NodeSelector = nil
	if err := env.Kube.Update(t.Context(), got); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Name: p.Name}, got); err != nil {
		t.Fatal(err)
	}
	for _, c := range got.Status.Conditions {
		if c.Type == "InvalidSpec" {
			t.Errorf("InvalidSpec still set after the selector was fixed: %+v", c)
		}
	}
}

// A reboot another gpufleet controller asks for (a driver upgrade whose new
// driver cannot load while the old kernel module is in use) runs inside that
// controller's NodeMaintenance, never without it, and leaves releasing it to
// its requestor.
func TestRequestedRebootRunsOnlyInsideItsRequestorsMaintenance(t *testing.T) {
	d := newDirect(t)
	const node, other = "b-2", "b-1"
	const upgrader = "driver-upgrade.gpufleet.nvidia.com"
	requested := func(name, nmName string) *repairv1.NodeRepair {
		t.Helper()
		nr := &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: repairv1.NodeRepairSpec{NodeName: node, Requestor: upgrader, Maintenance: nmName, Actions: []repairv1.Action{repairv1.ActionReboot},
				Fault: repairv1.Fault{Rule: "driver-module-in-use", ConditionType: "DriverUpgrade", Status: "True",
					Message: "nvidia-driver-ctr: Could not unload NVIDIA driver kernel modules, driver is in use", Since: metav1.NewTime(d.clock.Now())}}}
		if err := env.Kube.Create(t.Context(), nr); err != nil {
			t.Fatal(err)
		}
		if _, got := d.reconcile(name); got.Status.Phase != repairv1.PhaseRepairing || !strings.Contains(got.Status.Timeline[0].Message, upgrader+" asked for a reboot") {
			t.Fatalf("first step: phase %s timeline %+v", got.Status.Phase, got.Status.Timeline)
		}
		return nr
	}
	hold := func(name, on string, ready bool) {
		t.Helper()
		req := requestor.Request{RequestorID: upgrader, Namespace: ns, Name: name, NodeName: on, Cordon: ptr.To(true)}
		nm, err := requestor.Ensure(t.Context(), env.Kube, req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = requestor.Release(context.Background(), env.Kube, ns, name) })
		if ready {
			nm.Status.Conditions = []metav1.Condition{{Type: maintenancev1.ConditionTypeReady, Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now()}}
			if err := env.Kube.Status().Update(t.Context(), nm); err != nil {
				t.Fatal(err)
			}
		}
	}
	bootOf := func(n string) string {
		t.Helper()
		got, err := env.Client.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got.Status.NodeInfo.BootID
	}
	fails := map[string]struct {
		setup string // the NodeMaintenance it names: missing, not yet Ready, or another node's
		want  string
	}{
		"gone":        {"", "is gone; not rebooting"},
		"not-ready":   {"not-ready", "does not hold the node yet"},
		"other-nodes": {"other", "holds node " + other + ", not " + node},
	}
	for name, tc := range fails {
		t.Run("refused when the maintenance is "+name, func(t *testing.T) {
			nmName := "upgrade-" + name
			switch tc.setup {
			case "not-ready":
				hold(nmName, node, false)
			case "other":
				hold(nmName, other, true)
			}
			nr := requested("requested-"+name, nmName)
			_, got := d.reconcile(nr.Name)
			if got.Status.Phase != repairv1.PhaseRecoveryFailed || !strings.Contains(got.Status.Message, tc.want) || got.Status.Pending != nil {
				t.Fatalf("phase %s message %q pending %+v; want RecoveryFailed %q and no reboot asked", got.Status.Phase, got.Status.Message, got.Status.Pending, tc.want)
			}
			evs := strings.Join(d.events(), "\n")
			if !strings.Contains(evs, "Warning "+repair.ReasonFailed) || !strings.Contains(evs, "asked for by "+upgrader) {
				t.Errorf("events %q: want a Warning naming the requestor", evs)
			}
		})
	}

	t.Run("inside a Ready maintenance of the node: reboot, and the node stays held", func(t *testing.T) {
		hold("upgrade-ok", node, true)
		nr := requested("requested-ok", "upgrade-ok")
		before := bootOf(node)
		_, got := d.reconcile(nr.Name)
		if p := got.Status.Pending; p == nil || p.Action != repairv1.ActionReboot || got.Status.BootIDBefore != before {
			t.Fatalf("pending %+v bootIDBefore %q; want a Reboot asked with boot ID %s", p, got.Status.BootIDBefore, before)
		}
		if got.Status.MaintenanceName != "" {
			t.Errorf("the repair requested a maintenance of its own: %s", got.Status.MaintenanceName)
		}
		held := false
		for _, e := range got.Status.Timeline {
			held = held || (e.Outcome == "Held" && strings.Contains(e.Message, "upgrade-ok of "+upgrader))
		}
		if !held {
			t.Errorf("timeline %+v does not say which maintenance holds the node", got.Status.Timeline)
		}
		// The agent reboots the node.
		if err := env.Reboot(t.Context(), node, 0); err != nil {
			t.Fatal(err)
		}
		got.Status.Pending = nil
		if err := env.Kube.Status().Update(t.Context(), got); err != nil {
			t.Fatal(err)
		}
		if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			_, got = d.reconcile(nr.Name)
			return got.Status.Phase != repairv1.PhaseRepairing, nil
		}); err != nil || got.Status.Phase != repairv1.PhaseSucceeded {
			t.Fatalf("after the reboot: phase %s message %q (%v)", got.Status.Phase, got.Status.Message, err)
		}
		if m, err := requestor.Get(t.Context(), env.Kube, ns, "upgrade-ok"); err != nil || m == nil || m.DeletionTimestamp != nil {
			t.Errorf("the requestor's NodeMaintenance was released by the repair (%v)", err)
		}
	})
}

// TestRequestedRepairValidation: the schema keeps a requested repair to a
// reboot inside a named maintenance, and every repair to one origin.
func TestRequestedRepairValidation(t *testing.T) {
	devtest.NeedCluster(t)
	base := func(mut func(*repairv1.NodeRepairSpec)) *repairv1.NodeRepair {
		nr := &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"},
			Spec: repairv1.NodeRepairSpec{NodeName: "a-0", Requestor: "driver-upgrade.gpufleet.nvidia.com", Maintenance: "m",
				Actions: []repairv1.Action{repairv1.ActionReboot},
				Fault:   repairv1.Fault{Rule: "r", ConditionType: "X", Status: "True", Since: metav1.Now()}}}
		mut(&nr.Spec)
		return nr
	}
	tests := map[string]struct {
		mut     func(*repairv1.NodeRepairSpec)
		wantErr string
	}{
		"a requested reboot":             {func(*repairv1.NodeRepairSpec) {}, ""},
		"a policy's repair":              {func(s *repairv1.NodeRepairSpec) { s.Requestor, s.Maintenance, s.Policy = "", "", "p" }, ""},
		"neither policy nor requestor":   {func(s *repairv1.NodeRepairSpec) { s.Requestor = "" }, "either a policy"},
		"both policy and requestor":      {func(s *repairv1.NodeRepairSpec) { s.Policy = "p" }, "either a policy"},
		"requested, without maintenance": {func(s *repairv1.NodeRepairSpec) { s.Maintenance = "" }, "names the requestor's NodeMaintenance"},
		"requested, not a reboot": {func(s *repairv1.NodeRepairSpec) {
			s.Actions = []repairv1.Action{repairv1.ActionRestartKubelet, repairv1.ActionReboot}
		}, "has actions [Reboot]"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := env.Kube.Create(t.Context(), base(tc.mut), client.DryRunAll)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("rejected: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// gpuRepairWith creates a GPU repair of node a-0 (ResetGPU, then Reboot)
// with validation v and sets its status.
func (d *direct) gpuRepairWith(name string, v *repairv1.GPUValidation, st repairv1.NodeRepairStatus) *repairv1.NodeRepair {
	d.t.Helper()
	const node = "a-0"
	nr := &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Pool: "a", Policy: "test", Actions: []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot},
			GPUs: []repairv1.GPURef{{PCIBusID: "0000:18:00.0"}}, Validation: v,
			Fault: repairv1.Fault{Rule: "gpu-reset", ConditionType: repairv1.ConditionGPUProblem, Status: "True", Since: metav1.NewTime(d.clock.Now().Add(-time.Hour))}}}
	if err := env.Kube.Create(d.t.Context(), nr); err != nil {
		d.t.Fatal(err)
	}
	nr.Status = st
	if err := env.Kube.Status().Update(d.t.Context(), nr); err != nil {
		d.t.Fatal(err)
	}
	return nr
}

// TestARefusedGPUResetEndsTheRepair: the agent refused the reset (no GPU
// drain held the node): the repair ends RecoveryFailed with the agent's
// reason, and does not go on to the bigger disruption, a reboot.
func TestARefusedGPUResetEndsTheRepair(t *testing.T) {
	d := newDirect(t)
	now := metav1.NewTime(d.clock.Now())
	nr := d.gpuRepairWith("a-0-refused", nil, repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, NextAction: 1,
		Timeline: []repairv1.TimelineEntry{{Time: now, Step: "ResetGPU", Outcome: "Refused", Message: "refused: ResetGPU only runs inside a NodeMaintenance that holds the node; NodeMaintenance repair-x-gpu not found for node a-0"}}})
	_, got := d.reconcile(nr.Name)
	if got.Status.Phase != repairv1.PhaseRecoveryFailed || !strings.Contains(got.Status.Message, "did not reset the GPUs: refused") || got.Status.MaintenanceName != "" {
		t.Fatalf("phase %s, message %q, maintenance %q", got.Status.Phase, got.Status.Message, got.Status.MaintenanceName)
	}
}

// TestAValidationIsWaitedForAsLongAsItsOwnBound: a pending ValidateGPU is
// waited for as long as the validation's own timeout (plus a minute for
// the agent to record it), even past the policy's action timeout; past it,
// the repair fails.
func TestAValidationIsWaitedForAsLongAsItsOwnBound(t *testing.T) {
	d := newDirect(t)
	nr := d.gpuRepairWith("a-0-validating", &repairv1.GPUValidation{Level: repairv1.GPUValidationDiagnostic, TimeoutSeconds: 900},
		repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, NextAction: 1,
			Pending: &repairv1.PendingAction{Action: repairv1.ActionValidateGPU, RequestedAt: metav1.NewTime(d.clock.Now())}})
	d.clock.Step(700 * time.Second) // past the 600 s action timeout
	if res, got := d.reconcile(nr.Name); got.Status.Phase != repairv1.PhaseRepairing || res.RequeueAfter != 260*time.Second {
		t.Fatalf("within the validation's bound: phase %s, requeue %s", got.Status.Phase, res.RequeueAfter)
	}
	d.clock.Step(260 * time.Second)
	if _, got := d.reconcile(nr.Name); got.Status.Phase != repairv1.PhaseRecoveryFailed || !strings.Contains(got.Status.Message, "did not run ValidateGPU within 16m0s") {
		t.Fatalf("past it: phase %s, message %q", got.Status.Phase, got.Status.Message)
	}
}

// TestAnInterruptedValidationIsAskedForAgain: the agent restarted while it
// validated the GPUs after the reboot (outcome Interrupted, not run again
// by the agent): validation is read-only, so the repair asks for it again;
// after the fourth interruption it stops asking and the repair fails, the
// node released and the GPUs still out.
func TestAnInterruptedValidationIsAskedForAgain(t *testing.T) {
	d := newDirect(t)
	now := metav1.NewTime(d.clock.Now())
	entries := func(interrupted int) []repairv1.TimelineEntry {
		tl := []repairv1.TimelineEntry{{Time: now, Step: "Reboot", Outcome: repairv1.OutcomeRequested}, {Time: now, Step: "Reboot", Outcome: repairv1.OutcomeSucceeded}}
		for range interrupted {
			tl = append(tl, repairv1.TimelineEntry{Time: now, Step: "ValidateGPU", Outcome: repairv1.OutcomeInterrupted})
		}
		return tl
	}
	once := d.gpuRepairWith("a-0-interrupted", nil, repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, NextAction: 2,
		BootIDBefore: "an-earlier-boot", RebootRequestedAt: &now, Timeline: entries(1)})
	if _, got := d.reconcile(once.Name); got.Status.Pending == nil || got.Status.Pending.Action != repairv1.ActionValidateGPU {
		t.Fatalf("after one interruption: pending %+v, phase %s", got.Status.Pending, got.Status.Phase)
	}
	often := d.gpuRepairWith("a-0-interrupted-often", nil, repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, NextAction: 2,
		BootIDBefore: "an-earlier-boot", RebootRequestedAt: &now, Timeline: entries(4)})
	if _, got := d.reconcile(often.Name); got.Status.Phase != repairv1.PhaseRecoveryFailed || got.Status.Pending != nil {
		t.Fatalf("after four interruptions: phase %s, pending %+v, message %q", got.Status.Phase, got.Status.Pending, got.Status.Message)
	}
}

// TestAGPUStackThatStillHoldsTheGPUIsRestartedOnce: the repaired GPU passed
// its validation but the node's device plugin still leaves it out of the
// allocatable: the repair restarts the plugin's pods once (evicted: the
// DaemonSet starts new ones) and waits; a restart that does not help ends
// the repair RecoveryFailed at the bound, with what to do. A reconcile
// that finds the restart recorded (the operator restarted between the
// eviction and the next pass) does not restart again.
func TestAGPUStackThatStillHoldsTheGPUIsRestartedOnce(t *testing.T) {
	d := newDirect(t)
	const node = "a-0"
	setAllocatable := func(v string) {
		patch := fmt.Sprintf(`{"status":{"allocatable":{"nvidia.com/gpu":%q}}}`, v)
		if _, err := env.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	setAllocatable("7")
	t.Cleanup(func() { setAllocatable("8") })
	var plugin []corev1.Pod
	_ = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := env.Client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		plugin = nil
		for _, p := range pods.Items {
			if p.Labels["dra-driver-nvidia-gpu-component"] == "kubelet-plugin" && p.DeletionTimestamp == nil {
				plugin = append(plugin, p)
			}
		}
		return len(plugin) == 1, nil
	})
	if len(plugin) != 1 {
		t.Fatalf("plugin pods on %s: %d", node, len(plugin))
	}
	now := metav1.NewTime(d.clock.Now())
	nr := d.gpuRepairWith("a-0-held", nil, repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, NextAction: 1,
		Timeline: []repairv1.TimelineEntry{{Time: now, Step: "ResetGPU", Outcome: repairv1.OutcomeSucceeded},
			{Time: now, Step: "ValidateGPU", Outcome: repairv1.OutcomeSucceeded}}})
	res, got := d.reconcile(nr.Name)
	last := got.LastEntry()
	if got.Status.Phase != repairv1.PhaseRepairing || last.Step != string(repairv1.ActionRestartGPUStackPods) || last.Outcome != repairv1.OutcomeSucceeded ||
		!strings.Contains(last.Message, "gives out 7 of the node's 8 GPUs") || !strings.Contains(last.Message, plugin[0].Name) || res.RequeueAfter != 3*time.Minute {
		t.Fatalf("phase %s, last %+v, requeue %s", got.Status.Phase, last, res.RequeueAfter)
	}
	_ = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := env.Client.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, plugin[0].Name, metav1.GetOptions{})
		if err != nil {
			return true, nil //nolint:nilerr // gone: evicted
		}
		return p.DeletionTimestamp != nil, nil
	})
	if p, err := env.Client.CoreV1().Pods(metav1.NamespaceSystem).Get(t.Context(), plugin[0].Name, metav1.GetOptions{}); err == nil && p.DeletionTimestamp == nil {
		t.Errorf("plugin pod %s not evicted", p.Name)
	}
	// Within the bound: wait, no second restart.
	d.clock.Step(time.Minute)
	if res, got := d.reconcile(nr.Name); got.Status.Phase != repairv1.PhaseRepairing || len(got.Status.Timeline) != 3 || res.RequeueAfter != 2*time.Minute {
		t.Fatalf("within the bound: phase %s, timeline %q, requeue %s", got.Status.Phase, timelineSteps(got), res.RequeueAfter)
	}
	// Past it: RecoveryFailed, saying what to check.
	d.clock.Step(2 * time.Minute)
	if _, got := d.reconcile(nr.Name); got.Status.Phase != repairv1.PhaseRecoveryFailed || !strings.Contains(got.Status.Message, "check the node's device plugin or DRA kubelet plugin") {
		t.Fatalf("past the bound: phase %s, message %q", got.Status.Phase, got.Status.Message)
	}
	// Given out again: the repair succeeds without a restart.
	setAllocatable("8")
	ok := d.gpuRepairWith("a-0-given-out", nil, repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, NextAction: 1,
		Timeline: []repairv1.TimelineEntry{{Time: now, Step: "ValidateGPU", Outcome: repairv1.OutcomeSucceeded}}})
	if _, got := d.reconcile(ok.Name); got.Status.Phase != repairv1.PhaseSucceeded || strings.Contains(timelineSteps(got), "RestartGPUStackPods") {
		t.Fatalf("given out: phase %s, timeline %q", got.Status.Phase, timelineSteps(got))
	}
}

// TestCrashBetweenTheGPUDrainRequestAndItsRecord: the GPU drain's
// NodeMaintenance exists but the repair does not record it (the operator
// restarted between the two writes, or the NodeMaintenance's event came
// before the repair's own write reached the cache): the next pass takes it
// up as it is — no second create, no second listing of the node's pods.
func TestCrashBetweenTheGPUDrainRequestAndItsRecord(t *testing.T) {
	d := newDirect(t)
	// GPU 0000:18:00.0 of a-0 is out of service.
	gf := &repairv1.GPUFault{ObjectMeta: metav1.ObjectMeta{Name: "a-0-0000-18-00-0-crash"},
		Spec: repairv1.GPUFaultSpec{NodeName: "a-0", GPU: repairv1.GPURef{PCIBusID: "0000:18:00.0"}}}
	if err := env.Kube.Create(t.Context(), gf); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), gf) })
	gf.Status.Class = repairv1.GPUClassResetGPU
	if err := env.Kube.Status().Update(t.Context(), gf); err != nil {
		t.Fatal(err)
	}
	nr := d.gpuRepairWith("a-0-gpu-crash", nil, repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing})
	req := requestor.Request{RequestorID: repair.Requestor, Namespace: ns, Name: "repair-" + nr.Name + "-gpu", NodeName: nr.Spec.NodeName, Owner: nr,
		Cordon: ptr.To(false), Drain: &maintenancev1.DrainSpec{}}
	if _, err := requestor.Ensure(t.Context(), env.Kube, req); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = requestor.Release(context.Background(), env.Kube, ns, req.Name) })
	var got *repairv1.NodeRepair
	for range 20 { // the cache catches up with the create
		_, got = d.reconcile(nr.Name)
		if got.Status.GPUMaintenanceName != "" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got.Status.GPUMaintenanceName != req.Name {
		t.Fatalf("GPU drain recorded %q, want the existing %s; timeline %q", got.Status.GPUMaintenanceName, req.Name, timelineSteps(got))
	}
	if last := got.LastEntry(); last.Step != "Maintenance" || !strings.Contains(last.Message, "found") {
		t.Errorf("last entry %+v", last)
	}
}

// TestAnEndWhoseWriteConflictsIsStillWritten: the repair ends past its
// reboot bound and releases its NodeMaintenance; its status write then
// conflicts (the agent wrote the repair meanwhile). The end is written on
// the stored version — its own reason, the agent's entry kept, one Warning
// — rather than lost, which would have the next pass find the
// NodeMaintenance gone and give that as the reason instead.
func TestAnEndWhoseWriteConflictsIsStillWritten(t *testing.T) {
	d := newDirect(t)
	if err := env.SetNodeCondition(t.Context(), "a-2", corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Reason: "Injected"}); err != nil {
		t.Fatal(err)
	}
	node, err := env.Client.CoreV1().Nodes().Get(t.Context(), "a-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nr := d.repair("a-2-end-conflict", "a-2", roRule, nil)
	hold := holdNode(t, nr)
	requested := metav1.NewTime(d.clock.Now())
	nr.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, NextAction: 1, MaintenanceName: hold,
		BootIDBefore: node.Status.NodeInfo.BootID, RebootRequestedAt: &requested}
	if err := env.Kube.Status().Update(t.Context(), nr); err != nil {
		t.Fatal(err)
	}
	base, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Kube.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	conflicted := false
	d.r.Client = interceptor.NewClient(base, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if _, ok := obj.(*repairv1.NodeRepair); ok && !conflicted {
				conflicted = true
				// The agent records something meanwhile.
				stored := &repairv1.NodeRepair{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(obj), stored); err != nil {
					return err
				}
				stored.Status.Timeline = append(stored.Status.Timeline, repairv1.TimelineEntry{Time: metav1.NewTime(d.clock.Now()),
					Step: "Reboot", Outcome: repairv1.OutcomeInterrupted, Message: "written meanwhile"})
				if err := c.Status().Update(ctx, stored); err != nil {
					return err
				}
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	d.clock.Step(20 * time.Minute)
	_, got := d.reconcile(nr.Name)
	if !conflicted {
		t.Fatal("no status write was made")
	}
	if got.Status.Phase != repairv1.PhaseRecoveryFailed || !strings.Contains(got.Status.Message, "did not come back from the reboot within 20m0s") {
		t.Fatalf("after a conflicting end: phase %s, message %q", got.Status.Phase, got.Status.Message)
	}
	if steps := timelineSteps(got); !strings.Contains(steps, "Reboot:Interrupted Done:RecoveryFailed") {
		t.Errorf("timeline %q: want the entry written meanwhile, then the end", steps)
	}
	if nm, err := requestor.Get(t.Context(), env.Kube, ns, hold); err != nil || (nm != nil && nm.DeletionTimestamp == nil) {
		t.Errorf("the node's NodeMaintenance %s is still held: %v", hold, err)
	}
	evs := strings.Join(d.events(), "\n")
	if strings.Count(evs, "Warning "+repair.ReasonFailed) != 1 {
		t.Errorf("events %q: want one %s Warning", evs, repair.ReasonFailed)
	}
	before := got.ResourceVersion
	if _, again := d.reconcile(nr.Name); again.ResourceVersion != before {
		t.Errorf("the ended repair was written again: %q", again.Status.Message)
	}
}
