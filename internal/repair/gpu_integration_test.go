package repair_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/repair"
)

// The tests in this file run the whole GPU flow on the local cluster: the
// simulated GPU host of a kwok node (kernel log and dcgm-exporter in node
// annotations, read by the real parsers), the in-process node agent, the
// operator (repair and maintenance), the simulated DRA driver and the real
// kube-scheduler allocating ResourceClaims.

// gpuPolicy creates the test policy with the default GPU rules (threshold
// 2 s), a forced drain, and mut applied.
func gpuPolicy(t *testing.T, mut func(*repairv1.NodeRepairPolicySpec)) {
	t.Helper()
	rules := []repairv1.Rule{}
	for _, r := range repair.DefaultRules() {
		if strings.HasPrefix(r.Name, "gpu-") {
			r.ThresholdSeconds = 2
			rules = append(rules, r)
		}
	}
	policy(t, true, rules...)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error { // the detector writes its status
		p := &repairv1.NodeRepairPolicy{}
		if err := env.Kube.Get(t.Context(), types.NamespacedName{Name: "test"}, p); err != nil {
			return err
		}
		p.Spec.Drain.Force = ptr.To(true) // the test's pods have no controller
		if mut != nil {
			mut(&p.Spec)
		}
		return env.Kube.Update(t.Context(), p)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// cleanGPUs removes every GPUFault, DeviceTaintRule and simulated GPU fault
// of node at the end of the test; call it before starting the operator, so
// that it runs after the operator (and its agent) stopped.
func cleanGPUs(t *testing.T, node string) {
	t.Cleanup(func() {
		ctx := context.Background()
		_ = env.ClearSimGPUs(ctx, node)
		_ = env.Kube.DeleteAllOf(ctx, &repairv1.GPUFault{})
		_ = env.Kube.DeleteAllOf(ctx, &resourcev1.DeviceTaintRule{}, client.HasLabels{repair.LabelIsolates})
		patch := `{"metadata":{"annotations":{"repair.gpufleet.dev/recommendation":null}}}`
		_, _ = env.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		_ = env.ClearNodeCondition(ctx, node, repairv1.ConditionGPUProblem)
	})
}

// claimPods creates n pods on node, each with one GPU claim, and waits
// until all run; it returns each pod's device.
func claimPods(t *testing.T, prefix, node string, n int) map[string]string {
	t.Helper()
	for i := range n {
		p, err := env.CreateGPUClaimPod(t.Context(), "default", fmt.Sprintf("%s-%d", prefix, i), node)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
	}
	devices := map[string]string{}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		for i := range n {
			name := fmt.Sprintf("%s-%d", prefix, i)
			p, err := env.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				return false, nil //nolint:nilerr // keep polling
			}
			devs, err := env.AllocatedDevices(ctx, "default", name)
			if err != nil || len(devs) != 1 {
				return false, nil //nolint:nilerr // keep polling
			}
			devices[name] = devs[0]
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("claim pods %s-* not running with one device each within 60s: %v", prefix, devices)
	}
	return devices
}

func deviceIndex(t *testing.T, device string) int {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(device, "gpu-%d", &i); err != nil {
		t.Fatalf("device %q: %v", device, err)
	}
	return i
}

// waitTaintRule waits for the DeviceTaintRule of GPU i of node to exist
// (or, want false, to be gone) and returns when it saw it.
func waitTaintRule(t *testing.T, node string, i int, want bool, timeout time.Duration) time.Time {
	t.Helper()
	name := "gpufleet-" + agent.GPUFaultName(node, devcluster.SimGPU(node, i).PCIBusID)
	var seen time.Time
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		err := env.Kube.Get(ctx, types.NamespacedName{Name: name}, &resourcev1.DeviceTaintRule{})
		if err != nil && !apierrors.IsNotFound(err) {
			return false, nil // keep polling
		}
		seen = time.Now()
		return (err == nil) == want, nil
	})
	if err != nil {
		t.Fatalf("DeviceTaintRule %s present=%t not seen within %s", name, want, timeout)
	}
	return seen
}

// gpuRecord returns the GPUFault of GPU i of node.
func gpuRecordOf(t *testing.T, node string, i int) *repairv1.GPUFault {
	t.Helper()
	gf := &repairv1.GPUFault{}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Name: agent.GPUFaultName(node, devcluster.SimGPU(node, i).PCIBusID)}, gf); err != nil {
		t.Fatalf("GPUFault of GPU %d of %s: %v", i, node, err)
	}
	return gf
}

// neverCordoned watches node until the test ends and reports whether it
// was ever unschedulable.
func neverCordoned(t *testing.T, node string) func() bool {
	t.Helper()
	cordoned := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	go func() {
		_ = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err == nil && n.Spec.Unschedulable {
				cordoned <- struct{}{}
				return true, nil
			}
			return false, nil
		})
	}()
	return func() bool {
		select {
		case <-cordoned:
			return false
		default:
			return true
		}
	}
}

// TestGPUFaultIsolatesDrainsOnlyItsPodsResetsAndReturnsTheGPU: an
// uncorrectable ECC error (XID 48) on the GPU of one of four running pods
// of a node: the GPU is isolated at once — a new claim gets another GPU,
// by the real scheduler —, only the pod on it is drained, through a
// NodeMaintenance, without cordoning the node; the agent resets it and it
// returns to service.
func TestGPUFaultIsolatesDrainsOnlyItsPodsResetsAndReturnsTheGPU(t *testing.T) {
	devtest.NeedCluster(t)
	counted, requests := devcluster.CountRequests(env.OperatorConfig)
	const node = "b-0"
	cleanGPUs(t, node)
	startStoppableOn(t, counted, nil, "maintenance", "repair")
	gpuPolicy(t, nil)
	devices := claimPods(t, "train", node, 4)
	victim, faulty := "train-0", deviceIndex(t, devices["train-0"])
	uncordoned := neverCordoned(t, node)
	before := requests.Snapshot()

	injected := time.Now()
	if err := env.InjectXID(t.Context(), node, faulty, 48); err != nil {
		t.Fatal(err)
	}
	isolated := waitTaintRule(t, node, faulty, true, 10*time.Second)
	t.Logf("GPU %d of %s isolated %s after the XID was written to its kernel log", faulty, node, isolated.Sub(injected).Round(time.Millisecond))
	if gf := gpuRecordOf(t, node, faulty); gf.Status.Class != repairv1.GPUClassResetGPU || !strings.Contains(gf.Status.Summary, "48") {
		t.Errorf("GPUFault: class %q, summary %q", gf.Status.Class, gf.Status.Summary)
	}
	// The DRA driver taints the device too (its own view of the XID), and
	// the agent records that as a fault of its own.
	if got := waitDeviceTaint(t, node, faulty, true); got != devcluster.DRATaintXID+"=48" {
		t.Errorf("the driver's device taint %q", got)
	}
	_ = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(gpuRecordOf(t, node, faulty).Status.Summary, "device taint "+devcluster.DRATaintXID+"=48"), nil
	})
	if gf := gpuRecordOf(t, node, faulty); !strings.Contains(gf.Status.Summary, "device taint "+devcluster.DRATaintXID+"=48") {
		t.Errorf("the driver's taint is not a fault of the GPU: %q", gf.Status.Summary)
	}

	// A new claim on that node gets another GPU.
	fresh := claimPods(t, "fresh", node, 1)
	if fresh["fresh-0"] == devices[victim] {
		t.Errorf("a new claim was allocated the isolated GPU %s", devices[victim])
	}

	r := repairOf(t, node, repairv1.PhaseSucceeded, 90*time.Second)
	t.Logf("repaired %s after the XID; %d API requests by the operator and its in-process agent:\n%s",
		time.Since(injected).Round(100*time.Millisecond), total(requests.Since(before)), devcluster.FormatCounts(requests.Since(before)))
	steps := timelineSteps(r)
	for _, want := range []string{"Maintenance:Requested", "ResetGPU:Started", "ResetGPU:Succeeded",
		"ValidateGPU:Succeeded RestartGPUStackPods:Succeeded Done:Succeeded"} {
		if !strings.Contains(steps, want) {
			t.Errorf("timeline %q lacks %s", steps, want)
		}
	}
	if strings.Contains(steps, "Reboot") || r.Status.MaintenanceName != "" {
		t.Errorf("a GPU reset went up to a reboot: %q", steps)
	}
	// The driver's taint went with its kubelet plugin's restart.
	if got := waitDeviceTaint(t, node, faulty, false); got != "" {
		t.Errorf("the driver's taint stayed after the repair: %q", got)
	}
	if len(r.Spec.GPUs) != 1 || r.Spec.GPUs[0].PCIBusID != devcluster.SimGPU(node, faulty).PCIBusID {
		t.Errorf("repair GPUs %+v, want GPU %d", r.Spec.GPUs, faulty)
	}
	// Only the victim was drained; the pods on the other GPUs still run.
	pods, err := env.Client.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name := range devices {
		i := slices.IndexFunc(pods.Items, func(p corev1.Pod) bool { return p.Name == name })
		switch {
		case name == victim && i >= 0 && pods.Items[i].DeletionTimestamp == nil:
			t.Errorf("the pod on the faulty GPU, %s, was not drained (labels %v); timeline %+v", name, pods.Items[i].Labels, r.Status.Timeline)
		case name != victim && (i < 0 || pods.Items[i].DeletionTimestamp != nil):
			t.Errorf("pod %s on a healthy GPU was drained", name)
		}
	}
	if !uncordoned() {
		t.Errorf("node %s was cordoned for a GPU reset", node)
	}
	waitTaintRule(t, node, faulty, false, 10*time.Second)
	if gf := gpuRecordOf(t, node, faulty); gf.Status.Class != "" {
		t.Errorf("after the reset the GPU is not in service: class %q", gf.Status.Class)
	}
	if evs := nodeEvents(t, node, repair.ReasonIsolated, repair.ReasonStart, repair.ReasonAction, repair.ReasonSucceed, repair.ReasonReturned); !strings.Contains(evs, repair.ReasonReturned) {
		t.Errorf("events on the node: %s", evs)
	}
}

// waitDeviceTaint waits (10 s) until GPU i's device in node's
// ResourceSlice carries a driver taint (want) or none, and returns it
// ("key=value", "" for none).
func waitDeviceTaint(t *testing.T, node string, i int, want bool) string {
	t.Helper()
	var got string
	_ = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		s, err := env.Client.ResourceV1().ResourceSlices().Get(ctx, node+"-"+devcluster.DRADriver, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		got = ""
		for _, d := range s.Spec.Devices {
			if d.Name == devcluster.SimGPUDevice(i) && len(d.Taints) > 0 {
				got = d.Taints[0].Key + "=" + d.Taints[0].Value
			}
		}
		return (got != "") == want, nil
	})
	return got
}

func TestApplicationXIDIsRecordedAndNotRepaired(t *testing.T) {
	devtest.NeedCluster(t)
	const node = "a-2"
	cleanGPUs(t, node) // after the operator stops (cleanups run last first)
	startOperator(t)
	gpuPolicy(t, nil)
	if err := env.InjectXID(t.Context(), node, 1, 13); err != nil {
		t.Fatal(err)
	}
	var gf *repairv1.GPUFault
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		g := &repairv1.GPUFault{}
		if err := env.Kube.Get(ctx, types.NamespacedName{Name: agent.GPUFaultName(node, devcluster.SimGPU(node, 1).PCIBusID)}, g); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		gf = g
		return len(g.Status.Faults) > 0, nil
	})
	if err != nil {
		t.Fatalf("XID 13 not recorded within 10s")
	}
	if e := gf.Status.Faults[0]; e.Code != 13 || e.Class != repairv1.GPUClassApplication || gf.Status.Class != "" {
		t.Errorf("record: class %q, fault %+v", gf.Status.Class, e)
	}
	// Past the rules' threshold, nothing: no repair, no isolation.
	time.Sleep(3 * time.Second)
	var list repairv1.NodeRepairList
	if err := env.Kube.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	for _, r := range list.Items {
		if r.Spec.NodeName == node {
			t.Errorf("an application XID started a repair: %+v", r.Spec)
		}
	}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Name: "gpufleet-" + gf.Name}, &resourcev1.DeviceTaintRule{}); !apierrors.IsNotFound(err) {
		t.Errorf("an application XID isolated the GPU (err %v)", err)
	}
}

// TestFailedGPUResetRebootsTheNode: a GPU whose reset fails: the repair
// releases the GPU drain and reboots the node through a NodeMaintenance
// (cordon, drain, reboot, uncordon); the reboot brings the GPU back.
func TestFailedGPUResetRebootsTheNode(t *testing.T) {
	devtest.NeedCluster(t)
	const node = "a-1"
	cleanGPUs(t, node) // after the operator stops (cleanups run last first)
	startOperator(t)
	gpuPolicy(t, nil)
	if err := env.SetGPUState(t.Context(), node, 2, func(g *devcluster.SimGPUState) { g.ResetFails = true }); err != nil {
		t.Fatal(err)
	}
	bootBefore := bootID(t, node)
	if err := env.InjectXID(t.Context(), node, 2, 48); err != nil {
		t.Fatal(err)
	}
	r := repairOf(t, node, repairv1.PhaseSucceeded, 120*time.Second)
	steps := timelineSteps(r)
	for _, want := range []string{"ResetGPU:Failed", "Maintenance:Released", "Reboot:Succeeded"} {
		if !strings.Contains(steps, want) {
			t.Errorf("timeline %q lacks %s", steps, want)
		}
	}
	if bootID(t, node) == bootBefore {
		t.Errorf("node %s was not rebooted", node)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && !n.Spec.Unschedulable, nil
	})
	if err != nil {
		t.Errorf("node %s left cordoned after its reboot", node)
	}
	waitTaintRule(t, node, 2, false, 10*time.Second)
}

// TestRepeatedGPUFaultsEndInAReplaceRecommendation: a GPU taken out of
// service twice within the window (replaceAfter 2): the second time it is
// not reset again; the repair ends RecoveryFailed with the recommendation,
// shown on the node, and the GPU stays isolated.
func TestRepeatedGPUFaultsEndInAReplaceRecommendation(t *testing.T) {
	devtest.NeedCluster(t)
	const node = "b-1"
	cleanGPUs(t, node) // after the operator stops (cleanups run last first)
	startOperator(t)
	gpuPolicy(t, func(s *repairv1.NodeRepairPolicySpec) {
		s.GPU.ReplaceAfter = &repairv1.RepeatLimit{Count: 2, WindowSeconds: 3600}
	})
	if err := env.InjectXID(t.Context(), node, 6, 48); err != nil {
		t.Fatal(err)
	}
	first := repairOf(t, node, repairv1.PhaseSucceeded, 90*time.Second)
	waitTaintRule(t, node, 6, false, 10*time.Second)
	if err := env.InjectXID(t.Context(), node, 6, 48); err != nil {
		t.Fatal(err)
	}
	failed := repairOf(t, node, repairv1.PhaseRecoveryFailed, 60*time.Second)
	if failed.Name == first.Name || !strings.HasPrefix(failed.Spec.Recommendation, "replace GPU 6") || strings.Contains(timelineSteps(failed), "ResetGPU") {
		t.Errorf("second fault: recommendation %q, timeline %q", failed.Spec.Recommendation, timelineSteps(failed))
	}
	// The node's annotation and label follow the repair's end.
	var n *corev1.Node
	_ = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		n, err = env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && n.Annotations[repair.AnnotationRecommendation] == failed.Spec.Recommendation &&
			n.Labels[repair.LabelState] == string(repairv1.PhaseRecoveryFailed), nil
	})
	if n == nil {
		t.Fatal("node not read")
	}
	if n.Annotations[repair.AnnotationRecommendation] != failed.Spec.Recommendation || n.Labels[repair.LabelState] != string(repairv1.PhaseRecoveryFailed) {
		t.Errorf("node: recommendation %q, state %q", n.Annotations[repair.AnnotationRecommendation], n.Labels[repair.LabelState])
	}
	waitTaintRule(t, node, 6, true, 5*time.Second)
	if n.Spec.Unschedulable {
		t.Errorf("a GPU to replace cordoned its node")
	}
}

// TestGPUDrainWaitsForTheMaintenanceLimits: with maxParallelOperations 1
// and a human's maintenance in progress on another node, the GPU drain
// waits its turn; isolation does not.
func TestGPUDrainWaitsForTheMaintenanceLimits(t *testing.T) {
	devtest.NeedCluster(t)
	const node = "a-0"
	cleanGPUs(t, node) // after the operator stops (cleanups run last first)
	stopOperator := startStoppable(t, nil, "maintenance", "repair")
	gpuPolicy(t, nil)
	cfg := &maintenancev1.MaintenanceOperatorConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"},
		Spec: maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: ptr.To(intstr.FromInt32(1))}}
	if err := env.Kube.Create(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), cfg) })
	human := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "human-b-2"},
		Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: "human.example.com", NodeName: "b-2", Cordon: ptr.To(false)}}
	if err := env.Kube.Create(t.Context(), human); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), human) })
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return env.Kube.Get(ctx, client.ObjectKeyFromObject(human), human) == nil && human.IsReady(), nil
	})
	if err != nil {
		t.Fatalf("the human's maintenance never became Ready")
	}
	if err := env.InjectXID(t.Context(), node, 4, 48); err != nil {
		t.Fatal(err)
	}
	waitTaintRule(t, node, 4, true, 10*time.Second)
	r := repairOf(t, node, repairv1.PhaseRepairing, 30*time.Second)
	var gpuNM string
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := env.Kube.Get(ctx, client.ObjectKeyFromObject(r), r); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		gpuNM = r.Status.GPUMaintenanceName
		return gpuNM != "", nil
	})
	if err != nil {
		t.Fatalf("no GPU drain requested; timeline %q", timelineSteps(r))
	}
	// It stays Pending while the human holds the only slot.
	time.Sleep(2 * time.Second)
	nm := &maintenancev1.NodeMaintenance{}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: gpuNM}, nm); err != nil {
		t.Fatal(err)
	}
	if nm.InProgress() {
		t.Fatalf("the GPU drain started beside the human's maintenance with maxParallelOperations 1: phase %s", nm.Phase())
	}
	if err := env.Kube.Get(t.Context(), client.ObjectKeyFromObject(r), r); err != nil || r.Status.Pending != nil {
		t.Fatalf("the reset was requested before the drain: %+v", r.Status.Pending)
	}
	// The repair says what it waits for, with the scheduler's reason.
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		return env.Kube.Get(ctx, client.ObjectKeyFromObject(r), r) == nil &&
			strings.Contains(r.Status.Message, "waiting for NodeMaintenance "+ns+"/"+gpuNM+" (Pending): maxParallelOperations reached"), nil
	})
	if err != nil {
		t.Errorf("the NodeRepair does not say why it waits: message %q", r.Status.Message)
	}
	// The operator restarts while the drain waits; the human finishes: the
	// GPU repair proceeds where it was, without asking twice.
	stopOperator()
	startOperator(t)
	if err := env.Kube.Delete(t.Context(), human); err != nil {
		t.Fatal(err)
	}
	r = repairOf(t, node, repairv1.PhaseSucceeded, 90*time.Second)
	steps := timelineSteps(r)
	if strings.Count(steps, "Maintenance:Requested") != 1 || strings.Count(steps, "ResetGPU:Started") != 1 || r.Status.GPUMaintenanceName != gpuNM {
		t.Errorf("after a restart: timeline %q, GPU maintenance %q (was %q)", steps, r.Status.GPUMaintenanceName, gpuNM)
	}
}

func bootID(t *testing.T, node string) string {
	t.Helper()
	n, err := env.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Status.NodeInfo.BootID
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// devicePluginNode adds a GPU node whose GPUs the simulated DRA driver does
// not publish (pool "dp", 8 nvidia.com/gpu) and removes it at the end.
func devicePluginNode(t *testing.T, name string) {
	t.Helper()
	if err := env.AddNodes(t.Context(), devcluster.NodeSpec{Name: name, Pool: "dp", GPUs: 8, DevicePluginOnly: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// gpuPods creates, on node, one running pod per entry of gpus (pod name →
// GPU index; < 0: a pod without GPUs) requesting nvidia.com/gpu, with the
// annotation that tells the simulated kubelet which GPU the device plugin
// gave it, and waits until all run.
func gpuPods(t *testing.T, node string, gpus map[string]int) {
	t.Helper()
	for name, i := range gpus {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}}
		if i >= 0 {
			p.Annotations = map[string]string{devcluster.AnnotationGPUs: fmt.Sprint(i)}
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		}
		if err := env.Kube.Create(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
	}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		for name := range gpus {
			p, err := env.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				return false, nil //nolint:nilerr // keep polling
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pods %v not running on %s within 60s", gpus, node)
	}
}

// TestDevicePluginGPUFaultDrainsOnlyThePodHoldingTheGPU: on a node whose
// GPUs only the device plugin gives out, an uncorrectable ECC error on GPU
// 3 (dcgm-exporter's volatile DBE counter): the agent reports, from the
// kubelet's pod-resources API (simulated), the one pod that holds GPU 3;
// the repair drains that pod only, through a NodeMaintenance, without
// cordoning the node, resets the GPU and it returns to service.
func TestDevicePluginGPUFaultDrainsOnlyThePodHoldingTheGPU(t *testing.T) {
	devtest.NeedCluster(t)
	const node = "dp-0"
	devicePluginNode(t, node)
	cleanGPUs(t, node)
	startOperator(t)
	gpuPolicy(t, nil)
	pods := map[string]int{"dp-hold-3": 3, "dp-hold-1": 1, "dp-hold-5": 5, "dp-cpu": -1}
	gpuPods(t, node, pods)
	uncordoned := neverCordoned(t, node)

	if err := env.SetGPUState(t.Context(), node, 3, func(g *devcluster.SimGPUState) { g.VolatileDBE = 2 }); err != nil {
		t.Fatal(err)
	}
	// The record names the pod that holds the GPU.
	var gf *repairv1.GPUFault
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		g := &repairv1.GPUFault{}
		if err := env.Kube.Get(ctx, types.NamespacedName{Name: agent.GPUFaultName(node, devcluster.SimGPU(node, 3).PCIBusID)}, g); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		gf = g
		return g.Status.Allocation != nil, nil
	})
	if err != nil {
		t.Fatalf("GPU 3's record shows no allocation within 15s: %+v", gf)
	}
	if want := []repairv1.PodRef{{Namespace: "default", Name: "dp-hold-3"}}; !slices.Equal(gf.Status.Allocation.Pods, want) {
		t.Errorf("allocation of GPU 3: %+v, want %v", gf.Status.Allocation, want)
	}

	r := repairOf(t, node, repairv1.PhaseSucceeded, 90*time.Second)
	steps := timelineSteps(r)
	for _, want := range []string{"Maintenance:Requested", "ResetGPU:Succeeded", "Done:Succeeded"} {
		if !strings.Contains(steps, want) {
			t.Errorf("timeline %q lacks %s", steps, want)
		}
	}
	if strings.Contains(steps, "Reboot") || r.Status.MaintenanceName != "" || r.Spec.Escalation != "" {
		t.Errorf("one faulty GPU of 8 went up to the whole node: %q, escalation %q", steps, r.Spec.Escalation)
	}
	var requested string
	for _, e := range r.Status.Timeline {
		if e.Step == "Maintenance" && e.Outcome == "Requested" {
			requested = e.Message
		}
	}
	if !strings.Contains(requested, "the 1 pod(s) the kubelet gave them (device plugin, pod-resources API)") {
		t.Errorf("GPU drain request: %q", requested)
	}
	list, err := env.Client.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for name := range pods {
		i := slices.IndexFunc(list.Items, func(p corev1.Pod) bool { return p.Name == name })
		drained := i < 0 || list.Items[i].DeletionTimestamp != nil
		if drained != (name == "dp-hold-3") {
			t.Errorf("pod %s drained: %t; want only dp-hold-3 drained", name, drained)
		}
	}
	if !uncordoned() {
		t.Errorf("node %s was cordoned for the reset of one GPU", node)
	}
	if gf := gpuRecordOf(t, node, 3); gf.Status.Class != "" || gf.Status.Allocation != nil {
		t.Errorf("after the reset: class %q, allocation %+v", gf.Status.Class, gf.Status.Allocation)
	}
}

// TestDevicePluginXIDTakesTheGPUOutOfAllocatable: on a device-plugin node,
// an XID the plugin sees makes it mark GPU 3 unhealthy, so the kubelet
// advertises 7 of 8; the GPUFault's isolation note says the plugin keeps
// the GPU from new pods ("allocatable 7 of 8"), and the repair resets it
// and drains the one pod it held; after the reset the node advertises 8
// again.
func TestDevicePluginXIDTakesTheGPUOutOfAllocatable(t *testing.T) {
	devtest.NeedCluster(t)
	const node = "dp-3"
	devicePluginNode(t, node)
	cleanGPUs(t, node)
	startOperator(t)
	gpuPolicy(t, nil)
	gpuPods(t, node, map[string]int{"dpx-hold-3": 3, "dpx-hold-0": 0})
	if err := env.InjectXID(t.Context(), node, 3, 48); err != nil {
		t.Fatal(err)
	}
	var note string
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		g := &repairv1.GPUFault{}
		if err := env.Kube.Get(ctx, types.NamespacedName{Name: agent.GPUFaultName(node, devcluster.SimGPU(node, 3).PCIBusID)}, g); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		note = g.Annotations[repair.AnnotationIsolation]
		return strings.Contains(note, "allocatable 7 of 8"), nil
	})
	if err != nil {
		t.Fatalf("GPU 3's isolation note is %q, want the device plugin's allocatable 7 of 8", note)
	}
	r := repairOf(t, node, repairv1.PhaseSucceeded, 90*time.Second)
	// Like NVIDIA's, the simulated plugin never marks the GPU healthy
	// again: the repair restarts it after the validation.
	if steps := timelineSteps(r); !strings.Contains(steps, "ResetGPU:Succeeded") || strings.Contains(steps, "Reboot") ||
		!strings.Contains(steps, "ValidateGPU:Succeeded RestartGPUStackPods:Succeeded Done:Succeeded") {
		t.Errorf("timeline %q", steps)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		a := n.Status.Allocatable[devcluster.ResourceGPU]
		return a.Value() == 8, nil
	})
	if err != nil {
		t.Errorf("%s does not advertise its 8 GPUs again after the reset", node)
	}
	p, err := env.Client.CoreV1().Pods("default").Get(t.Context(), "dpx-hold-0", metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the pod on GPU 0 was drained too: %v", err)
	}
}

// faultyGPUs gives GPUs of node an uncorrectable ECC count at once (within
// the rules' 2 s threshold, so one repair sees them all).
func faultyGPUs(t *testing.T, node string, gpus ...int) {
	t.Helper()
	for _, i := range gpus {
		if err := env.SetGPUState(t.Context(), node, i, func(g *devcluster.SimGPUState) { g.VolatileDBE = 2 }); err != nil {
			t.Fatal(err)
		}
	}
}

func describeGPUs(gpus []repairv1.GPURef) string {
	names := make([]string, len(gpus))
	for i, g := range gpus {
		names[i] = g.Describe()
	}
	return "[" + strings.Join(names, ", ") + "]"
}

// drainedPods returns which of pods are gone from node or being deleted.
func drainedPods(t *testing.T, node string, pods map[string]int) map[string]bool {
	t.Helper()
	list, err := env.Client.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for name := range pods {
		i := slices.IndexFunc(list.Items, func(p corev1.Pod) bool { return p.Name == name })
		out[name] = i < 0 || list.Items[i].DeletionTimestamp != nil
	}
	return out
}

// TestDevicePluginNodeBelowWholeNodeAfterResetsGPUByGPU: 3 of the 8 GPUs
// of a device-plugin node out of service, under the default
// gpu.wholeNodeAfter (50%: 4): the repair stays per GPU — no escalation,
// the three GPUs reset, only the pods holding them drained, the node never
// cordoned.
func TestDevicePluginNodeBelowWholeNodeAfterResetsGPUByGPU(t *testing.T) {
	devtest.NeedCluster(t)
	const node = "dp-1"
	devicePluginNode(t, node)
	cleanGPUs(t, node)
	startOperator(t)
	gpuPolicy(t, nil)
	pods := map[string]int{"dpb-hold-1": 1, "dpb-hold-3": 3, "dpb-hold-5": 5, "dpb-hold-6": 6, "dpb-cpu": -1}
	gpuPods(t, node, pods)
	uncordoned := neverCordoned(t, node)
	bootBefore := bootID(t, node)

	faultyGPUs(t, node, 1, 3, 5)
	r := repairOf(t, node, repairv1.PhaseSucceeded, 90*time.Second)
	if r.Spec.Escalation != "" || !slices.Equal(r.Spec.Actions, []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot}) {
		t.Errorf("3 of 8 GPUs under wholeNodeAfter 50%%: escalation %q, actions %v; want none and [ResetGPU Reboot]", r.Spec.Escalation, r.Spec.Actions)
	}
	if len(r.Spec.GPUs) != 3 {
		t.Errorf("repair GPUs %s, want GPUs 1, 3 and 5", describeGPUs(r.Spec.GPUs))
	}
	steps := timelineSteps(r)
	if !strings.Contains(steps, "ResetGPU:Succeeded") || strings.Contains(steps, "Reboot") || r.Status.MaintenanceName != "" {
		t.Errorf("timeline %q, whole-node maintenance %q; want a GPU reset only", steps, r.Status.MaintenanceName)
	}
	for name, drained := range drainedPods(t, node, pods) {
		if want := name != "dpb-hold-6" && name != "dpb-cpu"; drained != want {
			t.Errorf("pod %s drained: %t, want %t (only the pods holding GPUs 1, 3 and 5)", name, drained, want)
		}
	}
	if !uncordoned() {
		t.Errorf("node %s was cordoned below gpu.wholeNodeAfter", node)
	}
	if bootID(t, node) != bootBefore {
		t.Errorf("node %s was rebooted below gpu.wholeNodeAfter", node)
	}
}

// TestDevicePluginNodeAtWholeNodeAfterTakesTheWholeNode: gpu.wholeNodeAfter
// 25% (2 of 8) and two GPUs of a device-plugin node out of service at
// once: the repair takes the whole node and says why (spec.escalation) —
// no GPU reset; a NodeMaintenance cordons it and drains every pod, the
// pods on healthy GPUs and without GPUs too; the agent reboots it; the
// reboot brings the GPUs back and the node is uncordoned.
func TestDevicePluginNodeAtWholeNodeAfterTakesTheWholeNode(t *testing.T) {
	devtest.NeedCluster(t)
	const node = "dp-2"
	devicePluginNode(t, node)
	cleanGPUs(t, node)
	startOperator(t)
	gpuPolicy(t, func(s *repairv1.NodeRepairPolicySpec) { s.GPU.WholeNodeAfter = ptr.To(intstr.FromString("25%")) })
	pods := map[string]int{"dpw-hold-2": 2, "dpw-hold-4": 4, "dpw-hold-7": 7, "dpw-cpu": -1}
	gpuPods(t, node, pods)
	cordoned := make(chan struct{})
	go func() {
		_ = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 120*time.Second, true, func(ctx context.Context) (bool, error) {
			n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err == nil && n.Spec.Unschedulable {
				close(cordoned)
				return true, nil
			}
			return false, nil
		})
	}()
	bootBefore := bootID(t, node)

	faultyGPUs(t, node, 2, 4)
	r := repairOf(t, node, repairv1.PhaseRepairing, 30*time.Second)
	if want := "2 of the node's 8 GPUs out of service (gpu.wholeNodeAfter 25%: 2) on a device-plugin node"; !strings.HasPrefix(r.Spec.Escalation, want) {
		t.Errorf("escalation %q, want %q…", r.Spec.Escalation, want)
	}
	if !slices.Equal(r.Spec.Actions, []repairv1.Action{repairv1.ActionReboot}) || len(r.Spec.GPUs) != 2 {
		t.Errorf("actions %v, GPUs %s; want [Reboot] for GPUs 2 and 4", r.Spec.Actions, describeGPUs(r.Spec.GPUs))
	}
	r = repairOf(t, node, repairv1.PhaseSucceeded, 120*time.Second)
	steps := timelineSteps(r)
	for _, want := range []string{"Maintenance:Requested", "Reboot:Started", "Reboot:Succeeded", "Done:Succeeded"} {
		if !strings.Contains(steps, want) {
			t.Errorf("timeline %q lacks %s", steps, want)
		}
	}
	if strings.Contains(steps, "ResetGPU") || r.Status.MaintenanceName == "" || r.Status.GPUMaintenanceName != "" {
		t.Errorf("timeline %q, maintenance %q, GPU maintenance %q: want the whole node's NodeMaintenance and no GPU reset",
			steps, r.Status.MaintenanceName, r.Status.GPUMaintenanceName)
	}
	if start := r.Status.Timeline[0]; start.Step != "Start" || !strings.Contains(start.Message, r.Spec.Escalation) {
		t.Errorf("the start does not say why the whole node: %+v", start)
	}
	select {
	case <-cordoned:
	default:
		t.Errorf("node %s was never cordoned", node)
	}
	for name, drained := range drainedPods(t, node, pods) {
		if !drained {
			t.Errorf("pod %s was not drained from the whole node", name)
		}
	}
	if bootID(t, node) == bootBefore {
		t.Errorf("node %s was not rebooted", node)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && !n.Spec.Unschedulable, nil
	})
	if err != nil {
		t.Errorf("node %s left cordoned after its reboot", node)
	}
	for _, i := range []int{2, 4} {
		if gf := gpuRecordOf(t, node, i); gf.Status.Class != "" {
			t.Errorf("after the reboot GPU %d is not in service: class %q", i, gf.Status.Class)
		}
	}
}

// TestAGPUThatFailsValidationStaysIsolatedUntilARebootFixesIt: a GPU whose
// reset succeeds but which fails its validation (the default level,
// Health) is not returned to service: its record says why and stays out
// (the DeviceTaintRule stays), a Warning event says so, and the repair
// goes up the ladder: the node is rebooted, the GPU validated again, and
// only then returned to service.
func TestAGPUThatFailsValidationStaysIsolatedUntilARebootFixesIt(t *testing.T) {
	devtest.NeedCluster(t)
	const node, gpu = "b-2", 3
	cleanGPUs(t, node)
	startOperator(t)
	gpuPolicy(t, nil)
	if err := env.SetGPUState(t.Context(), node, gpu, func(g *devcluster.SimGPUState) { g.FailsValidation = true }); err != nil {
		t.Fatal(err)
	}
	bootBefore := bootID(t, node)
	if err := env.InjectXID(t.Context(), node, gpu, 48); err != nil {
		t.Fatal(err)
	}
	waitTaintRule(t, node, gpu, true, 10*time.Second)
	var failed *repairv1.GPUFault
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		g := &repairv1.GPUFault{}
		if err := env.Kube.Get(ctx, types.NamespacedName{Name: agent.GPUFaultName(node, devcluster.SimGPU(node, gpu).PCIBusID)}, g); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		failed = g
		return g.Status.Validation != nil && !g.Status.Validation.Passed, nil
	})
	if err != nil {
		t.Fatalf("no failed validation on the GPU's record within 60 s: %+v", failed)
	}
	if failed.InService() || failed.Status.Validation.Level != repairv1.GPUValidationHealth || !strings.Contains(failed.Status.Validation.Message, "unhealthy") {
		t.Errorf("after a failed validation: class %q, validation %+v", failed.Status.Class, failed.Status.Validation)
	}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Name: "gpufleet-" + failed.Name}, &resourcev1.DeviceTaintRule{}); err != nil {
		t.Errorf("the GPU was returned to service after failing its validation: %v", err)
	}

	r := repairOf(t, node, repairv1.PhaseSucceeded, 120*time.Second)
	steps := timelineSteps(r)
	want := []string{"ResetGPU:Succeeded", "ValidateGPU:Failed", "Validate:Failed", "Reboot:Succeeded", "ValidateGPU:Succeeded", "Done:Succeeded"}
	at := 0
	for _, w := range want {
		i := strings.Index(steps[at:], w)
		if i < 0 {
			t.Fatalf("timeline %q lacks %s (in this order: %v)", steps, w, want)
		}
		at += i + len(w)
	}
	if !strings.Contains(r.Status.Message, "validated: Health") {
		t.Errorf("message %q", r.Status.Message)
	}
	if bootID(t, node) == bootBefore {
		t.Errorf("node %s was not rebooted", node)
	}
	if gf := gpuRecordOf(t, node, gpu); !gf.InService() || gf.Status.Validation == nil || !gf.Status.Validation.Passed {
		t.Errorf("after the reboot: class %q, validation %+v", gf.Status.Class, gf.Status.Validation)
	}
	waitTaintRule(t, node, gpu, false, 10*time.Second)
	if evs := nodeEvents(t, node, repair.ReasonValidationFailed); !strings.Contains(evs, repair.ReasonValidationFailed) {
		t.Errorf("events on the node: %s", evs)
	}
}

// TestGPUValidationOffReturnsTheGPUAfterTheReset: with gpu.validation.level
// Off, a reset GPU returns to service at once (no ValidateGPU).
func TestGPUValidationOffReturnsTheGPUAfterTheReset(t *testing.T) {
	devtest.NeedCluster(t)
	const node, gpu = "a-2", 5
	cleanGPUs(t, node)
	startOperator(t)
	gpuPolicy(t, func(s *repairv1.NodeRepairPolicySpec) {
		s.GPU.Validation = &repairv1.GPUValidation{Level: repairv1.GPUValidationOff}
	})
	if err := env.InjectXID(t.Context(), node, gpu, 48); err != nil {
		t.Fatal(err)
	}
	r := repairOf(t, node, repairv1.PhaseSucceeded, 60*time.Second)
	if steps := timelineSteps(r); strings.Contains(steps, "ValidateGPU") || !strings.Contains(steps, "ResetGPU:Succeeded") {
		t.Errorf("timeline %q", steps)
	}
	if r.Spec.Validation == nil || r.Spec.Validation.Level != repairv1.GPUValidationOff {
		t.Errorf("the repair does not carry the policy's validation: %+v", r.Spec.Validation)
	}
}
