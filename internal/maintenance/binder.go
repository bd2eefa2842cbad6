package maintenance

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// scheduleWriters is how many Scheduled writes are in flight at most.
const scheduleWriters = 32

// conflictReplan is how soon a pass plans again after a Scheduled write
// conflicted (the object changed since the cache showed it: the cache is
// about to show the change).
const conflictReplan = 100 * time.Millisecond

// binder sends the Scheduled writes the passes decide, so that a pass
// returns once it has decided and the next change is planned for while
// the writes are in flight (at 10,000 nodes a pass that waited for its
// slowest write took ~270 ms, of which the plan was ~36). The decisions
// are in the scheduler's record (scheduledRecord) until the cache shows
// them. A refused write forgets its decision and asks for a new pass,
// after the object's backoff; a conflict asks for one at once.
type binder struct {
	s *Scheduler
	// queue holds the objects whose decision is to be written.
	queue workqueue.TypedInterface[types.NamespacedName]
	// backoff spaces the new passes after an object's refused writes.
	backoff workqueue.TypedRateLimiter[types.NamespacedName]
	// replan asks the scheduler for a pass after the given delay.
	replan chan event.TypedGenericEvent[time.Duration]

	startOnce sync.Once
	workers   sync.WaitGroup
}

func newBinder(s *Scheduler) *binder {
	return &binder{
		s:       s,
		queue:   workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[types.NamespacedName]{Name: "nodemaintenance-scheduled-writes"}),
		backoff: workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
		replan:  make(chan event.TypedGenericEvent[time.Duration], 64),
	}
}

// Start runs the writers until ctx ends (a manager Runnable).
func (b *binder) Start(ctx context.Context) error {
	b.startOnce.Do(func() {
		for range scheduleWriters {
			b.workers.Go(func() {
				for {
					key, quit := b.queue.Get()
					if quit {
						return
					}
					b.write(ctx, key)
					b.queue.Done(key)
				}
			})
		}
	})
	<-ctx.Done()
	b.queue.ShutDown()
	b.workers.Wait()
	return nil
}

// NeedLeaderElection: only the leader schedules.
func (b *binder) NeedLeaderElection() bool { return true }

// flush writes every queued decision in the caller (tests, which start no
// writers).
func (b *binder) flush(ctx context.Context) {
	for b.queue.Len() > 0 {
		key, quit := b.queue.Get()
		if quit {
			return
		}
		b.write(ctx, key)
		b.queue.Done(key)
	}
}

// write sends the decision for key, if it is still to be sent.
func (b *binder) write(ctx context.Context, key types.NamespacedName) {
	s := b.s
	rec, ok := s.scheduled.sending(key)
	if !ok {
		return
	}
	after := rec.obj.DeepCopy() // the record's object is shared with the passes
	err := patchStatus(ctx, s.Client, rec.orig, after)
	if err == nil {
		s.scheduled.written(rec, after, s.Clock.Now())
		b.backoff.Forget(key)
		schedulingDecisions.WithLabelValues("scheduled").Inc()
		if rec.since != 0 {
			schedulingLatency.Observe(s.Clock.Since(time.Unix(0, rec.since)).Seconds())
		}
		return
	}
	// Pending again: the next pass decides anew, and its latency counts
	// from the change this decision planned for.
	s.scheduled.drop(rec)
	if rec.since != 0 {
		s.unplanned(rec.since)
	}
	if ctx.Err() != nil {
		return // stopping
	}
	if apierrors.IsConflict(err) {
		statusConflicts.WithLabelValues("scheduler").Inc()
		ctrl.LoggerFrom(ctx).V(1).Info("conflict while scheduling; planning again", "nodeMaintenance", key)
		b.ask(conflictReplan)
		return
	}
	delay := b.backoff.When(key)
	ctrl.LoggerFrom(ctx).Error(err, "scheduling refused; planning again after a backoff", "nodeMaintenance", key, "after", delay)
	b.ask(delay)
}

// ask asks the scheduler for a pass after delay. A full channel already
// holds requests for passes, each of which plans everything.
func (b *binder) ask(delay time.Duration) {
	select {
	case b.replan <- event.TypedGenericEvent[time.Duration]{Object: delay}:
	default:
	}
}
