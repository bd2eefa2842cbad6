package maintenance_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// evictionCalls reads the API server's count of successful eviction requests.
func evictionCalls(t *testing.T) int {
	t.Helper()
	raw, err := cluster.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "apiserver_request_total{") && strings.Contains(line, `subresource="eviction"`) &&
			strings.Contains(line, `code="201"`) {
			var v float64
			fields := strings.Fields(line)
			if _, err := fmtSscan(fields[len(fields)-1], &v); err == nil {
				total += int(v)
			}
		}
	}
	return total
}

func TestOperatorRestartMidDrainResumes(t *testing.T) {
	devtest.NeedCluster(t)
	defer uncordonAll(t)
	stop := startOperator(t)
	defer cleanupNMs(t)
	setConfig(t, ios(1), nil)
	node := "gpu-004"
	// Pods that take 4s to terminate keep the drain in progress long enough
	// to stop the operator in the middle of it.
	deployment(t, "restart", "slow", 3, map[string]string{devcluster.AnnotationTerminateAfter: "4s"}, node)
	onNode := len(podsOn(t, "restart", "slow", node))
	before := evictionCalls(t)

	nm := newNM("restart", node, "test.gpufleet.dev")
	nm.Spec.DrainSpec = &maintenancev1.DrainSpec{}
	create(t, nm)
	waitPhase(t, "restart", maintenancev1.PhaseDraining, 30*time.Second)
	// Wait for the first drain step to have evicted, then kill the operator.
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return evictionCalls(t)-before >= onNode, nil
	})
	if err != nil {
		t.Fatalf("drain never evicted the %d pods", onNode)
	}
	stop()
	if p := readyCondition(getNM(t, "restart")).Reason; p != "Draining" {
		t.Fatalf("phase after stop = %s, want Draining (the test needs a drain in progress)", p)
	}
	time.Sleep(5 * time.Second) // the pods finish terminating while nobody watches

	startOperator(t)
	done := waitPhase(t, "restart", maintenancev1.PhaseReady, 30*time.Second)
	if got := evictionCalls(t) - before; got != onNode {
		t.Errorf("%d successful evictions for %d pods: something was evicted twice or forgotten", got, onNode)
	}
	if done.Status.Drain.EvictionPods != int32(onNode) || done.Status.Drain.DrainProgress != 100 {
		t.Errorf("drain status after restart: %+v", done.Status.Drain)
	}
}

func TestNVIDIAStyleClientWorksUnchanged(t *testing.T) {
	withOperator(t, ios(2), nil)
	nvidiaStyleClient(t)
}

// TestNVIDIAStyleClientWorksUnchangedWithDomains: the same client, with
// spec.domains configured and its node in a domain whose other node has
// no request (the domain collects for collectSeconds, then starts).
func TestNVIDIAStyleClientWorksUnchangedWithDomains(t *testing.T) {
	withOperator(t, ios(2), nil)
	const rackLabel = "test.gpufleet.dev/nvidia-style-rack"
	for _, n := range []string{"gpu-005", "gpu-006"} {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"r1"}}}`, rackLabel)
		if _, err := cluster.Client.CoreV1().Nodes().Patch(t.Context(), n, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, rackLabel)
			_, _ = cluster.Client.CoreV1().Nodes().Patch(context.Background(), n, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		})
	}
	setDomains(t, &maintenancev1.MaintenanceDomains{NodeLabel: rackLabel, CollectSeconds: ptr.To[int32](3)})
	nvidiaStyleClient(t)
}

// setDomains sets spec.domains of the default config until the test ends.
func setDomains(t *testing.T, d *maintenancev1.MaintenanceDomains) {
	t.Helper()
	update := func(ctx context.Context, d *maintenancev1.MaintenanceDomains) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cfg := &maintenancev1.MaintenanceOperatorConfig{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: "default"}}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(cfg), cfg); err != nil {
				return err
			}
			cfg.Spec.Domains = d
			return k8s.Update(ctx, cfg)
		})
	}
	if err := update(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := update(context.Background(), nil); err != nil {
			t.Errorf("removing spec.domains: %v", err)
		}
	})
}

// nvidiaStyleClient drives one NodeMaintenance on gpu-005 as NVIDIA's
// clients do: created, Ready, then RequestorFailed keeps the node.
func nvidiaStyleClient(t *testing.T) {
	t.Helper()
	// Exactly what the NVIDIA network operator / driver upgrade library writes.
	doc := `apiVersion: maintenance.nvidia.com/v1alpha1
kind: NodeMaintenance
metadata:
  name: nvidia-style
  namespace: default
spec:
  requestorID: network.operator.nvidia.com
  nodeName: gpu-005
  cordon: true
  drainSpec:
    force: true
    podSelector: ""
    timeoutSeconds: 90
    deleteEmptyDir: true
    podEvictionFilters:
    - byResourceNameRegex: nvidia.com/gpu-*
    - byResourceNameRegex: nvidia.com/rdma*
`
	if err := applyYAML(t, doc); err != nil {
		t.Fatal(err)
	}
	nm := waitPhase(t, "nvidia-style", maintenancev1.PhaseReady, 30*time.Second)
	if !hasFinalizerNamed(nm, "maintenance.nvidia.com/finalizer") {
		t.Errorf("finalizers %v, want maintenance.nvidia.com/finalizer", nm.Finalizers)
	}
	// A requestor reports failure: the object leaves Ready and keeps the node.
	meta.SetStatusCondition(&nm.Status.Conditions, metav1.Condition{
		Type: "RequestorFailed", Status: metav1.ConditionTrue, Reason: "FailedMaintenance", Message: "firmware flash failed",
	})
	if err := k8s.Status().Update(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	failed := waitPhase(t, "nvidia-style", maintenancev1.PhaseRequestorFailed, 10*time.Second)
	if c := readyCondition(failed); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "firmware flash failed") {
		t.Errorf("Ready condition %+v", c)
	}
	if !getNode(t, "gpu-005").Spec.Unschedulable {
		t.Errorf("node released while the requestor failed")
	}
}

func hasFinalizerNamed(nm *maintenancev1.NodeMaintenance, f string) bool {
	for _, x := range nm.Finalizers {
		if x == f {
			return true
		}
	}
	return false
}

func TestAdditionalRequestorsHoldTheNode(t *testing.T) {
	withOperator(t, ios(2), nil)
	node := "gpu-006"
	nm := newNM("shared", node, "first.requestor")
	nm.Spec.AdditionalRequestors = []string{"second.requestor"}
	create(t, nm)
	nm = waitPhase(t, "shared", maintenancev1.PhaseReady, 30*time.Second)
	if err := k8s.Delete(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	// Deleted, but the second requestor still uses the node.
	time.Sleep(time.Second)
	held := getNM(t, "shared")
	if !getNode(t, node).Spec.Unschedulable || held.DeletionTimestamp == nil {
		t.Fatalf("node released while an additional requestor remained")
	}
	if msg := readyCondition(held).Message; !strings.Contains(msg, "second.requestor") {
		t.Errorf("Ready message %q does not say who holds the node", msg)
	}
	// The second requestor leaves: the node is released and the object goes.
	held.Spec.AdditionalRequestors = nil
	if err := k8s.Update(t.Context(), held); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "shared")
	if getNode(t, node).Spec.Unschedulable {
		t.Errorf("node still cordoned after the last requestor left")
	}
}

func TestWaitForPodCompletion(t *testing.T) {
	withOperator(t, ios(2), nil)
	node := "gpu-007"
	ns := "jobs"
	if err := devcluster.EnsureNamespace(t.Context(), cluster.Client, ns); err != nil {
		t.Fatal(err)
	}
	mkPod := func(name, runFor, role string) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"role": role},
				Annotations: map[string]string{devcluster.AnnotationRunFor: runFor}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "registry.example/job:1"}}},
		}
		if runFor == "" {
			delete(p.Annotations, devcluster.AnnotationRunFor)
		}
		if _, err := cluster.Client.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	mkPod("finishes", "3s", "training")
	mkPod("unrelated", "", "serving") // not selected: never waited for

	nm := newNM("wait", node, "test.gpufleet.dev")
	nm.Spec.WaitForPodCompletion = &maintenancev1.WaitForPodCompletionSpec{PodSelector: "role=training"}
	create(t, nm)
	waitPhase(t, "wait", maintenancev1.PhaseWaitForPodCompletion, 20*time.Second)
	var waiting []string
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 3*time.Second, true, func(context.Context) (bool, error) {
		waiting = getNM(t, "wait").Status.WaitForCompletion
		return len(waiting) > 0, nil
	})
	if err != nil || len(waiting) != 1 || waiting[0] != ns+"/finishes" {
		t.Errorf("waitForCompletion = %v, want [%s/finishes]", waiting, ns)
	}
	waitPhase(t, "wait", maintenancev1.PhaseReady, 20*time.Second)

	// A pod that never completes: the timeout moves on with a Warning event.
	mkPod("forever", "", "training")
	other := newNM("wait-timeout", node, "other.requestor")
	other.Spec.WaitForPodCompletion = &maintenancev1.WaitForPodCompletionSpec{PodSelector: "role=training", TimeoutSeconds: ptr.To[int32](2)}
	if err := k8s.Delete(t.Context(), getNM(t, "wait")); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "wait")
	create(t, other)
	waitPhase(t, "wait-timeout", maintenancev1.PhaseReady, 30*time.Second)
	if !eventSeen(t, "wait-timeout", "PodCompletionTimeout") {
		t.Errorf("no PodCompletionTimeout event: %v", eventsFor(t, "wait-timeout"))
	}
}

func TestGarbageCollectionAfterMaxTime(t *testing.T) {
	withOperator(t, ios(2), nil)
	cfg := &maintenancev1.MaintenanceOperatorConfig{}
	if err := k8s.Get(t.Context(), keyIn(operatorNS, "default"), cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Spec.MaxNodeMaintenanceTimeSeconds = ptr.To[int32](2)
	if err := k8s.Update(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cfg := &maintenancev1.MaintenanceOperatorConfig{}
		if err := k8s.Get(context.Background(), keyIn(operatorNS, "default"), cfg); err == nil {
			cfg.Spec.MaxNodeMaintenanceTimeSeconds = ptr.To[int32](3600)
			_ = k8s.Update(context.Background(), cfg)
		}
	}()
	create(t, newNM("stale", "gpu-000", "forgetful.requestor"))
	waitPhase(t, "stale", maintenancev1.PhaseReady, 20*time.Second)
	waitGone(t, "stale")
	if getNode(t, "gpu-000").Spec.Unschedulable {
		t.Errorf("garbage-collected maintenance left gpu-000 cordoned")
	}
}

func TestInvalidEvictionRegexEvictsNothing(t *testing.T) {
	withOperator(t, ios(2), nil)
	node := "gpu-009"
	deployment(t, "regex", "victim", 2, nil, node)
	onNode := len(podsOn(t, "regex", "victim", node))
	nm := newNM("bad-regex", node, "test.gpufleet.dev")
	nm.Spec.DrainSpec = &maintenancev1.DrainSpec{PodEvictionFilters: []maintenancev1.PodEvictionFilterEntry{{ByResourceNameRegex: ptr.To("nvidia.com/gpu[")}}}
	if err := k8s.Create(t.Context(), nm); err != nil {
		t.Logf("schema rejected the bad regex at admission: %v", err)
		return
	}
	waitPhase(t, "bad-regex", maintenancev1.PhaseDraining, 20*time.Second)
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		c := meta.FindStatusCondition(getNM(t, "bad-regex").Status.Conditions, maintenancev1.ConditionTypeInvalidSpec)
		return c != nil && c.Status == metav1.ConditionTrue, nil
	})
	if err != nil {
		t.Fatalf("no InvalidSpec condition for an uncompilable regex")
	}
	if !eventSeen(t, "bad-regex", "InvalidSpec") {
		t.Errorf("no InvalidSpec Warning event")
	}
	if got := len(podsOn(t, "regex", "victim", node)); got != onNode {
		t.Errorf("%d of %d pods left: a broken filter evicted pods", got, onNode)
	}
}

func TestNodeDeletionReleasesItsObjects(t *testing.T) {
	withOperator(t, ios(1), nil)
	spec := devcluster.NodeSpec{Name: "doomed", Pool: "pool-a", GPUs: 8}
	if err := cluster.AddNodes(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	create(t, newNM("doomed", "doomed", "test.gpufleet.dev"))
	waitPhase(t, "doomed", maintenancev1.PhaseReady, 20*time.Second)
	if err := cluster.Client.CoreV1().Nodes().Delete(t.Context(), "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "doomed")
	// Its slot is free again: another maintenance is scheduled.
	create(t, newNM("next", "gpu-001", "test.gpufleet.dev"))
	waitPhase(t, "next", maintenancev1.PhaseReady, 20*time.Second)
}

func TestPodsStuckTerminatingOnUnreachableNodeDoNotBlock(t *testing.T) {
	withOperator(t, ios(2), nil)
	node := "gpu-008"
	deployment(t, "stuck", "orphan", 2, nil, node)
	if len(podsOn(t, "stuck", "orphan", node)) == 0 {
		t.Fatalf("no pod on %s", node)
	}
	if err := cluster.StopKubelet(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cluster.StartKubelet(context.Background(), node) }()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return !devcluster.NodeReady(getNode(t, node)), nil
	})
	if err != nil {
		t.Fatalf("node never became NotReady")
	}
	nm := newNM("stuck", node, "test.gpufleet.dev")
	nm.Spec.DrainSpec = &maintenancev1.DrainSpec{}
	create(t, nm)
	// Evicted pods stay Terminating (no kubelet removes them), yet the
	// drain completes once they are past their grace period.
	waitPhase(t, "stuck", maintenancev1.PhaseReady, 90*time.Second)
	pods, err := cluster.Client.CoreV1().Pods("stuck").List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	terminating := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			terminating++
		}
	}
	if terminating == 0 {
		t.Errorf("no pod left Terminating: the scenario did not exercise the unreachable-node path")
	}
}
