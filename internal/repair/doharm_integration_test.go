package repair_test

// What a repair never does to the jobs it is there to protect, on the
// local cluster (real API server, kwok nodes, the operator with the
// simulated agent): no reboot while pods it would end run un-evicted
// before the drain's timeout; no GPU that failed after a reboot given out
// again by a device plugin; no wait of the ladder without a bound; no
// endless repairs of a fault that keeps coming back; no workload taken for
// the GPU stack; no NodeRepair kept for ever.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// patchPolicy merge-patches the test policy's spec (JSON: the fields as a
// user writes them).
func patchPolicy(t *testing.T, spec string) {
	t.Helper()
	p := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: "test"}}
	if err := env.Kube.Patch(t.Context(), p, client.RawPatch(types.MergePatchType, []byte(`{"spec":`+spec+`}`))); err != nil {
		t.Fatal(err)
	}
}

// jobPod creates a bare pod on node (no controller) with the /dev/shm
// emptyDir of a PyTorch job: what kubectl's drain rules refuse without
// force and deleteEmptyDir. Deleted at the end.
func jobPod(t *testing.T, name, node string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{"app": "doharm-job"}},
		Spec: corev1.PodSpec{NodeName: node, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/train:1", VolumeMounts: []corev1.VolumeMount{{Name: "shm", MountPath: "/dev/shm"}}}},
			Volumes:    []corev1.Volume{{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}}}}}
	if err := env.Kube.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
}

// podRunning reports whether the pod exists and is not being deleted.
func podRunning(ctx context.Context, name string) bool {
	p, err := env.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
	return err == nil && p.DeletionTimestamp == nil
}

// rebootAsked reports whether node's repair has asked for its reboot.
func rebootAsked(ctx context.Context, node string) bool {
	var list repairv1.NodeRepairList
	if err := env.Kube.List(ctx, &list); err != nil {
		return false
	}
	for _, r := range list.Items {
		if r.Spec.NodeName == node && (r.Status.RebootRequestedAt != nil || strings.Contains(timelineSteps(&r), "Reboot:")) {
			return true
		}
	}
	return false
}

// TestARebootEvictsWhatItWouldEndAnyway: two nodes of two pools repaired
// at once, each running a bare pod with a /dev/shm emptyDir (kubectl's
// drain refuses both without force and deleteEmptyDir). With the policy's
// default drain, each pod is evicted — its grace period, its budget —
// before its node's reboot is asked for; never rebooted under it. The
// operator is restarted between the NodeMaintenance's creation and the
// reboot: the new one goes on from the status.
func TestARebootEvictsWhatItWouldEndAnyway(t *testing.T) {
	devtest.NeedCluster(t)
	first := startStoppable(t, nil, "maintenance", "repair")
	policy(t, true, roRule)
	patchPolicy(t, `{"maxParallelPools":2}`)
	nodes := map[string]string{"a-1": "job-a-1", "b-1": "job-b-1"}
	for node, pod := range nodes {
		jobPod(t, pod, node)
	}
	stop := devtest.CheckWhile(t, func(ctx context.Context) string {
		for node, pod := range nodes {
			if rebootAsked(ctx, node) && podRunning(ctx, pod) {
				return fmt.Sprintf("the reboot of %s was asked for while pod %s still ran un-evicted", node, pod)
			}
		}
		return ""
	})
	for node := range nodes {
		fault(t, node, "ReadonlyFilesystem", string(repairv1.ActionReboot))
	}
	devtest.WaitFor(t, "both repairs holding their nodes through NodeMaintenance", 30*time.Second, func(ctx context.Context) (bool, string) {
		var list repairv1.NodeRepairList
		if err := env.Kube.List(ctx, &list); err != nil {
			return false, err.Error()
		}
		held := 0
		for _, r := range list.Items {
			if r.Status.MaintenanceName != "" {
				held++
			}
		}
		return held == len(nodes), fmt.Sprintf("%d of %d", held, len(nodes))
	})
	first()
	startOperator(t)
	for node, pod := range nodes {
		r := repairOf(t, node, repairv1.PhaseSucceeded, 90*time.Second)
		if steps := timelineSteps(r); strings.Contains(steps, "DrainTimedOut") || !strings.Contains(steps, "Reboot:Succeeded") {
			t.Errorf("%s: timeline %q, want a finished drain, then the reboot", node, steps)
		}
		if podRunning(t.Context(), pod) {
			t.Errorf("%s: pod %s still runs after its node's reboot", node, pod)
		}
	}
	stop()
}

// TestARefusedDrainHoldsTheRebootUntilItsTimeout: a policy that forbids
// evicting bare and emptyDir pods (force and deleteEmptyDir false): the
// drain is refused at once, and that is no timeout. The repair holds —
// its message says what refuses the drain — and reboots only once the
// drain's timeout has passed (the documented licence to go on without a
// finished drain).
func TestARefusedDrainHoldsTheRebootUntilItsTimeout(t *testing.T) {
	startOperator(t)
	policy(t, true, roRule)
	const timeout = 8 * time.Second
	patchPolicy(t, fmt.Sprintf(`{"drain":{"force":false,"deleteEmptyDir":false,"timeoutSeconds":%d}}`, int(timeout/time.Second)))
	const node = "a-2"
	jobPod(t, "job-a-2", node)
	fault(t, node, "ReadonlyFilesystem", string(repairv1.ActionReboot))
	devtest.WaitFor(t, "the repair saying its drain is refused", 30*time.Second, func(ctx context.Context) (bool, string) {
		var list repairv1.NodeRepairList
		if err := env.Kube.List(ctx, &list); err != nil {
			return false, err.Error()
		}
		for _, r := range list.Items {
			if r.Spec.NodeName == node && strings.Contains(r.Status.Message, "cannot drain node "+node) && strings.Contains(r.Status.Message, "local storage") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", list.Items)
	})
	r := repairOf(t, node, repairv1.PhaseSucceeded, 60*time.Second)
	var requested time.Time
	for _, e := range r.Status.Timeline {
		if e.Step == "Maintenance" && e.Outcome == "Requested" {
			requested = e.Time.Time
		}
	}
	if requested.IsZero() || r.Status.RebootRequestedAt == nil {
		t.Fatalf("timeline %q: no maintenance request or no reboot", timelineSteps(r))
	}
	if waited := r.Status.RebootRequestedAt.Sub(requested); waited < timeout {
		t.Errorf("rebooted %s after its NodeMaintenance was requested, before the drain's timeout %s: the refusal was taken for a timeout", waited, timeout)
	}
	if !strings.Contains(timelineSteps(r), "Maintenance:DrainTimedOut") {
		t.Errorf("timeline %q, want the drain's timeout recorded", timelineSteps(r))
	}
}

// TestAGPUThatFailsAfterTheRebootStaysOutOfService: a GPU that no reset
// nor reboot mends (it fails its validation after both) on two nodes at
// once. On a DRA node its DeviceTaintRule keeps it out of service, and the
// node goes back to work. On a node whose GPUs only the device plugin gives
// out, the plugin started afresh by the reboot would give it out again:
// the repair ends RecoveryFailed and keeps its NodeMaintenance, so the node
// stays cordoned, and says so, until a person deletes it.
func TestAGPUThatFailsAfterTheRebootStaysOutOfService(t *testing.T) {
	devtest.NeedCluster(t)
	const dp, dra, gpu = "dp-3", "b-2", 2
	devicePluginNode(t, dp)
	for _, n := range []string{dp, dra} {
		cleanGPUs(t, n)
	}
	startOperator(t)
	maintenanceConfig(t, `{"maxParallelOperations":2}`)
	gpuPolicy(t, func(s *repairv1.NodeRepairPolicySpec) {
		s.MaxParallelPools = ptr.To[int32](2)
		// After a reboot a failing GPU is tried again until the bound.
		s.GPU.Validation = &repairv1.GPUValidation{Level: repairv1.GPUValidationHealth, TimeoutSeconds: 10}
	})
	for _, n := range []string{dp, dra} {
		if err := env.SetGPUState(t.Context(), n, gpu, func(g *devcluster.SimGPUState) { g.FailsValidation, g.Broken = true, true }); err != nil {
			t.Fatal(err)
		}
		if err := env.InjectXID(t.Context(), n, gpu, 48); err != nil {
			t.Fatal(err)
		}
	}
	onDP := repairOf(t, dp, repairv1.PhaseRecoveryFailed, 180*time.Second)
	onDRA := repairOf(t, dra, repairv1.PhaseRecoveryFailed, 180*time.Second)
	for _, r := range []*repairv1.NodeRepair{onDP, onDRA} {
		if steps := timelineSteps(r); !strings.Contains(steps, "Reboot:Succeeded") || !strings.Contains(steps, "ValidateGPU:Failed") {
			t.Errorf("%s: timeline %q, want the validation to fail after the reboot", r.Spec.NodeName, steps)
		}
	}
	if !strings.Contains(onDP.Status.Message, "stays cordoned") || onDP.Status.MaintenanceName == "" {
		t.Errorf("device-plugin node: message %q, maintenance %q; want the node kept cordoned and the reason", onDP.Status.Message, onDP.Status.MaintenanceName)
	}
	time.Sleep(3 * time.Second) // anything that would release it has had its chance
	n, err := env.Client.CoreV1().Nodes().Get(t.Context(), dp, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Spec.Unschedulable {
		t.Errorf("device-plugin node %s schedulable after its GPU failed its validation after the reboot: the device plugin gives it out again", dp)
	}
	held := &maintenancev1.NodeMaintenance{}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: onDP.Status.MaintenanceName}, held); err != nil {
		t.Fatalf("the NodeMaintenance that holds %s: %v", dp, err)
	}
	devtest.WaitFor(t, "the DRA node back to work, its GPU still isolated", 20*time.Second, func(ctx context.Context) (bool, string) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, dra, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		rule := &resourcev1.DeviceTaintRule{}
		ruleErr := env.Kube.Get(ctx, types.NamespacedName{Name: "gpufleet-" + agent.GPUFaultName(dra, devcluster.SimGPU(dra, gpu).PCIBusID)}, rule)
		return !n.Spec.Unschedulable && ruleErr == nil, fmt.Sprintf("unschedulable %t, rule %v", n.Spec.Unschedulable, ruleErr)
	})

	// A person replaced the GPU and releases the node.
	if err := env.Kube.Delete(t.Context(), held); err != nil {
		t.Fatal(err)
	}
	devtest.WaitFor(t, "the node released by its NodeMaintenance's deletion", 20*time.Second, func(ctx context.Context) (bool, string) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, dp, metav1.GetOptions{})
		return err == nil && !n.Spec.Unschedulable, fmt.Sprint(err)
	})
}

// maintenanceConfig writes the operator's MaintenanceOperatorConfig (as
// JSON spec), removed at the end.
func maintenanceConfig(t *testing.T, spec string) {
	t.Helper()
	cfg := &maintenancev1.MaintenanceOperatorConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
	if err := env.Kube.Create(t.Context(), cfg); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), cfg) })
	if err := env.Kube.Patch(t.Context(), cfg, client.RawPatch(types.MergePatchType, []byte(`{"spec":`+spec+`}`))); err != nil {
		t.Fatal(err)
	}
}

// heldRepair waits for node's repair to name its NodeMaintenance.
func heldRepair(t *testing.T, node string) *repairv1.NodeRepair {
	t.Helper()
	var got *repairv1.NodeRepair
	devtest.WaitFor(t, "the repair of "+node+" asking for its NodeMaintenance", 30*time.Second, func(ctx context.Context) (bool, string) {
		var list repairv1.NodeRepairList
		if err := env.Kube.List(ctx, &list); err != nil {
			return false, err.Error()
		}
		for i := range list.Items {
			if r := &list.Items[i]; r.Spec.NodeName == node && r.Status.MaintenanceName != "" {
				got = r
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", list.Items)
	})
	return got
}

// TestARepairWhoseNodeMaintenanceGoesAwayEnds: the cluster's limits hold
// the repair's NodeMaintenance Pending (maxParallelOperations 0); someone
// deletes it. The repair does not wait for ever (its pool would stay
// blocked): it ends RecoveryFailed and says why.
func TestARepairWhoseNodeMaintenanceGoesAwayEnds(t *testing.T) {
	startOperator(t)
	maintenanceConfig(t, `{"maxParallelOperations":0}`)
	policy(t, true, roRule)
	const node = "a-0"
	fault(t, node, "ReadonlyFilesystem", string(repairv1.ActionReboot))
	r := heldRepair(t, node)
	// Once the repair has seen its NodeMaintenance wait (its own view has
	// caught up with its request), someone deletes the request.
	devtest.WaitFor(t, "the repair waiting for its NodeMaintenance", 20*time.Second, func(ctx context.Context) (bool, string) {
		got := &repairv1.NodeRepair{}
		if err := env.Kube.Get(ctx, types.NamespacedName{Name: r.Name}, got); err != nil {
			return false, err.Error()
		}
		return strings.Contains(got.Status.Message, "maxParallelOperations is 0"), got.Status.Message
	})
	nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: r.Status.MaintenanceName}}
	if err := env.Kube.Delete(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	failed := repairOf(t, node, repairv1.PhaseRecoveryFailed, 30*time.Second)
	if !strings.Contains(failed.Status.Message, "was deleted") {
		t.Errorf("message %q, want the NodeMaintenance's deletion named", failed.Status.Message)
	}
}

// TestARepairWhoseNodeMaintenanceNeverHoldsTheNodeEnds: the repair's
// NodeMaintenance stays Pending (maxParallelOperations 0) for longer than
// the policy's maintenanceTimeoutSeconds (default 1 h) plus its drain's
// timeout, on the operator's clock: the repair ends RecoveryFailed, its
// request released, its message saying what it waited for.
func TestARepairWhoseNodeMaintenanceNeverHoldsTheNodeEnds(t *testing.T) {
	devtest.NeedCluster(t)
	fake := clocktesting.NewFakeClock(time.Now())
	startStoppable(t, fake, "maintenance", "repair")
	maintenanceConfig(t, `{"maxParallelOperations":0}`)
	policy(t, true, roRule)
	const node = "b-0"
	fault(t, node, "ReadonlyFilesystem", string(repairv1.ActionReboot))
	time.Sleep(500 * time.Millisecond)
	fake.Step(3 * time.Second) // past the rule's threshold
	poke(t, node)
	started := repairOf(t, node, repairv1.PhaseRepairing, 30*time.Second)
	fake.Step(3 * time.Second) // past the verification window before the reboot rung
	lookAgain(t, started.Name)
	r := heldRepair(t, node)
	fake.Step(2 * time.Hour)
	lookAgain(t, r.Name)
	failed := repairOf(t, node, repairv1.PhaseRecoveryFailed, 30*time.Second)
	if !strings.Contains(failed.Status.Message, "did not hold node "+node+" within") || !strings.Contains(failed.Status.Message, "Pending") {
		t.Errorf("message %q, want the bound and what the NodeMaintenance waited for", failed.Status.Message)
	}
	devtest.WaitFor(t, "the repair's NodeMaintenance released", 20*time.Second, func(ctx context.Context) (bool, string) {
		err := env.Kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: r.Status.MaintenanceName}, &maintenancev1.NodeMaintenance{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// lookAgain makes the repair controller look at a repair again (its own
// requeues wait in real time; the test's clock moved).
func lookAgain(t *testing.T, name string) {
	t.Helper()
	nr := &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: name}}
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{"test.gpufleet.dev/look":"%d"}}}`, time.Now().UnixNano())
	if err := env.Kube.Patch(t.Context(), nr, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

// poke makes the detector look at node again (a label change passes its
// filter).
func poke(t *testing.T, node string) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{"test.gpufleet.dev/poke":"%d"}}}`, time.Now().UnixNano())
	if _, err := env.Client.CoreV1().Nodes().Patch(t.Context(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
}

// failingReboot is a host whose reboot command fails.
type failingReboot struct{ devcluster.SimExecutor }

func (f failingReboot) Execute(ctx context.Context, node *corev1.Node, a repairv1.Action, gpus []repairv1.GPURef) error {
	if a == repairv1.ActionReboot {
		return errors.New("systemctl reboot: Failed to talk to init daemon")
	}
	return f.SimExecutor.Execute(ctx, node, a, gpus)
}

// TestARebootThatFailsEndsTheRepairAtOnce: the agent's reboot command
// fails: there is no new boot to wait for, and the repair ends at once
// (RecoveryFailed, the reason, the node released) instead of keeping the
// node cordoned and drained for the whole reboot timeout.
func TestARebootThatFailsEndsTheRepairAtOnce(t *testing.T) {
	devtest.NeedCluster(t)
	devtest.StartOperator(t, env.OperatorConfig, operator.Options{Namespace: ns, Capabilities: []string{"maintenance", "repair"}},
		func(mgr manager.Manager) error {
			return devcluster.AddInProcessAgent(mgr, failingReboot{devcluster.SimExecutor{Cluster: env.Cluster, RebootDowntime: time.Second}}, nil)
		})
	policy(t, true, roRule)
	const node = "b-1"
	fault(t, node, "ReadonlyFilesystem", string(repairv1.ActionReboot))
	failed := repairOf(t, node, repairv1.PhaseRecoveryFailed, 45*time.Second)
	if !strings.Contains(failed.Status.Message, "Failed to talk to init daemon") {
		t.Errorf("message %q, want the reboot's failure", failed.Status.Message)
	}
	devtest.WaitFor(t, "the node released", 20*time.Second, func(ctx context.Context) (bool, string) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && !n.Spec.Unschedulable, fmt.Sprint(err)
	})
}

// TestARecurringFaultIsNotRepairedForever: a fault that each repair clears
// and that comes back (NTP, mended by a restart) is repaired twice; the
// third time within the window (repairAfter's default: 3 within 24 h) the
// repair runs nothing and ends RecoveryFailed with a recommendation, on
// the node (label, annotation) and in a Warning event; once the fault
// clears, the node's state lifts.
func TestARecurringFaultIsNotRepairedForever(t *testing.T) {
	startOperator(t)
	policy(t, true, ntpRule)
	const node = "a-1"
	for i := range 2 {
		fault(t, node, "NTPProblem", string(repairv1.ActionRestartNTP))
		devtest.WaitFor(t, fmt.Sprintf("repair %d of the recurring fault", i+1), 30*time.Second, func(ctx context.Context) (bool, string) {
			var list repairv1.NodeRepairList
			if err := env.Kube.List(ctx, &list); err != nil {
				return false, err.Error()
			}
			done := 0
			for _, r := range list.Items {
				if r.Spec.NodeName == node && r.Status.Phase == repairv1.PhaseSucceeded {
					done++
				}
			}
			return done == i+1, fmt.Sprintf("%d succeeded", done)
		})
		time.Sleep(1100 * time.Millisecond) // each repair has its own name (its creation second)
	}
	fault(t, node, "NTPProblem", string(repairv1.ActionRestartNTP))
	failed := repairOf(t, node, repairv1.PhaseRecoveryFailed, 30*time.Second)
	if !strings.Contains(failed.Status.Message, "came back 3 times") || strings.Contains(timelineSteps(failed), "RestartNTP") {
		t.Errorf("third repair: message %q, timeline %q; want a recommendation and no action", failed.Status.Message, timelineSteps(failed))
	}
	devtest.WaitFor(t, "the recommendation on the node", 10*time.Second, func(ctx context.Context) (bool, string) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return n.Labels["repair.gpufleet.dev/state"] == string(repairv1.PhaseRecoveryFailed) && strings.Contains(n.Annotations["repair.gpufleet.dev/recommendation"], "came back"),
			fmt.Sprintf("labels %v annotations %v", n.Labels, n.Annotations)
	})
	if evs := nodeEvents(t, node, "NodeRepairFailed"); !strings.Contains(evs, "NodeRepairFailed") {
		t.Errorf("no Warning NodeRepairFailed: %s", evs)
	}
	if err := env.ClearNodeCondition(t.Context(), node, "NTPProblem"); err != nil {
		t.Fatal(err)
	}
	devtest.WaitFor(t, "the node's state lifted once the fault cleared", 20*time.Second, func(ctx context.Context) (bool, string) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && n.Labels["repair.gpufleet.dev/state"] == "", fmt.Sprint(err)
	})
}

// TestABroadStackPodsSelectorNeverEvictsAWorkload: a policy whose
// gpu.stackPods selector matches far more than the GPU stack (every pod
// with an "app" label) and a rule that restarts the stack: the restart
// never evicts a workload — here a bare training pod with such a label.
func TestABroadStackPodsSelectorNeverEvictsAWorkload(t *testing.T) {
	startOperator(t)
	rule := repairv1.Rule{Name: "stack-stuck", ConditionType: "NTPProblem", Status: "True", ThresholdSeconds: 1,
		Actions: []repairv1.Action{repairv1.ActionRestartGPUStackPods}}
	policy(t, true, rule)
	patchPolicy(t, `{"gpu":{"stackPods":[{"matchExpressions":[{"key":"app","operator":"Exists"}]}]}}`)
	const node = "b-2"
	jobPod(t, "job-b-2", node)
	fault(t, node, "NTPProblem", "")
	r := repairOf(t, node, repairv1.PhaseRecoveryFailed, 45*time.Second)
	if !strings.Contains(timelineSteps(r), "RestartGPUStackPods:") {
		t.Fatalf("timeline %q: the stack restart did not run", timelineSteps(r))
	}
	if !podRunning(t.Context(), "job-b-2") {
		t.Errorf("the stack restart evicted the training pod job-b-2 (timeline %q)", timelineSteps(r))
	}
}

// TestFinishedRepairsArePrunedPastTheHistoryLimit: a node with twelve
// finished repairs: while repairAfter's window (24 h) counts them, all
// stay; once it no longer does (on the operator's clock), the detector
// keeps the newest historyLimit (default 10) and deletes the others.
func TestFinishedRepairsArePrunedPastTheHistoryLimit(t *testing.T) {
	devtest.NeedCluster(t)
	policy(t, true, ntpRule)
	const node, total = "a-2", 12
	for i := range total {
		nr := &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-old-%02d", node, i)},
			Spec: repairv1.NodeRepairSpec{NodeName: node, Pool: "a", Policy: "test", Actions: []repairv1.Action{repairv1.ActionRestartNTP},
				Fault: repairv1.Fault{Rule: ntpRule.Name, ConditionType: "NTPProblem", Status: "True", Since: metav1.Now()}}}
		if err := env.Kube.Create(t.Context(), nr); err != nil {
			t.Fatal(err)
		}
		nr.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseSucceeded, Message: "fault cleared"}
		if err := env.Kube.Status().Update(t.Context(), nr); err != nil {
			t.Fatal(err)
		}
	}
	count := func(ctx context.Context) (int, []string) {
		var list repairv1.NodeRepairList
		_ = env.Kube.List(ctx, &list)
		var names []string
		for _, r := range list.Items {
			if r.Spec.NodeName == node {
				names = append(names, r.Name)
			}
		}
		return len(names), names
	}
	fake := clocktesting.NewFakeClock(time.Now())
	startStoppable(t, fake, "repair")
	poke(t, node)
	time.Sleep(2 * time.Second)
	if n, names := count(t.Context()); n != total {
		t.Fatalf("%d repairs of %s within repairAfter's window, want all %d: %v", n, node, total, names)
	}
	fake.Step(25 * time.Hour)
	poke(t, node)
	devtest.WaitFor(t, "the oldest repairs pruned", 20*time.Second, func(ctx context.Context) (bool, string) {
		n, names := count(ctx)
		return n == 10, strings.Join(names, ",")
	})
	_, names := count(t.Context())
	for _, gone := range []string{node + "-old-00", node + "-old-01"} {
		for _, n := range names {
			if n == gone {
				t.Errorf("kept %s, one of the two oldest: %v", gone, names)
			}
		}
	}
}

// recordingHost records the actions it runs on top of the simulation.
type recordingHost struct {
	devcluster.SimExecutor
	ran chan repairv1.Action
}

func (h recordingHost) Execute(ctx context.Context, node *corev1.Node, a repairv1.Action, gpus []repairv1.GPURef) error {
	h.ran <- a
	return h.SimExecutor.Execute(ctx, node, a, gpus)
}

// TestTheAgentNeverRebootsANodeUncordonedFromOutside: the node agent, with
// its own RBAC identity, finds a pending reboot inside a Ready
// NodeMaintenance of the repair — but the node is schedulable (someone
// uncordoned it; pods may already have landed). It does not reboot, and
// records nothing: it waits. Once the node is cordoned again, the reboot
// runs.
func TestTheAgentNeverRebootsANodeUncordonedFromOutside(t *testing.T) {
	devtest.NeedCluster(t)
	const node = "b-0"
	devtest.InstallAgentRBAC(t, env.Kube)
	host := recordingHost{SimExecutor: devcluster.SimExecutor{Cluster: env.Cluster, RebootDowntime: time.Second}, ran: make(chan repairv1.Action, 4)}
	startAgent(t, agent.Options{NodeName: node, Namespace: ns, Executor: host})
	t.Cleanup(func() {
		patch := []byte(`{"spec":{"unschedulable":false}}`)
		_, _ = env.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{})
	})

	// The repair's NodeMaintenance, Ready (as the lifecycle leaves it);
	// the node uncordoned from outside since.
	nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "repair-agent-b-0"},
		Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: repairv1.RequestorID, NodeName: node}}
	if err := env.Kube.Create(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), nm) })
	nm.Status.Conditions = []metav1.Condition{{Type: maintenancev1.ConditionTypeReady, Status: metav1.ConditionTrue,
		Reason: string(maintenancev1.PhaseReady), Message: "node is ready for maintenance", LastTransitionTime: metav1.Now()}}
	if err := env.Kube.Status().Update(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	r := &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: "agent-reboot-b-0"},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Policy: "none", Actions: []repairv1.Action{repairv1.ActionReboot},
			Fault: repairv1.Fault{Rule: "readonly-filesystem", ConditionType: "ReadonlyFilesystem", Status: "True", Since: metav1.Now()}}}
	if err := env.Kube.Create(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), r) })
	r.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, MaintenanceName: nm.Name,
		Pending: &repairv1.PendingAction{Action: repairv1.ActionReboot, RequestedAt: metav1.Now()}}
	if err := env.Kube.Status().Update(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-host.ran:
		t.Fatalf("the agent ran %s on node %s, schedulable again", a, node)
	case <-time.After(4 * time.Second):
	}
	if err := env.Kube.Get(t.Context(), client.ObjectKeyFromObject(r), r); err != nil {
		t.Fatal(err)
	}
	if r.Status.Pending == nil || len(r.Status.Timeline) != 0 {
		t.Fatalf("waiting, the agent wrote the repair: pending %+v, timeline %q", r.Status.Pending, timelineSteps(r))
	}

	patch := []byte(`{"spec":{"unschedulable":true}}`)
	cordoned, err := env.Client.CoreV1().Nodes().Patch(t.Context(), node, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-host.ran:
		if a != repairv1.ActionReboot {
			t.Errorf("ran %s, want the reboot", a)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the agent did not reboot the node once it was cordoned again")
	}
	// The simulated reboot ends (the node Ready again) before the agent
	// stops: a reboot cut short leaves the node NotReady for the next test.
	devtest.WaitFor(t, "node "+node+" Ready after the reboot", 30*time.Second, func(ctx context.Context) (bool, string) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if n.Status.NodeInfo.BootID == cordoned.Status.NodeInfo.BootID {
			return false, "not rebooted yet"
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, c.Message
			}
		}
		return false, "no Ready condition"
	})
}
