package maintenance_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/liveowner"
	"github.com/gpufleet/gpufleet/internal/maintenance"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// countWrites counts, from a real watch, the changes of NodeMaintenance
// objects in namespace.
func countWrites(t *testing.T, namespace string) func() int {
	t.Helper()
	scheme, err := operator.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(maintenance.AdminConfigForTest, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.Watch(ctx, &maintenancev1.NodeMaintenanceList{}, client.InNamespace(namespace))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var mu sync.Mutex
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified || ev.Type == watch.Deleted {
				mu.Lock()
				n++
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); cancel(); <-done })
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// While NVIDIA's Maintenance Operator holds its leader lease, gpufleet's
// maintenance controllers write nothing to NodeMaintenance objects (no
// phase, finalizer, cordon or drain) and the config says who holds them;
// once the lease is released, the objects proceed.
func TestNothingDoneBesideALiveMaintenanceOperator(t *testing.T) {
	devtest.NeedCluster(t)
	t.Cleanup(func() { uncordonAll(t) })
	ctx := t.Context()
	start := time.Now().Add(-time.Second) // events of earlier tests do not count
	const ns = "maintenance-operator"
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, ns); err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: liveowner.MaintenanceOperator.Lease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("maintenance-operator-7d9f_1234"), LeaseDurationSeconds: ptr.To(int32(15)),
			AcquireTime: &metav1.MicroTime{Time: time.Now()}, RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}
	create(t, lease)
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), lease) })
	// The other operator renews its lease every 2 s, as controller-runtime does.
	renewCtx, stopRenewing := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		_ = wait.PollUntilContextCancel(renewCtx, 2*time.Second, false, func(ctx context.Context) (bool, error) {
			l := &coordinationv1.Lease{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(lease), l); err == nil {
				l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
				_ = k8s.Update(ctx, l) // a missed renewal is retried at the next tick
			}
			return false, nil
		})
	}()
	t.Cleanup(func() { stopRenewing(); <-renewed })

	setConfig(t, ios(3), nil)
	writes := countWrites(t, "default")
	fresh := newNM("beside-new", "gpu-002", "beside.example.com")
	fresh.Spec.DrainSpec = &maintenancev1.DrainSpec{}
	create(t, fresh)
	// One the other operator has scheduled (its finalizer, not yet cordoned).
	scheduled := newNM("beside-scheduled", "gpu-003", "beside.example.com")
	scheduled.Finalizers = []string{maintenancev1.Finalizer}
	create(t, scheduled)
	meta.SetStatusCondition(&scheduled.Status.Conditions, metav1.Condition{Type: maintenancev1.ConditionTypeReady, Status: metav1.ConditionFalse, Reason: string(maintenancev1.PhaseScheduled)})
	if err := k8s.Status().Update(ctx, scheduled); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // our own writes' events
	before := writes()

	startOperator(t)
	t.Cleanup(func() { cleanupNMs(t) })
	var cfg maintenancev1.MaintenanceOperatorConfig
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: "default"}, &cfg); err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(cfg.Status.Conditions, maintenancev1.ConfigConditionOtherOperatorActive), nil
	})
	if err != nil {
		t.Fatalf("config never said the other operator is active: %+v", cfg.Status.Conditions)
	}
	c := meta.FindStatusCondition(cfg.Status.Conditions, maintenancev1.ConfigConditionOtherOperatorActive)
	for _, want := range []string{"NVIDIA Maintenance Operator", ns + "/" + liveowner.MaintenanceOperator.Lease, "maintenance-operator-7d9f_1234"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("condition message %q does not name %q", c.Message, want)
		}
	}
	time.Sleep(6 * time.Second) // several renewals and the operator's passes
	if got := writes() - before; got != 0 {
		t.Errorf("%d NodeMaintenance writes while the other operator held its lease", got)
	}
	if n := getNode(t, "gpu-003"); n.Spec.Unschedulable {
		t.Errorf("node gpu-003 cordoned beside the other operator")
	}
	if nm := getNM(t, "beside-new"); len(nm.Status.Conditions) != 0 || len(nm.Finalizers) != 0 {
		t.Errorf("new object touched: finalizers %v, conditions %+v", nm.Finalizers, nm.Status.Conditions)
	}
	evs, err := cluster.Client.EventsV1().Events(operatorNS).List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=default"})
	if err != nil {
		t.Fatal(err)
	}
	warnings := 0
	for _, e := range evs.Items {
		if e.Reason == maintenance.ReasonOtherOperatorActive && !e.CreationTimestamp.Time.Before(start) {
			warnings++
			if e.Type != "Warning" {
				t.Errorf("event %s is %s, want Warning", e.Reason, e.Type)
			}
		}
	}
	if warnings != 1 {
		t.Errorf("%d %s events, want 1", warnings, maintenance.ReasonOtherOperatorActive)
	}

	// The other operator stops and releases its lease (as controller-runtime
	// does on a clean shutdown): the objects proceed.
	stopRenewing()
	<-renewed
	l := &coordinationv1.Lease{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(lease), l); err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity = ptr.To("")
	l.Spec.LeaseDurationSeconds = ptr.To(int32(1))
	if err := k8s.Update(ctx, l); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, "beside-new", maintenancev1.PhaseReady, 30*time.Second)
	waitPhase(t, "beside-scheduled", maintenancev1.PhaseReady, 30*time.Second)
	if !getNode(t, "gpu-003").Spec.Unschedulable {
		t.Errorf("node gpu-003 not cordoned once gpufleet took over")
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: "default"}, &cfg); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(cfg.Status.Conditions, maintenancev1.ConfigConditionOtherOperatorActive)
		return c != nil && c.Status == metav1.ConditionFalse, nil
	})
	if err != nil {
		t.Errorf("config still says the other operator is active: %+v", cfg.Status.Conditions)
	}
}
