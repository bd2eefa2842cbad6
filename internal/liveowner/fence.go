package liveowner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=update,resourceNames=a9620a8f.nvidia.com;53822513.nvidia.com

// The fence. While gpufleet acts in place of NVIDIA's GPU Operator or
// Maintenance Operator, it holds that operator's leader lease itself (the
// lease object that operator left, in its namespace), renewing it as a
// leader does: a leader of theirs that wakes from a stall, or is started
// again by mistake, finds the lease held and renewed by someone else and
// does not lead (client-go's leader election then stops it), instead of
// acting beside gpufleet. gpufleet takes a lease only once its holder is
// dead by gpufleet's own observation (Observer), a released one at once,
// and gives them back (no holder) when it stops, so that the other
// operator may start at once after a switch back.

// FenceAction is what the fence does with one lease.
type FenceAction int

// Fence actions.
const (
	// FenceWait: another operator's live holder; look again at the time
	// returned.
	FenceWait FenceAction = iota
	// FenceAcquire: take the lease (released, expired by observation, or
	// held by an earlier gpufleet).
	FenceAcquire
	// FenceRenew: renew gpufleet's hold.
	FenceRenew
	// FenceNothing: held and renewed recently; look again at the time
	// returned.
	FenceNothing
)

// FenceStep decides what the fence does with lease l at now (pure, but
// for the observation it records): identity is this gpufleet's fence
// holder. Another holder, another gpufleet's fence included, is waited for
// until it is dead by observation. It returns when to look again.
func FenceStep(l *coordinationv1.Lease, obs *Observer, identity string, now time.Time) (FenceAction, time.Duration) {
	d := duration(l)
	renewEvery := d / 3
	switch holder(l) {
	case identity:
		if t := l.Spec.RenewTime; t != nil && now.Sub(t.Time) < renewEvery && !now.Before(t.Time) {
			return FenceNothing, renewEvery - now.Sub(t.Time)
		}
		return FenceRenew, renewEvery
	case "":
		return FenceAcquire, renewEvery
	}
	if held, ok := obs.Held([]coordinationv1.Lease{*l}, Operator{Lease: l.Name}, now); ok {
		return FenceWait, held.Until.Sub(now) + 100*time.Millisecond
	}
	return FenceAcquire, renewEvery
}

// Fence is the controller that holds the other operators' leases.
type Fence struct {
	Client   client.Client
	Reader   client.Reader
	Observer *Observer
	Identity string
	Clock    clock.PassiveClock
	caches   map[string]cluster.Cluster // by lease name
}

// Reconcile takes, renews or waits for one lease.
func (f *Fence) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	c, ok := f.caches[req.Name]
	if !ok {
		return reconcile.Result{}, nil
	}
	l := &coordinationv1.Lease{}
	if err := c.GetCache().Get(ctx, req.NamespacedName, l); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	now := f.Clock.Now()
	act, next := FenceStep(l, f.Observer, f.Identity, now)
	switch act {
	case FenceWait, FenceNothing:
		return reconcile.Result{RequeueAfter: next}, nil
	}
	l = l.DeepCopy()
	t := metav1.NewMicroTime(now)
	if act == FenceAcquire {
		ctrl.LoggerFrom(ctx).Info("holding another operator's leader lease while gpufleet acts in its place",
			"lease", req.NamespacedName, "previousHolder", holder(l))
		l.Spec.HolderIdentity = ptr.To(f.Identity)
		l.Spec.AcquireTime = &t
		l.Spec.LeaseTransitions = ptr.To(ptrInt32(l.Spec.LeaseTransitions) + 1)
		// A released lease may be left with a short duration: held for
		// controller-runtime's 15 s at least, renewed every 5 s.
		if int64(ptrInt32(l.Spec.LeaseDurationSeconds)) < int64(defaultLeaseDuration/time.Second) {
			l.Spec.LeaseDurationSeconds = ptr.To(int32(defaultLeaseDuration / time.Second))
		}
		next = defaultLeaseDuration / 3
	}
	l.Spec.RenewTime = &t
	if err := f.Client.Update(ctx, l); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: time.Second}, nil // its holder wrote it meanwhile: judged again
		}
		return reconcile.Result{}, fmt.Errorf("holding lease %s: %w", req.NamespacedName, err)
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

// release gives back every lease this gpufleet holds (no holder), as a
// leader that stops releases its own.
func (f *Fence) release(ctx context.Context) error {
	var errs []error
	for name, c := range f.caches {
		var leases coordinationv1.LeaseList
		if err := c.GetCache().List(ctx, &leases); err != nil {
			errs = append(errs, fmt.Errorf("listing leases %s: %w", name, err))
			continue
		}
		for i := range leases.Items {
			if holder(&leases.Items[i]) != f.Identity {
				continue
			}
			l := &coordinationv1.Lease{}
			key := client.ObjectKeyFromObject(&leases.Items[i])
			if err := f.Reader.Get(ctx, key, l); err != nil {
				errs = append(errs, client.IgnoreNotFound(err))
				continue
			}
			if holder(l) != f.Identity {
				continue
			}
			l.Spec.HolderIdentity = nil
			if err := f.Client.Update(ctx, l); err != nil {
				errs = append(errs, fmt.Errorf("releasing lease %s: %w", key, err))
			}
		}
	}
	return errors.Join(errs...)
}

// FenceIdentity is this process's fence holder: the pod name, else the
// host name.
func FenceIdentity(podName string) string {
	if podName == "" {
		podName, _ = os.Hostname()
	}
	return FencePrefix + podName
}

// SetupFence registers the fence of ops' leases with mgr (it runs on the
// leader only) and returns the Observer that judges them, to share with
// the controllers that wait for those operators.
func SetupFence(mgr manager.Manager, obs *Observer, identity string, clk clock.PassiveClock, ops ...Operator) error {
	f := &Fence{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Observer: obs, Identity: identity, Clock: clk, caches: map[string]cluster.Cluster{}}
	b := builder.TypedControllerManagedBy[reconcile.Request](mgr).Named("liveowner-fence")
	for _, op := range ops {
		c, err := NewCache(mgr, op)
		if err != nil {
			return err
		}
		f.caches[op.Lease] = c
		b = b.WatchesRawSource(source.Kind[client.Object](c.GetCache(), &coordinationv1.Lease{}, &handler.EnqueueRequestForObject{}))
	}
	if err := b.Complete(f); err != nil {
		return fmt.Errorf("setting up the lease fence: %w", err)
	}
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := f.release(rctx); err != nil {
			mgr.GetLogger().WithName("liveowner-fence").Error(err, "giving back the other operators' leases failed; they expire")
		}
		return nil
	}))
}
