package uninstall

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/maintenance/requestor"
)

// Options of an uninstall.
type Options struct {
	// Client reads and writes with the uninstaller's identity (a scheme
	// with the core, apps, coordination, resource and maintenance types).
	Client client.Client
	// Namespace, Deployment and Lease locate the operator: its Deployment
	// and its leader-election lease (default: the Deployment's name).
	Namespace, Deployment, Lease string
	// Timeout bounds the wait for the operator to stop (default 2 minutes).
	// Past it the operator's replicas are restored and nothing is released.
	Timeout time.Duration
	// DryRun prints what would be done and changes nothing.
	DryRun bool
	// Out receives one line per step.
	Out   io.Writer
	Clock clock.PassiveClock
	// PollInterval of the wait for the operator to stop (default 1 s).
	PollInterval time.Duration
}

// Errors of an uninstall; each means nothing was changed or released.
var (
	// ErrOperatorRunning: the operator did not stop within the timeout, or
	// gpufleet's operator runs elsewhere too.
	ErrOperatorRunning = errors.New("the operator is still running")
	// ErrCannotTell: the named Deployment does not exist and the caller may
	// not look in every namespace: whether gpufleet's operator runs
	// elsewhere cannot be told.
	ErrCannotTell = errors.New("cannot tell whether the operator is stopped")
)

// Run stops the operator, then releases every NodeMaintenance (uncordon
// what a maintenance cordoned, delete the objects, remove their
// finalizers). It is idempotent: run again after any interruption.
func Run(ctx context.Context, o Options) error {
	if o.Lease == "" {
		o.Lease = o.Deployment
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	say := func(format string, args ...any) {
		prefix := ""
		if o.DryRun {
			prefix = "(dry run) "
		}
		_, _ = fmt.Fprintf(o.Out, prefix+format+"\n", args...)
	}

	restore, err := stopOperator(ctx, o, say)
	if err != nil {
		return err
	}
	if !o.DryRun {
		if err := waitStopped(ctx, o, say); err != nil {
			if restore != nil {
				if rerr := restore(context.WithoutCancel(ctx)); rerr != nil {
					err = errors.Join(err, rerr)
				} else {
					say("operator replicas restored; nothing was released")
				}
			}
			return err
		}
	}

	var nms maintenancev1.NodeMaintenanceList
	if err := o.Client.List(ctx, &nms); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			say("no NodeMaintenance CRD: nothing to release")
			return nil
		}
		return fmt.Errorf("listing NodeMaintenance objects: %w", err)
	}
	nodes := map[string]*corev1.Node{}
	for i := range nms.Items {
		name := nms.Items[i].Spec.NodeName
		if _, seen := nodes[name]; seen {
			continue
		}
		n := &corev1.Node{}
		switch err := o.Client.Get(ctx, client.ObjectKey{Name: name}, n); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return fmt.Errorf("reading node %s: %w", name, err)
		default:
			nodes[name] = n
		}
	}
	plan := MakePlan(nms.Items, nodes)
	for _, line := range plan.Describe() {
		say("%s", line)
	}
	if !o.DryRun {
		if err := execute(ctx, o.Client, plan, nodes); err != nil {
			return fmt.Errorf("%w (run gpufleet uninstall again to finish)", err)
		}
		if err := verify(ctx, o.Client, say); err != nil {
			return err
		}
	}
	reportKept(ctx, o.Client, say)
	return nil
}

// stopOperator scales the operator's Deployment to 0 and returns how to
// scale it back (nil when nothing was changed). It first makes sure that
// this Deployment is the only gpufleet operator of the cluster: with
// another one running (or a wrong namespace or name given, the operator
// running elsewhere), releasing the NodeMaintenance objects would pull
// nodes from under it; and a Deployment that is not there proves nothing
// unless every namespace could be searched.
func stopOperator(ctx context.Context, o Options, say func(string, ...any)) (func(context.Context) error, error) {
	d := &appsv1.Deployment{}
	key := client.ObjectKey{Namespace: o.Namespace, Name: o.Deployment}
	found := true
	if err := o.Client.Get(ctx, key, d); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading the operator's Deployment %s: %w", key, err)
		}
		found = false
	}
	now := o.Clock.Now()
	others, err := findOthers(ctx, o.Client, o.Namespace, o.Deployment, o.Lease, func(l *coordinationv1.Lease) (string, bool) { return leaseHeld(l, now) })
	if err != nil {
		return nil, err
	}
	switch {
	case len(others.Running) > 0 && !found:
		return nil, fmt.Errorf("%w: there is no Deployment %s, but gpufleet's operator runs as %s: run gpufleet uninstall with its namespace and Deployment (-n, --deployment); nothing was changed",
			ErrOperatorRunning, key, strings.Join(others.Running, ", "))
	case len(others.Running) > 0:
		return nil, fmt.Errorf("%w: besides Deployment %s, gpufleet's operator runs as %s: uninstall that one first; nothing was changed",
			ErrOperatorRunning, key, strings.Join(others.Running, ", "))
	case !others.Searched:
		return nil, fmt.Errorf("%w: the uninstaller %s, so another gpufleet operator (or this one under another name) cannot be excluded; nothing was changed",
			ErrCannotTell, others.Why)
	case !found:
		say("no Deployment %s, and no gpufleet operator in any namespace (no Deployment, pod or held lease): nothing to stop", key)
		return nil, nil
	}
	before := ptr.Deref(d.Spec.Replicas, 1)
	if before == 0 {
		say("operator Deployment %s already has 0 replicas", key)
		return nil, nil
	}
	say("scale the operator Deployment %s from %d replicas to 0", key, before)
	if o.DryRun {
		return nil, nil
	}
	if err := scale(ctx, o.Client, d, 0); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return scale(ctx, o.Client, d, before) }, nil
}

func scale(ctx context.Context, c client.Client, d *appsv1.Deployment, replicas int32) error {
	patch := client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas))
	if err := c.Patch(ctx, d, patch); err != nil {
		return fmt.Errorf("scaling Deployment %s/%s to %d: %w", d.Namespace, d.Name, replicas, err)
	}
	return nil
}

// waitStopped waits, at most o.Timeout, until no pod of the Deployment is
// left and the leader lease is free (released, or expired).
func waitStopped(ctx context.Context, o Options, say func(string, ...any)) error {
	// why is what the last successful look showed; a failed read (the API
	// server briefly away, or the timeout cutting a request short) does not
	// end the wait and does not erase what was seen before it.
	why, readErr := "not looked at yet", error(nil)
	err := wait.PollUntilContextTimeout(ctx, o.PollInterval, o.Timeout, true, func(ctx context.Context) (bool, error) {
		w, err := running(ctx, o)
		if err != nil {
			readErr = err
			return false, nil //nolint:nilerr // a failed look does not end the wait: the timeout does, and reports it
		}
		why, readErr = w, nil
		return why == "", nil
	})
	if err == nil {
		say("operator stopped")
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if readErr != nil {
		why += fmt.Sprintf(" (the last look failed: %v)", readErr)
	}
	return fmt.Errorf("%w after %s: %s; nothing is released while it runs", ErrOperatorRunning, o.Timeout, why)
}

// running says what shows the operator still running ("" when nothing).
func running(ctx context.Context, o Options) (string, error) {
	d := &appsv1.Deployment{}
	switch err := o.Client.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.Deployment}, d); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return "", fmt.Errorf("reading the operator's Deployment: %w", err)
	default:
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil {
			return "", fmt.Errorf("the operator Deployment's selector: %w", err)
		}
		var pods corev1.PodList
		if err := o.Client.List(ctx, &pods, client.InNamespace(o.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return "", fmt.Errorf("listing the operator's pods: %w", err)
		}
		if len(pods.Items) > 0 {
			names := make([]string, 0, len(pods.Items))
			for _, p := range pods.Items {
				names = append(names, p.Name)
			}
			return "pods " + strings.Join(names, ", ") + " still exist", nil
		}
	}
	l := &coordinationv1.Lease{}
	switch err := o.Client.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.Lease}, l); {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("reading the operator's lease: %w", err)
	}
	if holder, held := leaseHeld(l, o.Clock.Now()); held {
		return fmt.Sprintf("lease %s/%s is held by %s", o.Namespace, o.Lease, holder), nil
	}
	return "", nil
}

// leaseHeld reports whether l has a holder whose last renewal is younger
// than the lease duration at now.
func leaseHeld(l *coordinationv1.Lease, now time.Time) (string, bool) {
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	if holder == "" {
		return "", false
	}
	renewed := l.Spec.RenewTime
	if renewed == nil {
		renewed = l.Spec.AcquireTime
	}
	if renewed == nil || l.Spec.LeaseDurationSeconds == nil {
		return holder, true
	}
	return holder, now.Before(renewed.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second))
}

// execute applies the plan: deletes first (the objects stay, held by
// their finalizers), then uncordons, then finalizers, so an interruption
// at any point leaves objects that the next run finds and finishes.
func execute(ctx context.Context, c client.Client, p Plan, nodes map[string]*corev1.Node) error {
	for _, key := range p.Delete {
		nm := &maintenancev1.NodeMaintenance{}
		nm.Namespace, nm.Name = key.Namespace, key.Name
		if err := c.Delete(ctx, nm); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting NodeMaintenance %s: %w", key, err)
		}
	}
	for _, name := range p.Uncordon {
		if err := requestor.SetUnschedulable(ctx, c, nodes[name], false); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	for _, key := range p.Finalize {
		nm := &maintenancev1.NodeMaintenance{}
		if err := c.Get(ctx, key, nm); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("reading NodeMaintenance %s: %w", key, err)
		}
		patch := client.MergeFromWithOptions(nm.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if !controllerutil.RemoveFinalizer(nm, maintenancev1.Finalizer) {
			continue
		}
		if err := c.Patch(ctx, nm, patch); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("removing the finalizer of NodeMaintenance %s: %w", key, err)
		}
	}
	return nil
}

// verify lists what is left: objects a requestor created meanwhile (no
// operator adds a finalizer to them any more; they hold nothing) are
// reported, an object still carrying the finalizer is an error.
func verify(ctx context.Context, c client.Client, say func(string, ...any)) error {
	var left maintenancev1.NodeMaintenanceList
	if err := c.List(ctx, &left); err != nil {
		return fmt.Errorf("listing NodeMaintenance objects: %w", err)
	}
	var stuck []string
	for i := range left.Items {
		nm := &left.Items[i]
		if nm.HasFinalizer() {
			stuck = append(stuck, client.ObjectKeyFromObject(nm).String())
			continue
		}
		say("NodeMaintenance %s (requestor %s) was created while uninstalling: it holds nothing and has no finalizer",
			client.ObjectKeyFromObject(nm), nm.Spec.RequestorID)
	}
	if len(stuck) > 0 {
		return fmt.Errorf("NodeMaintenance objects still carry the finalizer: %s (run gpufleet uninstall again)", strings.Join(stuck, ", "))
	}
	say("every NodeMaintenance released")
	return nil
}

// reportKept names what uninstalling leaves on purpose: GPUs isolated by
// auto-repair stay isolated (their cards are faulty) until their
// DeviceTaintRules are deleted.
func reportKept(ctx context.Context, c client.Client, say func(string, ...any)) {
	var rules resourcev1.DeviceTaintRuleList
	if err := c.List(ctx, &rules, client.HasLabels{repairv1.LabelIsolates}); err != nil {
		return // no DRA, or not allowed to list: nothing to report
	}
	for _, r := range rules.Items {
		say("kept: DeviceTaintRule %s isolates a faulty GPU; delete it once the card is replaced or repaired", r.Name)
	}
}
