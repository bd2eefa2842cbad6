package maintenance

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	policyv1client "k8s.io/client-go/kubernetes/typed/policy/v1"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
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
	// order: the pods asked for, in the order asked.
	order []string
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
	a.order = append(a.order, ev.Name)
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

// evictor is an evictor asking a, on the real clock, started until the
// test ends.
func (a *evictionAPI) evictor(t *testing.T) *evictor {
	return a.evictorOn(t, clock.RealClock{})
}

// evictorOn is an evictor asking a, on clk, started until the test ends.
func (a *evictionAPI) evictorOn(t *testing.T, clk clock.PassiveClock) *evictor {
	e := newEvictor(a, func(_ context.Context, node string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.notified = append(a.notified, node)
	}, clk)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = e.Start(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return e
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
	e := api.evictor(t)
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
	e := api.evictor(t)
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
	ge := gone.evictor(t)
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
	e := api.evictor(t)
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
	e := api.evictor(t)
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
	e := api.evictor(t)
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
	e := api.evictor(t)
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
	e := api.evictor(t)
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
	e := api.evictor(t)
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
	e := api.evictor(t)
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

// stepUntil advances clk by d, then waits until cond holds. The queue's
// delays run on clk: it may arm the timer of an item added just before
// the step only after it, so the clock is nudged on by a millisecond now
// and then (at most a second in all) rather than waited for on the wall.
func stepUntil(t *testing.T, clk *clocktesting.FakeClock, d time.Duration, what string, cond func() bool) {
	t.Helper()
	clk.Step(d)
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; !cond(); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("%s never happened", what)
		}
		time.Sleep(time.Millisecond)
		if i%10 == 9 {
			clk.Step(time.Millisecond)
		}
	}
}

// inLine reports whether the evictions of pods wait for their budget's
// turn.
func (e *evictor) inLine(pods ...*corev1.Pod) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range pods {
		if ev := e.pods[p.UID]; ev == nil || ev.step != waitingTurn {
			return false
		}
	}
	return true
}

// A refusal is asked again once its backoff has passed on the evictor's
// clock, not before: no wall-clock wait.
func TestEvictorRetriesARefusalAfterItsBackoffOnItsClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	api := newEvictionAPI(func(string) error { return tooManyRequests })
	e := api.evictorOn(t, clk)
	p := evictionPod("a1")
	const backoff = 10 * time.Second
	refusedAt := clk.Now()
	e.evict(testDrain, p, "ns/pdb-a", refusedAt, backoff)
	e.wait()
	st, at := e.state(p.UID, clk.Now())
	if st != evictionRefused || !at.Equal(refusedAt.Add(backoff)) {
		t.Fatalf("after a 429: state %v, retry at %s; want refused until %s", st, at, refusedAt.Add(backoff))
	}
	clk.Step(backoff - time.Millisecond)
	if st, _ := e.state(p.UID, clk.Now()); st != evictionRefused {
		t.Fatalf("before its backoff passed: state %v, want refused", st)
	}
	clk.Step(time.Millisecond)
	if st, _ := e.state(p.UID, clk.Now()); st != evictNow {
		t.Fatalf("once its backoff passed: state %v, want evict now", st)
	}
	e.evict(testDrain, p, "ns/pdb-a", refusedAt, backoff) // the drain's next step
	e.wait()
	if n := api.requests["a1"]; n != 2 {
		t.Errorf("%d requests, want 2 (the refusal and its retry)", n)
	}
	if st, at := e.state(p.UID, clk.Now()); st != evictionRefused || !at.Equal(clk.Now().Add(backoff)) {
		t.Errorf("after the second 429: state %v, retry at %s; want refused until %s", st, at, clk.Now().Add(backoff))
	}
	if len(api.notified) != 2 {
		t.Errorf("nodes notified %v, want the pod's node twice", api.notified)
	}
}

// The budget's turn goes to the oldest drain first, whatever the order the
// evictions were handed over in.
func TestEvictorGivesTheTurnToTheOldestDrainFirst(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	api := newEvictionAPI(func(string) error { return nil })
	e := api.evictorOn(t, clk) // the clock stays: no bound passes a turn
	start := clk.Now()
	drainOf := func(name string) types.NamespacedName {
		return types.NamespacedName{Namespace: "default", Name: "nm-" + name}
	}
	e.evict(drainOf("a0"), evictionPod("a0"), "ns/pdb-a", start.Add(5*time.Second), time.Second) // the holder, from a late drain
	waitFor(t, "a0's eviction", func() bool { return api.asked("a0") })
	var waiting []*corev1.Pod
	for _, w := range []struct {
		name  string
		after time.Duration
	}{{"a3", 3 * time.Second}, {"a1", time.Second}, {"a2", 2 * time.Second}} {
		p := evictionPod(w.name)
		e.evict(drainOf(w.name), p, "ns/pdb-a", start.Add(w.after), time.Second)
		waiting = append(waiting, p)
	}
	waitFor(t, "a1, a2 and a3 in the budget's line", func() bool { return e.inLine(waiting...) })

	for i, holder := range []string{"a0", "a1", "a2"} {
		next := "a" + string(rune('1'+i))
		e.budgetChanged(pdb("pdb-a", holder), pdb("pdb-a")) // counted: the turn passes on
		waitFor(t, next+"'s eviction", func() bool { return api.asked(next) })
	}
	e.budgetChanged(pdb("pdb-a", "a3"), pdb("pdb-a"))
	e.wait()
	if diff := cmp.Diff([]string{"a0", "a1", "a2", "a3"}, api.order); diff != "" {
		t.Errorf("evictions asked for (-want +got):\n%s", diff)
	}
}

// A granted eviction the disruption controller never counts passes the
// turn on after countedWait on the evictor's clock; an eviction whose turn
// never comes goes out of turn after maxTurnWait.
func TestEvictorBoundsTheTurnsOnItsClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	api := newEvictionAPI(func(string) error { return nil })
	e := api.evictorOn(t, clk)
	start := clk.Now()
	// first holds budget's turn; second waits in line until just before
	// bound (nothing asked), then goes within one more step.
	holdsUntil := func(budget, first, second string, bound, step time.Duration, what string) {
		t.Helper()
		e.evict(testDrain, evictionPod(first), budget, start, time.Second)
		waitFor(t, first+"'s eviction", func() bool { return api.asked(first) })
		p := evictionPod(second)
		e.evict(testDrain, p, budget, start.Add(time.Second), time.Second)
		waitFor(t, second+" in the budget's line", func() bool { return e.inLine(p) })
		clk.Step(bound - step)
		time.Sleep(20 * time.Millisecond)
		if api.asked(second) {
			t.Fatalf("%s was asked for before %s", second, what)
		}
		stepUntil(t, clk, step, second+"'s eviction after "+what, func() bool { return api.asked(second) })
		e.wait()
	}
	holdsUntil("ns/pdb-a", "a0", "a1", maxCountedWait, time.Millisecond, "the bound passed a0's turn on")
	e.countedWait = time.Hour // from now on a granted eviction holds the turn for an hour
	holdsUntil("ns/pdb-b", "b0", "b1", maxTurnWait, time.Second, "maxTurnWait (out of turn)")
}

// Each ask for a turn has its own bound: a pod asking again soon after an
// earlier ask still waits maxTurnWait from its new ask (the queue keeps an
// item's earliest delay, the earlier ask's).
func TestEvictorBoundsEachAskForATurn(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	api := newEvictionAPI(func(name string) error {
		if name == "a1" {
			return tooManyRequests
		}
		return nil
	})
	e := api.evictorOn(t, clk)
	e.countedWait = time.Hour // a granted eviction holds the turn until counted
	start := clk.Now()
	e.evict(testDrain, evictionPod("a0"), "ns/pdb-a", start, time.Second)
	waitFor(t, "a0's eviction", func() bool { return api.asked("a0") })
	a1 := evictionPod("a1")
	e.evict(testDrain, a1, "ns/pdb-a", start.Add(time.Second), time.Second)
	waitFor(t, "a1 in the budget's line", func() bool { return e.inLine(a1) })
	e.budgetChanged(pdb("pdb-a", "a0"), pdb("pdb-a")) // a1's turn: refused
	waitFor(t, "a1's eviction", func() bool { return api.asked("a1") })
	e.wait()

	clk.Step(10 * time.Second)
	e.evict(testDrain, evictionPod("a2"), "ns/pdb-a", start.Add(2*time.Second), time.Second)
	waitFor(t, "a2's eviction", func() bool { return api.asked("a2") })
	e.evict(testDrain, a1, "ns/pdb-a", start.Add(time.Second), time.Second) // asked again, behind a2
	waitFor(t, "a1 in the budget's line again", func() bool { return e.inLine(a1) })
	clk.Step(20 * time.Second) // the first ask's bound
	time.Sleep(20 * time.Millisecond)
	api.mu.Lock()
	n := api.requests["a1"]
	api.mu.Unlock()
	if n != 1 {
		t.Fatalf("a1 asked for %d times 20 s after its second ask, want once (out of turn only after %s)", n, maxTurnWait)
	}
	stepUntil(t, clk, 10*time.Second, "a1's eviction out of turn, 30 s after its second ask", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return api.requests["a1"] == 2
	})
	e.wait()
}

// An eviction stopped before it was sent is never sent: neither one in
// its budget's line (the turn passes over it) nor one still in the queue
// behind busy workers; the workers then serve the others.
func TestEvictorNeverSendsAnEvictionStoppedBeforeItWasSent(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	release := make(chan struct{})
	api := newEvictionAPI(func(name string) error {
		if name[0] == 'x' {
			<-release
		}
		return nil
	})
	e := api.evictorOn(t, clk)
	start := clk.Now()
	other := types.NamespacedName{Namespace: "default", Name: "nm-other"}

	// In the budget's line.
	e.evict(other, evictionPod("a0"), "ns/pdb-a", start, time.Second)
	waitFor(t, "a0's eviction", func() bool { return api.asked("a0") })
	a1, a2 := evictionPod("a1"), evictionPod("a2")
	e.evict(testDrain, a1, "ns/pdb-a", start.Add(time.Second), time.Second)
	e.evict(other, a2, "ns/pdb-a", start.Add(2*time.Second), time.Second)
	waitFor(t, "a1 and a2 in the budget's line", func() bool { return e.inLine(a1, a2) })
	e.stop(testDrain)
	stepUntil(t, clk, maxCountedWait, "a2's eviction after a0's bound", func() bool { return api.asked("a2") })

	// In the queue, every worker busy with a request.
	for i := range maxEvictionsInFlight {
		e.evict(other, evictionPod(fmt.Sprintf("x%d", i)), "", start, time.Second)
	}
	waitFor(t, "every worker asking", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return api.inFlight["x"] == maxEvictionsInFlight
	})
	queued := evictionPod("b1")
	e.evict(testDrain, queued, "", start, time.Second)
	e.stop(testDrain)
	late := evictionPod("b2")
	e.evict(other, late, "", start, time.Second)
	close(release)
	e.wait()
	clk.Step(2 * maxTurnWait) // whatever was still to come on the clock
	e.wait()

	for _, p := range []string{"a1", "b1"} {
		if api.asked(p) {
			t.Errorf("%s was asked for after its drain stopped", p)
		}
	}
	if !api.asked("b2") {
		t.Error("b2, queued behind the busy workers, was never asked for")
	}
	if api.maxFlight["x"] > maxEvictionsInFlight {
		t.Errorf("%d requests in flight at once, want at most %d", api.maxFlight["x"], maxEvictionsInFlight)
	}
	for _, p := range []*corev1.Pod{a1, queued} {
		if st, _ := e.state(p.UID, clk.Now()); st != evictNow {
			t.Errorf("%s after its drain stopped: state %v, want evict now (forgotten)", p.Name, st)
		}
	}
}

// No worker waits for a budget's turn: with more evictions waiting in one
// budget's line than there are workers, the others still go.
func TestEvictorWorkersDoNotWaitForTurns(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	api := newEvictionAPI(func(string) error { return nil })
	e := api.evictorOn(t, clk) // the clock stays: a0 holds the turn
	start := clk.Now()
	e.evict(testDrain, evictionPod("a0"), "ns/pdb-a", start, time.Second)
	waitFor(t, "a0's eviction", func() bool { return api.asked("a0") })
	var line []*corev1.Pod
	for i := range 2 * maxEvictionsInFlight {
		p := evictionPod(fmt.Sprintf("a%d", i+1))
		e.evict(testDrain, p, "ns/pdb-a", start.Add(time.Second), time.Second)
		line = append(line, p)
	}
	for i := range 10 {
		e.evict(testDrain, evictionPod(fmt.Sprintf("c%d", i)), "", start, time.Second)
	}
	waitFor(t, "the evictions without a budget", func() bool {
		for i := range 10 {
			if !api.asked(fmt.Sprintf("c%d", i)) {
				return false
			}
		}
		return true
	})
	waitFor(t, "the budget's evictions all in its line", func() bool { return e.inLine(line...) })
	e.stop(testDrain)
	e.wait()
}
