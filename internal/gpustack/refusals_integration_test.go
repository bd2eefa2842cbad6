package gpustack_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// A ClusterRoleBinding's roleRef is immutable: a binding of the driver's
// name that points at another role cannot be updated to the rendered one.
// The API server refuses the write (422) on every try; the rest of the
// stack must still be reconciled, the refusal reported, and the write
// retried with a backoff, not at every pass.
func TestReconcileARefusedObjectDoesNotStopTheStackNorSpin(t *testing.T) {
	d := newDirect(t)
	ctx := t.Context()
	bad := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia-driver", Labels: map[string]string{
			gpustack.LabelManagedBy: "gpufleet", gpustack.LabelPartOf: "gpufleet-gpu-stack", gpustack.LabelComponent: gpustack.Driver}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "nvidia-driver", Namespace: ns}},
	}
	if err := k8s.Create(ctx, bad); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), bad) })
	p := createPolicy(t, "cluster-policy", nil)

	first := d.reconcile(p.Name)
	if first.err != nil {
		t.Fatalf("a refused object failed the pass: %s", first)
	}
	if n := first.count("Update", "ClusterRoleBinding"); n != 1 {
		t.Errorf("want the one refused update of the binding: %s", first)
	}
	if first.count("Create", "DaemonSet") == 0 {
		t.Errorf("the rest of the stack was not created after the refusal: %s", first)
	}
	got := getPolicy(t, p.Name)
	deg := meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionDegraded)
	if got.Status.State != nvidiav1.StateNotReady || deg == nil || deg.Reason != gpustack.ReasonObjectRefused ||
		!strings.Contains(deg.Message, "ClusterRoleBinding nvidia-driver refused by the API server") || !strings.Contains(deg.Message, "roleRef") {
		t.Errorf("status does not report the refusal with the API server's message: state %s, Degraded %+v", got.Status.State, deg)
	}
	if ev := first.eventsWith(gpustack.ReasonObjectRefused); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning ") {
		t.Errorf("want one ObjectRefused Warning: %v", first.events)
	}
	if first.res.RequeueAfter <= 0 || first.res.RequeueAfter > 5*time.Second {
		t.Errorf("requeue %s, want the refusal's backoff (5 s)", first.res.RequeueAfter)
	}

	// Passes within the backoff (pod events, node events...) do not send
	// the refused write again nor report it again (the status may still
	// change as the stack's pods start).
	for i := range 20 {
		again := d.reconcile(p.Name)
		if again.err != nil || again.count("Update", "ClusterRoleBinding") != 0 || len(again.eventsWith(gpustack.ReasonObjectRefused)) != 0 {
			t.Fatalf("pass %d within the backoff: %s", i, again)
		}
	}
	// Retried once the backoff is over, then after twice as long.
	d.clock.Step(5 * time.Second)
	if retry := d.reconcile(p.Name); retry.count("Update", "ClusterRoleBinding") != 1 || retry.err != nil {
		t.Errorf("after 5 s: want one retry: %s", retry)
	}
	d.clock.Step(5 * time.Second)
	if early := d.reconcile(p.Name); early.count("Update", "ClusterRoleBinding") != 0 {
		t.Errorf("5 s after the first retry: want none (10 s backoff): %s", early)
	}
	d.clock.Step(5 * time.Second)
	if retry := d.reconcile(p.Name); retry.count("Update", "ClusterRoleBinding") != 1 {
		t.Errorf("10 s after the first retry: want one: %s", retry)
	}

	// Fixed by hand (the binding deleted): created at the next retry,
	// and the Degraded report goes.
	if err := k8s.Delete(ctx, bad); err != nil {
		t.Fatal(err)
	}
	waitGone(t, bad)
	d.clock.Step(20 * time.Second)
	fixed := d.reconcile(p.Name)
	if fixed.count("Create", "ClusterRoleBinding") != 1 {
		t.Errorf("the binding is not created once the conflict is gone: %s", fixed)
	}
	got = getPolicy(t, p.Name)
	if deg := meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionDegraded); deg != nil && deg.Reason == gpustack.ReasonObjectRefused {
		t.Errorf("Degraded still reports the refusal: %+v", deg)
	}
}

// A pass that fails with a transient error while passes are coalesced is
// held back with a growing backoff: the deferred pass returns without an
// error (controller-runtime then forgets its own backoff).
func TestReconcileAFailingPassBacksOffWhenPassesAreCoalesced(t *testing.T) {
	d := newDirect(t)
	p := createPolicy(t, "cluster-policy", nil)
	r := d.reconciler()
	r.PassInterval = 200 * time.Millisecond
	if first := d.reconcileWith(r, p.Name); first.err != nil {
		t.Fatalf("first pass: %s", first)
	}
	d.clock.Step(time.Second)
	d.log.failNextStatusWrites(100)
	t.Cleanup(func() { d.log.failNextStatusWrites(0) })
	// Make the status change so that the pass writes it (and fails).
	p2 := getPolicy(t, p.Name)
	p2.Status.State = ""
	if err := k8s.Status().Update(t.Context(), p2); err != nil {
		t.Fatal(err)
	}
	waitPolicyState(t, p.Name, "")
	failed := d.reconcileWith(r, p.Name)
	if failed.err == nil {
		t.Fatalf("want the injected error: %s", failed)
	}
	attempts := 0
	for range 50 { // 50 requests at the pass interval: 10 s
		d.clock.Step(200 * time.Millisecond)
		if pass := d.reconcileWith(r, p.Name); pass.statusWrites() > 0 {
			attempts++
		}
	}
	// Backoff 1, 2, 4 s... within 10 s: at most 4 more attempts (was 50).
	if attempts > 4 {
		t.Errorf("%d failing passes in 10 s of 200 ms requests: the failure is not backed off", attempts)
	}
	if attempts == 0 {
		t.Errorf("the failing pass was never retried")
	}
}

func waitGone(t *testing.T, o client.Object) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(o), o.DeepCopyObject().(client.Object)); err != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s still there", o.GetName())
}

func waitPolicyState(t *testing.T, name string, state nvidiav1.State) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if getPolicy(t, name).Status.State == state {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("ClusterPolicy %s never in state %q", name, state)
}
