package maintenance

import (
	"context"
	"errors"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"

	"github.com/gpufleet/gpufleet/internal/ownwrites"
)

// WaitReasons writes why Pending objects wait, apart from the scheduling
// pass: a pass over thousands of waiting objects would otherwise spend
// seconds on their status writes while a freed slot stays unused. The
// scheduler sets the reasons of its latest plan; workers write each
// object's latest reason (a burst of plans for one object is one write) and
// only when its status says something else. A write from a stale copy fails
// with a conflict and is retried from the cache, so it never overwrites a
// scheduling decision.
type WaitReasons struct {
	Client client.Client
	Clock  clock.PassiveClock
	// Workers write in parallel (default 4).
	Workers int

	mu   sync.Mutex
	want map[types.NamespacedName]string
	// own: our writes the cache may not show yet.
	own   ownwrites.Record
	queue workqueue.TypedRateLimitingInterface[types.NamespacedName]
	once  sync.Once
}

func (w *WaitReasons) init() {
	w.once.Do(func() {
		w.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "nodemaintenance-wait-reasons"})
	})
}

// Set replaces the wanted reasons with a plan's (object key -> reason) and
// queues the objects whose status says something else.
func (w *WaitReasons) Set(waiting map[string]string, byKey map[string]*maintenancev1.NodeMaintenance) {
	w.init()
	want := make(map[types.NamespacedName]string, len(waiting))
	var changed []types.NamespacedName
	for key, reason := range waiting {
		nm := byKey[key]
		if nm == nil {
			continue
		}
		k := client.ObjectKeyFromObject(nm)
		want[k] = reason
		if needsReason(nm, reason) {
			changed = append(changed, k)
		}
	}
	w.mu.Lock()
	w.want = want
	// Scheduled or gone: never written again.
	w.own.Retain(func(k types.NamespacedName) bool { _, ok := want[k]; return ok })
	w.mu.Unlock()
	for _, k := range changed {
		w.queue.Add(k)
	}
}

func (w *WaitReasons) reason(k types.NamespacedName) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.want[k]
	return r, ok
}

// needsReason reports whether a Pending object's status lacks reason.
func needsReason(nm *maintenancev1.NodeMaintenance, reason string) bool {
	if !initialised(nm) || nm.DeletionTimestamp != nil || nm.Phase() != maintenancev1.PhasePending {
		return false // the lifecycle controller initialises it first; or it moved on
	}
	c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady)
	return c == nil || c.Reason != string(maintenancev1.PhasePending) || c.Message != reason
}

// Start runs the workers until ctx ends (a manager runnable: only the
// leader writes).
func (w *WaitReasons) Start(ctx context.Context) error {
	w.init()
	workers := w.Workers
	if workers <= 0 {
		workers = 4
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for w.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	w.queue.ShutDown()
	wg.Wait()
	return nil
}

func (w *WaitReasons) processNext(ctx context.Context) bool {
	k, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(k)
	if err := w.write(ctx, k); err != nil {
		switch {
		case errors.Is(err, errCacheBehind):
		case apierrors.IsConflict(err):
			statusConflicts.WithLabelValues("wait-reasons").Inc()
		default:
			ctrl.LoggerFrom(ctx).Info("writing wait reason failed; retrying", "object", k.String(), "error", err.Error())
		}
		w.queue.AddRateLimited(k)
		return true
	}
	w.queue.Forget(k)
	return true
}

// errCacheBehind: the cache has not seen our last write of the object yet;
// retried shortly, without a request.
var errCacheBehind = errors.New("cache has not seen the last wait-reason write yet")

// write sets one object's latest wanted reason, if it still needs it.
func (w *WaitReasons) write(ctx context.Context, k types.NamespacedName) error {
	reason, ok := w.reason(k)
	if !ok {
		return nil // scheduled or gone since
	}
	nm := &maintenancev1.NodeMaintenance{}
	if err := w.Client.Get(ctx, k, nm); err != nil {
		return client.IgnoreNotFound(err)
	}
	if w.own.Behind(k, nm.ResourceVersion) {
		return errCacheBehind
	}
	if !needsReason(nm, reason) {
		return nil
	}
	rvBefore := nm.ResourceVersion
	orig := nm.DeepCopy()
	setPhase(nm, maintenancev1.PhasePending, reason, w.Clock.Now())
	if err := patchStatus(ctx, w.Client, orig, nm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("updating wait reason of %s: %w", k, err)
	}
	w.own.Wrote(k, rvBefore)
	return nil
}
