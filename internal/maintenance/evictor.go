package maintenance

import (
	"context"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
)

// Eviction tuning.
const (
	// maxEvictionsInFlight bounds the eviction requests of this process in
	// flight at once, over all drains.
	maxEvictionsInFlight = 64
	// evictionSeenWithin: how long an evicted pod is not evicted again
	// while the pod watch still shows it untouched.
	evictionSeenWithin = 5 * time.Second
	// forgetEvictionAfter: a record nobody asked about for this long is
	// dropped (its drain ended or was deleted).
	forgetEvictionAfter = 10 * time.Minute
)

// evictor asks the API server for evictions in the background. A drain
// step hands it the pods to evict and returns at once, so no reconcile
// worker waits for a budget's turn or an eviction's round trip while the
// other objects' steps wait for a worker. An eviction's outcome comes
// back as a pod event (the evicted pod terminates) or, for a refusal or an
// error, as a notification of the pod's node; the next drain step reads
// it from here.
//
// Evictions of pods behind the same PodDisruptionBudget, from every drain
// of this process, go one at a time, the oldest drain first (budgetTurns).
//
// Nothing here is progress: after a restart the pod watch shows evicted
// pods terminating or gone, and the others are evicted again (eviction is
// idempotent).
type evictor struct {
	kube kubernetes.Interface
	// notify brings the drains of a node back (a refusal or an error).
	notify func(ctx context.Context, node string)

	turns budgetTurns
	slots chan struct{}
	// running: the evictions in flight (tests wait for them).
	running sync.WaitGroup

	mu   sync.Mutex
	ctx  context.Context // set by Start
	pods map[types.UID]*eviction
	// holders: per budget ("namespace/name"), the eviction that has its
	// turn, and how to pass the turn on.
	holders map[string]turnHolder
}

// turnHolder is the eviction that has a budget's turn.
type turnHolder struct {
	pod  string // name (a budget's disruptedPods are in its namespace)
	pass func() // idempotent
}

// eviction is what the evictor knows of one pod.
type eviction struct {
	inFlight bool
	budget   string    // "namespace/name" of its PodDisruptionBudget, "" for none
	evicted  time.Time // when its eviction was granted; zero if not
	// failed: the last request was refused or failed; retryAt is when it
	// may be asked again (sooner if its budget grows).
	failed  bool
	retryAt time.Time
	touched time.Time
}

// evictionState is a drain step's view of one pod.
type evictionState int

const (
	// evictNow: not asked for, or a refusal whose retry is due.
	evictNow evictionState = iota
	// evictionPending: in flight, or granted and the watch may not show
	// it yet.
	evictionPending
	// evictionRefused: refused or failed; retried at the returned time.
	evictionRefused
)

func newEvictor(kube kubernetes.Interface, notify func(context.Context, string)) *evictor {
	return &evictor{kube: kube, notify: notify, slots: make(chan struct{}, maxEvictionsInFlight),
		pods: map[types.UID]*eviction{}, holders: map[string]turnHolder{}}
}

// Start records the context evictions run in (a manager runnable that
// runs only on the leader, like the controller that uses it).
func (e *evictor) Start(ctx context.Context) error {
	e.mu.Lock()
	e.ctx = ctx
	e.mu.Unlock()
	<-ctx.Done()
	return nil
}

// NeedLeaderElection: only the leader drains.
func (e *evictor) NeedLeaderElection() bool { return true }

// state reports where the eviction of pod uid stands at wall time now,
// and for a refused one when it will be retried.
func (e *evictor) state(uid types.UID, now time.Time) (evictionState, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev := e.pods[uid]
	switch {
	case ev == nil:
		return evictNow, time.Time{}
	case ev.inFlight:
		return evictionPending, time.Time{}
	case !ev.evicted.IsZero() && now.Sub(ev.evicted) <= evictionSeenWithin:
		return evictionPending, time.Time{}
	case ev.failed && now.Before(ev.retryAt):
		return evictionRefused, ev.retryAt
	}
	return evictNow, time.Time{}
}

// evict asks for the eviction of p in the background, after its budget's
// turn (budget "" for none). drainStart orders the turns; a refusal is
// retried after retryAfter.
func (e *evictor) evict(p *corev1.Pod, budget string, drainStart time.Time, retryAfter time.Duration) {
	now := time.Now() // wall time: evictions are about the API server
	e.mu.Lock()
	for uid, ev := range e.pods {
		if !ev.inFlight && now.Sub(ev.touched) > forgetEvictionAfter {
			delete(e.pods, uid)
		}
	}
	if ev := e.pods[p.UID]; ev != nil && ev.inFlight {
		e.mu.Unlock()
		return
	}
	ctx := e.ctx
	if ctx == nil {
		ctx = context.Background() // not started (tests that drive steps directly)
	}
	e.pods[p.UID] = &eviction{inFlight: true, budget: budget, touched: now}
	e.mu.Unlock()

	ns, name, node, uid := p.Namespace, p.Name, p.Spec.NodeName, p.UID
	e.running.Go(func() {
		log := ctrl.LoggerFrom(ctx).WithValues("pod", ns+"/"+name, "node", node)
		if budget != "" {
			waitBegan := time.Now()
			pass := sync.OnceFunc(e.turns.take(ctx, budget, drainStart, node, maxTurnWait))
			evictionTurnWait.Observe(time.Since(waitBegan).Seconds())
			e.mu.Lock()
			e.holders[budget] = turnHolder{pod: name, pass: pass}
			e.mu.Unlock()
			defer func() {
				e.mu.Lock()
				if h, ok := e.holders[budget]; ok && h.pod == name {
					delete(e.holders, budget)
				}
				e.mu.Unlock()
				pass()
			}()
		}
		select {
		case e.slots <- struct{}{}:
		case <-ctx.Done():
			e.finish(uid, time.Time{}, retryAfter)
			return
		}
		began := time.Now()
		err := e.kube.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			// The pod's own terminationGracePeriodSeconds.
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
		})
		<-e.slots
		evictionDuration.WithLabelValues(strconv.FormatBool(budget != "")).Observe(time.Since(began).Seconds())
		switch {
		case err == nil:
			evictions.WithLabelValues("evicted").Inc()
			e.finish(uid, time.Now(), 0)
			return // the pod watch shows it terminating
		case apierrors.IsNotFound(err):
			e.finish(uid, time.Now(), 0)
			return // gone: the watch shows it
		case apierrors.IsTooManyRequests(err):
			evictions.WithLabelValues("refused").Inc()
			log.V(1).Info("eviction refused", "reason", err.Error())
		default:
			evictions.WithLabelValues("error").Inc()
			log.Info("eviction failed", "error", err.Error())
		}
		e.finish(uid, time.Time{}, retryAfter)
		if ctx.Err() == nil {
			e.notify(ctx, node)
		}
	})
}

// wait returns once no eviction is in flight (tests).
func (e *evictor) wait() { e.running.Wait() }

// finish records an eviction's outcome: granted at evicted, or (zero)
// refused, to be retried after retryAfter.
func (e *evictor) finish(uid types.UID, evicted time.Time, retryAfter time.Duration) {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	ev := e.pods[uid]
	if ev == nil {
		return
	}
	ev.inFlight, ev.touched = false, now
	if !evicted.IsZero() {
		ev.evicted, ev.failed = evicted, false
		return
	}
	ev.failed, ev.retryAt = true, now.Add(retryAfter)
}

// budgetChanged passes a budget's turn on as soon as the budget shows the
// eviction that has it (its pod newly among the disrupted pods): the API
// server has committed that eviction's decrement, so the next one no longer
// conflicts with it, and need not wait for the rest of its round trip (the
// pod's deletion and the response).
func (e *evictor) budgetChanged(old, cur *policyv1.PodDisruptionBudget) {
	budget := cur.Namespace + "/" + cur.Name
	e.mu.Lock()
	h, ok := e.holders[budget]
	e.mu.Unlock()
	if !ok {
		return
	}
	if _, was := old.Status.DisruptedPods[h.pod]; was {
		return
	}
	if _, is := cur.Status.DisruptedPods[h.pod]; is {
		turnsPassedEarly.Inc()
		h.pass()
	}
}

// budgetGrew makes the refused evictions under budget ("namespace/name")
// due at once: it allows more disruptions now.
func (e *evictor) budgetGrew(budget string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.pods {
		if ev.failed && ev.budget == budget {
			ev.retryAt = time.Time{}
		}
	}
}
