package maintenance_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// referenceFixture is a NodeMaintenance as NVIDIA's Maintenance Operator
// leaves it in one phase (its source, read for the switch: the Ready
// condition with its reason and an empty message, its finalizer from
// Scheduled on, its annotations on the object, nothing on the node).
type referenceFixture struct {
	name, node  string
	phase       maintenancev1.Phase
	finalizer   bool
	annotations map[string]string
	cordoned    bool // the node, as left
	deleting    bool
	mutate      func(*maintenancev1.NodeMaintenance)
	drain       *maintenancev1.DrainStatus
	// want: the phase gpufleet continues to ("" = gone), and the node's
	// cordon while held and once the object is gone.
	want                 maintenancev1.Phase
	wantCordonedAfterAll bool
}

func (f referenceFixture) create(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	nm := newNM(f.name, f.node, "network.operator.nvidia.com")
	nm.Annotations = f.annotations
	if f.finalizer {
		nm.Finalizers = []string{maintenancev1.Finalizer}
	}
	if f.mutate != nil {
		f.mutate(nm)
	}
	create(t, nm)
	status := metav1.ConditionFalse
	if f.phase == maintenancev1.PhaseReady {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&nm.Status.Conditions, metav1.Condition{
		Type: maintenancev1.ConditionTypeReady, Status: status, Reason: string(f.phase), ObservedGeneration: nm.Generation,
	})
	nm.Status.Drain = f.drain
	if err := k8s.Status().Update(ctx, nm); err != nil {
		t.Fatalf("writing the status of %s: %v", f.name, err)
	}
	setUnschedulable(t, f.node, f.cordoned)
	if f.deleting {
		if err := k8s.Delete(ctx, nm); err != nil {
			t.Fatal(err)
		}
	}
}

// Objects NVIDIA's Maintenance Operator left in every phase are continued
// by gpufleet from where they are: nothing uncordoned that is still held,
// the reference's record of an admin's cordon honoured, its finalizer
// removed on deletion (after the uncordon), a drain continued without
// touching pods of other nodes, a wait's start honoured.
func TestTakeoverOfReferenceObjects(t *testing.T) {
	devtest.NeedCluster(t)
	t.Cleanup(func() { uncordonAll(t) })
	setConfig(t, ios(10), nil)
	ctx := t.Context()
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, "takeover"); err != nil {
		t.Fatal(err)
	}
	barePod := func(name, node string, labels map[string]string) {
		t.Helper()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "takeover", Name: name, Labels: labels},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "registry.example/" + name + ":1"}}},
		}
		if _, err := cluster.Client.CoreV1().Pods("takeover").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Client.CoreV1().Pods("takeover").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		})
	}
	// The drain taken over: one of its two pods is gone already, one is
	// left; a pod of the same app on another node must stay.
	barePod("drain-left", "gpu-005", map[string]string{"app": "takeover-drain"})
	barePod("drain-elsewhere", "gpu-009", map[string]string{"app": "takeover-drain"})
	// The wait taken over: its pod still runs, but the wait began an hour
	// ago and its timeout (60 s) has passed.
	barePod("wait-running", "gpu-004", map[string]string{"app": "takeover-wait"})

	const (
		initial = maintenancev1.AnnotationNodeInitialUnschedulable
		start   = maintenancev1.AnnotationWaitPodCompletionStart
	)
	hourAgo := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	fixtures := []referenceFixture{
		{name: "ref-pending", node: "gpu-000", phase: maintenancev1.PhasePending, want: maintenancev1.PhaseReady},
		{name: "ref-scheduled", node: "gpu-001", phase: maintenancev1.PhaseScheduled, want: maintenancev1.PhaseReady},
		{name: "ref-scheduled-fin", node: "gpu-002", phase: maintenancev1.PhaseScheduled, finalizer: true, want: maintenancev1.PhaseReady},
		// In Cordon before the reference recorded and cordoned: nothing done yet.
		{name: "ref-cordon-unrecorded", node: "gpu-003", phase: maintenancev1.PhaseCordon, finalizer: true, want: maintenancev1.PhaseReady},
		{name: "ref-wait", node: "gpu-004", phase: maintenancev1.PhaseWaitForPodCompletion, finalizer: true, cordoned: true,
			annotations: map[string]string{initial: "false", start: hourAgo}, want: maintenancev1.PhaseReady,
			mutate: func(nm *maintenancev1.NodeMaintenance) {
				nm.Spec.WaitForPodCompletion = &maintenancev1.WaitForPodCompletionSpec{PodSelector: "app=takeover-wait", TimeoutSeconds: ptr.To(int32(60))}
			}},
		{name: "ref-draining", node: "gpu-005", phase: maintenancev1.PhaseDraining, finalizer: true, cordoned: true,
			annotations: map[string]string{initial: "false"}, want: maintenancev1.PhaseReady,
			drain: &maintenancev1.DrainStatus{TotalPods: 2, EvictionPods: 2, DrainProgress: 50, WaitForEviction: []string{"takeover/drain-left"}},
			mutate: func(nm *maintenancev1.NodeMaintenance) {
				nm.Spec.DrainSpec = &maintenancev1.DrainSpec{PodSelector: "app=takeover-drain", Force: true}
			}},
		{name: "ref-ready", node: "gpu-006", phase: maintenancev1.PhaseReady, finalizer: true, cordoned: true,
			annotations: map[string]string{initial: "false", "maintenance.nvidia.com/ready-time": hourAgo}, want: maintenancev1.PhaseReady},
		// An admin had cordoned the node before the maintenance.
		{name: "ref-ready-admin", node: "gpu-007", phase: maintenancev1.PhaseReady, finalizer: true, cordoned: true,
			annotations: map[string]string{initial: "true"}, want: maintenancev1.PhaseReady, wantCordonedAfterAll: true},
		{name: "ref-deleting", node: "gpu-008", phase: maintenancev1.PhaseReady, finalizer: true, cordoned: true, deleting: true,
			annotations: map[string]string{initial: "false"}},
		{name: "ref-deleting-admin", node: "gpu-009", phase: maintenancev1.PhaseDraining, finalizer: true, cordoned: true, deleting: true,
			annotations: map[string]string{initial: "true"}, wantCordonedAfterAll: true,
			mutate: func(nm *maintenancev1.NodeMaintenance) {
				nm.Spec.DrainSpec = &maintenancev1.DrainSpec{PodSelector: "app=takeover-nothing"}
			}},
	}
	for _, f := range fixtures {
		f.create(t)
	}
	// Nothing acted on them yet: gpufleet's maintenance controllers start now.
	evictionsBefore := evictionCalls(t)
	startOperator(t)
	t.Cleanup(func() { cleanupNMs(t) })

	for _, f := range fixtures {
		if f.want == "" {
			waitGone(t, f.name)
			if got := getNode(t, f.node).Spec.Unschedulable; got != f.wantCordonedAfterAll {
				t.Errorf("%s deleted: node %s unschedulable=%t, want %t", f.name, f.node, got, f.wantCordonedAfterAll)
			}
			continue
		}
		nm := waitPhase(t, f.name, f.want, 60*time.Second)
		if !nm.HasFinalizer() {
			t.Errorf("%s in %s without finalizer %v", f.name, nm.Phase(), nm.Finalizers)
		}
		if !getNode(t, f.node).Spec.Unschedulable {
			t.Errorf("%s in %s: node %s not cordoned", f.name, nm.Phase(), f.node)
		}
		wantInitial := "false"
		if f.annotations[initial] != "" {
			wantInitial = f.annotations[initial]
		}
		if got := nm.Annotations[initial]; got != wantInitial {
			t.Errorf("%s: %s = %q, want %q", f.name, initial, got, wantInitial)
		}
	}
	// The drain went on: the pod left was evicted, once; the pod of the
	// same app on another node, and the waited-for pod, were not touched.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().Pods("takeover").Get(ctx, "drain-left", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Errorf("pod takeover/drain-left of the taken-over drain never evicted")
	}
	for _, name := range []string{"drain-elsewhere", "wait-running"} {
		p, err := cluster.Client.CoreV1().Pods("takeover").Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			t.Errorf("pod takeover/%s, not on a drained node, was removed (%v)", name, err)
		}
	}
	if got := evictionCalls(t) - evictionsBefore; got != 1 {
		t.Errorf("eviction calls: %d, want 1 (the one pod left by the taken-over drain)", got)
	}
	// The taken-over wait kept its start: past its timeout, it did not
	// wait again for its running pod.
	if nm := getNM(t, "ref-wait"); nm.Annotations[start] != hourAgo {
		t.Errorf("ref-wait: %s = %q, want the reference's %q", start, nm.Annotations[start], hourAgo)
	}

	// Deleting each object releases its node, unless an admin had cordoned it.
	for _, f := range fixtures {
		if f.want == "" {
			continue
		}
		if err := k8s.Delete(ctx, getNM(t, f.name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range fixtures {
		if f.want == "" {
			continue
		}
		waitGone(t, f.name)
		if got := getNode(t, f.node).Spec.Unschedulable; got != f.wantCordonedAfterAll {
			t.Errorf("%s deleted: node %s unschedulable=%t, want %t", f.name, f.node, got, f.wantCordonedAfterAll)
		}
	}
}
