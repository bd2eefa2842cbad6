package maintenance_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/maintenance"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// withClockOperator runs the maintenance capability on a fake clock; the
// config is reset to the defaults at the end.
func withClockOperator(t *testing.T, now time.Time) *testingclock.FakeClock {
	t.Helper()
	devtest.NeedCluster(t)
	clk := testingclock.NewFakeClock(now)
	t.Cleanup(func() { uncordonAll(t) })
	t.Cleanup(func() { writeConfigSpec(t, maintenancev1.MaintenanceOperatorConfigSpec{}) })
	devtest.StartOperator(t, operatorCfg, operator.Options{Namespace: operatorNS, Capabilities: []string{"maintenance"}, Clock: clk})
	t.Cleanup(func() { cleanupNMs(t) })
	return clk
}

// writeConfigSpec replaces the default config's spec.
func writeConfigSpec(t *testing.T, spec maintenancev1.MaintenanceOperatorConfigSpec) {
	t.Helper()
	ctx := context.Background()
	cfg := &maintenancev1.MaintenanceOperatorConfig{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: "default"}}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(cfg), cfg); err != nil {
		cfg.Spec = spec
		if err := k8s.Create(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		return
	}
	cfg.Spec = spec
	if err := k8s.Update(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

func getConfig(t *testing.T) *maintenancev1.MaintenanceOperatorConfig {
	t.Helper()
	cfg := &maintenancev1.MaintenanceOperatorConfig{}
	if err := k8s.Get(t.Context(), keyIn(operatorNS, "default"), cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// waitReason waits until a Pending object's Ready condition message
// contains want.
func waitReason(t *testing.T, name, want string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		nm := getNM(t, name)
		if c := readyCondition(nm); c != nil {
			last = c.Reason + ": " + c.Message
			return nm.Phase() == maintenancev1.PhasePending && strings.Contains(c.Message, want), nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%s never waited with %q; last: %q", name, want, last)
	}
}

func waitConfigCondition(t *testing.T, typ string, status metav1.ConditionStatus, msgPart string) *metav1.Condition {
	t.Helper()
	var last *metav1.Condition
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		last = meta.FindStatusCondition(getConfig(t).Status.Conditions, typ)
		return last != nil && last.Status == status && strings.Contains(last.Message, msgPart), nil
	})
	if err != nil {
		t.Fatalf("config condition %s never %s with %q; last: %+v", typ, status, msgPart, last)
	}
	return last
}

// Nothing starts outside a window; the scheduler wakes when it opens (the
// fake clock's timer, no polling); work in progress finishes after it
// closes; an urgent request of a NotReady node starts outside it.
func TestMaintenanceWindowOnTheCluster(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	clk := withClockOperator(t, time.Date(2026, 12, 3, 0, 30, 0, 0, berlin))
	writeConfigSpec(t, maintenancev1.MaintenanceOperatorConfigSpec{
		MaxParallelOperations: ios(10),
		MaintenanceWindows: []maintenancev1.MaintenanceWindow{{Name: "nightly", Schedule: "0 1 * * *",
			Duration: metav1.Duration{Duration: time.Hour}, TimeZone: "Europe/Berlin"}},
	})
	waitConfigCondition(t, maintenancev1.ConfigConditionWindowOpen, metav1.ConditionFalse, "next opens 2026-12-03T01:00:00+01:00")

	create(t, newNM("win-a", "gpu-000", "test.window"), newNM("win-b", "gpu-001", "test.window"))
	waitReason(t, "win-a", "outside maintenance window; next opens 2026-12-03T01:00:00+01:00")
	waitReason(t, "win-b", "outside maintenance window; next opens 2026-12-03T01:00:00+01:00")

	// An urgent request of a NotReady node does not wait for the window.
	node := "gpu-003"
	t.Cleanup(func() { _ = cluster.ClearNodeCondition(context.Background(), node, corev1.NodeReady) })
	if err := cluster.SetNodeCondition(t.Context(), node, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse,
		Reason: "KubeletNotReady", Message: "test"}); err != nil {
		t.Fatal(err)
	}
	repair := newNM("win-urgent", node, "test.repair")
	repair.Annotations = map[string]string{maintenancev1.AnnotationUrgent: "true"}
	available := newNM("win-urgent-available", "gpu-004", "test.repair")
	available.Annotations = map[string]string{maintenancev1.AnnotationUrgent: "true"}
	create(t, repair, available)
	waitPhase(t, "win-urgent", maintenancev1.PhaseReady, 20*time.Second)
	waitReason(t, "win-urgent-available", "urgent, but its node is available")
	if p := getNM(t, "win-a").Phase(); p != maintenancev1.PhasePending {
		t.Fatalf("win-a is %s outside the window", p)
	}

	// The window opens: the scheduler wakes at that moment.
	clk.SetTime(time.Date(2026, 12, 3, 1, 0, 0, 0, berlin))
	waitPhase(t, "win-a", maintenancev1.PhaseReady, 20*time.Second)
	waitPhase(t, "win-b", maintenancev1.PhaseReady, 20*time.Second)
	waitPhase(t, "win-urgent-available", maintenancev1.PhaseReady, 20*time.Second)
	waitConfigCondition(t, maintenancev1.ConfigConditionWindowOpen, metav1.ConditionTrue, "may close at 2026-12-03T02:00:00+01:00")

	// It closes: new work waits for the next one; the work in progress
	// finishes (its requestor releases it and the node is uncordoned).
	clk.SetTime(time.Date(2026, 12, 3, 2, 0, 0, 0, berlin))
	waitConfigCondition(t, maintenancev1.ConfigConditionWindowOpen, metav1.ConditionFalse, "next opens 2026-12-04T01:00:00+01:00")
	create(t, newNM("win-c", "gpu-002", "test.window"))
	waitReason(t, "win-c", "outside maintenance window; next opens 2026-12-04T01:00:00+01:00")
	if err := k8s.Delete(t.Context(), getNM(t, "win-a")); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return !getNode(t, "gpu-000").Spec.Unschedulable, nil
	})
	if err != nil {
		t.Fatal("gpu-000 was not uncordoned after the window closed")
	}
	if p := getNM(t, "win-c").Phase(); p != maintenancev1.PhasePending {
		t.Fatalf("win-c is %s outside the window", p)
	}
}

// A pool's budget holds while the cluster-wide budget has room, and the
// wait reason names the pool.
func TestPoolBudgetOnTheCluster(t *testing.T) {
	withClockOperator(t, time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	writeConfigSpec(t, maintenancev1.MaintenanceOperatorConfigSpec{
		MaxParallelOperations: ios(10),
		Pools: []maintenancev1.MaintenancePool{{Name: "pool-a", MaxParallelOperations: ios(1),
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{devcluster.LabelPool: "pool-a"}}}},
	})
	// gpu-000 and gpu-002 are in pool-a, gpu-001 is not.
	create(t, newNM("pool-0", "gpu-000", "test.pool"))
	waitPhase(t, "pool-0", maintenancev1.PhaseReady, 20*time.Second)
	create(t, newNM("pool-2", "gpu-002", "test.pool"), newNM("pool-1", "gpu-001", "test.pool"))
	waitPhase(t, "pool-1", maintenancev1.PhaseReady, 20*time.Second)
	waitReason(t, "pool-2", "pool pool-a: maxParallelOperations reached: 1/1 nodes in maintenance")
}

// A config the schema accepts but that cannot be read (an unknown time
// zone) gets InvalidConfig and a Warning event; the previous valid config
// keeps applying; fixing it clears the condition.
func TestInvalidConfigKeepsThePreviousOne(t *testing.T) {
	withClockOperator(t, time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	writeConfigSpec(t, maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: ios(0)})
	create(t, newNM("inv-a", "gpu-005", "test.invalid"))
	waitReason(t, "inv-a", "maxParallelOperations is 0")
	waitConfigCondition(t, maintenancev1.ConfigConditionInvalid, metav1.ConditionFalse, "applies")

	bad := maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: ios(5),
		MaintenanceWindows: []maintenancev1.MaintenanceWindow{{Name: "mars", Schedule: "0 1 * * *",
			Duration: metav1.Duration{Duration: time.Hour}, TimeZone: "Mars/Olympus_Mons"}}}
	writeConfigSpec(t, bad)
	c := waitConfigCondition(t, maintenancev1.ConfigConditionInvalid, metav1.ConditionTrue, `timeZone "Mars/Olympus_Mons": unknown time zone`)
	if !strings.Contains(c.Message, "the previous valid configuration (generation") {
		t.Errorf("message %q does not say the previous configuration applies", c.Message)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return hasWarning(t, "default", maintenance.ReasonInvalidConfig), nil
	})
	if err != nil {
		t.Errorf("no InvalidConfig Warning event on the config")
	}
	// The previous config (maxParallelOperations 0) still applies.
	time.Sleep(time.Second)
	if p := getNM(t, "inv-a").Phase(); p != maintenancev1.PhasePending {
		t.Fatalf("inv-a is %s: the invalid config (maxParallelOperations 5) was applied", p)
	}
	bad.MaintenanceWindows[0].TimeZone = "UTC"
	bad.MaintenanceWindows[0].Schedule = "0 12 * * *"
	writeConfigSpec(t, bad)
	waitConfigCondition(t, maintenancev1.ConfigConditionInvalid, metav1.ConditionFalse, "applies")
	waitPhase(t, "inv-a", maintenancev1.PhaseReady, 20*time.Second)
}

// hasWarning reports a Warning event with reason on the config name.
func hasWarning(t *testing.T, name, reason string) bool {
	t.Helper()
	var list corev1.EventList
	if err := k8s.List(t.Context(), &list, client.InNamespace(operatorNS)); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "MaintenanceOperatorConfig" && e.InvolvedObject.Name == name && e.Reason == reason && e.Type == corev1.EventTypeWarning {
			return true
		}
	}
	return false
}
