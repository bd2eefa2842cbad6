package takeover_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/liveowner"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// referencePhases are the states NVIDIA's Maintenance Operator leaves its
// objects in, one node each in turn ("deleting": Ready, then deleted by
// its requestor while the operator was stopped; "admin": Ready on a node
// an administrator had cordoned before).
var referencePhases = []string{"Pending", "Scheduled", "Cordon", "WaitForPodCompletion", "Draining", "Ready", "deleting", "admin"}

// referenceObject makes node's NodeMaintenance as the Maintenance Operator
// leaves it in state, and the node as it leaves it.
func referenceObject(t *testing.T, node, state string) *maintenancev1.NodeMaintenance {
	t.Helper()
	ctx := t.Context()
	phase := maintenancev1.Phase(state)
	adminCordoned := state == "admin"
	if state == "deleting" || state == "admin" {
		phase = maintenancev1.PhaseReady
	}
	nm := &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "nvidia-operator-" + node},
		Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: "nvidia.network.operator", NodeName: node,
			DrainSpec: &maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](300)}},
	}
	past := phase != maintenancev1.PhasePending
	cordoned := phase == maintenancev1.PhaseWaitForPodCompletion || phase == maintenancev1.PhaseDraining || phase == maintenancev1.PhaseReady
	if past {
		nm.Finalizers = []string{maintenancev1.Finalizer} // added when it handled Scheduled
	}
	if cordoned {
		nm.Annotations = map[string]string{maintenancev1.AnnotationNodeInitialUnschedulable: fmt.Sprint(adminCordoned)}
	}
	if phase == maintenancev1.PhaseReady {
		nm.Annotations["maintenance.nvidia.com/ready-time"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	}
	if err := k8s.Create(ctx, nm); err != nil {
		t.Fatal(err)
	}
	status := metav1.ConditionFalse
	if phase == maintenancev1.PhaseReady {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&nm.Status.Conditions, metav1.Condition{Type: maintenancev1.ConditionTypeReady, Status: status,
		Reason: string(phase), ObservedGeneration: nm.Generation})
	if phase == maintenancev1.PhaseReady || phase == maintenancev1.PhaseDraining {
		progress := int32(100)
		if phase == maintenancev1.PhaseDraining {
			progress = 50
		}
		nm.Status.Drain = &maintenancev1.DrainStatus{TotalPods: 2, EvictionPods: 2, DrainProgress: progress}
	}
	if err := k8s.Status().Update(ctx, nm); err != nil {
		t.Fatal(err)
	}
	if cordoned {
		patch := []byte(`{"spec":{"unschedulable":true}}`)
		if err := k8s.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatal(err)
		}
	}
	if state == "deleting" {
		if err := k8s.Delete(ctx, nm); err != nil {
			t.Fatal(err)
		}
	}
	return nm
}

func uncordonAll(t *testing.T) {
	var nodes corev1.NodeList
	if err := k8s.List(context.Background(), &nodes); err != nil {
		t.Error(err)
		return
	}
	for i := range nodes.Items {
		if nodes.Items[i].Spec.Unschedulable {
			patch := []byte(`{"spec":{"unschedulable":false}}`)
			_ = k8s.Patch(context.Background(), &nodes.Items[i], client.RawPatch(types.MergePatchType, patch))
		}
	}
}

// Every GPU node holds a NodeMaintenance the NVIDIA Maintenance Operator
// left in one of its states (in turn). gpufleet waits while that
// operator's lease is held, then continues each object from its phase:
// every object not being deleted reaches Ready with its node cordoned, the
// one being deleted is released (its node uncordoned), an admin's cordon
// survives the release. The figures are logged.
func TestTakeOverFromTheMaintenanceOperator(t *testing.T) {
	devtest.NeedCluster(t)
	waitClean(t)
	t.Cleanup(func() { uncordonAll(t) })
	ctx := t.Context()
	cfg := &maintenancev1.MaintenanceOperatorConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
	all := intstr.FromString("100%")
	cfg.Spec.MaxParallelOperations, cfg.Spec.MaxUnavailable = &all, &all
	if err := k8s.Create(ctx, cfg); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), cfg) })
	var nodes corev1.NodeList
	if err := k8s.List(ctx, &nodes, client.MatchingLabels{"nvidia.com/gpu.present": "true"}); err != nil {
		t.Fatal(err)
	}
	state := map[string]string{} // node → state
	var objs []*maintenancev1.NodeMaintenance
	for i, n := range nodes.Items {
		state[n.Name] = referencePhases[i%len(referencePhases)]
		objs = append(objs, referenceObject(t, n.Name, state[n.Name]))
	}
	t.Cleanup(func() {
		for _, nm := range objs {
			_ = k8s.Delete(context.Background(), nm)
		}
	})
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "maintenance-operator", Name: liveowner.MaintenanceOperator.Lease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("maintenance-operator-5f7d9c-abcde_1"), LeaseDurationSeconds: ptr.To[int32](3600),
			RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, lease.Namespace); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), lease) })

	opCfg, wire := devcluster.CountRequests(operatorCfg)
	devtest.StartOperator(t, opCfg, operator.Options{Namespace: ns, Capabilities: []string{"maintenance"}})
	// While the reference runs: nothing written to the objects.
	time.Sleep(3 * time.Second)
	for k, v := range wire.Snapshot() {
		if devcluster.IsWrite(k) && strings.Contains(k, "nodemaintenances") {
			t.Errorf("written while the Maintenance Operator's lease is held: %s x%d", k, v)
		}
	}
	lease.Spec.HolderIdentity = ptr.To("")
	if err := k8s.Update(ctx, lease); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	before := wire.Snapshot()
	continued := map[string]int{}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		var list maintenancev1.NodeMaintenanceList
		if err := k8s.List(ctx, &list); err != nil {
			return false, nil //nolint:nilerr // the API server may be busy: keep polling
		}
		clear(continued)
		for _, nm := range list.Items {
			if nm.Phase() != maintenancev1.PhaseReady {
				return false, nil
			}
			continued[state[nm.Spec.NodeName]]++
		}
		return len(list.Items) == len(objs)-count(state, "deleting"), nil
	})
	if err != nil {
		t.Fatalf("not every taken-over object reached Ready (or was released): reached %v", continued)
	}
	took, requests := time.Since(released), wire.Since(before)
	for _, n := range nodes.Items {
		var node corev1.Node
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(&n), &node); err != nil {
			t.Fatal(err)
		}
		wantCordoned := state[n.Name] != "deleting"
		if node.Spec.Unschedulable != wantCordoned {
			t.Errorf("node %s (%s) cordoned %v, want %v", n.Name, state[n.Name], node.Spec.Unschedulable, wantCordoned)
		}
	}
	// The requestors release their nodes: each node back as it was.
	for _, nm := range objs {
		_ = k8s.Delete(ctx, nm)
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var list maintenancev1.NodeMaintenanceList
		err := k8s.List(ctx, &list)
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		t.Fatal("the objects were not released")
	}
	for _, n := range nodes.Items {
		var node corev1.Node
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(&n), &node); err != nil {
			t.Fatal(err)
		}
		if want := state[n.Name] == "admin"; node.Spec.Unschedulable != want {
			t.Errorf("after release node %s (%s) cordoned %v, want %v", n.Name, state[n.Name], node.Spec.Unschedulable, want)
		}
	}
	total, writes := 0, 0
	for k, v := range requests {
		total += v
		if devcluster.IsWrite(k) {
			writes += v
		}
	}
	t.Logf("takeover of %d NodeMaintenance objects from the Maintenance Operator (%d nodes): continued to Ready by the state they were left in %v, %d being deleted released; "+
		"%.1f s after its lease was released, %d requests (%d writes): %s",
		len(objs), len(nodes.Items), continued, count(state, "deleting"), took.Seconds(), total, writes, devcluster.FormatCounts(requests))
}

func count(m map[string]string, v string) int {
	n := 0
	for _, x := range m {
		if x == v {
			n++
		}
	}
	return n
}
