package maintenance

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// TestDirectOnlyAllowedNamespacesMaySchedule: with an allow-list of
// namespaces (--maintenance-namespaces), a NodeMaintenance created in
// another namespace — by anyone who may create one there — is never
// scheduled: it waits, and its Ready condition says why; one of an allowed
// namespace is scheduled as usual, on the real API server.
func TestDirectOnlyAllowedNamespacesMaySchedule(t *testing.T) {
	d := newDirectEnv(t)
	const intruderNS = "direct-not-allowed"
	if err := d.c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: intruderNS}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, n := range []string{"gpu-003", "gpu-004"} {
		d.useNode(t, n)
	}
	allowed := d.newNM(t, "allowed", "gpu-003")
	d.reconcile(t, allowed) // Pending
	intruder := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: intruderNS, Name: "drain-it"},
		Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: directRequestor, NodeName: "gpu-004"}}
	if err := d.c.Create(t.Context(), intruder); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(intruder)
	t.Cleanup(func() { d.removeNM(t, key) })
	d.reconcile(t, key) // Pending
	mpo := intstr.FromInt32(2)
	cfg := &maintenancev1.MaintenanceOperatorConfig{ObjectMeta: metav1.ObjectMeta{Namespace: directNS, Name: maintenancev1.DefaultConfigName},
		Spec: maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: &mpo}}
	if err := d.c.Create(t.Context(), cfg); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.c.Delete(context.Background(), cfg) })

	s := &Scheduler{Client: d.c, Live: d.c, Namespace: directNS, Clock: d.clock, Recorder: events.NewFakeRecorder(100),
		Reasons: &WaitReasons{Client: d.c, Clock: d.clock}, AllowedNamespaces: []string{"team-a"}}
	if _, err := s.Reconcile(t.Context(), reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	wantPhase(t, d.get(t, allowed), maintenancev1.PhaseScheduled) // the operator's own namespace
	if err := s.Reasons.write(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	got := d.get(t, key)
	wantPhase(t, got, maintenancev1.PhasePending)
	if c := meta.FindStatusCondition(got.Status.Conditions, maintenancev1.ConditionTypeReady); c == nil || !strings.Contains(c.Message, "namespace "+intruderNS+" may not request maintenance") {
		t.Errorf("the refused object's wait reason: %+v", c)
	}
	if d.cordoned(t, "gpu-004") {
		t.Errorf("gpu-004 cordoned by an object of a namespace that may not request maintenance")
	}
}
