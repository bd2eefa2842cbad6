package maintenance

// The lifecycle Reconciler tested directly: each test builds a Reconciler
// on the local cluster's API server (a direct, uncached client, a started
// PodWatch, a fake clock and a fake event recorder), reconciles single
// requests and checks the state on the server after each one. No manager,
// no scheduler, no polling for the operator: the scheduler's part (moving
// an object to Scheduled) is written by the test.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// AdminConfigForTest is the local cluster's admin config. TestMain
// (suite_test.go, package maintenance_test, compiled into the same test
// binary) sets it once the cluster runs; nil under -short.
var AdminConfigForTest *rest.Config

const (
	directNS        = "lifecycle-direct"
	directRequestor = "direct.test.gpufleet.dev"
)

// directEnv is a lifecycle Reconciler wired to the local cluster without a
// manager.
type directEnv struct {
	c     client.Client // admin, uncached
	kube  kubernetes.Interface
	clock *clocktesting.FakeClock
	rec   *events.FakeRecorder
	r     *Reconciler
}

func newDirectEnv(t *testing.T) *directEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs the local cluster (run without -short)")
	}
	if AdminConfigForTest == nil {
		t.Fatal("no local cluster: TestMain (suite_test.go) sets AdminConfigForTest when it has started one; " +
			"build the control plane with `make tools` and run without -short")
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := maintenancev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(AdminConfigForTest, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(AdminConfigForTest)
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: directNS}}
	if err := c.Create(t.Context(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	pods := NewPodWatch(kube)
	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	running.Go(func() { _ = pods.Start(ctx) })
	running.Go(func() { // nobody else reads the watch's announcements
		for {
			select {
			case <-pods.Changes():
			case <-ctx.Done():
				return
			}
		}
	})
	t.Cleanup(func() { cancel(); running.Wait() })

	d := &directEnv{
		c: c, kube: kube,
		// Whole seconds: timestamps are stored with second precision.
		clock: clocktesting.NewFakeClock(time.Now().Truncate(time.Second)),
		rec:   events.NewFakeRecorder(100),
	}
	// Its own namespace: no MaintenanceOperatorConfig there, so Ready
	// objects are garbage-collected only after the default hour.
	d.r = &Reconciler{Client: c, Kube: kube, Pods: pods, Namespace: directNS, Clock: d.clock, Recorder: d.rec}
	return d
}

// restart replaces the Reconciler by a new one with the same clients and
// watch, as a restarted operator would have: nothing in memory survives.
func (d *directEnv) restart() {
	d.r = &Reconciler{Client: d.r.Client, Kube: d.kube, Pods: d.r.Pods, Namespace: directNS, Clock: d.clock, Recorder: d.rec}
}

// useNode makes the test start and end with node schedulable.
func (d *directEnv) useNode(t *testing.T, node string) {
	t.Helper()
	d.setUnschedulable(t, node, false)
	t.Cleanup(func() { d.setUnschedulable(t, node, false) })
}

func (d *directEnv) setUnschedulable(t *testing.T, node string, v bool) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%t}}`, v)
	if _, err := d.kube.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("setting node %s unschedulable=%t: %v", node, v, err)
	}
}

func (d *directEnv) cordoned(t *testing.T, node string) bool {
	t.Helper()
	n, err := d.kube.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Spec.Unschedulable
}

// newNM creates a NodeMaintenance of directRequestor, removed (finalizer
// and all) when the test ends.
func (d *directEnv) newNM(t *testing.T, name, node string, mutate ...func(*maintenancev1.NodeMaintenance)) types.NamespacedName {
	t.Helper()
	nm := &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Namespace: directNS, Name: name},
		Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: directRequestor, NodeName: node},
	}
	for _, m := range mutate {
		m(nm)
	}
	if err := d.c.Create(t.Context(), nm); err != nil {
		t.Fatalf("creating NodeMaintenance %s: %v", name, err)
	}
	key := client.ObjectKeyFromObject(nm)
	t.Cleanup(func() { d.removeNM(t, key) })
	return key
}

func (d *directEnv) removeNM(t *testing.T, key types.NamespacedName) {
	t.Helper()
	ctx := context.Background()
	nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	err := d.c.Patch(ctx, nm, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
	if client.IgnoreNotFound(err) != nil {
		t.Errorf("cleanup: removing the finalizer of %s: %v", key, err)
	}
	if err := d.c.Delete(ctx, nm); client.IgnoreNotFound(err) != nil {
		t.Errorf("cleanup: deleting %s: %v", key, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		return apierrors.IsNotFound(d.c.Get(ctx, key, &maintenancev1.NodeMaintenance{})), nil
	})
	if err != nil {
		t.Errorf("cleanup: %s still exists", key)
	}
}

// admit creates an object, lets the Reconciler take it over (Pending)
// and moves it to Scheduled as the scheduler would.
func (d *directEnv) admit(t *testing.T, name, node string, mutate ...func(*maintenancev1.NodeMaintenance)) types.NamespacedName {
	t.Helper()
	key := d.newNM(t, name, node, mutate...)
	d.reconcile(t, key)
	nm := d.get(t, key)
	if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady); c == nil || c.Reason != string(maintenancev1.PhasePending) {
		t.Fatalf("%s not Pending after its first reconcile: %+v", key, nm.Status.Conditions)
	}
	now := metav1.NewTime(d.clock.Now())
	setPhase(nm, maintenancev1.PhaseScheduled, "scheduled by the test", now.Time)
	nm.Status.ScheduledTime = &now
	if err := d.c.Status().Update(t.Context(), nm); err != nil {
		t.Fatalf("scheduling %s: %v", key, err)
	}
	if evs := d.events(); len(evs) != 0 {
		t.Fatalf("events before the object was scheduled: %v", evs)
	}
	return key
}

func (d *directEnv) reconcile(t *testing.T, key types.NamespacedName) reconcile.Result {
	t.Helper()
	res, err := d.r.Reconcile(t.Context(), reconcile.Request{NamespacedName: key})
	d.r.evictions().wait() // as if the step had waited for its evictions
	if err != nil {
		t.Fatalf("reconciling %s: %v", key, err)
	}
	return res
}

func (d *directEnv) get(t *testing.T, key types.NamespacedName) *maintenancev1.NodeMaintenance {
	t.Helper()
	nm := &maintenancev1.NodeMaintenance{}
	if err := d.c.Get(t.Context(), key, nm); err != nil {
		t.Fatalf("getting %s: %v", key, err)
	}
	return nm
}

func (d *directEnv) gone(t *testing.T, key types.NamespacedName) bool {
	t.Helper()
	err := d.c.Get(t.Context(), key, &maintenancev1.NodeMaintenance{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return apierrors.IsNotFound(err)
}

// events returns the events recorded since the last call, as
// "<type> <reason> <note>".
func (d *directEnv) events() []string {
	var out []string
	for {
		select {
		case e := <-d.rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// reasons keeps "<type> <reason>" of each event.
func reasons(evs []string) []string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		f := strings.Fields(e)
		out = append(out, strings.Join(f[:min(2, len(f))], " "))
	}
	return out
}

// waitPodsSynced waits until the PodWatch serves node's pods (the
// Reconciler starts watching them from the Cordon phase on).
func (d *directEnv) waitPodsSynced(t *testing.T, node string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, synced := d.r.Pods.Pods(node)
		return synced, nil
	})
	if err != nil {
		t.Fatalf("the pods of node %s were never watched", node)
	}
}

func wantPhase(t *testing.T, nm *maintenancev1.NodeMaintenance, phase maintenancev1.Phase) {
	t.Helper()
	if nm.Phase() != phase {
		t.Fatalf("%s in phase %s, want %s (conditions %+v)", nm.Name, nm.Phase(), phase, nm.Status.Conditions)
	}
}

func withDrain(spec maintenancev1.DrainSpec) func(*maintenancev1.NodeMaintenance) {
	return func(nm *maintenancev1.NodeMaintenance) { nm.Spec.DrainSpec = &spec }
}

// A new object's first step writes Pending, as NVIDIA's Maintenance
// Operator does, and nothing else: no finalizer until it is scheduled
// (there too), so a Pending object is deleted at once by either operator.
func TestDirectNewObjectGetsPendingOnly(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-009"
	d.useNode(t, node)
	key := d.newNM(t, "new", node, withDrain(maintenancev1.DrainSpec{}))
	before := d.get(t, key)

	if res := d.reconcile(t, key); res != (reconcile.Result{}) {
		t.Errorf("first reconcile returned %+v, want nothing to come back for", res)
	}
	got := d.get(t, key)
	if len(got.Finalizers) != 0 {
		t.Errorf("finalizers %v on a Pending object", got.Finalizers)
	}
	if diff := cmp.Diff(before.Annotations, got.Annotations); diff != "" {
		t.Errorf("annotations changed (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(before.Spec, got.Spec); diff != "" {
		t.Errorf("spec changed (-before +after):\n%s", diff)
	}
	wantPhase(t, got, maintenancev1.PhasePending)
	if c := meta.FindStatusCondition(got.Status.Conditions, maintenancev1.ConditionTypeReady); c.Status != metav1.ConditionFalse || len(got.Status.Conditions) != 1 {
		t.Errorf("status of a new object: %+v, want only Ready=False reason Pending", got.Status)
	}
	if d.cordoned(t, node) {
		t.Errorf("node %s cordoned by the finalizer step", node)
	}
	if evs := d.events(); len(evs) != 0 {
		t.Errorf("events for a new object: %v", evs)
	}

	// Pending: the scheduler alone writes it, also once it has a wait reason.
	for _, reason := range []string{"", "waiting: maxParallelOperations (1) reached"} {
		if reason != "" {
			got = d.get(t, key)
			setCondition(got, maintenancev1.ConditionTypeReady, metav1.ConditionFalse, string(maintenancev1.PhasePending), reason, d.clock.Now())
			if err := d.c.Status().Update(t.Context(), got); err != nil {
				t.Fatal(err)
			}
		}
		pending := d.get(t, key)
		for range 2 {
			if res := d.reconcile(t, key); res != (reconcile.Result{}) {
				t.Errorf("reconcile of a Pending object (%q) returned %+v", reason, res)
			}
		}
		after := d.get(t, key)
		if after.ResourceVersion != pending.ResourceVersion {
			t.Errorf("Pending object (%q) written by the lifecycle controller: %s -> %s, status %+v",
				reason, pending.ResourceVersion, after.ResourceVersion, after.Status)
		}
		if d.cordoned(t, node) {
			t.Errorf("node %s cordoned for a Pending object", node)
		}
		if _, watched := d.r.Pods.Pods(node); watched {
			t.Errorf("the pods of node %s are watched for a Pending object", node)
		}
		if evs := d.events(); len(evs) != 0 {
			t.Errorf("events for a Pending object: %v", evs)
		}
	}
}

// writeTracker records, in order, the patches of NodeMaintenance objects
// (metadata or status) and of nodes.
type writeTracker struct {
	client.Client
	seq *sequence
}

func (c *writeTracker) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	err := c.Client.Patch(ctx, obj, patch, opts...)
	c.seq.add(fmt.Sprintf("patch %T: %v", obj, err))
	return err
}

func (c *writeTracker) Status() client.SubResourceWriter {
	return statusTracker{c.Client.Status(), c.seq}
}

type statusTracker struct {
	client.SubResourceWriter
	seq *sequence
}

func (s statusTracker) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	err := s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
	s.seq.add(fmt.Sprintf("status %T: %v", obj, err))
	return err
}

// The Scheduled step records the node's state on the object (the
// annotation NVIDIA's Maintenance Operator reads) before it cordons, then
// writes Cordon; every later phase is one step of its own, also after a
// restart.
func TestDirectCordonRecordsNodeStateFirst(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-008"
	d.useNode(t, node)
	key := d.admit(t, "cordon", node)
	seq := &sequence{}
	d.r.Client = &writeTracker{Client: d.c, seq: seq}

	if res := d.reconcile(t, key); res != (reconcile.Result{}) {
		t.Errorf("Scheduled step returned %+v", res)
	}
	want := []string{"patch *v1alpha1.NodeMaintenance: <nil>", "patch *v1.Node: <nil>", "status *v1alpha1.NodeMaintenance: <nil>"}
	if diff := cmp.Diff(want, seq.steps); diff != "" {
		t.Errorf("writes of the Scheduled step (-want +got):\n%s", diff)
	}
	got := d.get(t, key)
	wantPhase(t, got, maintenancev1.PhaseCordon)
	if a := got.Annotations[maintenancev1.AnnotationNodeInitialUnschedulable]; a != "false" {
		t.Errorf("%s = %q, want \"false\"", maintenancev1.AnnotationNodeInitialUnschedulable, a)
	}
	if diff := cmp.Diff(ptr.To(false), got.Status.NodeUnschedulableBefore); diff != "" {
		t.Errorf("nodeUnschedulableBefore (-want +got):\n%s", diff)
	}
	if !d.cordoned(t, node) {
		t.Fatalf("node %s not cordoned in phase Cordon", node)
	}
	if evs := d.events(); len(evs) != 0 {
		t.Errorf("events of the cordon: %v", evs)
	}

	// The operator restarts here: the new process goes on from the object.
	d.restart()
	for _, phase := range []maintenancev1.Phase{maintenancev1.PhaseWaitForPodCompletion, maintenancev1.PhaseDraining, maintenancev1.PhaseReady} {
		if res := d.reconcile(t, key); res != (reconcile.Result{}) {
			t.Errorf("step to %s returned %+v", phase, res)
		}
		got = d.get(t, key)
		wantPhase(t, got, phase)
		if !d.cordoned(t, node) {
			t.Errorf("node %s not cordoned in phase %s", node, phase)
		}
	}
	if diff := cmp.Diff(ptr.To(false), got.Status.NodeUnschedulableBefore); diff != "" {
		t.Errorf("nodeUnschedulableBefore after the cordon (-want +got):\n%s", diff)
	}
	evs := d.events()
	if diff := cmp.Diff([]string{"Normal Ready"}, reasons(evs)); diff != "" {
		t.Errorf("events (-want +got):\n%s\nall: %v", diff, evs)
	}
	if len(evs) > 0 && (!strings.Contains(evs[0], node) || !strings.Contains(evs[0], "cordoned")) {
		t.Errorf("Ready event %q does not name node %s and its cordon", evs[0], node)
	}

	// Steady state: no write, no event, and a bounded wait for the GC.
	rv := got.ResourceVersion
	res := d.reconcile(t, key)
	if got := d.get(t, key); got.ResourceVersion != rv {
		t.Errorf("a Ready object was written again: %+v", got.Status)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > time.Hour {
		t.Errorf("Ready object requeued after %s, want the time left until the default GC age (1h)", res.RequeueAfter)
	}
	if evs := d.events(); len(evs) != 0 {
		t.Errorf("events in steady state: %v", evs)
	}
}

// staleOnce returns, once, a NodeMaintenance that it changes on the server
// right after reading it: the reconcile then works from a stale copy.
type staleOnce struct {
	client.Client
	key   types.NamespacedName
	fired bool
}

func (s *staleOnce) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := s.Client.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if _, ok := obj.(*maintenancev1.NodeMaintenance); !ok || key != s.key || s.fired {
		return nil
	}
	s.fired = true
	other := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	return s.Patch(ctx, other, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"direct.test/changed":"meanwhile"}}}`)))
}

func TestDirectEventsOnlyAfterStatusWrite(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-007"
	d.useNode(t, node)
	// A drain of pods nobody runs: Draining, then Ready at once.
	key := d.admit(t, "conflict", node, withDrain(maintenancev1.DrainSpec{PodSelector: "app=direct-nobody"}))
	d.reconcile(t, key)
	wantPhase(t, d.get(t, key), maintenancev1.PhaseCordon)
	d.waitPodsSynced(t, node) // the cordon step waits for it
	stale := &staleOnce{Client: d.c, key: key}
	d.r.Client = stale
	conflictsBefore := lifecycleConflicts(t)
	res, err := d.r.Reconcile(t.Context(), reconcile.Request{NamespacedName: key})
	if !stale.fired {
		t.Fatal("the reconcile never read the object")
	}
	if err != nil {
		t.Errorf("a status conflict returned error %v; the newer version's event brings the object back", err)
	}
	if res != (reconcile.Result{}) {
		t.Errorf("a status conflict returned %+v", res)
	}
	if got := lifecycleConflicts(t) - conflictsBefore; got != 1 {
		t.Errorf("status conflicts counted: %v, want 1", got)
	}
	wantPhase(t, d.get(t, key), maintenancev1.PhaseCordon) // the write did not happen
	if !d.cordoned(t, node) {
		t.Errorf("node %s not cordoned in phase Cordon", node)
	}
	evs := d.events()
	for _, r := range reasons(evs) {
		switch r {
		case "Normal " + ReasonDraining, "Normal " + ReasonReady, "Normal " + ReasonWaitingForPods:
			t.Errorf("event %q reported a phase change whose status write failed; events: %v", r, evs)
		}
	}

	// From fresh data the step is taken again and reported once.
	d.r.Client = d.c
	d.reconcile(t, key)
	wantPhase(t, d.get(t, key), maintenancev1.PhaseWaitForPodCompletion)
	d.reconcile(t, key)
	wantPhase(t, d.get(t, key), maintenancev1.PhaseDraining)
	evs = d.events()
	if diff := cmp.Diff([]string{}, reasons(evs)); diff != "" {
		t.Errorf("events of the retried step (-want +got):\n%s", diff)
	}
	d.waitPodsSynced(t, node)
	d.reconcile(t, key)
	wantPhase(t, d.get(t, key), maintenancev1.PhaseReady)
	evs = d.events()
	if diff := cmp.Diff([]string{"Normal Ready"}, reasons(evs)); diff != "" {
		t.Errorf("events of the drain step (-want +got):\n%s", diff)
	}
	if !d.cordoned(t, node) {
		t.Errorf("node %s not cordoned in phase Ready", node)
	}
}

// lifecycleConflicts reads gpufleet_maintenance_status_conflicts_total{writer="lifecycle"}.
func lifecycleConflicts(t *testing.T) float64 {
	t.Helper()
	var m dto.Metric
	if err := statusConflicts.WithLabelValues("lifecycle").Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestDirectObjectsOnSeveralNodesInterleaved(t *testing.T) {
	d := newDirectEnv(t)
	nodes := []string{"gpu-004", "gpu-005", "gpu-006"}
	var allNodes corev1.NodeList
	if err := d.c.List(t.Context(), &allNodes); err != nil {
		t.Fatal(err)
	}
	keys := map[string]types.NamespacedName{} // by node
	for i, node := range nodes {
		d.useNode(t, node)
		keys[node] = d.admit(t, fmt.Sprintf("several-%d", i), node)
	}
	before := map[string]bool{} // every other node, as it was
	for _, n := range allNodes.Items {
		if _, mine := keys[n.Name]; !mine {
			before[n.Name] = n.Spec.Unschedulable
		}
	}

	// Each object needs four steps (cordon, then one per phase); they are
	// taken in an interleaved order by one Reconciler.
	order := []string{"gpu-004", "gpu-005", "gpu-004", "gpu-006", "gpu-005", "gpu-006",
		"gpu-006", "gpu-004", "gpu-005", "gpu-004", "gpu-006", "gpu-005"}
	phases := []maintenancev1.Phase{maintenancev1.PhaseScheduled, maintenancev1.PhaseCordon,
		maintenancev1.PhaseWaitForPodCompletion, maintenancev1.PhaseDraining, maintenancev1.PhaseReady}
	steps := map[string]int{}
	for _, node := range order {
		d.reconcile(t, keys[node])
		steps[node]++
		want := map[string]bool{}
		for _, n := range nodes {
			nm := d.get(t, keys[n])
			wantPhase(t, nm, phases[steps[n]])
			if diff := cmp.Diff(ptr.To(false), nm.Status.NodeUnschedulableBefore); steps[n] > 0 && diff != "" {
				t.Errorf("%s: nodeUnschedulableBefore (-want +got):\n%s", nm.Name, diff)
			}
			want[n] = steps[n] >= 1
		}
		got := map[string]bool{}
		for _, n := range nodes {
			got[n] = d.cordoned(t, n)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("after reconciling the object of %s, cordoned nodes (-want +got):\n%s", node, diff)
		}
	}

	var after corev1.NodeList
	if err := d.c.List(t.Context(), &after); err != nil {
		t.Fatal(err)
	}
	for _, n := range after.Items {
		if was, other := before[n.Name]; other && n.Spec.Unschedulable != was {
			t.Errorf("node %s, held by none of the objects, went from unschedulable=%t to %t", n.Name, was, n.Spec.Unschedulable)
		}
	}
	evs := d.events()
	perNode := map[string][]string{}
	for _, e := range evs {
		for _, n := range nodes {
			if strings.Contains(e, n) {
				perNode[n] = append(perNode[n], reasons([]string{e})[0])
			}
		}
	}
	for _, n := range nodes {
		if diff := cmp.Diff([]string{"Normal Ready"}, perNode[n]); diff != "" {
			t.Errorf("events naming %s (-want +got):\n%s\nall: %v", n, diff, evs)
		}
	}
}

// barePod creates a pod bound to node (no scheduler), deleted at the end.
func (d *directEnv) barePod(t *testing.T, name, node string, labels map[string]string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: directNS, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "main", Image: "registry.example/" + name + ":1"}},
		},
	}
	if err := d.c.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.deletePods(t, labels) })
	return pod
}

// deletePods deletes the pods with labels in directNS and waits until they are gone.
func (d *directEnv) deletePods(t *testing.T, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	err := d.c.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(directNS), client.MatchingLabels(labels), client.GracePeriodSeconds(0))
	if err != nil {
		t.Errorf("cleanup: deleting pods %v: %v", labels, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := d.c.List(ctx, &pods, client.InNamespace(directNS), client.MatchingLabels(labels)); err != nil {
			return false, err
		}
		return len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Errorf("cleanup: pods %v still there: %v", labels, err)
	}
}

func TestDirectWaitForPodCompletionTimeout(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-003"
	d.useNode(t, node)
	labels := map[string]string{"app": "direct-waiter"}
	pod := d.barePod(t, "waiter", node, labels)
	const timeout = 60 * time.Second
	key := d.admit(t, "wait", node, func(nm *maintenancev1.NodeMaintenance) {
		nm.Spec.WaitForPodCompletion = &maintenancev1.WaitForPodCompletionSpec{
			PodSelector: "app=direct-waiter", TimeoutSeconds: ptr.To(int32(timeout / time.Second)),
		}
	})
	d.reconcile(t, key) // Scheduled -> Cordon, the wait's start recorded with it
	if a := d.get(t, key).Annotations[maintenancev1.AnnotationWaitPodCompletionStart]; a != d.clock.Now().UTC().Format(time.RFC3339) {
		t.Errorf("%s = %q, want the clock's %v", maintenancev1.AnnotationWaitPodCompletionStart, a, d.clock.Now())
	}
	d.clock.Step(time.Second)
	d.waitPodsSynced(t, node) // the Cordon step waits for the watch of the node's pods
	d.reconcile(t, key)       // enter WaitForPodCompletion
	got := d.get(t, key)
	wantPhase(t, got, maintenancev1.PhaseWaitForPodCompletion)
	if s := got.Status.WaitForCompletionStartTime; s == nil || !s.Time.Equal(d.clock.Now().Add(-time.Second)) {
		t.Errorf("waitForCompletionStartTime = %v, want the annotation's %v", s, d.clock.Now().Add(-time.Second))
	}
	if diff := cmp.Diff([]string{"Normal WaitForPodCompletion"}, reasons(d.events())); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	d.waitPodsSynced(t, node)

	// Before the timeout: the wait is bounded by the time left.
	for _, elapsed := range []time.Duration{0, 25 * time.Second, timeout - time.Second} {
		d.clock.SetTime(got.Status.WaitForCompletionStartTime.Add(elapsed))
		res := d.reconcile(t, key)
		if res.RequeueAfter != timeout-elapsed {
			t.Errorf("after %s of waiting: RequeueAfter %s, want the %s left", elapsed, res.RequeueAfter, timeout-elapsed)
		}
		nm := d.get(t, key)
		wantPhase(t, nm, maintenancev1.PhaseWaitForPodCompletion)
		if diff := cmp.Diff([]string{directNS + "/" + pod.Name}, nm.Status.WaitForCompletion); diff != "" {
			t.Errorf("after %s: waitForCompletion (-want +got):\n%s", elapsed, diff)
		}
		if evs := d.events(); len(evs) != 0 {
			t.Errorf("after %s: events before the timeout: %v", elapsed, evs)
		}
	}

	// At the timeout the maintenance proceeds, with a Warning.
	d.clock.SetTime(got.Status.WaitForCompletionStartTime.Add(timeout))
	if res := d.reconcile(t, key); res.RequeueAfter > time.Hour {
		t.Errorf("proceeding returned %+v", res)
	}
	nm := d.get(t, key)
	wantPhase(t, nm, maintenancev1.PhaseDraining)
	if len(nm.Status.WaitForCompletion) != 0 {
		t.Errorf("waitForCompletion = %v after giving up", nm.Status.WaitForCompletion)
	}
	d.reconcile(t, key) // no drain: Ready
	wantPhase(t, d.get(t, key), maintenancev1.PhaseReady)
	evs := d.events()
	if diff := cmp.Diff([]string{"Warning PodCompletionTimeout", "Normal Ready"}, reasons(evs)); diff != "" {
		t.Fatalf("events at the timeout (-want +got):\n%s\nall: %v", diff, evs)
	}
	if !strings.Contains(evs[0], directNS+"/"+pod.Name) {
		t.Errorf("PodCompletionTimeout event %q does not name the pod", evs[0])
	}
}

// guardedPods runs a Deployment of n pods on node with a PDB of
// minAvailable n, and returns the pods once the budget allows no eviction.
func (d *directEnv) guardedPods(t *testing.T, name, node string, n int32) []corev1.Pod {
	t.Helper()
	return d.budgetedPods(t, name, node, n, 0)
}

// budgetedPods runs a Deployment of n pods on node with a PDB of
// minAvailable n-allowed, and returns the pods once the budget allows
// allowed evictions.
func (d *directEnv) budgetedPods(t *testing.T, name, node string, n, allowed int32) []corev1.Pod {
	t.Helper()
	ctx := t.Context()
	labels := map[string]string{"app": name}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: directNS, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(n),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{corev1.LabelHostname: node},
					Containers:   []corev1.Container{{Name: "main", Image: "registry.example/" + name + ":1"}},
				},
			},
		},
	}
	if err := d.c.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.c.Delete(context.Background(), dep, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			t.Errorf("cleanup: %v", err)
		}
		d.deletePods(t, labels)
	})
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: directNS, Name: name},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(n - allowed)),
			Selector:     &metav1.LabelSelector{MatchLabels: labels},
		},
	}
	if err := d.c.Create(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.c.Delete(context.Background(), pdb); client.IgnoreNotFound(err) != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := d.c.Get(ctx, client.ObjectKeyFromObject(pdb), pdb); err != nil {
			return false, err
		}
		s := pdb.Status
		return s.ObservedGeneration == pdb.Generation && s.CurrentHealthy == n && s.DisruptionsAllowed == allowed, nil
	})
	if err != nil {
		t.Fatalf("PDB %s never counted %d healthy pods allowing %d evictions (status %+v): %v", name, n, allowed, pdb.Status, err)
	}
	var pods corev1.PodList
	if err := d.c.List(ctx, &pods, client.InNamespace(directNS), client.MatchingLabels(labels)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != node {
			t.Fatalf("pod %s on node %q, want %s", p.Name, p.Spec.NodeName, node)
		}
	}
	if len(pods.Items) != int(n) {
		t.Fatalf("%d pods of %s, want %d", len(pods.Items), name, n)
	}
	return pods.Items
}

func TestDirectDrainTimeoutNamesBlockingPods(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-002"
	d.useNode(t, node)
	pods := d.guardedPods(t, "direct-guarded", node, 2)
	const timeout = 30 * time.Second
	key := d.admit(t, "drain", node, withDrain(maintenancev1.DrainSpec{
		PodSelector: "app=direct-guarded", TimeoutSeconds: ptr.To(int32(timeout / time.Second)),
	}))
	d.reconcile(t, key)       // Scheduled -> Cordon
	d.waitPodsSynced(t, node) // the cordon step waits for the watch of the node's pods
	d.reconcile(t, key)       // enter WaitForPodCompletion (nothing to wait for)
	d.reconcile(t, key)       // enter Draining
	got := d.get(t, key)
	wantPhase(t, got, maintenancev1.PhaseDraining)
	if diff := cmp.Diff([]string{}, reasons(d.events())); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	start := got.Status.Drain.StartTime.Time
	d.waitPodsSynced(t, node)
	var names []string
	for _, p := range pods {
		names = append(names, directNS+"/"+p.Name)
	}
	sort.Strings(names)

	blockedCondition := func(nm *maintenancev1.NodeMaintenance) *metav1.Condition {
		return meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeDrainBlocked)
	}
	// Before the timeout: refused evictions, retried with a bounded backoff.
	for _, elapsed := range []time.Duration{0, 10 * time.Second, timeout - time.Second} {
		d.clock.SetTime(start.Add(elapsed))
		res := d.reconcile(t, key)
		if res.RequeueAfter <= 0 || res.RequeueAfter > maxDrainBackoff {
			t.Errorf("after %s of draining: RequeueAfter %s, want in (0, %s] while pods remain", elapsed, res.RequeueAfter, maxDrainBackoff)
		}
		nm := d.get(t, key)
		wantPhase(t, nm, maintenancev1.PhaseDraining)
		if c := blockedCondition(nm); c != nil {
			t.Errorf("after %s: DrainBlocked before the timeout: %+v", elapsed, c)
		}
		if st := nm.Status.Drain; st == nil || !cmp.Equal(names, st.WaitForEviction) || st.EvictionPods != 2 || st.DrainProgress != 0 {
			t.Errorf("after %s: drain status %+v, want 2 pods to evict, none gone, waiting for %v", elapsed, st, names)
		}
		if evs := d.events(); len(evs) != 0 {
			t.Errorf("after %s: events before the timeout: %v", elapsed, evs)
		}
	}

	// Past the timeout: a condition and a Warning name the blocking pods.
	d.clock.SetTime(start.Add(timeout + time.Second))
	for i := range 2 {
		res := d.reconcile(t, key)
		if res.RequeueAfter <= 0 || res.RequeueAfter > maxDrainBackoff {
			t.Errorf("blocked drain #%d: RequeueAfter %s, want in (0, %s]", i, res.RequeueAfter, maxDrainBackoff)
		}
		nm := d.get(t, key)
		wantPhase(t, nm, maintenancev1.PhaseDraining)
		c := blockedCondition(nm)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonDrainBlocked {
			t.Fatalf("blocked drain #%d: DrainBlocked condition %+v, want True/%s", i, c, ReasonDrainBlocked)
		}
		evs := d.events()
		wantEvents := []string{"Warning DrainBlocked"}
		if i > 0 {
			wantEvents = []string{} // same message: reported once
		}
		if diff := cmp.Diff(wantEvents, reasons(evs)); diff != "" {
			t.Errorf("blocked drain #%d: events (-want +got):\n%s", i, diff)
		}
		for _, name := range names {
			if !strings.Contains(c.Message, name) {
				t.Errorf("DrainBlocked message %q does not name pod %s", c.Message, name)
			}
			if i == 0 && len(evs) > 0 && !strings.Contains(evs[0], name) {
				t.Errorf("DrainBlocked event %q does not name pod %s", evs[0], name)
			}
		}
	}
	var left corev1.PodList
	if err := d.c.List(t.Context(), &left, client.InNamespace(directNS), client.MatchingLabels{"app": "direct-guarded"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range left.Items {
		if p.DeletionTimestamp != nil {
			t.Errorf("pod %s evicted despite its PDB", p.Name)
		}
	}
}

// A NodeMaintenance deleted while its evictions wait for their budget's
// turn evicts nothing more: its requestor withdrew it, the node is
// released, and no pod is evicted for a drain nobody wants any more.
func TestDirectDeletedDrainEvictsNothingMore(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-005"
	d.useNode(t, node)
	const n = 3
	d.budgetedPods(t, "direct-withdrawn", node, n, n) // the budget allows them all
	key := d.admit(t, "withdrawn", node, withDrain(maintenancev1.DrainSpec{PodSelector: "app=direct-withdrawn"}))
	d.reconcile(t, key)       // Scheduled -> Cordon
	d.waitPodsSynced(t, node) // the cordon step waits for the watch of the node's pods
	d.reconcile(t, key)       // enter WaitForPodCompletion (nothing to wait for)
	d.reconcile(t, key)       // enter Draining
	wantPhase(t, d.get(t, key), maintenancev1.PhaseDraining)
	d.events()

	// Another drain, started earlier, holds the budget's turn: this
	// drain's evictions wait behind it.
	e := d.r.evictions()
	release := e.turns.take(t.Context(), directNS+"/direct-withdrawn", time.Unix(0, 0), "elsewhere", time.Hour)
	if _, err := d.r.Reconcile(t.Context(), reconcile.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	if !e.draining(key) {
		t.Fatal("the drain step handed no pod to the evictor")
	}
	d.delete(t, key)
	d.reconcile(t, key) // the finalizer releases the node
	if !d.gone(t, key) {
		t.Fatalf("object still there after its finalizer step: %+v", d.get(t, key).ObjectMeta)
	}
	if e.draining(key) {
		t.Error("the deleted drain's evictions were not stopped")
	}
	release() // the turn comes to the stopped evictions
	e.wait()
	var pods corev1.PodList
	if err := d.c.List(t.Context(), &pods, client.InNamespace(directNS), client.MatchingLabels{"app": "direct-withdrawn"}); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != n {
		t.Errorf("%d pods, want %d", len(pods.Items), n)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Spec.NodeName != node {
			t.Errorf("pod %s evicted after its drain was deleted", p.Name)
		}
	}
	if d.cordoned(t, node) {
		t.Errorf("node %s still cordoned after the deleted drain released it", node)
	}
}

// readyOn takes a new object on node to phase Ready (no drain, no wait).
func (d *directEnv) readyOn(t *testing.T, name, node string, mutate ...func(*maintenancev1.NodeMaintenance)) types.NamespacedName {
	t.Helper()
	key := d.admit(t, name, node, mutate...)
	for range 4 { // Cordon, WaitForPodCompletion, Draining, Ready
		d.reconcile(t, key)
	}
	wantPhase(t, d.get(t, key), maintenancev1.PhaseReady)
	d.events()
	return key
}

func (d *directEnv) delete(t *testing.T, key types.NamespacedName) {
	t.Helper()
	nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	if err := d.c.Delete(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
}

func TestDirectDeletionReleasesNode(t *testing.T) {
	tests := map[string]struct {
		cordonedBefore bool
		wantCordoned   bool
		wantEvents     []string
	}{
		"uncordons":                 {wantEvents: []string{}}, // the node shows it
		"an admin's cordon is kept": {cordonedBefore: true, wantCordoned: true, wantEvents: []string{"Normal LeftCordoned"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := newDirectEnv(t)
			node := "gpu-001"
			d.useNode(t, node)
			d.setUnschedulable(t, node, tc.cordonedBefore)
			key := d.readyOn(t, "release", node)
			if diff := cmp.Diff(ptr.To(tc.cordonedBefore), d.get(t, key).Status.NodeUnschedulableBefore); diff != "" {
				t.Errorf("nodeUnschedulableBefore (-want +got):\n%s", diff)
			}
			if !d.cordoned(t, node) {
				t.Fatalf("node %s not cordoned in phase Ready", node)
			}
			d.delete(t, key)
			if d.gone(t, key) {
				t.Fatal("deleted at once: the finalizer did not hold the object")
			}
			d.reconcile(t, key)
			if !d.gone(t, key) {
				t.Errorf("object still there after its finalizer step: %+v", d.get(t, key).ObjectMeta)
			}
			if got := d.cordoned(t, node); got != tc.wantCordoned {
				t.Errorf("node %s unschedulable=%t after the release, want %t", node, got, tc.wantCordoned)
			}
			if diff := cmp.Diff(tc.wantEvents, reasons(d.events())); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			// A reconcile of what is gone does nothing.
			if res := d.reconcile(t, key); res != (reconcile.Result{}) {
				t.Errorf("reconcile of a gone object returned %+v", res)
			}
		})
	}
}

func TestDirectDeletionWaitsForAdditionalRequestors(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-000"
	d.useNode(t, node)
	key := d.readyOn(t, "shared", node, func(nm *maintenancev1.NodeMaintenance) {
		nm.Spec.AdditionalRequestors = []string{"second.requestor", "third.requestor"}
	})
	d.delete(t, key)

	held := func(want string) {
		t.Helper()
		for i := range 2 {
			d.reconcile(t, key)
			if d.gone(t, key) {
				t.Fatalf("%s released while %s remain", key, want)
			}
			nm := d.get(t, key)
			if !nm.HasFinalizer() || nm.DeletionTimestamp == nil {
				t.Fatalf("%s released while %s remain: %+v", key, want, nm.ObjectMeta)
			}
			if !d.cordoned(t, node) {
				t.Fatalf("node %s uncordoned while %s remain", node, want)
			}
			c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady)
			if c == nil || c.Status != metav1.ConditionTrue || c.Reason != string(maintenancev1.PhaseReady) ||
				c.Message != "deleted; node held until additional requestors leave: "+want {
				t.Errorf("Ready condition %+v, want still True, naming %s", c, want)
			}
			evs := d.events()
			wantEvents := []string{"Normal WaitingForRequestors"}
			if i > 0 {
				wantEvents = []string{} // reported once per list
			}
			if diff := cmp.Diff(wantEvents, reasons(evs)); diff != "" {
				t.Errorf("holding for %s, reconcile #%d: events (-want +got):\n%s", want, i, diff)
			}
		}
	}
	held("second.requestor, third.requestor")

	leave := func(remaining ...string) {
		t.Helper()
		nm := d.get(t, key)
		nm.Spec.AdditionalRequestors = remaining
		if err := d.c.Update(t.Context(), nm); err != nil {
			t.Fatal(err)
		}
	}
	leave("third.requestor")
	held("third.requestor")

	leave()
	d.reconcile(t, key)
	if !d.gone(t, key) {
		t.Errorf("object still there once every requestor left: %+v", d.get(t, key).ObjectMeta)
	}
	if d.cordoned(t, node) {
		t.Errorf("node %s still cordoned once every requestor left", node)
	}
	if diff := cmp.Diff([]string{}, reasons(d.events())); diff != "" {
		t.Errorf("events of the release (-want +got):\n%s", diff)
	}
}

// sequence records, in order, what the client and the recorder did.
type sequence struct {
	mu    sync.Mutex
	steps []string
}

func (s *sequence) add(step string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps = append(s.steps, step)
}

// deleteTracker records NodeMaintenance deletions and fails them while err is set.
type deleteTracker struct {
	client.Client
	seq *sequence
	err error
}

func (c *deleteTracker) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if _, ok := obj.(*maintenancev1.NodeMaintenance); !ok {
		return c.Client.Delete(ctx, obj, opts...)
	}
	if c.err != nil {
		c.seq.add("delete failed")
		return c.err
	}
	err := c.Client.Delete(ctx, obj, opts...)
	c.seq.add(fmt.Sprintf("delete %s: %v", obj.GetName(), err))
	return err
}

type sequencedRecorder struct {
	events.EventRecorder
	seq *sequence
}

func (r sequencedRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.seq.add("event " + reason)
	r.EventRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

func TestDirectNodeDeletedDeletesObject(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-never-existed"
	if err := d.c.Get(t.Context(), types.NamespacedName{Name: node}, &corev1.Node{}); !apierrors.IsNotFound(err) {
		t.Fatalf("node %s: %v, want it absent", node, err)
	}
	key := d.admit(t, "orphan", node)
	seq := &sequence{}
	injected := errors.New("injected delete failure")
	tracker := &deleteTracker{Client: d.c, seq: seq, err: injected}
	d.r.Client, d.r.Recorder = tracker, sequencedRecorder{EventRecorder: d.rec, seq: seq}

	// The delete fails: nothing is reported, the error is returned.
	_, err := d.r.Reconcile(t.Context(), reconcile.Request{NamespacedName: key})
	if !errors.Is(err, injected) {
		t.Errorf("reconcile with a failing delete returned %v, want the delete's error", err)
	}
	if evs := d.events(); len(evs) != 0 {
		t.Errorf("events although the delete failed: %v", evs)
	}
	if nm := d.get(t, key); nm.DeletionTimestamp != nil {
		t.Fatalf("object deleted although the delete failed")
	}

	// The delete succeeds, then the Warning follows.
	tracker.err = nil
	d.reconcile(t, key)
	evs := d.events()
	if diff := cmp.Diff([]string{"Warning NodeDeleted"}, reasons(evs)); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	if !strings.Contains(evs[0], node) {
		t.Errorf("NodeDeleted event %q does not name node %s", evs[0], node)
	}
	want := []string{"delete failed", "delete orphan: <nil>", "event NodeDeleted"}
	if diff := cmp.Diff(want, seq.steps); diff != "" {
		t.Errorf("order of writes and events (-want +got):\n%s", diff)
	}
	// Nothing was done to a node (it never existed): the object had no
	// finalizer yet, and is gone at once.
	if !d.gone(t, key) {
		t.Errorf("%s still exists after its deletion", key)
	}
}

// TestDirectScheduledWithNodeStateCordonsAtOnce: an object the scheduler
// moved to Scheduled carries the node's state, so its first step is the
// cordon (written as Cordon), then WaitForPodCompletion and Draining with
// the pods to evict already listed; the eviction step then has nothing new
// to write, and the drain's end is written with the one Normal event of
// the maintenance.
func TestDirectScheduledWithNodeStateCordonsAtOnce(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-003"
	d.useNode(t, node)
	labels := map[string]string{"app": "direct-planned"}
	pod := d.barePod(t, "planned", node, labels)
	key := d.admit(t, "planned", node, withDrain(maintenancev1.DrainSpec{PodSelector: "app=direct-planned", Force: true}))
	nm := d.get(t, key)
	nm.Status.NodeUnschedulableBefore = ptr.To(false) // as the scheduler records it
	if err := d.c.Status().Update(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	// The first reconcile starts the watch of the node's pods; started
	// here, it has synced by the Cordon step.
	d.r.watchPods(nm)
	d.waitPodsSynced(t, node)

	for _, phase := range []maintenancev1.Phase{maintenancev1.PhaseCordon, maintenancev1.PhaseWaitForPodCompletion, maintenancev1.PhaseDraining} {
		if res := d.reconcile(t, key); res != (reconcile.Result{}) {
			t.Errorf("step to %s returned %+v", phase, res)
		}
		wantPhase(t, d.get(t, key), phase)
		if !d.cordoned(t, node) {
			t.Fatalf("node %s not cordoned in phase %s", node, phase)
		}
	}
	got := d.get(t, key)
	want := []string{directNS + "/" + pod.Name}
	if st := got.Status.Drain; st == nil || st.StartTime == nil || st.EvictionPods != 1 || !cmp.Equal(want, st.WaitForEviction) {
		t.Errorf("drain status %+v, want a start time and %v to evict", st, want)
	}
	if evs := d.events(); len(evs) != 0 {
		t.Errorf("events before Ready: %v", evs)
	}

	rv := got.ResourceVersion
	d.reconcile(t, key) // evicts the pod, which terminates
	if got := d.get(t, key); got.ResourceVersion != rv {
		t.Errorf("the eviction step wrote what the cordon step had: %+v", got.Status.Drain)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		pods, _ := d.r.Pods.Pods(node)
		for i := range pods {
			if pods[i].Name == pod.Name {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("evicted pod %s never gone", pod.Name)
	}
	d.reconcile(t, key)
	got = d.get(t, key)
	wantPhase(t, got, maintenancev1.PhaseReady)
	if st := got.Status.Drain; st == nil || st.DrainProgress != 100 || len(st.WaitForEviction) != 0 {
		t.Errorf("drain status at Ready %+v, want progress 100, nothing left", st)
	}
	evs := d.events()
	if diff := cmp.Diff([]string{"Normal Ready"}, reasons(evs)); diff != "" {
		t.Fatalf("events (-want +got):\n%s\nall: %v", diff, evs)
	}
	if !strings.Contains(evs[0], "cordoned") || !strings.Contains(evs[0], "drained (1 pod(s) to evict)") {
		t.Errorf("Ready event %q does not say what was done", evs[0])
	}
}
