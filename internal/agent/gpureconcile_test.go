package agent

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpufault"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

// fakeGPUs is a GPUSource showing obs.
type fakeGPUs struct {
	obs GPUObservation
	err error
}

func (f *fakeGPUs) ObserveGPUs(context.Context, *corev1.Node) (GPUObservation, error) {
	return f.obs, f.err
}

// writeCounter counts the writes a fake client receives, as "verb kind".
type writeCounter struct{ writes []string }

func (w *writeCounter) funcs(fail func(verb string, obj client.Object) error) interceptor.Funcs {
	rec := func(verb string, obj client.Object) error {
		w.writes = append(w.writes, verb+" "+fmt.Sprintf("%T", obj))
		if fail != nil {
			return fail(verb, obj)
		}
		return nil
	}
	return interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if err := rec("create", obj); err != nil {
				return err
			}
			return c.Create(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			if err := rec("patch", obj); err != nil {
				return err
			}
			return c.Patch(ctx, obj, p, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			if err := rec("patch status", obj); err != nil {
				return err
			}
			return c.SubResource(sub).Patch(ctx, obj, p, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			rec("update", obj) //nolint:errcheck // never fails: counted only
			return c.Update(ctx, obj, opts...)
		},
	}
}

// gpuNode is a node with 8 GPUs, booted as gBoot.
func gpuNode(name string) *corev1.Node {
	return testobj.Node(name, testobj.BootID(gBoot), testobj.GPUCapacity(8))
}

func newFakeClient(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) client.Client {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(agentScheme(t)).
		WithStatusSubresource(&repairv1.GPUFault{}, &repairv1.NodeRepair{}, &corev1.Node{}).
		WithObjects(objs...).WithInterceptorFuncs(funcs).Build()
}

func getNode(t *testing.T, c client.Client) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	if err := c.Get(t.Context(), types.NamespacedName{Name: gNode}, n); err != nil {
		t.Fatal(err)
	}
	return n
}

func listFaults(t *testing.T, c client.Client) []repairv1.GPUFault {
	t.Helper()
	var l repairv1.GPUFaultList
	if err := c.List(t.Context(), &l); err != nil {
		t.Fatal(err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items
}

func conditionOf(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == repairv1.ConditionGPUProblem {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// TestGPUMonitorReconcile: an XID creates the record (create, then its
// status) and sets GPUProblem; a second pass writes nothing; the policy's
// override applies; a reset clears it; another node's request is ignored.
func TestGPUMonitorReconcile(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(gNow)
	w := &writeCounter{}
	node := gpuNode(gNode)
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	policy := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: repairv1.NodeRepairPolicySpec{GPU: repairv1.GPUSpec{XIDClasses: []repairv1.XIDClass{{Code: 13, Class: repairv1.GPUClassReboot}}}}}
	c := newFakeClient(t, w.funcs(nil), node, gpuNode("gpu-004"), policy)
	src := &fakeGPUs{obs: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t0)}, DCGM: health(nil)}}
	m := &GPUMonitor{Client: clientAPI{c}, Source: src, Clock: clk, NodeName: gNode}
	pass := func() {
		t.Helper()
		res, err := m.Reconcile(t.Context(), gNode)
		if err != nil || res != 0 {
			t.Fatalf("reconcile: %+v, %v", res, err)
		}
	}
	pass()
	if diff := cmp.Diff([]string{"create *v1alpha1.GPUFault", "patch status *v1alpha1.GPUFault", "patch status *v1.Node"}, w.writes); diff != "" {
		t.Errorf("writes of the first pass (-want +got):\n%s", diff)
	}
	faults := listFaults(t, c)
	if len(faults) != 1 || faults[0].Name != name3 || faults[0].Status.Class != repairv1.GPUClassResetGPU ||
		faults[0].Spec.GPU.UUID != uuid3 || faults[0].Spec.GPU.Index == nil || *faults[0].Spec.GPU.Index != 3 {
		t.Fatalf("records %+v, want GPU 3's, class ResetGPU, with index and UUID from the exporter", faults)
	}
	cond := conditionOf(getNode(t, c))
	if cond == nil || cond.Status != corev1.ConditionTrue || cond.Reason != "ResetGPU" ||
		cond.Message != "GPU 3 ("+uuid3+", "+bus3+"): Xid 48 ("+meta48+")" {
		t.Fatalf("condition %+v", cond)
	}
	if n := getNode(t, c); len(n.Status.Conditions) != 2 {
		t.Errorf("conditions %+v: the Ready condition must stay", n.Status.Conditions)
	}

	w.writes = nil
	clk.SetTime(gNow.Add(time.Minute))
	pass()
	if len(w.writes) != 0 {
		t.Errorf("a pass over nothing new wrote %v", w.writes)
	}

	// An XID 13 on GPU 1: Reboot by the policy's override.
	src.obs.XIDs = append(src.obs.XIDs, xidAt(bus1, 13, t0.Add(time.Second)))
	pass()
	cond = conditionOf(getNode(t, c))
	if cond.Reason != "Reboot" || cond.LastTransitionTime.Time.Equal(cond.LastHeartbeatTime.Time) {
		t.Errorf("condition %+v, want reason Reboot, the transition time kept", cond)
	}

	// Reset both: back in service, condition False.
	w.writes = nil
	if err := ClearResetGPUs(t.Context(), clientAPI{c}, clk, gNode, []repairv1.GPURef{{PCIBusID: bus1}, {PCIBusID: "00000000:18:00.0"}}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"patch status *v1alpha1.GPUFault", "patch status *v1alpha1.GPUFault", "patch status *v1.Node"}, w.writes); diff != "" {
		t.Errorf("writes of the clearing (-want +got):\n%s", diff)
	}
	for _, f := range listFaults(t, c) {
		if !f.InService() {
			t.Errorf("after the reset %s is out of service: %+v", f.Name, f.Status)
		}
	}
	if cond = conditionOf(getNode(t, c)); cond.Status != corev1.ConditionFalse || cond.Reason != repairv1.ReasonGPUsHealthy {
		t.Errorf("condition after the reset %+v", cond)
	}
	// The kernel log still shows the XIDs: nothing comes back.
	w.writes = nil
	pass()
	if len(w.writes) != 0 {
		t.Errorf("after the reset the old XIDs wrote %v", w.writes)
	}
	// A request of another node is not this agent's.
	if _, err := m.Reconcile(t.Context(), "gpu-004"); err != nil || len(w.writes) != 0 {
		t.Errorf("another node's request: %v, writes %v", err, w.writes)
	}
}

// TestGPUMonitorWritesOnTheVersionItRead: a record changed since it was
// read is not overwritten (the status patch conflicts and the pass is
// retried); a failing source writes nothing.
func TestGPUMonitorWritesOnTheVersionItRead(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(gNow)
	stored := rec(name3, ref3(), repairv1.GPUFaultStatus{BootID: gBoot})
	stored.ResourceVersion = ""
	conflicts := 1
	w := &writeCounter{}
	c := newFakeClient(t, w.funcs(func(verb string, obj client.Object) error {
		if _, ok := obj.(*repairv1.GPUFault); ok && verb == "patch status" && conflicts > 0 {
			conflicts--
			return apierrors.NewConflict(schema.GroupResource{Group: repairv1.GroupVersion.Group, Resource: "gpufaults"}, obj.GetName(), errors.New("modified"))
		}
		return nil
	}), gpuNode(gNode), &stored)
	m := &GPUMonitor{Client: clientAPI{c}, Source: &fakeGPUs{obs: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t0)}}}, Clock: clk, NodeName: gNode}
	req := gNode
	if res, err := m.Reconcile(t.Context(), req); err != nil || res == 0 {
		t.Fatalf("first pass: %+v, %v; want to look again soon, no error", res, err)
	}
	if cond := conditionOf(getNode(t, c)); cond != nil {
		t.Errorf("the condition was written before the record: %+v", cond)
	}
	if _, err := m.Reconcile(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if f := listFaults(t, c); f[0].Status.Class != repairv1.GPUClassResetGPU || f[0].Status.Faults[0].Count != 1 {
		t.Errorf("after the retry: %+v", f[0].Status)
	}
	w.writes = nil
	m.Source = &fakeGPUs{err: errors.New("no kernel log")}
	if _, err := m.Reconcile(t.Context(), req); err == nil || len(w.writes) != 0 {
		t.Errorf("a failing source: %v, writes %v; want the error and no write", err, w.writes)
	}
}

// TestAgentResetGPUClearsTheRecords: a successful ResetGPU returns the
// GPUs to service before its outcome is recorded; a failed one leaves them
// out; records that cannot be written make the outcome Failed.
func TestAgentResetGPUClearsTheRecords(t *testing.T) {
	out := rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU, Summary: "Xid 48 (" + meta48 + ")",
		Faults: []repairv1.GPUFaultEntry{x48(t0, t0, 1, true)}, Occurrences: []metav1.Time{mt(t0)}})
	out.ResourceVersion = ""
	repair := func() *repairv1.NodeRepair {
		nr := testRepair(gNode, repairv1.ActionResetGPU)
		nr.Spec.GPUs = []repairv1.GPURef{ref3()}
		nr.Status.GPUMaintenanceName = "repair-r-gpu" // its pods drained: the reset may run
		nr.Spec.Validation = &repairv1.GPUValidation{Level: repairv1.GPUValidationOff}
		return nr
	}
	drained := holding("gpufleet-system", "repair-r-gpu", repairv1.RequestorID, gNode, maintenancev1.PhaseReady)
	tests := map[string]struct {
		execErr       error
		failRecord    bool
		wantOutcome   string
		wantInService bool
	}{
		"reset: back in service":        {wantOutcome: "Succeeded", wantInService: true},
		"the reset failed: still out":   {execErr: errors.New("nvidia-smi: in use"), wantOutcome: "Failed"},
		"the records cannot be written": {failRecord: true, wantOutcome: "Failed"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			w := &writeCounter{}
			c := newFakeClient(t, w.funcs(func(verb string, obj client.Object) error {
				if _, ok := obj.(*repairv1.GPUFault); ok && tc.failRecord {
					return errors.New("injected: etcd unavailable")
				}
				return nil
			}), repair(), out.DeepCopy(), gpuNode(gNode), drained.DeepCopy())
			exec := &recordingExecutor{err: tc.execErr}
			a := &Agent{Client: clientAPI{c}, NodeName: gNode, Executor: exec, Clock: clocktesting.NewFakePassiveClock(agentNow)}
			if err := reconcileRepair(t, a, repairName); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{gNode + " ResetGPU " + bus3}, exec.calls); diff != "" {
				t.Errorf("executor calls (-want +got):\n%s", diff)
			}
			nr := getRepair(t, a)
			if last := nr.Status.Timeline[len(nr.Status.Timeline)-1]; last.Outcome != tc.wantOutcome {
				t.Errorf("outcome %+v, want %s", last, tc.wantOutcome)
			}
			if got := listFaults(t, c)[0].InService(); got != tc.wantInService {
				t.Errorf("GPU in service: %t, want %t", got, tc.wantInService)
			}
		})
	}
}

// TestGPUMonitorStaleNodeWritesTheConditionOnce: a pass that reads the
// node as it was before the previous pass wrote the condition (a cache
// behind) does not write the condition again with new times: its write
// conflicts, it looks again soon, and the next pass writes nothing.
func TestGPUMonitorStaleNodeWritesTheConditionOnce(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(gNow)
	w := &writeCounter{}
	var serveStale *corev1.Node
	funcs := w.funcs(nil)
	funcs.Get = func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if n, ok := obj.(*corev1.Node); ok && serveStale != nil {
			serveStale.DeepCopyInto(n)
			serveStale = nil
			return nil
		}
		return c.Get(ctx, key, obj, opts...)
	}
	c := newFakeClient(t, funcs, gpuNode(gNode))
	before := getNode(t, c)
	m := &GPUMonitor{Client: clientAPI{c}, Source: &fakeGPUs{obs: GPUObservation{XIDs: []XIDObservation{xidAt(bus3, 48, t0)}}}, Clock: clk, NodeName: gNode}
	req := gNode
	if _, err := m.Reconcile(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	written := conditionOf(getNode(t, c))
	clk.SetTime(gNow.Add(time.Minute))
	w.writes = nil
	serveStale = before
	res, err := m.Reconcile(t.Context(), req)
	if err != nil || res == 0 {
		t.Errorf("a pass on a stale node: %+v, %v, writes %v; want to look again", res, err, w.writes)
	}
	if got := conditionOf(getNode(t, c)); got == nil || *got != *written {
		t.Errorf("the condition was written again: %+v, was %+v", got, written)
	}
	w.writes = nil
	if _, err := m.Reconcile(t.Context(), req); err != nil || len(w.writes) != 0 {
		t.Errorf("the next pass: %v, writes %v; want none", err, w.writes)
	}
}

// TestAgentValidatesBeforeReturningTheGPU: with validation (the default),
// a successful reset leaves the GPU out of service; the ValidateGPU the
// repair asks for next runs at the repair's level and bound, and returns
// the GPU to service only when it passes (the result on the record, the
// outcome in the timeline, the ladder's next rung unchanged). A failed one
// keeps it out with a ValidationFailed fault of class Reboot (the ladder's
// next rung), or Replace once the node was rebooted.
func TestAgentValidatesBeforeReturningTheGPU(t *testing.T) {
	out := rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU, Summary: "Xid 48 (" + meta48 + ")",
		Faults: []repairv1.GPUFaultEntry{x48(t0, t0, 1, true)}, Occurrences: []metav1.Time{mt(t0)}})
	out.ResourceVersion = ""
	drained := holding("gpufleet-system", "repair-r-gpu", repairv1.RequestorID, gNode, maintenancev1.PhaseReady)
	repair := func(pending repairv1.Action, rebooted bool) *repairv1.NodeRepair {
		nr := testRepair(gNode, pending)
		nr.Spec.Actions = []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot}
		nr.Spec.GPUs = []repairv1.GPURef{ref3()}
		nr.Status.GPUMaintenanceName = "repair-r-gpu"
		if pending == repairv1.ActionValidateGPU {
			nr.Status.NextAction = 1
		}
		if rebooted {
			nr.Status.BootIDBefore = "boot-1"
		}
		return nr
	}
	for name, tc := range map[string]struct {
		pending       repairv1.Action
		rebooted      bool
		execErr       error
		wantOutcome   string
		wantInService bool
		wantClass     repairv1.GPUFaultClass
		wantNext      int32
	}{
		"the reset succeeded: still out until validated": {pending: repairv1.ActionResetGPU, wantOutcome: "Succeeded", wantClass: repairv1.GPUClassResetGPU, wantNext: 1},
		"validation passed: back in service":             {pending: repairv1.ActionValidateGPU, wantOutcome: "Succeeded", wantInService: true, wantNext: 1},
		"validation failed: out, a reboot is next":       {pending: repairv1.ActionValidateGPU, execErr: errors.New("GPU 0000:18:00.0: uncorrectable ECC errors since the reset: 2"), wantOutcome: "Failed", wantClass: repairv1.GPUClassReboot, wantNext: 1},
		"validation failed after the reboot: replace it": {pending: repairv1.ActionValidateGPU, rebooted: true, execErr: errors.New("GPU 0000:18:00.0: the driver does not answer"), wantOutcome: "Failed", wantClass: repairv1.GPUClassReplace, wantNext: 1},
	} {
		t.Run(name, func(t *testing.T) {
			stored := out.DeepCopy()
			if tc.pending == repairv1.ActionValidateGPU { // the reset (or the reboot) marked it pending
				*stored = ValidationPending([]repairv1.GPUFault{*stored}, []repairv1.GPURef{ref3()}, t0.Add(time.Second))[0]
				stored.ResourceVersion = ""
			}
			c := newFakeClient(t, interceptor.Funcs{}, repair(tc.pending, tc.rebooted), stored, gpuNode(gNode), drained.DeepCopy())
			exec := &levelExecutor{err: tc.execErr}
			a := &Agent{Client: clientAPI{c}, NodeName: gNode, Executor: exec, Clock: clocktesting.NewFakePassiveClock(agentNow), ValidationRetry: -1}
			if err := reconcileRepair(t, a, repairName); err != nil {
				t.Fatal(err)
			}
			nr := getRepair(t, a)
			last := nr.Status.Timeline[len(nr.Status.Timeline)-1]
			if last.Step != string(tc.pending) || last.Outcome != tc.wantOutcome || nr.Status.NextAction != tc.wantNext {
				t.Errorf("timeline %+v, nextAction %d", nr.Status.Timeline, nr.Status.NextAction)
			}
			gf := listFaults(t, c)[0]
			if gf.InService() != tc.wantInService || gf.Status.Class != tc.wantClass {
				t.Errorf("in service %t class %q, want %t %q: %+v", gf.InService(), gf.Status.Class, tc.wantInService, tc.wantClass, gf.Status)
			}
			if tc.pending != repairv1.ActionValidateGPU {
				return
			}
			if exec.level != repairv1.GPUValidationHealth || !exec.bounded {
				t.Errorf("validated at level %q, bounded %t; want Health, bounded", exec.level, exec.bounded)
			}
			v := gf.Status.Validation
			if v == nil || v.Passed != tc.wantInService || v.Level != repairv1.GPUValidationHealth || (!v.Passed && !strings.Contains(v.Message, tc.execErr.Error())) {
				t.Errorf("validation result %+v", v)
			}
		})
	}
}

// levelExecutor records the validation level and whether its context has a
// deadline.
type levelExecutor struct {
	err     error
	level   repairv1.GPUValidationLevel
	bounded bool
}

func (e *levelExecutor) Execute(ctx context.Context, _ *corev1.Node, a repairv1.Action, _ []repairv1.GPURef) error {
	if a == repairv1.ActionValidateGPU {
		e.level = ValidationLevel(ctx)
		_, e.bounded = ctx.Deadline()
	}
	return e.err
}

// flakyExecutor fails ValidateGPU for the GPUs in failing, the first
// failFirst calls for every other GPU, and records the calls.
type flakyExecutor struct {
	failing   map[string]bool
	failFirst int
	calls     []string
}

func (e *flakyExecutor) Execute(_ context.Context, _ *corev1.Node, a repairv1.Action, gpus []repairv1.GPURef) error {
	e.calls = append(e.calls, string(a)+" "+gpus[0].PCIBusID)
	if a != repairv1.ActionValidateGPU {
		return nil
	}
	if e.failing[gpus[0].PCIBusID] {
		return errors.New("the driver does not answer for it")
	}
	if e.failFirst > 0 {
		e.failFirst--
		return errors.New("the driver is still loading")
	}
	return nil
}

// TestAgentValidatesEachGPU: each GPU of the repair gets its own result
// (one failing GPU does not keep a healthy one out); after a reboot a GPU
// that fails (the driver still loading) is tried again until it passes;
// before a reboot the agent marks the GPUs pending, so that the reboot,
// which clears their kernel-log faults, does not return them to service
// unvalidated.
func TestAgentValidatesEachGPU(t *testing.T) {
	pending := func(r repairv1.GPUFault) *repairv1.GPUFault {
		p := ValidationPending([]repairv1.GPUFault{r}, []repairv1.GPURef{r.Spec.GPU}, t0.Add(time.Second))[0]
		p.ResourceVersion = ""
		return &p
	}
	g3 := rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU, Faults: []repairv1.GPUFaultEntry{x48(t0, t0, 1, true)}})
	g5 := rec(name5, ref(bus5), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU, Faults: []repairv1.GPUFaultEntry{x48(t0, t0, 1, true)}})
	held := holding("gpufleet-system", "repair-r", repairv1.RequestorID, gNode, maintenancev1.PhaseReady)
	repair := func(action repairv1.Action, rebooted bool) *repairv1.NodeRepair {
		nr := testRepair(gNode, action)
		nr.Spec.Actions = []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot}
		nr.Spec.GPUs = []repairv1.GPURef{ref3(), ref(bus5)}
		nr.Status.NextAction, nr.Status.MaintenanceName = 1, "repair-r"
		if rebooted {
			nr.Status.BootIDBefore = "boot-1"
		}
		return nr
	}
	run := func(t *testing.T, nr *repairv1.NodeRepair, exec Executor, objs ...client.Object) (client.Client, *repairv1.NodeRepair) {
		node := gpuNode(gNode)
		node.Spec.Unschedulable = true // cordoned by the repair's NodeMaintenance
		c := newFakeClient(t, interceptor.Funcs{}, append(objs, nr, node, held.DeepCopy())...)
		a := &Agent{Client: clientAPI{c}, NodeName: gNode, Executor: exec, Clock: clocktesting.NewFakePassiveClock(agentNow), ValidationRetry: time.Millisecond}
		if err := reconcileRepair(t, a, repairName); err != nil {
			t.Fatal(err)
		}
		return c, getRepair(t, a)
	}
	byName := func(fs []repairv1.GPUFault) map[string]repairv1.GPUFault {
		m := map[string]repairv1.GPUFault{}
		for _, f := range fs {
			m[f.Name] = f
		}
		return m
	}

	t.Run("one GPU fails: only it stays out", func(t *testing.T) {
		c, nr := run(t, repair(repairv1.ActionValidateGPU, false), &flakyExecutor{failing: map[string]bool{bus5: true}}, pending(g3), pending(g5))
		got := byName(listFaults(t, c))
		f3, f5 := got[name3], got[name5]
		if !f3.InService() || f5.InService() || f5.Status.Class != repairv1.GPUClassReboot {
			t.Errorf("GPU 3 in service %t, GPU 5 class %q", f3.InService(), f5.Status.Class)
		}
		if last := nr.Status.Timeline[len(nr.Status.Timeline)-1]; last.Outcome != "Failed" || !strings.Contains(last.Message, bus5) || strings.Contains(last.Message, bus3) {
			t.Errorf("outcome %+v", last)
		}
	})
	t.Run("after a reboot, a driver still loading is tried again", func(t *testing.T) {
		exec := &flakyExecutor{failFirst: 3}
		c, nr := run(t, repair(repairv1.ActionValidateGPU, true), exec, pending(g3), pending(g5))
		if last := nr.Status.Timeline[len(nr.Status.Timeline)-1]; last.Outcome != "Succeeded" {
			t.Errorf("outcome %+v after calls %v", last, exec.calls)
		}
		for _, f := range listFaults(t, c) {
			if !f.InService() {
				t.Errorf("%s still out: %+v", f.Name, f.Status.Faults)
			}
		}
	})
	t.Run("before a reboot the GPUs are marked pending", func(t *testing.T) {
		nr := repair(repairv1.ActionReboot, false)
		c, _ := run(t, nr, &flakyExecutor{}, g3.DeepCopy(), g5.DeepCopy())
		for _, f := range listFaults(t, c) {
			if e := entryFor(&f, 0, gpufault.CounterValidationPending); e == nil || !e.Active {
				t.Errorf("%s not pending before the reboot: %+v", f.Name, f.Status.Faults)
			}
		}
	})
}

// staleNodeAPI serves the node as it was before a status update that its
// cache has not seen yet, as an informer behind on a busy cluster does;
// Fresh reads the stored node.
type staleNodeAPI struct {
	clientAPI
	stale  *corev1.Node
	served int
}

func (s *staleNodeAPI) Node(context.Context, string) (*corev1.Node, error) {
	s.served++
	return s.stale.DeepCopy(), nil
}

func (s *staleNodeAPI) Fresh() API { return s.clientAPI }

// TestAgentResetGPUOnAStaleNodeCacheSucceeds: a reset that worked is
// recorded as Succeeded although the agent's cache of its node is behind
// (the kubelet updated the node's status meanwhile): the condition write
// conflicts once, the next try reads the node from the API server. Before,
// every try read the cache again, all conflicted, and the reset was
// recorded Failed — which sends the repair on to a reboot of the node.
func TestAgentResetGPUOnAStaleNodeCacheSucceeds(t *testing.T) {
	out := rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU, Summary: "Xid 48 (" + meta48 + ")",
		Faults: []repairv1.GPUFaultEntry{x48(t0, t0, 1, true)}, Occurrences: []metav1.Time{mt(t0)}})
	out.ResourceVersion = ""
	nr := testRepair(gNode, repairv1.ActionResetGPU)
	nr.Spec.GPUs = []repairv1.GPURef{ref3()}
	nr.Status.GPUMaintenanceName = "repair-r-gpu"
	drained := holding("gpufleet-system", "repair-r-gpu", repairv1.RequestorID, gNode, maintenancev1.PhaseReady)
	c := newFakeClient(t, interceptor.Funcs{}, nr, out.DeepCopy(), gpuNode(gNode), drained.DeepCopy())
	stale := getNode(t, c)
	// The kubelet's status update the cache has not seen.
	moved := stale.DeepCopy()
	moved.Status.Conditions = append(moved.Status.Conditions, corev1.NodeCondition{Type: "KubeletHeartbeat", Status: corev1.ConditionTrue})
	if err := c.Status().Update(t.Context(), moved); err != nil {
		t.Fatal(err)
	}
	api := &staleNodeAPI{clientAPI: clientAPI{c}, stale: stale}
	a := &Agent{Client: api, NodeName: gNode, Executor: &recordingExecutor{}, Clock: clocktesting.NewFakePassiveClock(agentNow)}
	if err := reconcileRepair(t, a, repairName); err != nil {
		t.Fatal(err)
	}
	got := &repairv1.NodeRepair{}
	if err := c.Get(t.Context(), client.ObjectKey{Name: repairName}, got); err != nil {
		t.Fatal(err)
	}
	if last := got.Status.Timeline[len(got.Status.Timeline)-1]; last.Step != string(repairv1.ActionResetGPU) || last.Outcome != repairv1.OutcomeSucceeded {
		t.Errorf("the reset's outcome %+v, want Succeeded", last)
	}
	if cond := conditionOf(getNode(t, c)); cond == nil {
		t.Errorf("no %s condition written", repairv1.ConditionGPUProblem)
	}
	if f := listFaults(t, c)[0]; f.InService() {
		t.Errorf("the GPU is back in service before its validation: %+v", f.Status)
	}
}
