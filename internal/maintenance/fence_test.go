package maintenance_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/liveowner"
	"github.com/gpufleet/gpufleet/internal/maintenance"
)

// nvidiaLeader runs client-go's leader election for the lease of NVIDIA's
// Maintenance Operator in namespace, as that operator's manager does (15 s
// lease, 10 s renew deadline, 2 s retries), as identity. It reports
// whether it leads; stop freezes it (no renewal, no release: a stalled
// VM), or ends it.
func nvidiaLeader(t *testing.T, namespace, identity string) (leading *atomic.Bool, stop func()) {
	t.Helper()
	kube, err := kubernetes.NewForConfig(maintenance.AdminConfigForTest)
	if err != nil {
		t.Fatal(err)
	}
	lock := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: namespace, Name: liveowner.MaintenanceOperator.Lease},
		Client: kube.CoordinationV1(), LockConfig: resourcelock.ResourceLockConfig{Identity: identity}}
	leading = &atomic.Bool{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { leading.Store(true) },
				OnStoppedLeading: func() { leading.Store(false) },
			},
		})
	}()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return leading, stop
}

// TestTwoOperatorsNeverActAtOnce: whether NVIDIA's Maintenance Operator is
// alive is judged by its lease changing, on gpufleet's own clock, not by
// comparing the lease's renewTime with that clock; and while gpufleet acts
// in its place it holds that lease.
//
//   - A holder whose clock is an hour behind, renewing every second, is
//     alive: gpufleet writes nothing to any NodeMaintenance.
//   - A real leader (client-go's leader election) that freezes — no more
//     renewals, no release — is dead once its lease has stayed unchanged
//     for a lease duration: gpufleet takes the lease and acts.
//   - That leader, woken, does not lead again while gpufleet runs (the
//     lease is held and renewed by someone else); once gpufleet stops, and
//     gives the lease back, it leads at once.
func TestTwoOperatorsNeverActAtOnce(t *testing.T) {
	devtest.NeedCluster(t)
	t.Cleanup(func() { uncordonAll(t) })
	ctx := t.Context()
	const nvidiaNS = "nvidia-maintenance"
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, nvidiaNS); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: nvidiaNS, Name: liveowner.MaintenanceOperator.Lease}
	t.Cleanup(func() {
		_ = k8s.Delete(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
	})

	// A skewed holder: renewTime an hour behind gpufleet's clock.
	skewed := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: nvidiaNS, Name: key.Name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("maintenance-operator-skewed_1"), LeaseDurationSeconds: ptr.To[int32](15),
			RenewTime: &metav1.MicroTime{Time: time.Now().Add(-time.Hour)}}}
	create(t, skewed)
	renewCtx, stopRenewing := context.WithCancel(ctx)
	renewing := make(chan struct{})
	go func() {
		defer close(renewing)
		_ = wait.PollUntilContextCancel(renewCtx, time.Second, false, func(ctx context.Context) (bool, error) {
			l := &coordinationv1.Lease{}
			if err := k8s.Get(ctx, key, l); err == nil {
				l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-time.Hour)}
				_ = k8s.Update(ctx, l)
			}
			return false, nil
		})
	}()
	t.Cleanup(func() { stopRenewing(); <-renewing })

	setConfig(t, ios(3), nil)
	writes := countWrites(t, "default")
	first := newNM("fence-first", "gpu-004", "fence.example.com")
	create(t, first)
	time.Sleep(500 * time.Millisecond)
	before := writes()
	stopOperator := startOperator(t)
	t.Cleanup(func() { cleanupNMs(t) })
	time.Sleep(6 * time.Second) // several renewals and passes of the operator
	if got := writes() - before; got != 0 {
		t.Fatalf("%d NodeMaintenance writes beside a live Maintenance Operator whose clock is an hour behind", got)
	}
	if l := getLease(t, key); !strings.HasPrefix(ptr.Deref(l.Spec.HolderIdentity, ""), "maintenance-operator-skewed") {
		t.Fatalf("the live holder's lease was taken: %+v", l.Spec)
	}

	// A real leader, which freezes.
	stopRenewing()
	<-renewing
	if err := k8s.Delete(ctx, skewed); err != nil {
		t.Fatal(err)
	}
	leading, freeze := nvidiaLeader(t, nvidiaNS, "maintenance-operator-1")
	devtest.WaitFor(t, "NVIDIA's operator leading", 30*time.Second, func(context.Context) (bool, string) { return leading.Load(), "" })
	freeze()
	frozeAt := time.Now()
	waitPhase(t, "fence-first", maintenancev1.PhaseReady, 60*time.Second)
	if acted := time.Since(frozeAt); acted < 10*time.Second {
		t.Errorf("gpufleet acted %s after the leader froze, before its lease could expire", acted)
	}
	if l := getLease(t, key); !strings.HasPrefix(ptr.Deref(l.Spec.HolderIdentity, ""), liveowner.FencePrefix) {
		t.Fatalf("gpufleet acts in the Maintenance Operator's place without holding its lease: %+v", l.Spec)
	}

	// The frozen leader wakes (its process goes on with the same identity).
	woken, stopWoken := nvidiaLeader(t, nvidiaNS, "maintenance-operator-1")
	time.Sleep(20 * time.Second) // more than a lease duration and a renew deadline
	if woken.Load() {
		t.Fatalf("the woken Maintenance Operator leads again while gpufleet acts in its place")
	}
	// gpufleet stops and gives the lease back: the other operator leads.
	cleanupNMs(t) // while gpufleet still runs (its finalizer)
	stopOperator()
	devtest.WaitFor(t, "NVIDIA's operator leading once gpufleet stopped", 30*time.Second, func(context.Context) (bool, string) {
		return woken.Load(), ""
	})
	stopWoken()
}

func getLease(t *testing.T, key client.ObjectKey) *coordinationv1.Lease {
	t.Helper()
	l := &coordinationv1.Lease{}
	if err := k8s.Get(t.Context(), key, l); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return l
}

// operatorDeployment runs a Deployment of one pod in namespace, labelled
// labels, whose container runs argv, and waits until it is ready; its
// cleanup deletes it.
func operatorDeployment(t *testing.T, namespace, name string, labels map[string]string, argv ...string) *appsv1.Deployment {
	t.Helper()
	ctx := t.Context()
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, namespace); err != nil {
		t.Fatal(err)
	}
	selector := map[string]string{"app": name}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: selector},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: selector}, Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "manager", Image: "registry.example/" + name + ":1", Command: argv[:1], Args: argv[1:]}}}}}}
	create(t, d)
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), d) })
	devtest.WaitFor(t, "Deployment "+name+" ready", 60*time.Second, func(ctx context.Context) (bool, string) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(d), d)
		return err == nil && d.Status.ReadyReplicas == 1, fmt.Sprint(err, d.Status)
	})
	return d
}

// otherOperatorCondition waits until the default config's
// OtherOperatorActive condition has status, its message containing want.
func otherOperatorCondition(t *testing.T, status metav1.ConditionStatus, want string) *metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	devtest.WaitFor(t, "OtherOperatorActive "+string(status)+": "+want, 30*time.Second, func(ctx context.Context) (bool, string) {
		cfg := &maintenancev1.MaintenanceOperatorConfig{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: "default"}, cfg); err != nil {
			return false, err.Error()
		}
		c = meta.FindStatusCondition(cfg.Status.Conditions, maintenancev1.ConfigConditionOtherOperatorActive)
		return c != nil && c.Status == status && strings.Contains(c.Message, want), fmt.Sprint(c)
	})
	return c
}

// TestOperatorsNoLeaseShowsAreSeen: an operator that acts without a lease
// — NVIDIA's Maintenance Operator run without --leader-elect, a second
// gpufleet installed in another namespace — is found by its Deployment:
// gpufleet writes nothing to any NodeMaintenance while either has a ready
// replica, the config says which and what to do, and it acts as soon as
// the last is gone (the Deployment's event, not a poll).
func TestOperatorsNoLeaseShowsAreSeen(t *testing.T) {
	devtest.NeedCluster(t)
	t.Cleanup(func() { uncordonAll(t) })
	ctx := t.Context()
	nvidia := operatorDeployment(t, "nvidia-unfenced", "maintenance-operator",
		map[string]string{"app.kubernetes.io/component": "maintenance-operator-controller-manager"}, "/manager", "--health-probe-bind-address=:8081")

	setConfig(t, ios(3), nil)
	writes := countWrites(t, "default")
	nm := newNM("unfenced", "gpu-005", "unfenced.example.com")
	create(t, nm)
	time.Sleep(500 * time.Millisecond)
	before := writes()
	startOperator(t)
	t.Cleanup(func() { cleanupNMs(t) })
	c := otherOperatorCondition(t, metav1.ConditionTrue, "Deployment nvidia-unfenced/maintenance-operator (1 ready) without leader election")
	if c.Reason != "OperatorRunsWithoutLease" || !strings.Contains(c.Message, "scale it to 0") {
		t.Errorf("the condition does not say what runs and what to do: %+v", c)
	}

	// A second gpufleet starts in another namespace; NVIDIA's is scaled down.
	second := operatorDeployment(t, "gpufleet-second", "gpufleet", nil, "/usr/local/bin/gpufleet", "operator", "--leader-elect")
	if err := k8s.Patch(ctx, nvidia, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":0}}`))); err != nil {
		t.Fatal(err)
	}
	otherOperatorCondition(t, metav1.ConditionTrue, "another gpufleet operator runs as Deployment gpufleet-second/gpufleet")
	time.Sleep(3 * time.Second) // the operator's passes
	if got := writes() - before; got != 0 {
		t.Fatalf("%d NodeMaintenance writes beside an operator that holds no lease", got)
	}
	if getNode(t, "gpu-005").Spec.Unschedulable {
		t.Fatal("node gpu-005 cordoned beside another operator")
	}

	// The second gpufleet is removed: gpufleet acts, well before it would
	// have looked again by itself.
	removed := time.Now()
	if err := k8s.Delete(ctx, second); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, "unfenced", maintenancev1.PhaseReady, 60*time.Second)
	t.Logf("acted %.1f s after the second gpufleet's Deployment was deleted", time.Since(removed).Seconds())
	otherOperatorCondition(t, metav1.ConditionFalse, "")
}
