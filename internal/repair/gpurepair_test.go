package repair_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/repair"
)

var gpuResetRule = repairv1.Rule{Name: "gpu-reset", ConditionType: repairv1.ConditionGPUProblem, Status: "True", Reason: "ResetGPU",
	ThresholdSeconds: 1, Actions: []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot}}

// claimPod creates a pod on node whose claim was allocated the node's
// device gpu-<i> (written as the scheduler would; no scheduler runs in the
// direct tests' objects: the pod is bound by nodeName). i < 0: no claim.
func claimPod(t *testing.T, name, node string, i int) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if i >= 0 {
		claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name + "-gpu"},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
				Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: devcluster.DRADriver}}}}}}
		if err := env.Kube.Create(t.Context(), claim); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), claim) })
		claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: devcluster.DRADriver, Pool: node, Device: devcluster.SimGPUDevice(i)}}}}
		if err := env.Kube.Status().Update(t.Context(), claim); err != nil {
			t.Fatal(err)
		}
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim.Name)}}
		pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	}
	if err := env.Kube.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
}

// addRule adds a rule to the test policy.
func addRule(t *testing.T, r repairv1.Rule) {
	t.Helper()
	p := &repairv1.NodeRepairPolicy{}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Name: "test"}, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Rules = append(p.Spec.Rules, r)
	if err := env.Kube.Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
}

func nodeMaintenance(t *testing.T, name string) *maintenancev1.NodeMaintenance {
	t.Helper()
	nm := &maintenancev1.NodeMaintenance{}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, nm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatal(err)
	}
	return nm
}

// setReady writes the Ready phase as the maintenance controllers would.
func setReady(t *testing.T, nm *maintenancev1.NodeMaintenance) {
	t.Helper()
	nm.Status.Conditions = []metav1.Condition{{Type: maintenancev1.ConditionTypeReady, Status: metav1.ConditionTrue,
		Reason: string(maintenancev1.PhaseReady), LastTransitionTime: metav1.Now()}}
	if err := env.Kube.Status().Update(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
}

func podLabel(t *testing.T, name string) string {
	t.Helper()
	p := &corev1.Pod{}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Namespace: "default", Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return p.Labels[repair.LabelGPUDrain]
}

// gpuRepair sets up a ResetGPU repair of GPU 3 of node (out of service),
// with a pod on GPU 3, one on GPU 5 and one without a GPU.
func gpuRepairSetUp(t *testing.T, d *direct, node string) (*repairv1.NodeRepair, *repairv1.GPUFault) {
	t.Helper()
	addRule(t, gpuResetRule)
	gf := gpuFault(t, node, 3, repairv1.GPUClassResetGPU)
	claimPod(t, node+"-on-gpu3", node, 3)
	claimPod(t, node+"-on-gpu5", node, 5)
	claimPod(t, node+"-cpu", node, -1)
	nr := d.repair(node+"-gpu", node, gpuResetRule, nil)
	nr.Spec.GPUs = []repairv1.GPURef{gf.Spec.GPU}
	if err := env.Kube.Update(t.Context(), nr); err != nil {
		t.Fatal(err)
	}
	return nr, gf
}

func TestGPUResetDrainsOnlyThePodsOfTheGPUWithoutCordoning(t *testing.T) {
	d := newDirect(t)
	nr, gf := gpuRepairSetUp(t, d, "b-1")

	d.reconcile(nr.Name) // Start
	_, got := d.reconcile(nr.Name)
	name := got.Status.GPUMaintenanceName
	if name == "" || got.Status.Pending != nil {
		t.Fatalf("after the start: gpuMaintenanceName %q, pending %+v; want a GPU drain requested and no action yet", name, got.Status.Pending)
	}
	nm := nodeMaintenance(t, name)
	if nm == nil {
		t.Fatalf("NodeMaintenance %s not created", name)
	}
	if nm.CordonRequested() || nm.Spec.DrainSpec == nil || string(nm.Spec.DrainSpec.PodSelector) != repair.LabelGPUDrain+"="+string(nr.UID) {
		t.Errorf("GPU drain request: cordon %t, drain %+v; want no cordon and a drain of the marked pods", nm.CordonRequested(), nm.Spec.DrainSpec)
	}
	if nm.Spec.RequestorID != repair.Requestor || len(nm.OwnerReferences) != 1 || nm.OwnerReferences[0].UID != nr.UID {
		t.Errorf("requestor %q, owners %+v", nm.Spec.RequestorID, nm.OwnerReferences)
	}
	if podLabel(t, "b-1-on-gpu3") != string(nr.UID) || podLabel(t, "b-1-on-gpu5") != "" || podLabel(t, "b-1-cpu") != "" {
		t.Errorf("marked pods: gpu3 %q, gpu5 %q, cpu %q; want only the pod on GPU 3", podLabel(t, "b-1-on-gpu3"), podLabel(t, "b-1-on-gpu5"), podLabel(t, "b-1-cpu"))
	}
	if !strings.Contains(timelineSteps(got), "Maintenance:Requested") || !strings.Contains(got.Status.Timeline[len(got.Status.Timeline)-1].Message, "the 1 pod(s)") {
		t.Errorf("timeline %q / %q", timelineSteps(got), got.Status.Timeline[len(got.Status.Timeline)-1].Message)
	}

	// A restarted operator (a fresh Repairer) waits for the drain: no
	// second request, no action.
	d.r = &repair.Repairer{Client: env.Kube, Live: env.Kube, Namespace: ns, Clock: d.clock, Recorder: d.rec}
	_, got = d.reconcile(nr.Name)
	if got.Status.Pending != nil || got.Status.GPUMaintenanceName != name {
		t.Fatalf("while draining: pending %+v, maintenance %q", got.Status.Pending, got.Status.GPUMaintenanceName)
	}

	// Drained: the reset is handed to the agent; the node never cordoned.
	setReady(t, nm)
	_, got = d.reconcile(nr.Name)
	if got.Status.Pending == nil || got.Status.Pending.Action != repairv1.ActionResetGPU {
		t.Fatalf("after the drain: pending %+v, want ResetGPU", got.Status.Pending)
	}
	if n, _ := env.Client.CoreV1().Nodes().Get(t.Context(), "b-1", metav1.GetOptions{}); n.Spec.Unschedulable {
		t.Errorf("the node was cordoned for a GPU reset")
	}

	// The agent reset it and the GPU is back in service: Succeeded, the
	// drain's hold released.
	got.Status.Pending, got.Status.NextAction = nil, 1
	if err := env.Kube.Status().Update(t.Context(), got); err != nil {
		t.Fatal(err)
	}
	setClass(t, gf, "")
	_, got = d.reconcile(nr.Name)
	if got.Status.Phase != repairv1.PhaseSucceeded || !strings.Contains(got.Status.Message, "back in service: GPU 3") {
		t.Fatalf("after the reset: phase %s, message %q", got.Status.Phase, got.Status.Message)
	}
	if nm := nodeMaintenance(t, name); nm != nil && nm.DeletionTimestamp == nil {
		t.Errorf("the GPU drain's NodeMaintenance was not released")
	}
}

func TestFailedGPUResetFallsBackToTheRebootRung(t *testing.T) {
	d := newDirect(t)
	nr, _ := gpuRepairSetUp(t, d, "b-2")
	d.reconcile(nr.Name)
	_, got := d.reconcile(nr.Name)
	gpuNM := got.Status.GPUMaintenanceName
	setReady(t, nodeMaintenance(t, gpuNM))
	_, got = d.reconcile(nr.Name)
	// The agent's reset failed: the GPU stays out of service.
	got.Status.Pending, got.Status.NextAction = nil, 1
	got.Status.Timeline = append(got.Status.Timeline, repairv1.TimelineEntry{Time: metav1.NewTime(d.clock.Now()), Step: "ResetGPU", Outcome: "Failed", Message: "nvidia-smi: GPU reset failed"})
	if err := env.Kube.Status().Update(t.Context(), got); err != nil {
		t.Fatal(err)
	}
	_, got = d.reconcile(nr.Name) // verification window
	if got.Status.VerifyUntil == nil {
		t.Fatalf("no verification window after the failed reset; timeline %q", timelineSteps(got))
	}
	d.clock.Step(3 * time.Second)
	// The reboot rung first releases the GPU drain (the node stays
	// schedulable until the reboot's own maintenance cordons it)...
	_, got = d.reconcile(nr.Name)
	if got.Status.GPUMaintenanceName != "" || got.Status.MaintenanceName != "" {
		t.Fatalf("reboot rung step 1: gpu maintenance %q, maintenance %q; want the GPU drain released first", got.Status.GPUMaintenanceName, got.Status.MaintenanceName)
	}
	if nm := nodeMaintenance(t, gpuNM); nm != nil && nm.DeletionTimestamp == nil {
		t.Errorf("GPU drain %s not released before the reboot", gpuNM)
	}
	// ... then asks for the whole node: cordon and drain.
	_, got = d.reconcile(nr.Name)
	nm := nodeMaintenance(t, got.Status.MaintenanceName)
	if nm == nil || !nm.CordonRequested() || nm.Spec.DrainSpec == nil || nm.Spec.DrainSpec.PodSelector != "" {
		t.Fatalf("reboot maintenance %q: %+v", got.Status.MaintenanceName, nm)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), nm) })
}

func TestGPURecommendationEndsAtOnceAndShowsOnTheNode(t *testing.T) {
	d := newDirect(t)
	addRule(t, gpuResetRule)
	nr := d.repair("a-1-replace", "a-1", gpuResetRule, nil)
	nr.Spec.Actions = nil
	nr.Spec.GPUs = []repairv1.GPURef{devcluster.SimGPU("a-1", 6)}
	nr.Spec.Recommendation = "replace GPU 6: out of service 3 times within 24h0m0s (replaceAfter 3)"
	if err := env.Kube.Update(t.Context(), nr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = env.Client.CoreV1().Nodes().Patch(context.Background(), "a-1", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"repair.gpufleet.dev/recommendation":null}}}`), metav1.PatchOptions{})
	})
	d.reconcile(nr.Name)
	_, got := d.reconcile(nr.Name)
	if got.Status.Phase != repairv1.PhaseRecoveryFailed || got.Status.Message != nr.Spec.Recommendation || got.Status.MaintenanceName != "" || got.Status.GPUMaintenanceName != "" {
		t.Fatalf("phase %s, message %q, maintenance %q/%q", got.Status.Phase, got.Status.Message, got.Status.MaintenanceName, got.Status.GPUMaintenanceName)
	}
	n, err := env.Client.CoreV1().Nodes().Get(t.Context(), "a-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Annotations[repair.AnnotationRecommendation] != nr.Spec.Recommendation || n.Labels[repair.LabelState] != string(repairv1.PhaseRecoveryFailed) {
		t.Errorf("node: recommendation %q, state %q", n.Annotations[repair.AnnotationRecommendation], n.Labels[repair.LabelState])
	}
	if evs := d.events(); len(evs) != 1 || !strings.Contains(evs[0], "needs a person: replace GPU 6") {
		t.Errorf("events %q", evs)
	}
}

// TestARepairIsolatesItsGPUBeforeTheDrain: in a burst of faults the
// isolator's queue can be long, and a repair allowed at its threshold
// reaches its drain first. The repair isolates the GPU itself before it
// chooses the pods to drain (else a new pod could get the faulty GPU
// after that choice, and the reset would find it in use); when the
// isolator came first, the repair leaves its rule as it is.
func TestARepairIsolatesItsGPUBeforeTheDrain(t *testing.T) {
	for _, isolatorFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "isolator behind", true: "isolator first"}[isolatorFirst], func(t *testing.T) {
			d := newDirect(t)
			d.r.DRA = true
			nr, gf := gpuRepairSetUp(t, d, "b-1")
			t.Cleanup(func() {
				_ = env.Kube.Delete(context.Background(), &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "gpufleet-" + gf.Name}})
			})
			if isolatorFirst {
				isolate(t, &repair.Isolator{Client: env.Kube, Recorder: d.rec}, gf)
			}
			d.reconcile(nr.Name) // Start
			_, got := d.reconcile(nr.Name)
			if got.Status.GPUMaintenanceName == "" {
				t.Fatalf("no GPU drain requested; timeline %s", timelineSteps(got))
			}
			rule := taintRule(t, gf)
			if rule == nil {
				t.Fatalf("the GPU drain was requested and the GPU is not isolated; timeline %s", timelineSteps(got))
			}
			if sel := rule.Spec.DeviceSelector; sel == nil || ptr.Deref(sel.Device, "") != devcluster.SimGPUDevice(3) || ptr.Deref(sel.Pool, "") != "b-1" {
				t.Errorf("the rule taints %+v, want device %s of pool b-1", sel, devcluster.SimGPUDevice(3))
			}
			steps := timelineSteps(got)
			if isolatorFirst {
				if strings.Contains(steps, "Isolate:") {
					t.Errorf("timeline %s: the repair isolated a GPU the isolator had isolated", steps)
				}
				return
			}
			i, m := strings.Index(steps, "Isolate:Isolated"), strings.Index(steps, "Maintenance:Requested")
			if i < 0 || m < 0 || i > m {
				t.Errorf("timeline %s: want the isolation recorded before the drain request", steps)
			}
			if note := isolate(t, &repair.Isolator{Client: env.Kube, Recorder: d.rec}, gf).Annotations[repair.AnnotationIsolation]; !strings.Contains(note, rule.Name) {
				t.Errorf("isolation note %q, want it to name %s", note, rule.Name)
			}
		})
	}
}

// refusingRules is the API server refusing every DeviceTaintRule (an
// admission policy, a missing permission).
type refusingRules struct{ client.Client }

func (c refusingRules) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*resourcev1.DeviceTaintRule); ok {
		return apierrors.NewForbidden(resourcev1.Resource("devicetaintrules"), obj.GetName(), errors.New("refused by the test"))
	}
	return c.Client.Create(ctx, obj, opts...)
}

// TestARefusedIsolationDoesNotHoldTheRepair: when the API server refuses
// the DeviceTaintRule, the repair says so in its timeline and drains and
// resets the GPU all the same (the drain and reset mend it; the isolator
// keeps trying on its own), instead of retrying the drain forever behind
// an error only the log shows.
func TestARefusedIsolationDoesNotHoldTheRepair(t *testing.T) {
	d := newDirect(t)
	d.r.DRA = true
	d.r.Client = refusingRules{env.Kube}
	nr, gf := gpuRepairSetUp(t, d, "b-1")
	d.reconcile(nr.Name) // Start
	_, got := d.reconcile(nr.Name)
	if got.Status.GPUMaintenanceName == "" {
		t.Fatalf("no GPU drain requested after a refused isolation; timeline %s", timelineSteps(got))
	}
	if taintRule(t, gf) != nil {
		t.Errorf("a DeviceTaintRule exists although the API server refused it")
	}
	var failed *repairv1.TimelineEntry
	for i, e := range got.Status.Timeline {
		if e.Step == "Isolate" && e.Outcome == repairv1.OutcomeFailed {
			failed = &got.Status.Timeline[i]
		}
	}
	if failed == nil || !strings.Contains(failed.Message, "refused by the test") {
		t.Errorf("timeline %s (%+v): want the refused isolation recorded with its reason", timelineSteps(got), failed)
	}
}
