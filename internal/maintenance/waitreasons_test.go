package maintenance

import (
	"context"
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

// drain processes the queued objects in the test's goroutine.
func (w *WaitReasons) drain(ctx context.Context) {
	w.init()
	for w.queue.Len() > 0 {
		w.processNext(ctx)
	}
}

func TestWaitReasonsWriteLatestReasonOnceAndNeverOverAScheduledObject(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = maintenancev1.AddToScheme(scheme)
	mk := func(name string) *maintenancev1.NodeMaintenance {
		return &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Finalizers: []string{maintenancev1.Finalizer}},
			Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: "n-" + name},
		}
	}
	a, b, fresh := mk("a"), mk("b"), mk("fresh")
	fresh.Finalizers = nil // not yet initialised by the lifecycle controller
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(a, b, fresh).WithStatusSubresource(&maintenancev1.NodeMaintenance{}).Build()
	counting := &countingClient{ListCopies: testobj.ListCopies{Client: api}}
	w := &WaitReasons{Client: counting, Clock: clocktesting.NewFakeClock(t0)}
	ctx := context.Background()
	run := func() { w.drain(ctx) }
	byKey := map[string]*maintenancev1.NodeMaintenance{"default/a": a, "default/b": b, "default/fresh": fresh}
	reasonOf := func(name string) string {
		var nm maintenancev1.NodeMaintenance
		if err := api.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &nm); err != nil {
			t.Fatal(err)
		}
		if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady); c != nil {
			return c.Reason + ": " + c.Message
		}
		return ""
	}

	// Two plans before the workers run: only the latest reason is written.
	w.Set(map[string]string{"default/a": "first", "default/b": "slots", "default/fresh": "slots"}, byKey)
	w.Set(map[string]string{"default/a": "second", "default/b": "slots", "default/fresh": "slots"}, byKey)
	run()
	if got := reasonOf("a"); got != "Pending: second" {
		t.Errorf("a: %q", got)
	}
	if got := reasonOf("fresh"); got != "" {
		t.Errorf("an object without the finalizer got a reason: %q", got)
	}
	if counting.writes != 2 {
		t.Errorf("%d status writes, want 2 (a and b once each)", counting.writes)
	}

	// Unchanged reasons on objects that already show them: nothing queued.
	for _, n := range []string{"a", "b"} {
		_ = api.Get(ctx, client.ObjectKey{Namespace: "default", Name: n}, byKey["default/"+n])
	}
	w.Set(map[string]string{"default/a": "second", "default/b": "slots"}, byKey)
	if w.queue.Len() != 0 {
		t.Errorf("%d objects queued though their reasons did not change", w.queue.Len())
	}

	// b is scheduled meanwhile; a plan computed from an older copy still
	// says it waits: the writer reads the object again and leaves it.
	var nm maintenancev1.NodeMaintenance
	_ = api.Get(ctx, client.ObjectKey{Namespace: "default", Name: "b"}, &nm)
	stale := nm.DeepCopy()
	setPhase(&nm, maintenancev1.PhaseScheduled, "scheduled for maintenance", t0)
	if err := api.Status().Update(ctx, &nm); err != nil {
		t.Fatal(err)
	}
	writes := counting.writes
	w.Set(map[string]string{"default/b": "budget"}, map[string]*maintenancev1.NodeMaintenance{"default/b": stale})
	run()
	if got := reasonOf("b"); got != "Scheduled: scheduled for maintenance" {
		t.Errorf("a scheduled object was overwritten: %q", got)
	}
	if counting.writes != writes {
		t.Errorf("%d writes to a scheduled object", counting.writes-writes)
	}
	// a is no longer in the plan (scheduled or deleted): a queued key for
	// it writes nothing.
	w.queue.Add(client.ObjectKey{Namespace: "default", Name: "a"})
	run()
	if counting.writes != writes {
		t.Errorf("wrote a reason no plan wants")
	}
}

// staleGet serves Get of the objects in stale from those copies (a cache
// that has not seen the latest writes).
type staleGet struct {
	client.Client
	stale map[client.ObjectKey]*maintenancev1.NodeMaintenance
}

func (c *staleGet) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if nm, ok := c.stale[key]; ok {
		nm.DeepCopyInto(obj.(*maintenancev1.NodeMaintenance))
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// A plan computed before the cache showed the writer's own last write asks
// for the same reason again: the writer waits for the cache instead of
// writing from the old copy (which could only end in a conflict).
func TestWaitReasonsWaitForTheCacheToShowTheirOwnWrite(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = maintenancev1.AddToScheme(scheme)
	a := &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a", Finalizers: []string{maintenancev1.Finalizer}},
		Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "r", NodeName: "n-a"},
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(a).WithStatusSubresource(&maintenancev1.NodeMaintenance{}).Build()
	ctx := context.Background()
	key := client.ObjectKeyFromObject(a)
	old := &maintenancev1.NodeMaintenance{}
	if err := api.Get(ctx, key, old); err != nil {
		t.Fatal(err)
	}
	cache := &staleGet{Client: api}
	counting := &countingClient{ListCopies: testobj.ListCopies{Client: cache}}
	w := &WaitReasons{Client: counting, Clock: clocktesting.NewFakeClock(t0)}

	w.Set(map[string]string{"default/a": "slots"}, map[string]*maintenancev1.NodeMaintenance{"default/a": old})
	w.drain(ctx)
	if counting.writes != 1 {
		t.Fatalf("%d writes, want 1", counting.writes)
	}
	// The cache still shows the copy from before the write.
	cache.stale = map[client.ObjectKey]*maintenancev1.NodeMaintenance{key: old}
	w.Set(map[string]string{"default/a": "slots"}, map[string]*maintenancev1.NodeMaintenance{"default/a": old})
	if err := w.write(ctx, key); !errors.Is(err, errCacheBehind) {
		t.Errorf("write from the copy our write replaced: %v, want errCacheBehind", err)
	}
	if counting.writes != 1 {
		t.Errorf("wrote from a stale copy")
	}
	// Caught up: the reason is there, nothing to write.
	cache.stale = nil
	if err := w.write(ctx, key); err != nil {
		t.Fatal(err)
	}
	if counting.writes != 1 {
		t.Errorf("%d writes once the cache caught up, want still 1", counting.writes)
	}
	// A plan without the object (scheduled) forgets it.
	w.Set(map[string]string{}, nil)
	if n := w.own.Len(); n != 0 {
		t.Errorf("%d write records after the object left the plan", n)
	}
}

func TestLifecycleWaitsForTheCacheToShowItsOwnWrite(t *testing.T) {
	r := &Reconciler{}
	nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a", ResourceVersion: "5"}}
	key := client.ObjectKeyFromObject(nm)
	if r.own.Behind(key, nm.ResourceVersion) {
		t.Fatal("behind before any write")
	}
	r.own.Wrote(key, "5")
	if !r.own.Behind(key, nm.ResourceVersion) {
		t.Error("a cache still at the resourceVersion from before our write must count as behind")
	}
	nm.ResourceVersion = "6"
	if r.own.Behind(key, nm.ResourceVersion) {
		t.Error("a cache at a newer resourceVersion is not behind")
	}
	nm.ResourceVersion = "5"
	if r.own.Behind(key, nm.ResourceVersion) {
		t.Error("once caught up the expectation is forgotten")
	}
}
