package maintenance

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	policyv1client "k8s.io/client-go/kubernetes/typed/policy/v1"
)

// evictionAPI is a fake clientset whose evictions answer with answer(pod),
// counting the requests and the most in flight at once per budget label.
type evictionAPI struct {
	*fake.Clientset
	mu        sync.Mutex
	requests  map[string]int
	inFlight  map[string]int
	maxFlight map[string]int
	answer    func(pod string) error
	notified  []string
	// cancelled: the request's context had ended when it was answered.
	cancelled map[string]bool
}

func newEvictionAPI(answer func(pod string) error) *evictionAPI {
	return &evictionAPI{Clientset: fake.NewClientset(), requests: map[string]int{},
		inFlight: map[string]int{}, maxFlight: map[string]int{}, answer: answer, cancelled: map[string]bool{}}
}

// The fake clientset runs its reactors one at a time: evictions are
// answered here instead, concurrently as the API server would.
func (a *evictionAPI) PolicyV1() policyv1client.PolicyV1Interface {
	return evictionPolicy{PolicyV1Interface: a.Clientset.PolicyV1(), api: a}
}

type evictionPolicy struct {
	policyv1client.PolicyV1Interface
	api *evictionAPI
}

func (p evictionPolicy) Evictions(ns string) policyv1client.EvictionInterface {
	return fakeEvictions{EvictionInterface: p.PolicyV1Interface.Evictions(ns), api: p.api}
}

type fakeEvictions struct {
	policyv1client.EvictionInterface
	api *evictionAPI
}

func (e fakeEvictions) Evict(ctx context.Context, ev *policyv1.Eviction) error {
	a := e.api
	budget := ev.Name[:1] // pods "a…" share one budget, "b…" another
	a.mu.Lock()
	a.requests[ev.Name]++
	a.inFlight[budget]++
	a.maxFlight[budget] = max(a.maxFlight[budget], a.inFlight[budget])
	a.mu.Unlock()
	err := a.answer(ev.Name)
	a.mu.Lock()
	a.inFlight[budget]--
	if ctx.Err() != nil {
		a.cancelled[ev.Name] = true
	}
	a.mu.Unlock()
	return err
}

func (a *evictionAPI) evictor() *evictor {
	return newEvictor(a, func(_ context.Context, node string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.notified = append(a.notified, node)
	})
}

func evictionPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: "node-" + name}}
}

var tooManyRequests = apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)

// A refused eviction is reported to its node's drains, waits for its
// retry time, and is due at once when its own budget grows (not another).
func TestEvictorRetriesARefusalAfterItsBackoffOrWhenItsBudgetGrows(t *testing.T) {
	api := newEvictionAPI(func(string) error { return tooManyRequests })
	e := api.evictor()
	p := evictionPod("a1")
	before := time.Now()
	e.evict(testDrain, p, "ns/pdb-a", before, time.Hour)
	e.wait()

	st, retryAt := e.state(p.UID, time.Now())
	if st != evictionRefused || retryAt.Before(before.Add(time.Hour)) {
		t.Fatalf("after a 429: state %v retry at %s, want refused until an hour from now", st, retryAt)
	}
	if len(api.notified) != 1 || api.notified[0] != "node-a1" {
		t.Errorf("nodes notified %v, want [node-a1]", api.notified)
	}
	if st, _ := e.state(p.UID, before.Add(time.Hour+time.Minute)); st != evictNow {
		t.Errorf("past its retry time: state %v, want evict now", st)
	}
	e.budgetGrew("ns/pdb-b")
	if st, _ := e.state(p.UID, time.Now()); st != evictionRefused {
		t.Errorf("after another budget grew: state %v, want still refused", st)
	}
	e.budgetGrew("ns/pdb-a")
	if st, _ := e.state(p.UID, time.Now()); st != evictNow {
		t.Errorf("after its budget grew: state %v, want evict now", st)
	}
}

// A granted eviction is pending while the pod watch may not show it yet,
// then due again (the watch never showed it: ask again); nobody is
// notified (the pod's own event brings the drain back).
func TestEvictorGrantedIsPendingUntilTheWatchShouldShowIt(t *testing.T) {
	api := newEvictionAPI(func(string) error { return nil })
	e := api.evictor()
	p := evictionPod("b1")
	e.evict(testDrain, p, "", time.Now(), time.Second)
	e.wait()
	if st, _ := e.state(p.UID, time.Now()); st != evictionPending {
		t.Errorf("just granted: state %v, want pending", st)
	}
	if st, _ := e.state(p.UID, time.Now().Add(evictionSeenWithin+time.Second)); st != evictNow {
		t.Errorf("granted long ago and still running: state %v, want evict now", st)
	}
	if len(api.notified) != 0 {
		t.Errorf("nodes notified %v after a granted eviction, want none", api.notified)
	}
	// A pod already gone counts as granted.
	gone := newEvictionAPI(func(name string) error { return apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name) })
	ge := gone.evictor()
	ge.evict(testDrain, p, "", time.Now(), time.Second)
	ge.wait()
	if st, _ := ge.state(p.UID, time.Now()); st != evictionPending || len(gone.notified) != 0 {
		t.Errorf("pod gone: state %v, notified %v; want pending, none", st, gone.notified)
	}
}

// While its eviction is in flight a pod is never asked for twice, however
// many drain steps run meanwhile.
func TestEvictorAsksOncePerPodWhileInFlight(t *testing.T) {
	release := make(chan struct{})
	api := newEvictionAPI(func(string) error { <-release; return nil })
	e := api.evictor()
	p := evictionPod("a1")
	for range 5 {
		e.evict(testDrain, p, "", time.Now(), time.Second)
		if st, _ := e.state(p.UID, time.Now()); st != evictionPending {
			t.Errorf("in flight: state %v, want pending", st)
		}
	}
	close(release)
	e.wait()
	if n := api.requests["a1"]; n != 1 {
		t.Errorf("%d eviction requests for one pod in flight, want 1", n)
	}
}

// Evictions behind one budget go one at a time; those behind different
// budgets, or none, go in parallel.
func TestEvictorTakesTurnsPerBudget(t *testing.T) {
	api := newEvictionAPI(func(string) error { time.Sleep(5 * time.Millisecond); return nil })
	e := api.evictor()
	e.countedWait = 0 // no disruption controller here
	start := time.Now()
	for i := range 8 {
		for _, prefix := range []string{"a", "b", "c"} {
			p := evictionPod(prefix + string(rune('0'+i)))
			budget := "ns/pdb-" + prefix
			if prefix == "c" {
				budget = "" // no budget
			}
			e.evict(testDrain, p, budget, start.Add(time.Duration(i)*time.Second), time.Second)
		}
	}
	e.wait()
	if api.maxFlight["a"] != 1 || api.maxFlight["b"] != 1 {
		t.Errorf("most evictions in flight under one budget: a %d, b %d; want 1 each", api.maxFlight["a"], api.maxFlight["b"])
	}
	if api.maxFlight["c"] < 2 {
		t.Errorf("most evictions without a budget in flight: %d, want them in parallel", api.maxFlight["c"])
	}
}

// An eviction that fails for another reason is retried like a refusal,
// and the failure reaches its node's drains.
func TestEvictorRetriesAFailure(t *testing.T) {
	api := newEvictionAPI(func(string) error { return apierrors.NewInternalError(context.DeadlineExceeded) })
	e := api.evictor()
	p := evictionPod("a1")
	e.evict(testDrain, p, "", time.Now(), 2*time.Second)
	e.wait()
	if st, at := e.state(p.UID, time.Now()); st != evictionRefused || time.Until(at) <= 0 {
		t.Errorf("after a 500: state %v retry at %s, want refused, retried later", st, at)
	}
	if len(api.notified) != 1 {
		t.Errorf("nodes notified %v, want the pod's node", api.notified)
	}
}

// The budget's turn passes on once the disruption controller has counted
// the granted eviction that holds it (the budget lists the pod among its
// disrupted pods, then no longer does), not at the response; a budget
// change that does not show that passes nothing on.
func TestEvictorPassesTheTurnWhenTheDisruptionControllerCountedTheEviction(t *testing.T) {
	api := newEvictionAPI(func(string) error { return nil })
	e := api.evictor()
	e.countedWait = time.Hour // no bound in this test
	start := time.Now()
	e.evict(testDrain, evictionPod("a1"), "ns/pdb-a", start, time.Second)
	waitFor(t, "a1's eviction", func() bool { return api.asked("a1") })
	e.evict(testDrain, evictionPod("a2"), "ns/pdb-a", start.Add(time.Second), time.Second)

	e.budgetChanged(pdb("pdb-a"), pdb("pdb-a", "other"))         // not the holder
	e.budgetChanged(pdb("pdb-a"), pdb("pdb-a", "a1"))            // the eviction's own update
	e.budgetChanged(pdb("pdb-b", "a1"), pdb("pdb-b"))            // another budget
	e.budgetChanged(pdb("pdb-a", "a1"), pdb("pdb-a", "a1", "x")) // still listed
	time.Sleep(50 * time.Millisecond)
	if api.asked("a2") {
		t.Fatal("a2 was asked for before the disruption controller counted a1")
	}
	e.budgetChanged(pdb("pdb-a", "a1"), pdb("pdb-a"))
	waitFor(t, "a2's eviction after a1 was counted", func() bool { return api.asked("a2") })
	e.wait()
}

// A granted eviction the disruption controller does not count passes the
// turn on after the bound; a refused one at once.
func TestEvictorPassesTheTurnAfterTheBoundOrARefusal(t *testing.T) {
	api := newEvictionAPI(func(name string) error {
		if name == "b1" {
			return tooManyRequests
		}
		return nil
	})
	e := api.evictor()
	e.countedWait = 20 * time.Millisecond
	start := time.Now()
	e.evict(testDrain, evictionPod("a1"), "ns/pdb-a", start, time.Second)
	waitFor(t, "a1's eviction", func() bool { return api.asked("a1") })
	e.evict(testDrain, evictionPod("a2"), "ns/pdb-a", start.Add(time.Second), time.Second)
	waitFor(t, "a2's eviction after the bound", func() bool { return api.asked("a2") })

	e.wait()
	e.countedWait = time.Hour
	e.evict(testDrain, evictionPod("b1"), "ns/pdb-b", start, time.Second)
	waitFor(t, "b1's eviction", func() bool { return api.asked("b1") })
	e.evict(testDrain, evictionPod("b2"), "ns/pdb-b", start.Add(time.Second), time.Second)
	waitFor(t, "b2's eviction after b1 was refused", func() bool { return api.asked("b2") })
	e.wait()
}

func (a *evictionAPI) asked(pod string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.requests[pod] > 0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s never happened", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// pdb is a budget in namespace ns listing disrupted pods.
func pdb(name string, disrupted ...string) *policyv1.PodDisruptionBudget {
	b := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptedPods: map[string]metav1.Time{}}}
	for _, p := range disrupted {
		b.Status.DisruptedPods[p] = metav1.Now()
	}
	return b
}

// testDrain is the NodeMaintenance the unit tests' evictions are for.
var testDrain = types.NamespacedName{Namespace: "default", Name: "nm-test"}

// A drain that stops (its NodeMaintenance withdrawn) evicts nothing more:
// its evictions waiting for a budget's turn are never asked for, another
// drain's evictions behind the same budget go on, and the stopped pods'
// records are forgotten, so a later drain of the same node starts afresh.
func TestEvictorStopsTheEvictionsOfAStoppedDrain(t *testing.T) {
	api := newEvictionAPI(func(string) error { return nil })
	e := api.evictor()
	e.countedWait = time.Hour // the turn passes only when counted
	other := types.NamespacedName{Namespace: "default", Name: "nm-other"}
	start := time.Now()
	e.evict(other, evictionPod("a1"), "ns/pdb-a", start, time.Second)
	waitFor(t, "a1's eviction", func() bool { return api.asked("a1") })
	stopped := evictionPod("a2")
	e.evict(testDrain, stopped, "ns/pdb-a", start.Add(time.Second), time.Second)
	e.evict(other, evictionPod("a3"), "ns/pdb-a", start.Add(2*time.Second), time.Second)
	if !e.draining(testDrain) {
		t.Fatal("the drain handed pods over but is not recorded")
	}

	e.stop(testDrain)
	e.stop(testDrain) // twice: nothing more
	if e.draining(testDrain) {
		t.Error("a stopped drain is still recorded")
	}
	e.budgetChanged(pdb("pdb-a", "a1"), pdb("pdb-a")) // a1 counted: the turn passes on
	waitFor(t, "a3's eviction after the stopped a2", func() bool { return api.asked("a3") })
	e.budgetChanged(pdb("pdb-a", "a3"), pdb("pdb-a"))
	e.wait()
	if api.asked("a2") {
		t.Error("a2 was evicted for a drain that had stopped")
	}
	if st, _ := e.state(stopped.UID, time.Now()); st != evictNow {
		t.Errorf("a2 after its drain stopped: state %v, want evict now (forgotten)", st)
	}
	e.stop(types.NamespacedName{Name: "never-drained"}) // unknown: nothing happens
}

// TestEvictorLetsARequestSentFinishAfterItsDrainStopped: a drain that
// ends while one of its evictions waits for the API server's answer does
// not cut that request (client-go would log the cut response as an error,
// and the eviction may have been granted); the request is bounded by its
// own timeout.
func TestEvictorLetsARequestSentFinishAfterItsDrainStopped(t *testing.T) {
	release := make(chan struct{})
	api := newEvictionAPI(func(string) error { <-release; return nil })
	e := api.evictor()
	e.evict(testDrain, evictionPod("x1"), "", time.Now(), time.Second)
	waitFor(t, "x1's eviction sent", func() bool { return api.asked("x1") })
	e.stop(testDrain)
	close(release)
	e.wait()
	api.mu.Lock()
	defer api.mu.Unlock()
	if api.cancelled["x1"] {
		t.Error("the eviction request was cancelled with its drain")
	}
}
