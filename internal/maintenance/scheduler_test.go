package maintenance

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

// laggingCache serves NodeMaintenance lists from a frozen copy, like an
// informer cache that has not yet received the watch events of our writes.
type laggingCache struct {
	client.Client
	frozen *maintenancev1.NodeMaintenanceList
}

func (c *laggingCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if l, ok := list.(*maintenancev1.NodeMaintenanceList); ok && c.frozen != nil {
		c.frozen.DeepCopyInto(l)
		return nil
	}
	return c.Client.List(ctx, list, opts...)
}

func TestSchedulerNeverSchedulesTwiceFromAStaleCache(t *testing.T) {
	scheme := testScheme()
	var objs []client.Object
	for i := range 3 {
		objs = append(objs, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i)},
			Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
		})
		objs = append(objs, &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("nm%d", i), Finalizers: []string{maintenancev1.Finalizer},
				CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(i) * time.Second))},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: fmt.Sprintf("n%d", i)},
		})
	}
	mpo := intstr.FromInt32(1)
	objs = append(objs, &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "default"},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: &mpo},
	})
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&maintenancev1.NodeMaintenance{}, &maintenancev1.MaintenanceOperatorConfig{}).Build()
	cache := &laggingCache{Client: api}
	s := &Scheduler{Client: cache, Namespace: "ops", Clock: clocktesting.NewFakeClock(t0), Recorder: events.NewFakeRecorder(100),
		Reasons: &WaitReasons{Client: cache, Clock: clocktesting.NewFakeClock(t0)}}
	ctx := context.Background()

	inProgress := func() []string {
		var l maintenancev1.NodeMaintenanceList
		if err := api.List(ctx, &l); err != nil {
			t.Fatal(err)
		}
		var out []string
		for i := range l.Items {
			if l.Items[i].InProgress() {
				out = append(out, l.Items[i].Name)
			}
		}
		return out
	}

	// Freeze the cache as it is before the first decision.
	var before maintenancev1.NodeMaintenanceList
	if err := api.List(ctx, &before); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reconcile(ctx, reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	if got := inProgress(); len(got) != 1 || got[0] != "nm0" {
		t.Fatalf("first pass scheduled %v, want [nm0]", got)
	}

	// Events for other objects arrive while the cache has not seen nm0's
	// update: every such pass plans with nm0 as written (in progress), so
	// it decides nothing, and needs no second look.
	cache.frozen = &before
	ahead := testutil.ToFloat64(plannedAheadOfCache)
	for range 3 {
		res, err := s.Reconcile(ctx, reconcile.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter != 0 {
			t.Errorf("a pass on a stale cache asked to look again after %s; it plans with its own writes", res.RequeueAfter)
		}
	}
	if got := inProgress(); len(got) != 1 {
		t.Fatalf("scheduled from a stale cache: %v in progress with maxParallelOperations=1", got)
	}
	if got := testutil.ToFloat64(plannedAheadOfCache) - ahead; got != 3 {
		t.Errorf("%v objects planned ahead of the cache in 3 passes, want 3 (nm0 each time)", got)
	}
	// The watch's echo of nm0's write brings no pass; an older or a later
	// version of it would.
	var written maintenancev1.NodeMaintenance
	if err := api.Get(ctx, client.ObjectKey{Namespace: "default", Name: "nm0"}, &written); err != nil {
		t.Fatal(err)
	}
	echo := event.UpdateEvent{ObjectOld: &before.Items[0], ObjectNew: &written}
	if s.notOwnWrite().Update(echo) {
		t.Error("the echo of the scheduler's own write brings a pass")
	}
	later := written.DeepCopy()
	later.ResourceVersion += "0"
	if !s.notOwnWrite().Update(event.UpdateEvent{ObjectOld: &written, ObjectNew: later}) {
		t.Error("a later change of a scheduled object is taken for the scheduler's own write")
	}

	// The cache catches up: the slot is taken, still nothing new.
	cache.frozen = nil
	if _, err := s.Reconcile(ctx, reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	if got := inProgress(); len(got) != 1 {
		t.Fatalf("in progress %v after the cache caught up", got)
	}
	// And the waiting objects say why.
	s.Reasons.drain(ctx)
	var nm maintenancev1.NodeMaintenance
	if err := api.Get(ctx, client.ObjectKey{Namespace: "default", Name: "nm2"}, &nm); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady); c == nil || c.Message != "maxParallelOperations reached: 1/1 nodes in maintenance" {
		t.Errorf("nm2 wait reason: %+v", c)
	}
}

func TestSchedulerWritesNothingWhenNothingChanged(t *testing.T) {
	scheme := testScheme()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n0"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	busy := &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a", Finalizers: []string{maintenancev1.Finalizer}},
		Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: "n0"},
	}
	waiting := busy.DeepCopy()
	waiting.Name = "b"
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(node, busy, waiting).WithStatusSubresource(&maintenancev1.NodeMaintenance{}, &maintenancev1.MaintenanceOperatorConfig{}).Build()
	counting := &countingClient{ListCopies: testobj.ListCopies{Client: api}}
	s := &Scheduler{Client: counting, Namespace: "ops", Clock: clocktesting.NewFakeClock(t0), Recorder: events.NewFakeRecorder(100),
		Reasons: &WaitReasons{Client: counting, Clock: clocktesting.NewFakeClock(t0)}}
	for range 2 {
		if _, err := s.Reconcile(context.Background(), reconcile.Request{}); err != nil {
			t.Fatal(err)
		}
		s.Reasons.drain(context.Background())
	}
	writes := counting.writes
	for range 5 {
		if _, err := s.Reconcile(context.Background(), reconcile.Request{}); err != nil {
			t.Fatal(err)
		}
		s.Reasons.drain(context.Background())
	}
	if counting.writes != writes {
		t.Errorf("%d writes in passes where nothing changed", counting.writes-writes)
	}
}

type countingClient struct {
	testobj.ListCopies
	writes int
}

// TestSchedulerPassCopiesNoCachedObject: a scheduling pass reads the
// cache's nodes and NodeMaintenance objects without copying them (at
// 10,000 nodes a pass copied every node; the pass only reads them).
func TestSchedulerPassCopiesNoCachedObject(t *testing.T) {
	scheme := testScheme()
	var objs []client.Object
	for i := range 3 {
		objs = append(objs, readyNode(fmt.Sprintf("n%d", i)),
			&maintenancev1.NodeMaintenance{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("m%d", i), Finalizers: []string{maintenancev1.Finalizer}},
				Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: fmt.Sprintf("n%d", i)},
			})
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&maintenancev1.NodeMaintenance{}, &maintenancev1.MaintenanceOperatorConfig{}).Build()
	counting := &countingClient{ListCopies: testobj.ListCopies{Client: api}}
	s := &Scheduler{Client: counting, Namespace: "ops", Clock: clocktesting.NewFakeClock(t0), Recorder: events.NewFakeRecorder(100),
		Reasons: &WaitReasons{Client: api, Clock: clocktesting.NewFakeClock(t0)}}
	if _, err := s.Reconcile(context.Background(), reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	if copying := counting.Copying(); len(copying) != 0 {
		t.Errorf("lists that copy every cached object: %v", copying)
	}
}

func (c *countingClient) Status() client.SubResourceWriter {
	return &countingStatus{SubResourceWriter: c.Client.Status(), c: c}
}

type countingStatus struct {
	client.SubResourceWriter
	c *countingClient
}

func (s *countingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.c.writes++
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

func (s *countingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	s.c.writes++
	return s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// heldWrites holds every status patch until want of them are in flight
// at once (or the first has waited two seconds: then all go on), and
// records the most in flight.
type heldWrites struct {
	client.Client
	want    int
	mu      sync.Mutex
	flight  int
	most    int
	release chan struct{}
	once    sync.Once
}

func (h *heldWrites) Status() client.SubResourceWriter {
	return &heldStatus{SubResourceWriter: h.Client.Status(), h: h}
}

type heldStatus struct {
	client.SubResourceWriter
	h *heldWrites
}

func (s *heldStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	h := s.h
	h.mu.Lock()
	h.flight++
	h.most = max(h.most, h.flight)
	if h.flight >= h.want {
		h.once.Do(func() { close(h.release) })
	}
	h.mu.Unlock()
	select {
	case <-h.release:
	case <-time.After(2 * time.Second):
		h.once.Do(func() { close(h.release) })
	}
	err := s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
	h.mu.Lock()
	h.flight--
	h.mu.Unlock()
	return err
}

// TestSchedulerSendsThePassWritesTogether: the objects one pass schedules
// are written in parallel, up to scheduleWriters at once (at 10,000 nodes
// a pass wrote them one after the other, ~100 ms each on a busy API
// server, and every release waited behind it), and each is Scheduled with
// its node's unschedulable state recorded.
func TestSchedulerSendsThePassWritesTogether(t *testing.T) {
	scheme := testScheme()
	const n = scheduleWriters + 8
	var objs []client.Object
	for i := range n {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%02d", i)}, Spec: corev1.NodeSpec{Unschedulable: i == 3},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}},
			&maintenancev1.NodeMaintenance{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("m%02d", i), Finalizers: []string{maintenancev1.Finalizer}},
				Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: fmt.Sprintf("n%02d", i)},
			})
	}
	mpo, mu := intstr.FromInt32(n), intstr.FromInt32(n)
	objs = append(objs, &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "default"},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: &mpo, MaxUnavailable: &mu},
	})
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&maintenancev1.NodeMaintenance{}, &maintenancev1.MaintenanceOperatorConfig{}).Build()
	held := &heldWrites{Client: api, want: scheduleWriters, release: make(chan struct{})}
	s := &Scheduler{Client: held, Namespace: "ops", Clock: clocktesting.NewFakeClock(t0), Recorder: events.NewFakeRecorder(100),
		Reasons: &WaitReasons{Client: api, Clock: clocktesting.NewFakeClock(t0)}}
	if _, err := s.Reconcile(context.Background(), reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	if held.most != scheduleWriters {
		t.Errorf("at most %d scheduling writes in flight at once, want %d", held.most, scheduleWriters)
	}
	var l maintenancev1.NodeMaintenanceList
	if err := api.List(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	for i := range l.Items {
		nm := &l.Items[i]
		if nm.Phase() != maintenancev1.PhaseScheduled {
			t.Errorf("%s is %s, want Scheduled", nm.Name, nm.Phase())
			continue
		}
		if want := nm.Spec.NodeName == "n03"; nm.Status.NodeUnschedulableBefore == nil || *nm.Status.NodeUnschedulableBefore != want {
			t.Errorf("%s: nodeUnschedulableBefore %v, want %v", nm.Name, nm.Status.NodeUnschedulableBefore, want)
		}
	}
}

// TestSchedulingRelevantNMSkipsTheStepsOfAMaintenance: the steps of a
// maintenance in progress bring no scheduling pass (at 10,000 nodes they
// kept the scheduler busy the whole rollout); what a plan reads does.
func TestSchedulingRelevantNMSkipsTheStepsOfAMaintenance(t *testing.T) {
	at := func(phase maintenancev1.Phase, edit ...func(*maintenancev1.NodeMaintenance)) *maintenancev1.NodeMaintenance {
		nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "m"},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: "n"}}
		setPhase(nm, phase, "", t0)
		for _, e := range edit {
			e(nm)
		}
		return nm
	}
	deleting := func(nm *maintenancev1.NodeMaintenance) { nm.DeletionTimestamp = &metav1.Time{Time: t0} }
	finalizer := func(nm *maintenancev1.NodeMaintenance) { nm.Finalizers = []string{maintenancev1.Finalizer} }
	urgent := func(nm *maintenancev1.NodeMaintenance) {
		nm.Annotations = map[string]string{maintenancev1.AnnotationUrgent: "true"}
	}
	reason := func(nm *maintenancev1.NodeMaintenance) {
		setPhase(nm, maintenancev1.PhasePending, "waiting: maxParallelOperations 1 reached", t0)
	}
	uninitialised := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "m"},
		Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: "n"}}
	for name, tc := range map[string]struct {
		old, cur *maintenancev1.NodeMaintenance
		want     bool
	}{
		"initialised":                 {uninitialised, at(maintenancev1.PhasePending), true},
		"scheduled":                   {at(maintenancev1.PhasePending), at(maintenancev1.PhaseScheduled), true},
		"made urgent":                 {at(maintenancev1.PhasePending), at(maintenancev1.PhasePending, urgent), true},
		"deletion of one in progress": {at(maintenancev1.PhaseReady, finalizer), at(maintenancev1.PhaseReady, finalizer, deleting), false},
		"a pending object withdrawn":  {at(maintenancev1.PhasePending), at(maintenancev1.PhasePending, deleting), true},
		"Scheduled to Cordon":         {at(maintenancev1.PhaseScheduled), at(maintenancev1.PhaseCordon, finalizer), false},
		"Cordon to WaitForPodCompletion": {at(maintenancev1.PhaseCordon, finalizer),
			at(maintenancev1.PhaseWaitForPodCompletion, finalizer), false},
		"WaitForPodCompletion to Draining": {at(maintenancev1.PhaseWaitForPodCompletion, finalizer), at(maintenancev1.PhaseDraining, finalizer), false},
		"Draining to Ready":                {at(maintenancev1.PhaseDraining, finalizer), at(maintenancev1.PhaseReady, finalizer), false},
		"finalizer gone while deleting":    {at(maintenancev1.PhaseReady, finalizer, deleting), at(maintenancev1.PhaseReady, deleting), false},
		"a wait reason written":            {at(maintenancev1.PhasePending), at(maintenancev1.PhasePending, reason), false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := schedulingRelevantNM.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.cur}); got != tc.want {
				t.Errorf("a scheduling pass: %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSchedulerPassWithARefusedWrite: the API server refuses one object's
// Scheduled write (invalid) and conflicts on another: the pass's other
// objects are still scheduled, the pass returns the refusal as its error
// (the work queue's backoff, not a hot loop), and the conflict alone
// would only bring a new pass.
func TestSchedulerPassWithARefusedWrite(t *testing.T) {
	scheme := testScheme()
	const n = 6
	var objs []client.Object
	for i := range n {
		objs = append(objs, readyNode(fmt.Sprintf("n%d", i)),
			&maintenancev1.NodeMaintenance{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("m%d", i), Finalizers: []string{maintenancev1.Finalizer}},
				Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: fmt.Sprintf("n%d", i)},
			})
	}
	mpo := intstr.FromInt32(n)
	objs = append(objs, &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "default"},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: &mpo, MaxUnavailable: &mpo},
	})
	refuse := map[string]error{
		"m1": apierrors.NewInvalid(maintenancev1.GroupVersion.WithKind("NodeMaintenance").GroupKind(), "m1", nil),
		"m4": apierrors.NewConflict(maintenancev1.GroupVersion.WithResource("nodemaintenances").GroupResource(), "m4", nil),
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&maintenancev1.NodeMaintenance{}, &maintenancev1.MaintenanceOperatorConfig{}).
		WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if err := refuse[obj.GetName()]; err != nil {
				return err
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		}}).Build()
	s := &Scheduler{Client: api, Namespace: "ops", Clock: clocktesting.NewFakeClock(t0), Recorder: events.NewFakeRecorder(100),
		Reasons: &WaitReasons{Client: api, Clock: clocktesting.NewFakeClock(t0)}}
	res, err := s.Reconcile(context.Background(), reconcile.Request{})
	if !apierrors.IsInvalid(err) || apierrors.IsConflict(err) {
		t.Errorf("pass error %v, want the refusal of m1 alone", err)
	}
	if res.RequeueAfter != 0 {
		t.Errorf("requeue after %s on a refused write, want the work queue's backoff", res.RequeueAfter)
	}
	var l maintenancev1.NodeMaintenanceList
	if err := api.List(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	for i := range l.Items {
		nm := &l.Items[i]
		want := maintenancev1.PhaseScheduled
		if refuse[nm.Name] != nil {
			want = maintenancev1.PhasePending
		}
		if nm.Phase() != want {
			t.Errorf("%s is %s, want %s", nm.Name, nm.Phase(), want)
		}
	}
	// Only the conflict: a new pass soon, no error.
	delete(refuse, "m1")
	s.scheduled = scheduledRecord{}
	if res, err := s.Reconcile(context.Background(), reconcile.Request{}); err != nil || res.RequeueAfter == 0 {
		t.Errorf("a pass whose only failure is a conflict: %+v, %v; want a requeue and no error", res, err)
	}
}

// TestSchedulingLatencyCountsFromTheFirstChange: the latency of a pass
// that schedules counts from the first change seen since the last pass
// that planned, through a pass whose write was refused; a pass that
// schedules nothing observes nothing and starts the count anew.
func TestSchedulingLatencyCountsFromTheFirstChange(t *testing.T) {
	scheme := testScheme()
	var objs []client.Object
	for i := range 3 {
		objs = append(objs, readyNode(fmt.Sprintf("n%d", i)))
	}
	pending := func(name, node string) *maintenancev1.NodeMaintenance {
		return &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Finalizers: []string{maintenancev1.Finalizer}},
			Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: node},
		}
	}
	mpo := intstr.FromInt32(3)
	objs = append(objs, pending("m0", "n0"), pending("m1", "n1"), &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "default"},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: &mpo, MaxUnavailable: &mpo},
	})
	var refusing bool
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&maintenancev1.NodeMaintenance{}, &maintenancev1.MaintenanceOperatorConfig{}).
		WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if refusing {
				return apierrors.NewInternalError(fmt.Errorf("refused"))
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		}}).Build()
	clk := clocktesting.NewFakeClock(t0)
	s := &Scheduler{Client: api, Namespace: "ops", Clock: clk, Recorder: events.NewFakeRecorder(100),
		Reasons: &WaitReasons{Client: api, Clock: clk}}
	observed := func() (uint64, float64) {
		var m dto.Metric
		if err := schedulingLatency.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
	}
	pass := func() error {
		_, err := s.Reconcile(context.Background(), reconcile.Request{})
		return err
	}
	count0, sum0 := observed()

	s.Changed()
	clk.Step(100 * time.Millisecond)
	s.Changed() // a later change: the count stays from the first
	clk.Step(50 * time.Millisecond)
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	count, sum := observed()
	if count-count0 != 1 || !near(sum-sum0, 0.150) {
		t.Fatalf("after the first pass: %d observations, %.3f s; want 1 of 0.150 s", count-count0, sum-sum0)
	}

	// A pass with nothing to schedule: nothing observed, and the next
	// count starts at the next change.
	s.Changed()
	clk.Step(time.Second)
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	if c, _ := observed(); c != count {
		t.Fatalf("a pass that scheduled nothing observed a latency")
	}

	// A new object; the first pass's write is refused, the next succeeds:
	// one observation, from the creation.
	if err := api.Create(context.Background(), pending("m2", "n2")); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Second)
	s.Changed()
	clk.Step(200 * time.Millisecond)
	refusing = true
	if err := pass(); err == nil {
		t.Fatal("the refused write did not fail the pass")
	}
	clk.Step(300 * time.Millisecond)
	refusing = false
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	count2, sum2 := observed()
	if count2-count != 1 || !near(sum2-sum, 0.5) {
		t.Fatalf("after the refused and the retried pass: %d observations, %.3f s; want 1 of 0.500 s", count2-count, sum2-sum)
	}
}

func near(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }

// TestNodeChangesOfAHeldNodeBringNoPass: the cordon, uncordon or readiness
// change of a node that a maintenance in progress holds changes no plan
// (it counts as unavailable and takes no new maintenance either way), so
// it brings no pass; on a node that none holds it does, and a label
// change (pools, NVLink domain) always does. When the holder is gone from
// the cache before the uncordon arrives, the uncordon brings the pass.
func TestNodeChangesOfAHeldNodeBringNoPass(t *testing.T) {
	scheme := testScheme()
	nm := func(name, node string, phase maintenancev1.Phase) *maintenancev1.NodeMaintenance {
		o := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Finalizers: []string{maintenancev1.Finalizer}},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: node}}
		setPhase(o, phase, "", t0)
		return o
	}
	api := fake.NewClientBuilder().WithScheme(scheme).
		WithObjects(nm("held", "busy", maintenancev1.PhaseDraining), nm("waiting", "idle", maintenancev1.PhasePending)).
		WithIndex(&maintenancev1.NodeMaintenance{}, indexNodeName, func(o client.Object) []string {
			return []string{o.(*maintenancev1.NodeMaintenance).Spec.NodeName}
		}).Build()
	s := &Scheduler{Client: api, Namespace: "ops", Clock: clocktesting.NewFakeClock(t0)}
	node := func(name string, edit ...func(*corev1.Node)) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "a"}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
		for _, e := range edit {
			e(n)
		}
		return n
	}
	cordoned := func(n *corev1.Node) { n.Spec.Unschedulable = true }
	notReady := func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }
	relabelled := func(n *corev1.Node) { n.Labels = map[string]string{"pool": "b"} }
	heartbeat := func(n *corev1.Node) { n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(t0) }
	for _, tc := range []struct {
		name     string
		old, cur *corev1.Node
		want     bool
	}{
		{"held node cordoned", node("busy"), node("busy", cordoned), false},
		{"held node uncordoned", node("busy", cordoned), node("busy"), false},
		{"held node not ready", node("busy"), node("busy", notReady), false},
		{"held node relabelled", node("busy"), node("busy", relabelled), true},
		{"node of a Pending object cordoned", node("idle"), node("idle", cordoned), true},
		{"node without objects uncordoned", node("free", cordoned), node("free"), true},
		{"node without objects not ready", node("free"), node("free", notReady), true},
		{"heartbeat", node("free"), node("free", heartbeat), false},
	} {
		if got := s.nodeChangeRelevant().Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.cur}); got != tc.want {
			t.Errorf("%s: a pass %v, want %v", tc.name, got, tc.want)
		}
	}
	// The holder is gone from the cache before its node's uncordon arrives.
	if err := api.Delete(context.Background(), nm("held", "busy", maintenancev1.PhaseDraining)); err != nil {
		t.Fatal(err)
	}
	var left maintenancev1.NodeMaintenance
	if err := api.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "held"}, &left); err == nil {
		left.Finalizers = nil
		if err := api.Update(context.Background(), &left); err != nil {
			t.Fatal(err)
		}
	}
	if !s.nodeChangeRelevant().Update(event.UpdateEvent{ObjectOld: node("busy", cordoned), ObjectNew: node("busy")}) {
		t.Error("the uncordon of a node whose maintenance is gone brings no pass")
	}
}

// testScheme knows the core kinds and gpufleet's maintenance kinds.
func testScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = maintenancev1.AddToScheme(scheme)
	return scheme
}

// readyNode is a Ready node.
func readyNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
}

// TestSchedulerRestartBetweenTwoPasses: a scheduler that starts after
// another one's pass (its record of its own writes lost with the process)
// plans from the API server's state and schedules nothing the limits do
// not allow.
func TestSchedulerRestartBetweenTwoPasses(t *testing.T) {
	scheme := testScheme()
	var objs []client.Object
	for i := range 3 {
		objs = append(objs, readyNode(fmt.Sprintf("n%d", i)), &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("m%d", i), Finalizers: []string{maintenancev1.Finalizer}},
			Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: fmt.Sprintf("n%d", i)},
		})
	}
	mpo := intstr.FromInt32(1)
	objs = append(objs, &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "default"},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: &mpo},
	})
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&maintenancev1.NodeMaintenance{}, &maintenancev1.MaintenanceOperatorConfig{}).Build()
	ctx := context.Background()
	newScheduler := func() *Scheduler {
		return &Scheduler{Client: api, Namespace: "ops", Clock: clocktesting.NewFakeClock(t0), Recorder: events.NewFakeRecorder(100),
			Reasons: &WaitReasons{Client: api, Clock: clocktesting.NewFakeClock(t0)}}
	}
	inProgress := func() int {
		var l maintenancev1.NodeMaintenanceList
		if err := api.List(ctx, &l); err != nil {
			t.Fatal(err)
		}
		n := 0
		for i := range l.Items {
			if l.Items[i].InProgress() {
				n++
			}
		}
		return n
	}
	if _, err := newScheduler().Reconcile(ctx, reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	if got := inProgress(); got != 1 {
		t.Fatalf("first pass: %d in progress, want 1", got)
	}
	for range 2 { // restarted, twice
		if _, err := newScheduler().Reconcile(ctx, reconcile.Request{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := inProgress(); got != 1 {
		t.Errorf("after restarts: %d in progress with maxParallelOperations 1", got)
	}
}
