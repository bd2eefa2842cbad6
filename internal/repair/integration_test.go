package repair_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/operator"
	"github.com/gpufleet/gpufleet/internal/repair"
)

const ns = "gpufleet-system"

var env *devcluster.Env

func TestMain(m *testing.M) {
	var specs []devcluster.NodeSpec
	for _, pool := range []string{"a", "b"} {
		for i := range 3 {
			specs = append(specs, devcluster.NodeSpec{Name: fmt.Sprintf("%s-%d", pool, i), Pool: pool, GPUs: 8})
		}
	}
	scheme, err := operator.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(devtest.Main(m, specs, ns, scheme, func(e *devcluster.Env) { env = e }))
}

// startOperator runs maintenance and repair with the simulated agent.
func startOperator(t *testing.T) {
	t.Helper()
	devtest.NeedCluster(t)
	startStoppable(t, nil, "maintenance", "repair")
}

// policy creates a NodeRepairPolicy with fast rules; removed at cleanup
// together with every NodeRepair and injected fault.
func policy(t *testing.T, allowReboot bool, rules ...repairv1.Rule) {
	t.Helper()
	p := &repairv1.NodeRepairPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "test"},
		Spec:       repairv1.NodeRepairPolicySpec{AllowReboot: allowReboot, Rules: rules, VerificationSeconds: ptr.To[int32](2)},
	}
	// The previous test's operator may have created a repair between its
	// cleanup's DeleteAllOf and its own stop (from a cache that still held
	// the deleted policy); no operator acts without a policy, so nothing
	// is created between this delete and the Create below.
	if err := env.Kube.DeleteAllOf(t.Context(), &repairv1.NodeRepair{}); err != nil {
		t.Fatal(err)
	}
	if err := env.Kube.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = env.Kube.Delete(ctx, p)
		_ = env.Kube.DeleteAllOf(ctx, &repairv1.NodeRepair{})
		for _, pool := range []string{"a", "b"} {
			for i := range 3 {
				name := fmt.Sprintf("%s-%d", pool, i)
				for _, c := range []corev1.NodeConditionType{"NTPProblem", "ReadonlyFilesystem"} {
					_ = env.ClearNodeCondition(ctx, name, c)
				}
				patch := `{"metadata":{"labels":{"repair.gpufleet.dev/state":null},"annotations":{"sim.gpufleet.dev/fixed-by":null,"repair.gpufleet.dev/faults-since":null}},"spec":{"unschedulable":false}}`
				_, _ = env.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			}
		}
	})
}

func fault(t *testing.T, node string, typ corev1.NodeConditionType, fixedBy string) {
	t.Helper()
	if fixedBy != "" {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, devcluster.AnnotationFixedBy, fixedBy)
		if _, err := env.Client.CoreV1().Nodes().Patch(t.Context(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.SetNodeCondition(t.Context(), node, corev1.NodeCondition{Type: typ, Status: corev1.ConditionTrue, Reason: "Injected"}); err != nil {
		t.Fatal(err)
	}
}

// repairOf waits for the node's NodeRepair to reach phase.
func repairOf(t *testing.T, node string, phase repairv1.Phase, timeout time.Duration) *repairv1.NodeRepair {
	t.Helper()
	var got *repairv1.NodeRepair
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var list repairv1.NodeRepairList
		if err := env.Kube.List(ctx, &list); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		for i := range list.Items {
			if list.Items[i].Spec.NodeName == node && list.Items[i].Status.Phase == phase {
				got = &list.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		var list repairv1.NodeRepairList
		_ = env.Kube.List(context.Background(), &list)
		t.Fatalf("no %s repair of %s; repairs: %+v", phase, node, list.Items)
	}
	return got
}

func timelineSteps(r *repairv1.NodeRepair) string {
	var s []string
	for _, e := range r.Status.Timeline {
		s = append(s, e.Step+":"+e.Outcome)
	}
	return strings.Join(s, " ")
}

// nodeEvents returns the reasons of the events about node, waiting up to
// 10 s for the reasons in want (events are recorded after the status
// writes the tests wait for).
func nodeEvents(t *testing.T, node string, want ...string) string {
	t.Helper()
	var out string
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := env.Client.EventsV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + node})
		if err != nil {
			return false, err
		}
		reasons := make([]string, 0, len(evs.Items))
		for _, e := range evs.Items {
			reasons = append(reasons, e.Reason)
		}
		out = strings.Join(reasons, ",")
		for _, w := range want {
			if !slices.Contains(reasons, w) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil && !wait.Interrupted(err) {
		t.Fatal(err)
	}
	return out
}

var ntpRule = repairv1.Rule{Name: "ntp-problem", ConditionType: "NTPProblem", Status: "True", ThresholdSeconds: 2,
	Actions: []repairv1.Action{repairv1.ActionRestartNTP}}

var roRule = repairv1.Rule{Name: "readonly-filesystem", ConditionType: "ReadonlyFilesystem", Status: "True", ThresholdSeconds: 2,
	Actions: []repairv1.Action{repairv1.ActionReboot}}

func TestComponentRestartFixesTheFault(t *testing.T) {
	startOperator(t)
	policy(t, true, ntpRule)
	injected := time.Now()
	fault(t, "a-0", "NTPProblem", string(repairv1.ActionRestartNTP))
	// Latency from the threshold crossing to the first action requested.
	var firstAction time.Time
	_ = wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		var list repairv1.NodeRepairList
		if err := env.Kube.List(ctx, &list); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		for _, r := range list.Items {
			if r.Spec.NodeName == "a-0" && (r.Status.Pending != nil || r.Status.NextAction > 0) {
				firstAction = time.Now()
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("first action requested %s after the fault was injected (threshold 2s): %s after the threshold",
		firstAction.Sub(injected).Round(10*time.Millisecond), firstAction.Sub(injected.Add(2*time.Second)).Round(10*time.Millisecond))
	r := repairOf(t, "a-0", repairv1.PhaseSucceeded, 30*time.Second)
	if started := r.CreationTimestamp.Time; started.Before(injected.Add(2*time.Second - time.Second)) {
		t.Errorf("repair created %s after the fault, before its 2s threshold", started.Sub(injected))
	}
	if got := timelineSteps(r); !strings.Contains(got, "RestartNTP:Started RestartNTP:Succeeded") || strings.Contains(got, "Reboot") {
		t.Errorf("timeline %q", got)
	}
	if r.Status.MaintenanceName != "" {
		t.Errorf("a component restart went through NodeMaintenance %s", r.Status.MaintenanceName)
	}
	var nms maintenancev1.NodeMaintenanceList
	_ = env.Kube.List(t.Context(), &nms)
	if len(nms.Items) != 0 {
		t.Errorf("NodeMaintenance created for a component restart")
	}
	if evs := nodeEvents(t, "a-0", repair.ReasonStart, repair.ReasonAction, repair.ReasonSucceed); !strings.Contains(evs, repair.ReasonStart) || !strings.Contains(evs, repair.ReasonAction) || !strings.Contains(evs, repair.ReasonSucceed) {
		t.Errorf("events on the node: %s", evs)
	}
}

// TestGPUServiceRestartsFixTheirFaults: a rule's GPU-stack rungs run
// without a NodeMaintenance: the operator restarts the node's GPU plugin
// pods (RestartGPUStackPods: the DaemonSet starts a new one), the agent
// restarts Fabric Manager, which fixes the fault. On another node with no
// GPU stack pod the rung fails visibly and the ladder goes on.
func TestGPUServiceRestartsFixTheirFaults(t *testing.T) {
	startOperator(t)
	fm := repairv1.Rule{Name: "fabric-manager", ConditionType: repair.ConditionFabricManagerUnhealthy, Status: "True", ThresholdSeconds: 2,
		Actions: []repairv1.Action{repairv1.ActionRestartGPUStackPods, repairv1.ActionRestartFabricManager}}
	policy(t, true, fm)
	t.Cleanup(func() {
		for _, n := range []string{"a-1", "b-1"} {
			_ = env.ClearNodeCondition(context.Background(), n, repair.ConditionFabricManagerUnhealthy)
		}
	})
	plugin := func(node string) *corev1.Pod {
		pods, err := env.Client.CoreV1().Pods(metav1.NamespaceSystem).List(t.Context(), metav1.ListOptions{
			LabelSelector: "dra-driver-nvidia-gpu-component=kubelet-plugin", FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			t.Fatal(err)
		}
		for i := range pods.Items {
			if pods.Items[i].DeletionTimestamp == nil {
				return &pods.Items[i]
			}
		}
		return nil
	}
	var before *corev1.Pod
	_ = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		before = plugin("a-1")
		return before != nil, nil
	})
	if before == nil {
		t.Fatal("no simulated DRA kubelet plugin pod on a-1")
	}
	fault(t, "a-1", repair.ConditionFabricManagerUnhealthy, string(repairv1.ActionRestartFabricManager))
	r := repairOf(t, "a-1", repairv1.PhaseSucceeded, 60*time.Second)
	got := timelineSteps(r)
	if !strings.Contains(got, "RestartGPUStackPods:Succeeded RestartFabricManager:Requested RestartFabricManager:Started RestartFabricManager:Succeeded") {
		t.Errorf("timeline %q", got)
	}
	if r.Status.MaintenanceName != "" || r.Status.GPUMaintenanceName != "" {
		t.Errorf("a service restart went through NodeMaintenance: %q %q", r.Status.MaintenanceName, r.Status.GPUMaintenanceName)
	}
	var after *corev1.Pod
	_ = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		after = plugin("a-1")
		return after != nil && after.UID != before.UID, nil
	})
	if after == nil || after.UID == before.UID {
		t.Errorf("the DRA kubelet plugin pod of a-1 was not restarted")
	}

	// No GPU stack pod matches: the rung fails, the next one runs.
	var p repairv1.NodeRepairPolicy
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Name: "test"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.GPU.StackPods = []metav1.LabelSelector{{MatchLabels: map[string]string{"app": "no-such-plugin"}}}
	if err := env.Kube.Update(t.Context(), &p); err != nil {
		t.Fatal(err)
	}
	fault(t, "b-1", repair.ConditionFabricManagerUnhealthy, string(repairv1.ActionRestartFabricManager))
	r = repairOf(t, "b-1", repairv1.PhaseSucceeded, 60*time.Second)
	if got := timelineSteps(r); !strings.Contains(got, "RestartGPUStackPods:Failed RestartFabricManager:Requested") {
		t.Errorf("timeline without a stack pod %q", got)
	}
	for _, e := range r.Status.Timeline {
		if e.Step == string(repairv1.ActionRestartGPUStackPods) && !strings.Contains(e.Message, "gpu.stackPods") {
			t.Errorf("the failed rung does not say why: %q", e.Message)
		}
	}
}

func TestRebootRepairCordonsDrainsAndReleases(t *testing.T) {
	startOperator(t)
	policy(t, true, roRule)
	before, err := env.Client.CoreV1().Nodes().Get(t.Context(), "a-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Watch that the node is cordoned at some point (through NodeMaintenance).
	cordoned := make(chan bool, 1)
	go func() {
		_ = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			n, err := env.Client.CoreV1().Nodes().Get(ctx, "a-1", metav1.GetOptions{})
			if err == nil && n.Spec.Unschedulable {
				cordoned <- true
				return true, nil
			}
			return false, nil
		})
	}()
	fault(t, "a-1", "ReadonlyFilesystem", string(repairv1.ActionReboot))
	r := repairOf(t, "a-1", repairv1.PhaseSucceeded, 60*time.Second)
	select {
	case <-cordoned:
	case <-time.After(time.Second):
		t.Errorf("the node was never cordoned before its reboot")
	}
	after, _ := env.Client.CoreV1().Nodes().Get(t.Context(), "a-1", metav1.GetOptions{})
	if after.Status.NodeInfo.BootID == before.Status.NodeInfo.BootID || r.Status.BootIDBefore != before.Status.NodeInfo.BootID {
		t.Errorf("boot ID before %s, recorded %s, after %s", before.Status.NodeInfo.BootID, r.Status.BootIDBefore, after.Status.NodeInfo.BootID)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, "a-1", metav1.GetOptions{})
		return err == nil && !n.Spec.Unschedulable && n.Labels[repair.LabelState] == "", nil
	})
	if err != nil {
		t.Errorf("node not uncordoned / still labelled after a successful repair")
	}
	if got := timelineSteps(r); !strings.Contains(got, "Maintenance:Requested") || !strings.Contains(got, "Reboot:Succeeded") {
		t.Errorf("timeline %q", got)
	}
}

func TestFailedRepairSuspendsItsPoolOnly(t *testing.T) {
	startOperator(t)
	policy(t, false, roRule) // the only remedy, a reboot, is not allowed
	fault(t, "a-2", "ReadonlyFilesystem", "")
	failed := repairOf(t, "a-2", repairv1.PhaseRecoveryFailed, 30*time.Second)
	if !strings.Contains(failed.Status.Message, "reboots are not allowed") {
		t.Errorf("message %q", failed.Status.Message)
	}
	// The node's label follows the NodeRepair's final status.
	var n *corev1.Node
	_ = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		n, _ = env.Client.CoreV1().Nodes().Get(ctx, "a-2", metav1.GetOptions{})
		return n != nil && n.Labels[repair.LabelState] == string(repairv1.PhaseRecoveryFailed), nil
	})
	if n == nil {
		n = &corev1.Node{}
	}
	if n.Labels[repair.LabelState] != string(repairv1.PhaseRecoveryFailed) || n.Spec.Unschedulable {
		t.Errorf("failed node: labels %v unschedulable %t", n.Labels, n.Spec.Unschedulable)
	}
	if evs := nodeEvents(t, "a-2", repair.ReasonFailed); !strings.Contains(evs, repair.ReasonFailed) {
		t.Errorf("no %s event: %s", repair.ReasonFailed, evs)
	}
	// Pool a is suspended: a new fault there waits; pool b is still repaired.
	ntpAndRO := repairv1.Rule{Name: "ntp-problem", ConditionType: "NTPProblem", Status: "True", ThresholdSeconds: 1,
		Actions: []repairv1.Action{repairv1.ActionRestartNTP}}
	p := &repairv1.NodeRepairPolicy{}
	if err := env.Kube.Get(t.Context(), client.ObjectKey{Name: "test"}, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Rules = append(p.Spec.Rules, ntpAndRO)
	if err := env.Kube.Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	fault(t, "a-0", "NTPProblem", string(repairv1.ActionRestartNTP))
	fault(t, "b-0", "NTPProblem", string(repairv1.ActionRestartNTP))
	repairOf(t, "b-0", repairv1.PhaseSucceeded, 30*time.Second)
	var list repairv1.NodeRepairList
	_ = env.Kube.List(t.Context(), &list)
	for _, r := range list.Items {
		if r.Spec.NodeName == "a-0" {
			t.Errorf("pool a is suspended, yet a-0 got repair %s (%s)", r.Name, r.Status.Phase)
		}
	}
	if err := env.Kube.Get(t.Context(), client.ObjectKey{Name: "test"}, p); err != nil {
		t.Fatal(err)
	}
	if len(p.Status.SuspendedPools) != 1 || p.Status.SuspendedPools[0].Pool != "a" || p.Status.SuspendedPools[0].Node != "a-2" {
		t.Errorf("suspended pools %+v, want pool a because of a-2", p.Status.SuspendedPools)
	}
	// The fault clears: the suspension lifts and a-0 is repaired.
	if err := env.ClearNodeCondition(t.Context(), "a-2", "ReadonlyFilesystem"); err != nil {
		t.Fatal(err)
	}
	repairOf(t, "a-0", repairv1.PhaseSucceeded, 30*time.Second)
}

func TestDryRunRecordsWithoutActing(t *testing.T) {
	startOperator(t)
	start := time.Now().Add(-time.Second)
	policy(t, true, ntpRule)
	p := &repairv1.NodeRepairPolicy{}
	if err := env.Kube.Get(t.Context(), client.ObjectKey{Name: "test"}, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.DryRun = true
	if err := env.Kube.Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	fault(t, "b-1", "NTPProblem", string(repairv1.ActionRestartNTP))
	r := repairOf(t, "b-1", repairv1.PhaseIgnored, 30*time.Second)
	if !strings.Contains(r.Status.Message, "dry run: would run [RestartNTP]") || strings.Contains(timelineSteps(r), "RestartNTP") {
		t.Errorf("dry run repair: message %q timeline %q", r.Status.Message, timelineSteps(r))
	}
	n, _ := env.Client.CoreV1().Nodes().Get(t.Context(), "b-1", metav1.GetOptions{})
	for _, c := range n.Status.Conditions {
		if c.Type == "NTPProblem" && c.Status != corev1.ConditionTrue {
			t.Errorf("dry run changed the node: %+v", c)
		}
	}
	if evs := nodeEvents(t, "b-1", repair.ReasonStart); !strings.Contains(evs, repair.ReasonStart) {
		t.Errorf("dry run must still report: events %s", evs)
	}
	// The fault persists: it was recorded once and stays recorded once
	// (the defect: a new NodeRepair and NodeRepairStart about every second).
	time.Sleep(5 * time.Second)
	var list repairv1.NodeRepairList
	if err := env.Kube.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Errorf("%d NodeRepairs for one persistent fault in a dry run, want 1", len(list.Items))
	}
	if evs := eventsSince(t, "b-1", start); strings.Count(evs, repair.ReasonStart) != 1 {
		t.Errorf("events %s: want exactly one %s", evs, repair.ReasonStart)
	}
	if l := nodeLabelOf(t, "b-1"); l != "" {
		t.Errorf("a dry run labelled the node %q", l)
	}
}

// eventsSince returns the reasons of the events about node recorded since.
func eventsSince(t *testing.T, node string, since time.Time) string {
	t.Helper()
	evs, err := env.Client.EventsV1().Events("").List(t.Context(), metav1.ListOptions{FieldSelector: "regarding.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, e := range evs.Items {
		if e.EventTime.After(since) {
			reasons = append(reasons, e.Reason)
		}
	}
	return strings.Join(reasons, ",")
}

func nodeLabelOf(t *testing.T, node string) string {
	t.Helper()
	n, err := env.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels[repair.LabelState]
}

// TestIgnoredNodesGetTheIgnoreEventAndNothingElse: nodes held by another
// requestor's NodeMaintenance fault at the same moment as a free node of
// the same pool. Each held node gets one Ignored record and one
// NodeRepairIgnore event and is never acted on; the free node is repaired
// (an ignore record holds no pool).
func TestIgnoredNodesGetTheIgnoreEventAndNothingElse(t *testing.T) {
	startOperator(t)
	start := time.Now().Add(-time.Second)
	policy(t, true, ntpRule)
	cfg := &maintenancev1.MaintenanceOperatorConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"},
		Spec: maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: ptr.To(intstr.FromInt32(10))}}
	if err := env.Kube.Create(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), cfg) })
	held := []string{"a-0", "a-1", "a-2"}
	for _, node := range held {
		nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "human-" + node},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: "human.example.com", NodeName: node, Cordon: ptr.To(false)}}
		if err := env.Kube.Create(t.Context(), nm); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), nm) })
	}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var list maintenancev1.NodeMaintenanceList
		if err := env.Kube.List(ctx, &list, client.InNamespace("default")); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		ready := 0
		for i := range list.Items {
			if list.Items[i].IsReady() {
				ready++
			}
		}
		return ready == len(held), nil
	})
	if err != nil {
		t.Fatal("the human NodeMaintenance objects never became Ready")
	}
	for _, node := range append(slices.Clone(held), "b-0") {
		fault(t, node, "NTPProblem", string(repairv1.ActionRestartNTP))
	}
	repairOf(t, "b-0", repairv1.PhaseSucceeded, 30*time.Second)
	for _, node := range held {
		r := repairOf(t, node, repairv1.PhaseIgnored, 30*time.Second)
		if !strings.Contains(r.Spec.IgnoreReason, "planned maintenance by human.example.com") || r.Status.Pending != nil || r.Status.MaintenanceName != "" {
			t.Errorf("%s: ignore reason %q, pending %v, maintenance %q", node, r.Spec.IgnoreReason, r.Status.Pending, r.Status.MaintenanceName)
		}
	}
	time.Sleep(3 * time.Second) // anything that would wrongly follow has had its chance
	var list repairv1.NodeRepairList
	if err := env.Kube.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	perNode := map[string]int{}
	for _, r := range list.Items {
		perNode[r.Spec.NodeName]++
	}
	for _, node := range held {
		if perNode[node] != 1 {
			t.Errorf("%d NodeRepairs for %s, want 1 ignored record", perNode[node], node)
		}
		nodeEvents(t, node, repair.ReasonIgnore)
		if evs := eventsSince(t, node, start); evs != repair.ReasonIgnore {
			t.Errorf("events of %s: %s; want %s and nothing else", node, evs, repair.ReasonIgnore)
		}
		if l := nodeLabelOf(t, node); l != "" {
			t.Errorf("ignored node %s labelled %q", node, l)
		}
		n, _ := env.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		for _, c := range n.Status.Conditions {
			if c.Type == "NTPProblem" && c.Status != corev1.ConditionTrue {
				t.Errorf("ignored node %s was repaired: %+v", node, c)
			}
		}
	}
}

func TestStormProtection(t *testing.T) {
	startOperator(t)
	policy(t, true, ntpRule)
	p := &repairv1.NodeRepairPolicy{}
	if err := env.Kube.Get(t.Context(), client.ObjectKey{Name: "test"}, p); err != nil {
		t.Fatal(err)
	}
	limit := intstrFrom(1)
	p.Spec.MaxUnhealthy = &limit
	if err := env.Kube.Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	fault(t, "b-0", "NTPProblem", string(repairv1.ActionRestartNTP))
	fault(t, "b-2", "NTPProblem", string(repairv1.ActionRestartNTP))
	var c *metav1.Condition
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := env.Kube.Get(ctx, client.ObjectKey{Name: "test"}, p); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == "RepairsBlocked" && p.Status.Conditions[i].Status == metav1.ConditionTrue {
				c = &p.Status.Conditions[i]
			}
		}
		return c != nil && strings.Contains(c.Message, "storm protection"), nil
	})
	if err != nil {
		t.Fatalf("no storm-protection condition: %+v", p.Status.Conditions)
	}
	var list repairv1.NodeRepairList
	_ = env.Kube.List(t.Context(), &list)
	if len(list.Items) != 0 {
		var which []string
		for _, r := range list.Items {
			which = append(which, fmt.Sprintf("%s (%s, %s)", r.Spec.NodeName, r.Status.Phase, r.CreationTimestamp.Format(time.RFC3339Nano)))
		}
		t.Errorf("repairs started despite 2 unhealthy nodes with maxUnhealthy 1: %d: %v", len(list.Items), which)
	}
}

func TestAdminCordonSurvivesARebootRepair(t *testing.T) {
	startOperator(t)
	policy(t, true, roRule)
	if _, err := env.Client.CoreV1().Nodes().Patch(t.Context(), "b-2", types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	fault(t, "b-2", "ReadonlyFilesystem", string(repairv1.ActionReboot))
	repairOf(t, "b-2", repairv1.PhaseSucceeded, 60*time.Second)
	time.Sleep(time.Second) // the NodeMaintenance's cleanup has run
	if n, _ := env.Client.CoreV1().Nodes().Get(t.Context(), "b-2", metav1.GetOptions{}); !n.Spec.Unschedulable {
		t.Errorf("a node cordoned before the repair was uncordoned by it")
	}
}

func intstrFrom(v int) intstr.IntOrString { return intstr.FromInt32(int32(v)) }

func TestOperatorRestartMidRepairResumes(t *testing.T) {
	devtest.NeedCluster(t)
	// A first operator starts the repair; it is stopped once the node is
	// held for its reboot; a second one finishes. No action runs twice.
	first := startStoppable(t, nil, "maintenance", "repair")
	policy(t, true, roRule)
	fault(t, "a-1", "ReadonlyFilesystem", string(repairv1.ActionReboot))
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var list repairv1.NodeRepairList
		if err := env.Kube.List(ctx, &list); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		for _, r := range list.Items {
			if r.Spec.NodeName == "a-1" && r.Status.MaintenanceName != "" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("repair never reached its maintenance step")
	}
	first()
	startOperator(t)
	r := repairOf(t, "a-1", repairv1.PhaseSucceeded, 60*time.Second)
	starts := strings.Count(timelineSteps(r), "Reboot:Started")
	if starts != 1 {
		t.Errorf("Reboot started %d times: %s", starts, timelineSteps(r))
	}
}

// startStoppable starts an operator (clk nil: the real clock) with the
// simulated agent and returns its stop function (also run at cleanup).
func startStoppable(t *testing.T, clk clock.WithTicker, capabilities ...string) func() {
	t.Helper()
	return startStoppableOn(t, env.OperatorConfig, clk, capabilities...)
}

// startStoppableOn is startStoppable with the operator's client config
// (e.g. one whose requests are counted).
func startStoppableOn(t *testing.T, cfg *rest.Config, clk clock.WithTicker, capabilities ...string) func() {
	t.Helper()
	return devtest.StartOperator(t, cfg, operator.Options{Namespace: ns, Clock: clk, Capabilities: capabilities},
		func(mgr manager.Manager) error {
			return devcluster.AddInProcessAgent(mgr, devcluster.SimExecutor{Cluster: env.Cluster, RebootDowntime: time.Second}, clk)
		})
}

func TestRepairsNeverOverlapAcrossPools(t *testing.T) {
	startOperator(t)
	policy(t, true, roRule)
	stop := devtest.CheckWhile(t, func(ctx context.Context) string {
		var list repairv1.NodeRepairList
		if err := env.Kube.List(ctx, &list); err != nil {
			return ""
		}
		pools := map[string]bool{}
		for _, r := range list.Items {
			if r.Status.Phase == repairv1.PhaseRepairing {
				pools[r.Spec.Pool] = true
			}
		}
		if len(pools) > 1 {
			return fmt.Sprintf("repairs in %d pools at once", len(pools))
		}
		return ""
	})
	fault(t, "a-0", "ReadonlyFilesystem", string(repairv1.ActionReboot))
	fault(t, "b-0", "ReadonlyFilesystem", string(repairv1.ActionReboot))
	repairOf(t, "a-0", repairv1.PhaseSucceeded, 60*time.Second)
	repairOf(t, "b-0", repairv1.PhaseSucceeded, 60*time.Second)
	stop()
}

func TestRebootRepairHonoursPDBAndGoesOnAfterTheDrainTimeout(t *testing.T) {
	startOperator(t)
	policy(t, true, roRule)
	p := &repairv1.NodeRepairPolicy{}
	if err := env.Kube.Get(t.Context(), client.ObjectKey{Name: "test"}, p); err != nil {
		t.Fatal(err)
	}
	// Force is needed to evict a bare pod; without it the drain reports it.
	p.Spec.Drain.TimeoutSeconds, p.Spec.Drain.Force = ptr.To[int32](3), ptr.To(true)
	if err := env.Kube.Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	// A pod on b-1 protected by a PDB that allows no disruption.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "guarded", Labels: map[string]string{"app": "guarded"}},
		Spec:       corev1.PodSpec{NodeName: "b-1", Containers: []corev1.Container{{Name: "main", Image: "registry.example/g:1"}}},
	}
	if _, err := env.Client.CoreV1().Pods("default").Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Pods("default").Delete(context.Background(), "guarded", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "guarded"},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: ptr.To(intstr.FromInt32(0)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}},
	}
	if _, err := env.Client.PolicyV1().PodDisruptionBudgets("default").Create(t.Context(), pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.PolicyV1().PodDisruptionBudgets("default").Delete(context.Background(), "guarded", metav1.DeleteOptions{})
	})
	fault(t, "b-1", "ReadonlyFilesystem", string(repairv1.ActionReboot))
	r := repairOf(t, "b-1", repairv1.PhaseSucceeded, 60*time.Second)
	if got := timelineSteps(r); !strings.Contains(got, "Maintenance:DrainTimedOut") || !strings.Contains(got, "Reboot:Succeeded") {
		t.Errorf("timeline %q: want the drain to time out and the reboot to go on", got)
	}
	// The PDB held: the guarded pod was never evicted.
	got, err := env.Client.CoreV1().Pods("default").Get(t.Context(), "guarded", metav1.GetOptions{})
	if err != nil || got.DeletionTimestamp != nil {
		t.Errorf("the PDB-protected pod was evicted: %v %v", err, got.DeletionTimestamp)
	}
}

// TestDefaultRulesFireAtTheirThreshold drives the default rules with a fake
// clock: injected condition → no repair just before the threshold → the
// repair starts at it, with the rule's actions in order and its events.
func TestDefaultRulesFireAtTheirThreshold(t *testing.T) {
	devtest.NeedCluster(t)
	fake := clocktesting.NewFakeClock(time.Now())
	startStoppable(t, fake, "repair")
	policy(t, true) // no rules: the defaults

	tick := 0
	// poke makes the detector look again (a label change passes its filter).
	poke := func(node string) {
		tick++
		patch := fmt.Sprintf(`{"metadata":{"labels":{"test.gpufleet.dev/tick":"%d"}}}`, tick)
		if _, err := env.Client.CoreV1().Nodes().Patch(t.Context(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	repairsOf := func(node, rule string) []repairv1.NodeRepair {
		var list repairv1.NodeRepairList
		_ = env.Kube.List(t.Context(), &list)
		var out []repairv1.NodeRepair
		for _, r := range list.Items {
			if r.Spec.NodeName == node && r.Spec.Fault.Rule == rule {
				out = append(out, r)
			}
		}
		return out
	}
	for _, rule := range repair.DefaultRules() {
		t.Run(rule.Name, func(t *testing.T) {
			node := "b-0"
			reason := rule.Reason
			if reason == "" {
				reason = "Injected"
			}
			c := corev1.NodeCondition{Type: corev1.NodeConditionType(rule.ConditionType), Status: corev1.ConditionStatus(rule.Status),
				Reason: reason, Message: rule.MessageContains}
			if rule.ConditionType == repairv1.ConditionGPUProblem {
				// The node agent writes this condition from its GPUFault
				// records (the detector waits for them): fault a GPU of
				// the simulated host instead.
				injectGPUFault(t, node, repairv1.GPUFaultClass(rule.Reason))
			} else if err := env.SetNodeCondition(t.Context(), node, c); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if rule.ConditionType == repairv1.ConditionGPUProblem {
					_ = env.ClearSimGPUs(context.Background(), node)
					_ = env.Kube.DeleteAllOf(context.Background(), &repairv1.GPUFault{})
				}
				// Clear the fault first and wait for it to be gone, so that
				// no new repair of it starts while cleaning up.
				_ = env.ClearNodeCondition(context.Background(), node, c.Type)
				_ = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
					n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
					if err != nil {
						return false, nil //nolint:nilerr // keep polling
					}
					for _, x := range n.Status.Conditions {
						if x.Type == c.Type {
							return string(x.Status) != rule.Status || !strings.Contains(x.Message, rule.MessageContains), nil
						}
					}
					return true, nil
				})
				_ = env.Kube.DeleteAllOf(context.Background(), &repairv1.NodeRepair{})
				patch := `{"metadata":{"labels":{"repair.gpufleet.dev/state":null},"annotations":{"repair.gpufleet.dev/faults-since":null}},"spec":{"unschedulable":false}}`
				_, _ = env.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
				time.Sleep(time.Second)
			})
			poke(node) // gpufleet's clock for this fault starts now
			threshold := time.Duration(rule.ThresholdSeconds) * time.Second
			fake.Step(threshold - time.Second)
			poke(node)
			if got := repairsOf(node, rule.Name); len(got) != 0 {
				t.Fatalf("repair %s started 1s before the %s threshold", got[0].Name, threshold)
			}
			fake.Step(time.Second)
			poke(node)
			var got []repairv1.NodeRepair
			err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				got = repairsOf(node, rule.Name)
				return len(got) == 1, nil
			})
			if err != nil {
				t.Fatalf("no repair at the threshold (%s)", threshold)
			}
			want := repair.PlannedActions(rule, true)
			if diff := cmp.Diff(want, got[0].Spec.Actions); diff != "" || got[0].Spec.Fault.Rule != rule.Name {
				t.Errorf("repair %s for rule %s, actions (-want +got):\n%s", got[0].Name, got[0].Spec.Fault.Rule, diff)
			}
			if evs := nodeEvents(t, node, repair.ReasonStart); !strings.Contains(evs, repair.ReasonStart) {
				t.Errorf("no %s event: %s", repair.ReasonStart, evs)
			}
		})
	}
}

// injectGPUFault faults a GPU of node's simulated host so that the agent
// reports GPUProblem with reason class, and waits for the condition.
func injectGPUFault(t *testing.T, node string, class repairv1.GPUFaultClass) {
	t.Helper()
	var err error
	switch class {
	case repairv1.GPUClassResetGPU:
		err = env.InjectXID(t.Context(), node, 3, 48) // uncorrectable ECC error
	case repairv1.GPUClassReboot:
		err = env.InjectXID(t.Context(), node, 5, 79) // fell off the bus
	case repairv1.GPUClassReplace:
		err = env.SetGPUState(t.Context(), node, 6, func(s *devcluster.SimGPUState) { s.RowRemapFailure = true })
	default:
		t.Fatalf("no simulated fault of class %q", class)
	}
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		for _, c := range n.Status.Conditions {
			if c.Type == repairv1.ConditionGPUProblem {
				return c.Status == corev1.ConditionTrue && c.Reason == string(class), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the agent did not report GPUProblem=True/%s on %s within 20s", class, node)
	}
}

// Issue 16: a repair is urgent. Its NodeMaintenance starts outside the
// maintenance windows when its node is already unavailable (here cordoned by
// an administrator), and waits — saying why — when the node is available.
func TestUrgentRepairOfAnUnavailableNodePassesAClosedWindow(t *testing.T) {
	startOperator(t)
	now := time.Now()
	cfg := &maintenancev1.MaintenanceOperatorConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"},
		Spec: maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: ptr.To(intstrFrom(5)),
			MaintenanceExclusions: []maintenancev1.MaintenanceExclusion{{Name: "freeze",
				Start: metav1.NewTime(now.Add(-time.Hour)), End: metav1.NewTime(now.Add(time.Hour))}}}}
	if err := env.Kube.Create(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), cfg) })
	policy(t, true, roRule)
	cordon := func(node string, v bool) {
		patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, v)
		if _, err := env.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cordon("a-2", true)
	t.Cleanup(func() { cordon("a-2", false) })

	fault(t, "a-2", "ReadonlyFilesystem", string(repairv1.ActionReboot))
	repairOf(t, "a-2", repairv1.PhaseSucceeded, 60*time.Second)

	fault(t, "b-0", "ReadonlyFilesystem", string(repairv1.ActionReboot))
	r := repairOf(t, "b-0", repairv1.PhaseRepairing, 30*time.Second)
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		return env.Kube.Get(ctx, client.ObjectKeyFromObject(r), r) == nil &&
			strings.Contains(r.Status.Message, `(Pending): in maintenance exclusion "freeze"`) &&
			strings.Contains(r.Status.Message, "urgent, but its node is available"), nil
	})
	if err != nil {
		t.Fatalf("the repair of an available node does not wait for the exclusion, or does not say so: %q", r.Status.Message)
	}
	if n, _ := env.Client.CoreV1().Nodes().Get(t.Context(), "b-0", metav1.GetOptions{}); n.Spec.Unschedulable {
		t.Errorf("b-0 was cordoned during the exclusion")
	}
}

// TestAForgedRebootIsRefusedByTheAgent: a reboot set pending on a node's
// NodeRepair without a NodeMaintenance holding the node (what a buggy or
// compromised agent of another node could write, before the admission
// policy stops it) is not run: the node's agent records Refused with the
// reason, the boot ID stays, and the repair ends RecoveryFailed saying so.
func TestAForgedRebootIsRefusedByTheAgent(t *testing.T) {
	const node = "b-2"
	startOperator(t)
	policy(t, true)
	bootBefore := bootID(t, node)
	nr := &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: "forged-" + node},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Policy: "test", Actions: []repairv1.Action{repairv1.ActionReboot},
			Fault: repairv1.Fault{Rule: "forged", ConditionType: "Ready", Status: "False", Since: metav1.NewTime(time.Now().Truncate(time.Second))}}}
	if err := env.Kube.Create(t.Context(), nr); err != nil {
		t.Fatal(err)
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	nr.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, BootIDBefore: bootBefore, RebootRequestedAt: &now,
		MaintenanceName: "repair-forged-" + node, // named, but no such object holds the node
		Pending:         &repairv1.PendingAction{Action: repairv1.ActionReboot, RequestedAt: now},
		Timeline:        []repairv1.TimelineEntry{{Time: now, Step: "Reboot", Outcome: "Requested"}}}
	if err := env.Kube.Status().Update(t.Context(), nr); err != nil {
		t.Fatal(err)
	}
	r := repairOf(t, node, repairv1.PhaseRecoveryFailed, 30*time.Second)
	if steps := timelineSteps(r); !strings.Contains(steps, "Reboot:Refused") {
		t.Errorf("timeline %q lacks the refusal", steps)
	}
	if !strings.Contains(r.Status.Message, "did not reboot") || !strings.Contains(r.Status.Message, "not found") {
		t.Errorf("message %q", r.Status.Message)
	}
	if got := bootID(t, node); got != bootBefore {
		t.Errorf("node %s rebooted (boot ID %s → %s)", node, bootBefore, got)
	}
}
