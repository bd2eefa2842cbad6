package liveowner

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FencePrefix starts the holder identity gpufleet writes into another
// operator's lease while it acts in that operator's place (Fence): such a
// lease is gpufleet's, never a live other operator.
const FencePrefix = "gpufleet/"

// Observer judges whether another operator's lease is held as client-go's
// leader election judges it: a holder is alive while the lease's record
// (holder, renew and acquire times, transitions, duration) keeps changing,
// and dead once the record has stayed the same for a lease duration of
// gpufleet's own observation. The times written in the lease are not
// compared with gpufleet's clock: a holder whose clock is skewed by more
// than a lease duration would look expired while it renews, and a frozen
// holder (a VM stall) alive while its renewTime is in gpufleet's future.
// A lease seen for the first time counts as renewed then: after a start,
// gpufleet waits a lease duration before it takes a silent holder for
// dead, as a new leader-election candidate does. The zero value is ready;
// it is safe for concurrent use. A nil Observer remembers nothing: every
// lease with a holder counts as held.
type Observer struct {
	// Self is this gpufleet's fence holder (FenceIdentity): its own hold.
	// Any other holder — another gpufleet's fence included: a second
	// gpufleet in the cluster, or this one's previous leader not yet gone —
	// is judged by observation like any other.
	Self string
	// Rivals, when set, finds what no lease shows: an operator that runs
	// without leader election, a second gpufleet (Rivals.Find).
	Rivals *Rivals

	mu   sync.Mutex
	seen map[types.NamespacedName]observation
}

type observation struct {
	record string
	at     time.Time
}

// record is what changes each time a holder renews or takes a lease.
func record(l *coordinationv1.Lease) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%d", holder(l), ptrInt32(l.Spec.LeaseTransitions))
	if t := l.Spec.RenewTime; t != nil {
		fmt.Fprintf(&b, "|r%d", t.UnixNano())
	}
	if t := l.Spec.AcquireTime; t != nil {
		fmt.Fprintf(&b, "|a%d", t.UnixNano())
	}
	fmt.Fprintf(&b, "|d%d", ptrInt32(l.Spec.LeaseDurationSeconds))
	return b.String()
}

func ptrInt32(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}

// observe records the lease's record at now and returns since when gpufleet
// has seen it unchanged.
func (o *Observer) observe(l *coordinationv1.Lease, now time.Time) time.Time {
	if o == nil {
		return now // nothing remembered: every holder looks alive for a lease duration
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen == nil {
		o.seen = map[types.NamespacedName]observation{}
	}
	key := types.NamespacedName{Namespace: l.Namespace, Name: l.Name}
	rec := record(l)
	if prev, ok := o.seen[key]; ok && prev.record == rec {
		return prev.at
	}
	o.seen[key] = observation{record: rec, at: now}
	return now
}

// Held returns the live holding of op's lease among leases (any
// namespace), if any, by observation: a lease of op's name with a holder
// that is not this gpufleet (Self), whose record changed within its
// duration of now (gpufleet's clock). Until is when it expires unless it
// changes again.
func (o *Observer) Held(leases []coordinationv1.Lease, op Operator, now time.Time) (Holding, bool) {
	var best Holding
	found := false
	for i := range leases {
		l := &leases[i]
		h := holder(l)
		if l.Name != op.Lease || h == "" {
			continue
		}
		since := o.observe(l, now)
		if o != nil && h == o.Self {
			continue // this gpufleet's own hold
		}
		until := since.Add(duration(l))
		if !now.Before(until) {
			continue
		}
		if !found || until.After(best.Until) {
			best = Holding{Operator: op, Namespace: l.Namespace, Holder: h, Until: until}
			found = true
		}
	}
	return best, found
}

// Read lists op's leases from r (its cache, NewCache; nil: none looked at)
// and returns its live holding by observation, if any; failing that, what
// the Observer's Rivals find.
func (o *Observer) Read(ctx context.Context, r client.Reader, op Operator, now time.Time) (Holding, bool, error) {
	if r != nil {
		var leases coordinationv1.LeaseList
		if err := r.List(ctx, &leases); err != nil {
			return Holding{}, false, fmt.Errorf("listing leases: %w", err)
		}
		if h, ok := o.Held(leases.Items, op, now); ok {
			return h, true, nil
		}
	}
	return o.Rival(ctx, op, now)
}

// Rival is what the Observer's Rivals find of op (nothing without them).
func (o *Observer) Rival(ctx context.Context, op Operator, now time.Time) (Holding, bool, error) {
	if o == nil {
		return Holding{}, false, nil
	}
	return o.Rivals.Find(ctx, op, now)
}

// duration is a lease's duration (controller-runtime's 15 s when unset).
func duration(l *coordinationv1.Lease) time.Duration {
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return defaultLeaseDuration
}

// OrNew is obs, or a new Observer of self when nil.
func OrNew(obs *Observer, self string) *Observer {
	if obs == nil {
		return &Observer{Self: self}
	}
	return obs
}
