package maintenance_test

import (
	"context"
	"strings"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

func TestFullLifecycleDrainsAndReleases(t *testing.T) {
	withOperator(t, ios(1), nil)
	node := "gpu-001"
	deployment(t, "lifecycle", "trainer", 3, nil, node)
	before := len(podsOn(t, "lifecycle", "trainer", node))
	if before == 0 {
		t.Fatalf("no trainer pod landed on %s", node)
	}

	nm := newNM("lifecycle", node, "test.gpufleet.dev")
	nm.Spec.DrainSpec = &maintenancev1.DrainSpec{}
	create(t, nm)
	got := waitPhase(t, "lifecycle", maintenancev1.PhaseReady, 60*time.Second)
	if c := readyCondition(got); c.Status != metav1.ConditionTrue {
		t.Errorf("Ready condition %+v, want True", c)
	}
	if !getNode(t, node).Spec.Unschedulable {
		t.Errorf("node %s not cordoned in phase Ready", node)
	}
	if pods := podsOn(t, "lifecycle", "trainer", node); len(pods) != 0 {
		t.Errorf("%d trainer pods still on %s after the drain", len(pods), node)
	}
	if d := got.Status.Drain; d == nil || d.EvictionPods != int32(before) || d.DrainProgress != 100 {
		t.Errorf("drain status %+v, want evictionPods=%d progress=100", d, before)
	}
	if got.Status.NodeUnschedulableBefore == nil || *got.Status.NodeUnschedulableBefore {
		t.Errorf("nodeUnschedulableBefore = %v, want false", got.Status.NodeUnschedulableBefore)
	}
	// The evicted pods were recreated elsewhere by their Deployment.
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		d, err := cluster.Client.AppsV1().Deployments("lifecycle").Get(ctx, "trainer", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == 3, nil
	})
	if err != nil {
		t.Errorf("trainer pods not rescheduled elsewhere: %v", err)
	}
	evs := eventsFor(t, "lifecycle")
	// One Normal event per maintenance: Ready, saying what was done.
	if !hasEvent(evs, "Ready") {
		t.Errorf("no Ready event; events: %v", evs)
	}
	for _, e := range evs {
		if strings.HasPrefix(e, "Ready:") && !strings.Contains(e, "cordoned") {
			t.Errorf("Ready event %q does not say the node was cordoned", e)
		}
	}
	for _, unwanted := range []string{"Scheduled", "Cordoned", "Draining"} {
		if hasEvent(evs, unwanted) {
			t.Errorf("%s event (their facts are in the status and the Ready event); events: %v", unwanted, evs)
		}
	}

	if err := k8s.Delete(t.Context(), got); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return !getNode(t, node).Spec.Unschedulable, nil
	})
	if err != nil {
		t.Fatalf("node %s still cordoned after the NodeMaintenance was deleted", node)
	}
	waitGone(t, "lifecycle")
}

func TestPDBKeepsObjectDraining(t *testing.T) {
	withOperator(t, ios(1), nil)
	node := "gpu-002"
	ns := "pdb"
	deployment(t, ns, "guarded", 2, nil, node)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guarded"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(0)),
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}},
		},
	}
	if _, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Create(t.Context(), pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := podsOn(t, ns, "guarded", node)
	if len(pods) == 0 {
		t.Fatalf("no guarded pod on %s", node)
	}

	nm := newNM("pdb", node, "test.gpufleet.dev")
	nm.Spec.DrainSpec = &maintenancev1.DrainSpec{TimeoutSeconds: ptr.To[int32](2)}
	create(t, nm)
	waitPhase(t, "pdb", maintenancev1.PhaseDraining, 30*time.Second)
	// Past the drain timeout the blocking pod is named in a condition.
	var blocked *metav1.Condition
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got := getNM(t, "pdb")
		for i := range got.Status.Conditions {
			if got.Status.Conditions[i].Type == maintenancev1.ConditionTypeDrainBlocked {
				blocked = &got.Status.Conditions[i]
			}
		}
		return blocked != nil, nil
	})
	if err != nil {
		t.Fatalf("no DrainBlocked condition: %v", err)
	}
	if !strings.Contains(blocked.Message, pods[0].Name) {
		t.Errorf("DrainBlocked message %q does not name the blocking pod %s", blocked.Message, pods[0].Name)
	}
	got := getNM(t, "pdb")
	if w := got.Status.Drain.WaitForEviction; len(w) == 0 || !strings.Contains(strings.Join(w, ","), pods[0].Name) {
		t.Errorf("status.drain.waitForEviction = %v, want the blocking pod", w)
	}
	if !eventSeen(t, "pdb", "DrainBlocked") {
		t.Errorf("no DrainBlocked Warning event")
	}
	// Still Draining, not Ready.
	if p := readyCondition(got); p.Reason != "Draining" {
		t.Fatalf("phase %s, want Draining while the PDB blocks", p.Reason)
	}
	// Relax the PDB: the drain completes.
	current, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Get(t.Context(), "guarded", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	current.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(2))
	if _, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Update(t.Context(), current, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := waitPhase(t, "pdb", maintenancev1.PhaseReady, 60*time.Second)
	for _, c := range done.Status.Conditions {
		if c.Type == maintenancev1.ConditionTypeDrainBlocked {
			t.Errorf("DrainBlocked condition left after the drain completed: %+v", c)
		}
	}
}

func TestAdminCordonSurvivesMaintenance(t *testing.T) {
	withOperator(t, ios(1), nil)
	node := "gpu-003"
	setUnschedulable(t, node, true)
	create(t, newNM("admin-cordon", node, "test.gpufleet.dev"))
	got := waitPhase(t, "admin-cordon", maintenancev1.PhaseReady, 30*time.Second)
	if got.Status.NodeUnschedulableBefore == nil || !*got.Status.NodeUnschedulableBefore {
		t.Fatalf("nodeUnschedulableBefore = %v, want true", got.Status.NodeUnschedulableBefore)
	}
	if err := k8s.Delete(t.Context(), got); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "admin-cordon")
	if !getNode(t, node).Spec.Unschedulable {
		t.Errorf("node %s was cordoned by an admin before the maintenance and is now uncordoned", node)
	}
}

func waitGone(t *testing.T, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		nm := &maintenancev1.NodeMaintenance{}
		err := k8s.Get(ctx, keyOf(name), nm)
		return err != nil, nil
	})
	if err != nil {
		t.Fatalf("%s still exists", name)
	}
}
