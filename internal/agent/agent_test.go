package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

// agentNow is the agent's fake clock (whole seconds: the fake client
// round-trips the status through JSON).
var agentNow = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// recordingExecutor records "node action" for every call and returns err.
type recordingExecutor struct {
	calls []string
	err   error
}

func (e *recordingExecutor) Execute(_ context.Context, node *corev1.Node, a repairv1.Action, gpus []repairv1.GPURef) error {
	call := node.Name + " " + string(a)
	for _, g := range gpus {
		call += " " + g.PCIBusID
	}
	e.calls = append(e.calls, call)
	return e.err
}

func agentScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := repairv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := maintenancev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// repairName names the NodeRepair of the tests.
const repairName = "r"

// testRepair is a NodeRepair of node with a ladder of two actions; pending,
// if set, is the action waiting for the agent; timeline is what happened
// before.
func testRepair(node string, pending repairv1.Action, timeline ...repairv1.TimelineEntry) *repairv1.NodeRepair {
	nr := &repairv1.NodeRepair{
		ObjectMeta: metav1.ObjectMeta{Name: repairName},
		Spec: repairv1.NodeRepairSpec{
			NodeName: node, Policy: "default",
			Fault:   repairv1.Fault{Rule: "kubelet", ConditionType: "Ready", Status: "False", Since: metav1.NewTime(agentNow.Add(-time.Hour))},
			Actions: []repairv1.Action{repairv1.ActionRestartKubelet, repairv1.ActionRestartContainerRuntime},
		},
		Status: repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, Timeline: timeline},
	}
	if pending != "" {
		nr.Status.Pending = &repairv1.PendingAction{Action: pending, RequestedAt: metav1.NewTime(agentNow.Add(-time.Minute))}
	}
	return nr
}

func at(step, outcome, msg string) repairv1.TimelineEntry {
	return repairv1.TimelineEntry{Time: metav1.NewTime(agentNow), Step: step, Outcome: outcome, Message: msg}
}

// newTestAgent returns an agent of node ("" = every node) on a fake client
// holding objs, with the status subresource of NodeRepair.
func newTestAgent(t *testing.T, node string, exec Executor, funcs *interceptor.Funcs, objs ...client.Object) *Agent {
	t.Helper()
	b := fake.NewClientBuilder().WithScheme(agentScheme(t)).
		WithStatusSubresource(&repairv1.NodeRepair{}).WithObjects(objs...)
	if funcs != nil {
		b = b.WithInterceptorFuncs(*funcs)
	}
	return &Agent{Client: clientAPI{b.Build()}, NodeName: node, Executor: exec, Clock: clocktesting.NewFakePassiveClock(agentNow)}
}

func reconcileRepair(t *testing.T, a *Agent, name string) error {
	t.Helper()
	return a.Reconcile(t.Context(), name)
}

func getRepair(t *testing.T, a *Agent) *repairv1.NodeRepair {
	t.Helper()
	nr := &repairv1.NodeRepair{}
	if err := a.Client.(clientAPI).Get(t.Context(), types.NamespacedName{Name: repairName}, nr); err != nil {
		t.Fatal(err)
	}
	return nr
}

func TestAgentReconcile(t *testing.T) {
	earlier := repairv1.TimelineEntry{Time: metav1.NewTime(agentNow.Add(-time.Minute)), Step: "Start", Outcome: "Requested"}
	startedBefore := repairv1.TimelineEntry{Time: metav1.NewTime(agentNow.Add(-30 * time.Second)), Step: "RestartKubelet", Outcome: "Started"}
	tests := map[string]struct {
		agentNode string
		repair    *repairv1.NodeRepair
		execErr   error
		// want: the executor's calls and the NodeRepair's status after.
		wantCalls    []string
		wantTimeline []repairv1.TimelineEntry
		wantNext     int32
		wantPending  bool
		// wantUntouched: the NodeRepair is not written at all.
		wantUntouched bool
	}{
		"a pending action runs once": {
			agentNode: "gpu-1", repair: testRepair("gpu-1", repairv1.ActionRestartKubelet, earlier),
			wantCalls:    []string{"gpu-1 RestartKubelet"},
			wantTimeline: []repairv1.TimelineEntry{earlier, at("RestartKubelet", "Started", ""), at("RestartKubelet", "Succeeded", "")},
			wantNext:     1,
		},
		"the executor's error is in the timeline": {
			agentNode: "gpu-1", repair: testRepair("gpu-1", repairv1.ActionRestartKubelet),
			execErr:   errors.New("systemctl restart kubelet: exit status 1: job for kubelet.service failed"),
			wantCalls: []string{"gpu-1 RestartKubelet"},
			wantTimeline: []repairv1.TimelineEntry{at("RestartKubelet", "Started", ""),
				at("RestartKubelet", "Failed", "systemctl restart kubelet: exit status 1: job for kubelet.service failed")},
			wantNext: 1,
		},
		"started but no outcome (restart mid-action): not run again": {
			agentNode: "gpu-1", repair: testRepair("gpu-1", repairv1.ActionRestartKubelet, earlier, startedBefore),
			wantTimeline: []repairv1.TimelineEntry{earlier, startedBefore,
				at("RestartKubelet", "Interrupted", "the agent restarted while running it; not run again")},
			wantNext: 1,
		},
		"the start of another action does not stop this one": {
			agentNode: "gpu-1", repair: testRepair("gpu-1", repairv1.ActionRestartContainerRuntime, startedBefore),
			wantCalls: []string{"gpu-1 RestartContainerRuntime"},
			wantTimeline: []repairv1.TimelineEntry{startedBefore,
				at("RestartContainerRuntime", "Started", ""), at("RestartContainerRuntime", "Succeeded", "")},
			wantNext: 1,
		},
		"another node's repair is left alone": {
			agentNode: "gpu-1", repair: testRepair("gpu-2", repairv1.ActionRestartKubelet, earlier),
			wantTimeline: []repairv1.TimelineEntry{earlier}, wantPending: true, wantUntouched: true,
		},
		"a repair without a pending action is not touched": {
			agentNode: "gpu-1", repair: testRepair("gpu-1", "", earlier),
			wantTimeline: []repairv1.TimelineEntry{earlier}, wantUntouched: true,
		},
		"the in-process agent runs every node's actions": {
			agentNode: "", repair: testRepair("gpu-2", repairv1.ActionRestartKubelet),
			wantCalls:    []string{"gpu-2 RestartKubelet"},
			wantTimeline: []repairv1.TimelineEntry{at("RestartKubelet", "Started", ""), at("RestartKubelet", "Succeeded", "")},
			wantNext:     1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			exec := &recordingExecutor{err: tc.execErr}
			a := newTestAgent(t, tc.agentNode, exec, nil, tc.repair, testobj.Node("gpu-1"), testobj.Node("gpu-2"))
			before := getRepair(t, a)
			if err := reconcileRepair(t, a, repairName); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantCalls, exec.calls); diff != "" {
				t.Errorf("executor calls (-want +got):\n%s", diff)
			}
			got := getRepair(t, a)
			if diff := cmp.Diff(tc.wantTimeline, got.Status.Timeline); diff != "" {
				t.Errorf("timeline (-want +got):\n%s", diff)
			}
			if got.Status.NextAction != tc.wantNext {
				t.Errorf("nextAction %d, want %d", got.Status.NextAction, tc.wantNext)
			}
			if (got.Status.Pending != nil) != tc.wantPending {
				t.Errorf("pending %+v, want pending: %t", got.Status.Pending, tc.wantPending)
			}
			if written := got.ResourceVersion != before.ResourceVersion; written == tc.wantUntouched {
				t.Errorf("NodeRepair written: %t (resourceVersion %s → %s), want written: %t",
					written, before.ResourceVersion, got.ResourceVersion, !tc.wantUntouched)
			}
			// A second pass over the result runs nothing more and writes nothing.
			if err := reconcileRepair(t, a, repairName); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantCalls, exec.calls); diff != "" {
				t.Errorf("executor calls after a second pass (-want +got):\n%s", diff)
			}
			if again := getRepair(t, a); again.ResourceVersion != got.ResourceVersion {
				t.Errorf("the second pass wrote the repair (resourceVersion %s → %s)", got.ResourceVersion, again.ResourceVersion)
			}
		})
	}
}

func TestAgentIgnoresADeletedRepair(t *testing.T) {
	exec := &recordingExecutor{}
	a := newTestAgent(t, "gpu-1", exec, nil, testobj.Node("gpu-1"))
	if err := reconcileRepair(t, a, "gone"); err != nil {
		t.Errorf("a NodeRepair that no longer exists: %v, want no error", err)
	}
	if len(exec.calls) != 0 {
		t.Errorf("executor calls %v, want none", exec.calls)
	}
}

// TestAgentStatusConflictRunsNothingTwice: a conflict on the start's
// write runs nothing (retried); a conflict on the outcome's write (the
// operator wrote the repair while the action ran) is written again on the
// stored version, not lost and later taken for an interrupted action —
// unless the repair no longer waits for it.
func TestAgentStatusConflictRunsNothingTwice(t *testing.T) {
	tests := map[string]struct {
		failWrite    int // the status write that conflicts: 1 = the start, 2 = the outcome
		between      func(*repairv1.NodeRepair)
		wantErr      bool // the first pass fails (retried)
		wantTimeline []repairv1.TimelineEntry
		wantNext     int32
	}{
		"the start's write conflicts": {failWrite: 1, wantErr: true, wantNext: 1,
			wantTimeline: []repairv1.TimelineEntry{at("RestartKubelet", "Started", ""), at("RestartKubelet", "Succeeded", "")}},
		"the outcome's write conflicts": {failWrite: 2, wantNext: 1,
			between:      func(nr *repairv1.NodeRepair) { nr.Status.Message = "written by the operator" },
			wantTimeline: []repairv1.TimelineEntry{at("RestartKubelet", "Started", ""), at("RestartKubelet", "Succeeded", "")}},
		"the outcome's write conflicts, the action withdrawn meanwhile": {failWrite: 2, wantNext: 0,
			between:      func(nr *repairv1.NodeRepair) { nr.Status.Pending = nil },
			wantTimeline: []repairv1.TimelineEntry{at("RestartKubelet", "Started", "")}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			writes := 0
			funcs := &interceptor.Funcs{
				SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
					writes++
					if writes == tc.failWrite {
						if tc.between != nil {
							stored := &repairv1.NodeRepair{}
							if err := c.Get(ctx, client.ObjectKeyFromObject(obj), stored); err != nil {
								return err
							}
							tc.between(stored)
							if err := c.Status().Update(ctx, stored); err != nil {
								return err
							}
						}
						return apierrors.NewConflict(schema.GroupResource{Group: repairv1.GroupVersion.Group, Resource: "noderepairs"}, obj.GetName(), errors.New("the object has been modified"))
					}
					return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
				},
			}
			exec := &recordingExecutor{}
			a := newTestAgent(t, "gpu-1", exec, funcs, testRepair("gpu-1", repairv1.ActionRestartKubelet), testobj.Node("gpu-1"))
			err := reconcileRepair(t, a, repairName)
			if tc.wantErr != apierrors.IsConflict(err) || (!tc.wantErr && err != nil) {
				t.Fatalf("first pass: %v, want a conflict: %t", err, tc.wantErr)
			}
			for range 2 {
				if err := reconcileRepair(t, a, repairName); err != nil {
					t.Fatalf("retry: %v", err)
				}
			}
			if diff := cmp.Diff([]string{"gpu-1 RestartKubelet"}, exec.calls); diff != "" {
				t.Errorf("executor calls (-want +got):\n%s", diff)
			}
			got := getRepair(t, a)
			if diff := cmp.Diff(tc.wantTimeline, got.Status.Timeline); diff != "" {
				t.Errorf("timeline (-want +got):\n%s", diff)
			}
			if got.Status.Pending != nil || got.Status.NextAction != tc.wantNext {
				t.Errorf("pending %+v nextAction %d, want none and %d", got.Status.Pending, got.Status.NextAction, tc.wantNext)
			}
		})
	}
}

// TestAgentWritesOnTheVersionItRead: a status write made on a version of
// the NodeRepair older than the stored one fails (optimistic lock) instead
// of overwriting what the repair controller wrote in between.
func TestAgentWritesOnTheVersionItRead(t *testing.T) {
	exec := &recordingExecutor{}
	var a *Agent
	funcs := &interceptor.Funcs{
		// Between the agent's read and its first write, the controller
		// changes the repair (a newer version is stored).
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := c.Get(ctx, key, obj, opts...); err != nil {
				return err
			}
			if nr, ok := obj.(*repairv1.NodeRepair); ok && len(nr.Status.Timeline) == 0 {
				newer := nr.DeepCopy()
				newer.Status.Message = "written by the controller"
				return c.Status().Update(ctx, newer)
			}
			return nil
		},
	}
	a = newTestAgent(t, "gpu-1", exec, funcs, testRepair("gpu-1", repairv1.ActionRestartKubelet), testobj.Node("gpu-1"))
	if err := reconcileRepair(t, a, repairName); !apierrors.IsConflict(err) {
		t.Fatalf("write on a stale version: %v, want a conflict", err)
	}
	if len(exec.calls) != 0 {
		t.Errorf("executor ran %v although the start could not be recorded", exec.calls)
	}
	if got := getRepair(t, a); got.Status.Message != "written by the controller" || len(got.Status.Timeline) != 0 {
		t.Errorf("the controller's write was overwritten: status %+v", got.Status)
	}
}

// TestAgentNodeReadFailureIsRetriedNotInterrupted: when the node cannot be
// read, nothing is recorded, and the retry runs the action (once).
func TestAgentNodeReadFailureIsRetriedNotInterrupted(t *testing.T) {
	exec := &recordingExecutor{}
	failOnce := true
	funcs := &interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if _, ok := obj.(*corev1.Node); ok && failOnce {
			failOnce = false
			return fmt.Errorf("injected: the API server is not reachable")
		}
		return c.Get(ctx, key, obj, opts...)
	}}
	a := newTestAgent(t, "gpu-1", exec, funcs, testobj.Node("gpu-1"), testRepair("gpu-1", repairv1.ActionRestartKubelet))
	if err := reconcileRepair(t, a, repairName); err == nil {
		t.Fatal("a failed node read must be an error (retried)")
	}
	if got := getRepair(t, a); len(got.Status.Timeline) != 0 || got.Status.Pending == nil {
		t.Fatalf("after a failed node read: timeline %+v, pending %v; want nothing recorded", got.Status.Timeline, got.Status.Pending)
	}
	if err := reconcileRepair(t, a, repairName); err != nil {
		t.Fatal(err)
	}
	got := getRepair(t, a)
	if len(exec.calls) != 1 || len(got.Status.Timeline) != 2 || got.Status.Timeline[1].Outcome != "Succeeded" {
		t.Errorf("retry: executor calls %v, timeline %+v; want one run, Started then Succeeded", exec.calls, got.Status.Timeline)
	}
}

// TestAgentLeavesEndedRepairsAlone: a repair that ended (the controller saw
// the GPUs back in service, or failed it past a bound) while an action was
// still pending runs nothing.
func TestAgentLeavesEndedRepairsAlone(t *testing.T) {
	for _, phase := range []repairv1.Phase{repairv1.PhaseSucceeded, repairv1.PhaseRecoveryFailed, repairv1.PhaseIgnored} {
		t.Run(string(phase), func(t *testing.T) {
			nr := testRepair("gpu-1", repairv1.ActionRestartKubelet)
			nr.Status.Phase = phase
			exec := &recordingExecutor{}
			a := newTestAgent(t, "gpu-1", exec, nil, nr, testobj.Node("gpu-1"))
			if err := reconcileRepair(t, a, repairName); err != nil {
				t.Fatal(err)
			}
			if len(exec.calls) != 0 || len(getRepair(t, a).Status.Timeline) != 0 {
				t.Errorf("an ended repair was acted on: calls %v, timeline %+v", exec.calls, getRepair(t, a).Status.Timeline)
			}
		})
	}
}

// TestAgentStaleReadOfItsOwnStartIsNotAnError: the update event of the
// agent's own "Started" write, read from a cache that has not seen the
// outcome yet, looks like an interrupted action; recording "Interrupted"
// then conflicts with the stored outcome, which is expected, not an error.
func TestAgentStaleReadOfItsOwnStartIsNotAnError(t *testing.T) {
	funcs := &interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			return apierrors.NewConflict(schema.GroupResource{Group: repairv1.GroupVersion.Group, Resource: "noderepairs"}, obj.GetName(), errors.New("the object has been modified"))
		},
	}
	exec := &recordingExecutor{}
	a := newTestAgent(t, "gpu-1", exec, funcs, testRepair("gpu-1", repairv1.ActionRestartKubelet, at("RestartKubelet", "Started", "")), testobj.Node("gpu-1"))
	if err := reconcileRepair(t, a, repairName); err != nil {
		t.Errorf("stale read of the agent's own start: %v, want no error", err)
	}
	if len(exec.calls) != 0 {
		t.Errorf("ran %v again", exec.calls)
	}
}

// TestAgentRefusesADisruptiveActionOutsideItsNodeMaintenance: a pending
// reboot whose NodeMaintenance does not hold the node at this moment
// (draining again, or the node uncordoned from outside) waits: nothing
// runs, nothing is recorded, the agent looks again with backoff. One that
// no NodeMaintenance can ever authorize (the object holds another node) is
// refused: the refusal and its reason are the action's outcome in the
// timeline. With the object Ready and the node cordoned, the reboot runs.
func TestAgentRefusesADisruptiveActionOutsideItsNodeMaintenance(t *testing.T) {
	nr := testRepair("gpu-1", repairv1.ActionReboot)
	nr.Status.MaintenanceName = "repair-r"
	nm := holding("gpufleet-system", "repair-r", repairv1.RequestorID, "gpu-1", maintenancev1.PhaseDraining)
	exec := &recordingExecutor{}
	a := newTestAgent(t, "gpu-1", exec, nil, nr, testobj.Node("gpu-1", testobj.Unschedulable()), &nm)
	a.Namespace = "gpufleet-system"
	if err := reconcileRepair(t, a, repairName); err == nil || !strings.Contains(err.Error(), "does not hold the node at this moment (phase Draining)") {
		t.Fatalf("a reboot while its NodeMaintenance drains: %v, want a wait", err)
	}
	if got := getRepair(t, a); len(exec.calls) != 0 || len(got.Status.Timeline) != len(nr.Status.Timeline) || got.Status.Pending == nil {
		t.Fatalf("waiting: ran %v, timeline %+v, pending %+v", exec.calls, got.Status.Timeline, got.Status.Pending)
	}
	// Gone, and another node's in its place: nothing can authorize it.
	other := &maintenancev1.NodeMaintenance{}
	if err := a.Client.(clientAPI).Get(t.Context(), types.NamespacedName{Namespace: "gpufleet-system", Name: "repair-r"}, other); err != nil {
		t.Fatal(err)
	}
	if err := a.Client.(clientAPI).Delete(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	wrong := holding("gpufleet-system", "repair-r", repairv1.RequestorID, "gpu-2", maintenancev1.PhaseReady)
	if err := a.Client.(clientAPI).Create(t.Context(), &wrong); err != nil {
		t.Fatal(err)
	}
	if err := reconcileRepair(t, a, repairName); err != nil {
		t.Fatal(err)
	}
	if len(exec.calls) != 0 {
		t.Fatalf("ran %v while the node is not held", exec.calls)
	}
	got := getRepair(t, a)
	last := got.Status.Timeline[len(got.Status.Timeline)-1]
	if last.Step != "Reboot" || last.Outcome != "Refused" || !strings.Contains(last.Message, "NodeMaintenance repair-r not found for node gpu-1") || got.Status.Pending != nil {
		t.Fatalf("timeline %+v, pending %+v", got.Status.Timeline, got.Status.Pending)
	}

	// The repair asks again once its object is Ready: the reboot runs.
	ready := holding("gpufleet-system", "repair-r", repairv1.RequestorID, "gpu-1", maintenancev1.PhaseReady)
	stored := &maintenancev1.NodeMaintenance{}
	if err := a.Client.(clientAPI).Get(t.Context(), types.NamespacedName{Namespace: "gpufleet-system", Name: "repair-r"}, stored); err != nil {
		t.Fatal(err)
	}
	stored.Spec.NodeName, stored.Status = "gpu-1", ready.Status
	if err := a.Client.(clientAPI).Update(t.Context(), stored); err != nil {
		t.Fatal(err)
	}
	got.Status.Pending = &repairv1.PendingAction{Action: repairv1.ActionReboot, RequestedAt: metav1.NewTime(agentNow)}
	if err := a.Client.(clientAPI).Status().Update(t.Context(), got); err != nil {
		t.Fatal(err)
	}
	if err := reconcileRepair(t, a, repairName); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"gpu-1 Reboot"}, exec.calls); diff != "" {
		t.Errorf("executor calls (-want +got):\n%s", diff)
	}
}
