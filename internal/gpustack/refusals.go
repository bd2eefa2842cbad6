package gpustack

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// A refused write is one the API server answered with a final no for this
// object as rendered: invalid (422, e.g. an immutable field), forbidden
// (403: RBAC, an admission policy or a webhook's denial), or a bad request
// (400). Sending it again unchanged gets the same answer, so it is not
// retried on every pass: it is reported (ClusterPolicy status and a
// Warning event), the rest of the stack is still reconciled, and the write
// is retried with an exponential backoff, or at once when the rendered
// object changes (a policy edit that may fix it).
//
// A transient failure (a timeout, a 5xx, a conflict) is not a refusal: it
// fails the pass, which is retried with the controller's backoff.
func isRefusal(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err)
}

// Backoff of a refused write: 5 s, doubling, at most 5 minutes. And of a
// policy whose pass failed with a transient error, when passes are
// coalesced: 1 s, doubling, at most 2 minutes.
const (
	refusalBackoffBase = 5 * time.Second
	refusalBackoffMax  = 5 * time.Minute
	passBackoffBase    = time.Second
	passBackoffMax     = 2 * time.Minute
)

// refusal is one refused write.
type refusal struct {
	// What: "DaemonSet gpu-operator/nvidia-operator-validator".
	What string
	// Message is the API server's answer.
	Message string
	// desired identifies the object as it was rendered when refused.
	desired uint64
	// retryAt is when the write may be sent again unchanged.
	retryAt time.Time
}

// refusals are the writes the API server refused, by object.
type refusals struct {
	mu      sync.Mutex
	byWhat  map[string]refusal
	backoff workqueue.TypedRateLimiter[string]
}

// allowed reports whether the write of what, rendered as desired, may be
// sent now: it was not refused, it changed since, or its backoff is over.
func (r *refusals) allowed(what string, desired uint64, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.byWhat[what]
	return !ok || f.desired != desired || !now.Before(f.retryAt)
}

// refused records a refused write and returns when it may be retried.
func (r *refusals) refused(what string, desired uint64, err error, now time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.backoff == nil {
		r.backoff = workqueue.NewTypedItemExponentialFailureRateLimiter[string](refusalBackoffBase, refusalBackoffMax)
	}
	if r.byWhat == nil {
		r.byWhat = map[string]refusal{}
	}
	if f, ok := r.byWhat[what]; ok && f.desired != desired {
		r.backoff.Forget(what) // a new object: its own backoff
	}
	at := now.Add(r.backoff.When(what))
	r.byWhat[what] = refusal{What: what, Message: refusalMessage(err), desired: desired, retryAt: at}
	return at
}

// has reports whether the last write of what was refused.
func (r *refusals) has(what string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.byWhat[what]
	return ok
}

// accepted forgets a refusal once the write went through (or is no
// longer wanted).
func (r *refusals) accepted(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byWhat[what]; !ok {
		return
	}
	delete(r.byWhat, what)
	r.backoff.Forget(what)
}

// keepOnly forgets the refusals of objects no longer rendered.
func (r *refusals) keepOnly(wanted map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for what := range r.byWhat {
		if !wanted[what] {
			delete(r.byWhat, what)
			r.backoff.Forget(what)
		}
	}
}

// current lists the refusals in a stable order, and the earliest retry.
func (r *refusals) current() ([]refusal, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []refusal
	var next time.Time
	for _, f := range r.byWhat {
		out = append(out, f)
		if next.IsZero() || f.retryAt.Before(next) {
			next = f.retryAt
		}
	}
	slices.SortFunc(out, func(a, b refusal) int { return strings.Compare(a.What, b.What) })
	return out, next
}

// refusalMessage is the API server's message of a refusal.
func refusalMessage(err error) string {
	if s, ok := err.(apierrors.APIStatus); ok && s.Status().Message != "" {
		return s.Status().Message
	}
	return err.Error()
}

// refusalsMessage is the status message that names every refused object
// with the API server's answer.
func refusalsMessage(list []refusal) string {
	parts := make([]string, len(list))
	for i, f := range list {
		parts[i] = fmt.Sprintf("%s refused by the API server: %s", f.What, f.Message)
	}
	return summarize(parts, 3)
}

// desiredHash identifies an object as rendered (its serialized form).
func desiredHash(o any) uint64 {
	b, err := json.Marshal(o)
	if err != nil {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write(b)
	return h.Sum64()
}

// passBackoff holds back the passes of a policy whose pass failed, when
// passes are coalesced: a coalesced pass returns a requeue without an
// error, which resets the controller's own backoff, so without this a
// failing pass would be retried at the pass interval for ever.
type passBackoff struct {
	mu      sync.Mutex
	limiter workqueue.TypedRateLimiter[string]
	until   map[string]time.Time
}

// failed records a failed pass of policy; it returns the delay before the
// next one.
func (b *passBackoff) failed(policy string, clk clock.PassiveClock) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limiter == nil {
		b.limiter = workqueue.NewTypedItemExponentialFailureRateLimiter[string](passBackoffBase, passBackoffMax)
		b.until = map[string]time.Time{}
	}
	d := b.limiter.When(policy)
	b.until[policy] = clk.Now().Add(d)
	return d
}

// succeeded resets the backoff of policy.
func (b *passBackoff) succeeded(policy string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limiter == nil {
		return
	}
	b.limiter.Forget(policy)
	delete(b.until, policy)
}

// wait is how long the next pass of policy must still wait (0: none).
func (b *passBackoff) wait(policy string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d := b.until[policy].Sub(now); d > 0 {
		return d
	}
	return 0
}
