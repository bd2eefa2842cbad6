package maintenance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/liveowner"
	"github.com/gpufleet/gpufleet/internal/maintenance/requestor"
	"github.com/gpufleet/gpufleet/internal/ownwrites"
	"github.com/gpufleet/gpufleet/internal/pendingevents"
)

// Reconciler drives one NodeMaintenance through its lifecycle, one step per
// reconcile. Every step's progress is in the object's status, so the
// operator can stop at any moment and resume where it was.
type Reconciler struct {
	Client client.Client
	// Kube is used for evictions.
	Kube kubernetes.Interface
	// Pods watches the pods of the nodes in maintenance.
	Pods      *PodWatch
	Namespace string
	// PodName is the operator's own pod; it is never evicted.
	PodName  string
	Clock    clock.PassiveClock
	Recorder events.EventRecorder
	// ComputeDomains names what waitForComputeDomains waits for (nil:
	// UIDs are shown).
	ComputeDomains *ComputeDomainNames
	// Leases judges whether NVIDIA's Maintenance Operator is alive.
	Leases *liveowner.Observer
	// BoundedRequestors are the requestors whose objects are never
	// garbage-collected (maxNodeMaintenanceTimeSeconds): gpufleet's own
	// repairs and driver upgrades, which release their objects within
	// their own bounds and may hold a node Ready for longer (a reboot, a
	// validation, a GPU kept out of service for a person).
	BoundedRequestors []string

	// own: our status writes and finalizer removals the cache may not
	// show yet.
	own ownwrites.Record
	// evictor asks for the drains' evictions in the background
	// (evictions()).
	evictor     *evictor
	evictorOnce sync.Once
	// daemonSets: the DaemonSets the drains found lately (drainDaemonSets()).
	daemonSets     *daemonSetsSeen
	daemonSetsOnce sync.Once
	// claims: the DRA drivers of the drained pods' claims (claimDrivers()).
	claims podClaimDrivers
}

// evictions returns the evictor of the drains, made at first use.
func (r *Reconciler) evictions() *evictor {
	r.evictorOnce.Do(func() {
		r.evictor = newEvictor(r.Kube, r.Pods.Notify, r.Clock)
	})
	return r.evictor
}

// Reconcile advances one NodeMaintenance by one step.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nm := &maintenancev1.NodeMaintenance{}
	if err := r.Client.Get(ctx, req.NamespacedName, nm); err != nil {
		if apierrors.IsNotFound(err) {
			r.Pods.Release(req.NamespacedName)
			r.evictions().stop(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if h, held, err := otherOwner(ctx, r.Client, r.Leases, r.Clock.Now()); err != nil || held {
		// NVIDIA's Maintenance Operator runs: nothing is written, cordoned
		// or drained beside it (the scheduler's status on the config says
		// so). A released lease's event, or its expiry, brings us back.
		if err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: h.Until.Sub(r.Clock.Now()) + liveOwnerRecheck}, nil
	}
	if r.own.Behind(req.NamespacedName, nm.ResourceVersion) {
		// Our last write's watch event brings it back; the requeue is a
		// safety net.
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("node", nm.Spec.NodeName, "requestor", nm.Spec.RequestorID))
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: nm.Spec.NodeName}, node); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("getting node %s: %w", nm.Spec.NodeName, err)
		}
		node = nil
	}
	r.watchPods(nm)
	r.stopEvictionsUnlessDraining(nm)
	if nm.DeletionTimestamp != nil {
		return reconcile.Result{}, r.finalize(ctx, nm, node)
	}
	if !initialised(nm) {
		return reconcile.Result{}, r.initialise(ctx, nm)
	}
	// Versions of nm replaced by this reconcile's writes.
	var replaced []string
	if node != nil {
		rv := nm.ResourceVersion
		if wrote, err := r.writeMetadata(ctx, nm, node); err != nil || wrote {
			if apierrors.IsConflict(err) {
				return reconcile.Result{}, nil // the newer version's event brings it back
			}
			if err != nil {
				return reconcile.Result{}, err
			}
			replaced = append(replaced, rv)
		}
	}
	orig := nm.DeepCopy()
	ev := pendingevents.New(r.Recorder) // reports of the status change, sent once it is written
	res, err := r.step(ctx, nm, node, ev)
	r.watchPods(nm)
	r.stopEvictionsUnlessDraining(nm)
	if nm.InProgress() {
		// A requestor that changed the spec (a driver upgrade asking for a
		// whole-node drain) waits for the status of the new generation.
		nm.Status.ObservedGeneration = nm.Generation
	}
	if !equality.Semantic.DeepEqual(&orig.Status, &nm.Status) {
		nm.Status.ObservedGeneration = nm.Generation
		if uerr := patchStatus(ctx, r.Client, orig, nm); uerr != nil {
			if apierrors.IsConflict(uerr) {
				// Changed since we read it: the newer version's watch
				// event brings it back, and this step is taken again
				// from fresh data (nothing of it was reported).
				statusConflicts.WithLabelValues("lifecycle").Inc()
				ctrl.LoggerFrom(ctx).V(1).Info("status changed meanwhile; retrying from the newer version")
				return reconcile.Result{}, err
			}
			return reconcile.Result{}, errors.Join(err, fmt.Errorf("updating status: %w", uerr))
		}
		replaced = append(replaced, orig.ResourceVersion)
	}
	if len(replaced) > 0 {
		r.own.Wrote(client.ObjectKeyFromObject(nm), replaced...)
	}
	ev.Flush()
	return res, err
}

// initialised reports whether the lifecycle controller has seen the
// object: it has written its first phase, Pending (or, before gpufleet
// wrote every phase, its finalizer). Only such objects are scheduled.
func initialised(nm *maintenancev1.NodeMaintenance) bool {
	return nm.HasFinalizer() || meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady) != nil
}

// initialise writes Pending on a new object, as NVIDIA's Maintenance
// Operator does first; the finalizer comes with the Scheduled step (as
// there), before anything is done to the node. A Pending object thus has
// none, and is deleted at once by either operator.
func (r *Reconciler) initialise(ctx context.Context, nm *maintenancev1.NodeMaintenance) error {
	orig := nm.DeepCopy()
	setPhase(nm, maintenancev1.PhasePending, "waiting to be scheduled", r.Clock.Now())
	nm.Status.ObservedGeneration = nm.Generation
	if err := patchStatus(ctx, r.Client, orig, nm); err != nil {
		if apierrors.IsConflict(err) {
			return nil // the newer version's event brings it back
		}
		return fmt.Errorf("writing phase Pending: %w", err)
	}
	r.own.Wrote(client.ObjectKeyFromObject(nm), orig.ResourceVersion)
	return nil
}

// writeMetadata writes the finalizer and the annotations that metadataFor
// asks for, in one patch (with nm's resourceVersion as a precondition),
// before the step that relies on them: the node's state is on the object
// before the cordon.
func (r *Reconciler) writeMetadata(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node) (bool, error) {
	finalizer, annotations := metadataFor(nm, node, r.Clock.Now())
	if !finalizer && len(annotations) == 0 {
		return false, nil
	}
	patch := client.MergeFromWithOptions(nm.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if finalizer {
		controllerutil.AddFinalizer(nm, maintenancev1.Finalizer)
	}
	if nm.Annotations == nil {
		nm.Annotations = map[string]string{}
	}
	maps.Copy(nm.Annotations, annotations)
	if err := r.Client.Patch(ctx, nm, patch); err != nil {
		return false, fmt.Errorf("writing the finalizer and annotations %v: %w", annotations, err)
	}
	return true, nil
}

// metadataFor decides what an object past Pending lacks on its metadata:
// the finalizer (an object taken over from NVIDIA's Maintenance Operator
// before it added its own), and the annotations that operator reads, so
// that each operator can continue the other's objects:
//   - from Scheduled on, until the node's state is recorded:
//     node-initial-state.unschedulable, from gpufleet's status (its
//     scheduler's record) or else the node as it is now (nothing cordoned
//     it yet: both operators record it before cordoning);
//   - with waitForPodCompletion, from Scheduled on: the wait's start,
//     recorded with the cordon (gpufleet's wait starts in the next step),
//     or, taken over while waiting without one, now (as that operator does).
func metadataFor(nm *maintenancev1.NodeMaintenance, node *corev1.Node, now time.Time) (finalizer bool, annotations map[string]string) {
	if nm.DeletionTimestamp != nil || !nm.InProgress() {
		return false, nil
	}
	finalizer = !nm.HasFinalizer()
	annotations = map[string]string{}
	phase := nm.Phase()
	beforeCordon := phase == maintenancev1.PhaseScheduled || phase == maintenancev1.PhaseCordon
	if beforeCordon && nm.CordonRequested() && !parses(nm.Annotations[maintenancev1.AnnotationNodeInitialUnschedulable], strconv.ParseBool) {
		before := node.Spec.Unschedulable
		if b := nm.Status.NodeUnschedulableBefore; b != nil {
			before = *b
		}
		annotations[maintenancev1.AnnotationNodeInitialUnschedulable] = strconv.FormatBool(before)
	}
	waiting := beforeCordon || phase == maintenancev1.PhaseWaitForPodCompletion
	if waiting && nm.Spec.WaitForPodCompletion != nil && !parses(nm.Annotations[maintenancev1.AnnotationWaitPodCompletionStart], rfc3339) {
		start := now
		if t := nm.Status.WaitForCompletionStartTime; t != nil {
			start = t.Time
		}
		annotations[maintenancev1.AnnotationWaitPodCompletionStart] = start.UTC().Format(time.RFC3339)
	}
	if len(annotations) == 0 {
		annotations = nil
	}
	return finalizer, annotations
}

func parses[T any](v string, parse func(string) (T, error)) bool {
	_, err := parse(v)
	return err == nil
}

func rfc3339(v string) (time.Time, error) { return time.Parse(time.RFC3339, v) }

// watchPods keeps the node's pods watched while nm is about to wait for
// or drain them (from the cordon on, so the watch has synced by then), and
// releases them afterwards.
func (r *Reconciler) watchPods(nm *maintenancev1.NodeMaintenance) {
	key := client.ObjectKeyFromObject(nm)
	needs := false
	if nm.DeletionTimestamp == nil {
		switch nm.Phase() {
		case maintenancev1.PhaseScheduled, maintenancev1.PhaseCordon, maintenancev1.PhaseWaitForPodCompletion, maintenancev1.PhaseDraining:
			// From the cordon on, when there is something to wait for or drain.
			needs = nm.Spec.WaitForPodCompletion != nil || nm.Spec.DrainSpec != nil
		}
	}
	if needs {
		r.Pods.Hold(key, nm.Spec.NodeName)
	} else {
		r.Pods.Release(key)
	}
}

// stopEvictionsUnlessDraining stops the evictions nm handed to the
// evictor once it no longer drains: deleted, withdrawn by its requestor,
// its node gone, or its drain over. A pod waiting for its budget's turn
// is then not evicted for a drain nobody wants any more.
func (r *Reconciler) stopEvictionsUnlessDraining(nm *maintenancev1.NodeMaintenance) {
	if nm.DeletionTimestamp == nil && nm.Phase() == maintenancev1.PhaseDraining {
		return
	}
	r.evictions().stop(client.ObjectKeyFromObject(nm))
}

// step performs the action of the current phase and records the next one.
func (r *Reconciler) step(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node, ev *pendingevents.Recorder) (reconcile.Result, error) {
	now := r.Clock.Now()
	phase := nm.Phase()
	if phase == maintenancev1.PhasePending {
		// The scheduler alone writes Pending objects: their wait reason,
		// then the move to Scheduled.
		return reconcile.Result{}, nil
	}
	if node == nil {
		return r.nodeGone(ctx, nm)
	}
	if failed, msg := nm.RequestorFailure(); failed {
		if phase != maintenancev1.PhaseRequestorFailed {
			setPhase(nm, maintenancev1.PhaseRequestorFailed, "requestor reported failure: "+msg, now)
			ev.Eventf(nm, node, corev1.EventTypeWarning, ReasonRequestorFailed, actionRelease,
				"Requestor %s reported failure; node %s stays in maintenance until the object is deleted: %s", nm.Spec.RequestorID, node.Name, msg)
		}
		return reconcile.Result{}, nil
	}
	if again, err := r.reassertCordon(ctx, nm, node, ev); err != nil || again {
		return reconcile.Result{}, err
	}
	switch phase {
	case maintenancev1.PhaseScheduled:
		return r.cordon(ctx, nm, node)
	case maintenancev1.PhaseCordon:
		return r.afterCordon(ctx, nm, node, ev)
	case maintenancev1.PhaseWaitForPodCompletion:
		if nm.Spec.WaitForPodCompletion == nil {
			r.enterDraining(ctx, nm, node, ev)
			return reconcile.Result{}, nil
		}
		return r.waitForPods(ctx, nm, node, ev)
	case maintenancev1.PhaseDraining:
		if nm.Spec.DrainSpec == nil {
			nm.Status.Drain = nil
			r.enter(nm, node, maintenancev1.PhaseReady, ev)
			return reconcile.Result{}, nil
		}
		return r.drain(ctx, nm, node, ev)
	case maintenancev1.PhaseReady, maintenancev1.PhaseRequestorFailed:
		if phase == maintenancev1.PhaseRequestorFailed {
			// The requestor withdrew its failure: the node is ready again.
			setPhase(nm, maintenancev1.PhaseReady, "node is ready for maintenance", now)
		}
		if drainSpecChanged(nm) {
			// The requestor asked for more of the node (a driver upgrade
			// that must reboot drains what the reboot would end).
			ev.Eventf(nm, node, corev1.EventTypeNormal, ReasonDrainAgain, actionDrain,
				"drainSpec changed while Ready: draining node %s again with it", node.Name)
			r.enterDraining(ctx, nm, node, ev)
			return reconcile.Result{}, nil
		}
		return r.collectGarbage(ctx, nm)
	default:
		return reconcile.Result{}, nil // an unknown phase written by someone else: leave it
	}
}

// reassertCordon cordons again a node that was uncordoned from outside
// while its maintenance held it (waiting for pods, draining, Ready or
// failed): pods may land on it, and a requestor about to reboot it would
// end them. A Ready object drains again what landed meanwhile (again:
// the step is done). The cache is checked against the API server first:
// its view may still be from before the maintenance's own cordon.
func (r *Reconciler) reassertCordon(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node, ev *pendingevents.Recorder) (again bool, err error) {
	switch nm.Phase() {
	case maintenancev1.PhaseWaitForPodCompletion, maintenancev1.PhaseDraining, maintenancev1.PhaseReady, maintenancev1.PhaseRequestorFailed:
	default:
		return false, nil
	}
	if !nm.CordonRequested() || node.Spec.Unschedulable {
		return false, nil
	}
	live, err := r.Kube.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
	if err != nil {
		return false, client.IgnoreNotFound(fmt.Errorf("reading node %s: %w", node.Name, err))
	}
	if live.Spec.Unschedulable {
		return false, nil // the cache is behind
	}
	if err := r.setUnschedulable(ctx, live, true); err != nil {
		return false, err
	}
	msg := fmt.Sprintf("Node %s was uncordoned while %s/%s held it (phase %s); cordoned again", node.Name, nm.Namespace, nm.Name, nm.Phase())
	if nm.Phase() == maintenancev1.PhaseReady && nm.Spec.DrainSpec != nil {
		msg += ", and drained again: pods may have landed on it"
		r.enterDraining(ctx, nm, node, ev)
		again = true
	}
	ev.Eventf(nm, node, corev1.EventTypeWarning, ReasonRecordoned, actionCordon, "%s", msg)
	return again, nil
}

// drainSpecChanged reports whether a drained object's drainSpec is no
// longer the one its drain was for (recorded as the drain began; an
// object drained before that was recorded is taken as unchanged).
func drainSpecChanged(nm *maintenancev1.NodeMaintenance) bool {
	st := nm.Status.Drain
	return nm.Spec.DrainSpec != nil && st != nil && st.SpecHash != "" && st.SpecHash != drainSpecHash(nm.Spec.DrainSpec)
}

// drainSpecHash identifies a drainSpec.
func drainSpecHash(spec *maintenancev1.DrainSpec) string {
	data, err := json.Marshal(spec)
	if err != nil {
		return ""
	}
	h := fnv.New64a()
	_, _ = h.Write(data)
	return strconv.FormatUint(h.Sum64(), 16)
}

// cordon is the step of a Scheduled object: cordon the node (its state
// before is on the object already, see metadataFor) and write Cordon.
// Every phase of NVIDIA's Maintenance Operator is written, one per step,
// so a client waiting for any of them sees it.
func (r *Reconciler) cordon(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node) (reconcile.Result, error) {
	before := nm.NodeUnschedulableBefore()
	if before == nil {
		before = ptr.To(node.Spec.Unschedulable) // no cordon asked for: nothing to restore
	}
	nm.Status.NodeUnschedulableBefore = before
	msg := "node cordoned"
	if nm.CordonRequested() {
		if !node.Spec.Unschedulable {
			if err := r.setUnschedulable(ctx, node, true); err != nil {
				return reconcile.Result{}, err
			}
		}
	} else {
		msg = "cordon not requested"
	}
	setPhase(nm, maintenancev1.PhaseCordon, msg, r.Clock.Now())
	return reconcile.Result{}, nil
}

// afterCordon is the step of an object in Cordon: the node is cordoned
// (again, if someone uncordoned it, or not yet by an object taken over),
// then WaitForPodCompletion is entered once the node's pods are known.
func (r *Reconciler) afterCordon(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node, ev *pendingevents.Recorder) (reconcile.Result, error) {
	if nm.CordonRequested() && !node.Spec.Unschedulable {
		if err := r.setUnschedulable(ctx, node, true); err != nil {
			return reconcile.Result{}, err
		}
	}
	if nm.Status.NodeUnschedulableBefore == nil {
		nm.Status.NodeUnschedulableBefore = nm.NodeUnschedulableBefore()
	}
	if nm.Spec.WaitForPodCompletion != nil || nm.Spec.DrainSpec != nil {
		// The node's pods are watched from the cordon on (watchPods):
		// once the watch has synced, the next phases are entered knowing
		// them, and their first steps have nothing new to write.
		if _, synced := r.Pods.Pods(node.Name); !synced {
			return reconcile.Result{RequeueAfter: unsyncedRetry}, nil // the watch's sync brings us back
		}
	}
	r.enter(nm, node, maintenancev1.PhaseWaitForPodCompletion, ev)
	return reconcile.Result{}, nil
}

// enterDraining moves to Draining, with the pods to evict when there is a drain.
func (r *Reconciler) enterDraining(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node, ev *pendingevents.Recorder) {
	r.enter(nm, node, maintenancev1.PhaseDraining, ev)
	if nm.Spec.DrainSpec != nil {
		r.planDrain(ctx, nm, node)
	}
}

// enter moves to phase and records what it needs to start.
func (r *Reconciler) enter(nm *maintenancev1.NodeMaintenance, node *corev1.Node, phase maintenancev1.Phase, ev *pendingevents.Recorder) {
	now := r.Clock.Now()
	t := metav1.NewTime(now)
	switch phase {
	case maintenancev1.PhaseWaitForPodCompletion:
		if nm.Spec.WaitForPodCompletion == nil {
			setPhase(nm, phase, "no waitForPodCompletion: nothing to wait for", now)
			return
		}
		if start := nm.WaitForCompletionStart(); !start.IsZero() {
			t = metav1.NewTime(start) // recorded with the cordon (metadataFor)
		}
		nm.Status.WaitForCompletionStartTime = &t
		setPhase(nm, phase, "waiting for pods to complete", now)
		ev.Eventf(nm, node, corev1.EventTypeNormal, ReasonWaitingForPods, actionWait, "Waiting for pods on node %s to complete", node.Name)
	case maintenancev1.PhaseDraining:
		if nm.Spec.DrainSpec == nil {
			setPhase(nm, phase, "no drainSpec: nothing to drain", now)
			return
		}
		nm.Status.Drain = &maintenancev1.DrainStatus{StartTime: &t, SpecHash: drainSpecHash(nm.Spec.DrainSpec)}
		setPhase(nm, phase, "draining node", now)
	case maintenancev1.PhaseReady:
		setPhase(nm, phase, "node is ready for maintenance", now)
		ev.Eventf(nm, node, corev1.EventTypeNormal, ReasonReady, actionRelease, "Node %s is ready for maintenance%s", node.Name, preparedBy(nm, now))
	}
}

// preparedBy summarises, for the Ready event, what the maintenance did to
// the node: the one Normal event of a maintenance (scheduling, the cordon
// and the drain's start are in the status; the node shows its cordon).
func preparedBy(nm *maintenancev1.NodeMaintenance, now time.Time) string {
	var did []string
	if nm.CordonedTheNode() {
		did = append(did, "cordoned")
	}
	if d := nm.Status.Drain; d != nil && d.StartTime != nil {
		did = append(did, fmt.Sprintf("drained (%d pod(s) to evict) in %s", d.EvictionPods, now.Sub(d.StartTime.Time).Round(100*time.Millisecond)))
	}
	if nm.Status.ScheduledTime != nil {
		did = append(did, fmt.Sprintf("%s after it was scheduled", now.Sub(nm.Status.ScheduledTime.Time).Round(100*time.Millisecond)))
	}
	if len(did) == 0 {
		return ""
	}
	return ": " + strings.Join(did, ", ")
}

// waitForPods waits until the selected pods on the node have completed.
func (r *Reconciler) waitForPods(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node, ev *pendingevents.Recorder) (reconcile.Result, error) {
	now := r.Clock.Now()
	sel, err := labels.Parse(string(nm.Spec.WaitForPodCompletion.PodSelector))
	if err != nil {
		r.invalidSpec(nm, fmt.Sprintf("waitForPodCompletion.podSelector: %v", err), ev)
		return reconcile.Result{}, nil
	}
	clearCondition(nm, maintenancev1.ConditionTypeInvalidSpec)
	pods, synced := r.Pods.Pods(node.Name)
	if !synced {
		return reconcile.Result{RequeueAfter: unsyncedRetry}, nil // the watch's sync brings us back
	}
	var waiting []string
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || !sel.Matches(labels.Set(p.Labels)) {
			continue
		}
		if requestor.SurvivesDrain(p) {
			continue // they never complete on their own
		}
		waiting = append(waiting, p.Namespace+"/"+p.Name)
	}
	sort.Strings(waiting)
	nm.Status.WaitForCompletion = waiting
	domainWait, err := r.computeDomainWait(ctx, node)
	if err != nil {
		return reconcile.Result{}, err
	}
	if domainWait != "" {
		setPhase(nm, maintenancev1.PhaseWaitForPodCompletion, domainWait, now)
	} else if len(waiting) > 0 {
		setPhase(nm, maintenancev1.PhaseWaitForPodCompletion, "waiting for pods to complete", now)
	}
	if len(waiting) == 0 && domainWait == "" {
		r.enterDraining(ctx, nm, node, ev)
		return reconcile.Result{}, nil
	}
	timeout := seconds(nm.Spec.WaitForPodCompletion.TimeoutSeconds, 0)
	start := nm.WaitForCompletionStart() // taken over: the other operator's start
	if timeout == 0 || start.IsZero() {
		return reconcile.Result{}, nil // pod events bring us back
	}
	elapsed := now.Sub(start)
	if elapsed >= timeout {
		if len(waiting) > 0 {
			ev.Eventf(nm, node, corev1.EventTypeWarning, ReasonPodCompletionTimeout, actionWait,
				"Gave up waiting after %s for %d pod(s) on node %s: %s", timeout, len(waiting), node.Name, summarize(waiting, 5))
		} else {
			ev.Eventf(nm, node, corev1.EventTypeWarning, ReasonPodCompletionTimeout, actionWait,
				"Gave up waiting after %s: %s", timeout, domainWait)
		}
		nm.Status.WaitForCompletion = nil
		r.enterDraining(ctx, nm, node, ev)
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: timeout - elapsed}, nil
}

// computeDomainWait says what a node's maintenance still waits for in
// its NVLink domain when the config asks (spec.domains with
// waitForComputeDomains): the ComputeDomain workloads that run on nodes of
// the domain ("" for none, or without that setting).
func (r *Reconciler) computeDomainWait(ctx context.Context, node *corev1.Node) (string, error) {
	var obj maintenancev1.MaintenanceOperatorConfig
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: maintenancev1.DefaultConfigName}, &obj)
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading MaintenanceOperatorConfig: %w", err)
	}
	d := obj.Spec.Domains
	if d == nil || !d.WaitForComputeDomains || node.Labels[d.NodeLabel] == "" {
		return "", nil
	}
	domain := node.Labels[d.NodeLabel]
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.HasLabels{LabelComputeDomain}); err != nil {
		return "", fmt.Errorf("listing the nodes that run a ComputeDomain: %w", err)
	}
	return computeDomainWait(domain, computeDomainNodes(nodes.Items, d.NodeLabel, domain),
		func(uid string) string { return r.ComputeDomains.Name(ctx, uid) }), nil
}

// collectGarbage deletes an object that has been Ready for longer than
// maxNodeMaintenanceTimeSeconds (RequestorFailed objects are kept, and so
// are those of BoundedRequestors, with condition Retained saying why).
func (r *Reconciler) collectGarbage(ctx context.Context, nm *maintenancev1.NodeMaintenance) (reconcile.Result, error) {
	c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady)
	if c == nil || c.Status != metav1.ConditionTrue {
		return reconcile.Result{}, nil
	}
	maxAge, err := r.maxReadyAge(ctx)
	if err != nil || maxAge == 0 {
		return reconcile.Result{}, err
	}
	age := r.Clock.Since(c.LastTransitionTime.Time)
	if age < maxAge {
		return reconcile.Result{RequeueAfter: maxAge - age}, nil
	}
	if slices.Contains(r.BoundedRequestors, nm.Spec.RequestorID) {
		if meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeRetained) == nil {
			owner := "its requestor"
			if ref := metav1.GetControllerOf(nm); ref != nil {
				owner = ref.Kind + " " + ref.Name
			}
			setCondition(nm, maintenancev1.ConditionTypeRetained, metav1.ConditionTrue, ReasonRetained, fmt.Sprintf(
				"Ready since %s, longer than maxNodeMaintenanceTimeSeconds (%s), and not garbage-collected: requestor %s is gpufleet's own and ends it within its own bounds (%s); delete it to release the node",
				c.LastTransitionTime.UTC().Format(time.RFC3339), maxAge, nm.Spec.RequestorID, owner), r.Clock.Now())
		}
		return reconcile.Result{}, nil
	}
	if err := r.Client.Delete(ctx, nm, client.Preconditions{UID: &nm.UID}); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("garbage-collecting: %w", err))
	}
	r.Recorder.Eventf(nm, nil, corev1.EventTypeNormal, ReasonGarbageCollected, actionCollect,
		"Deleted: Ready for %s, longer than maxNodeMaintenanceTimeSeconds (%s)", age.Round(time.Second), maxAge)
	return reconcile.Result{}, nil
}

func (r *Reconciler) maxReadyAge(ctx context.Context) (time.Duration, error) {
	var cfg maintenancev1.MaintenanceOperatorConfig
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: maintenancev1.DefaultConfigName}, &cfg)
	if apierrors.IsNotFound(err) {
		return time.Hour, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading MaintenanceOperatorConfig: %w", err)
	}
	return seconds(cfg.Spec.MaxNodeMaintenanceTimeSeconds, 3600), nil
}

// nodeGone handles an in-progress object whose node was deleted: there is
// nothing left to maintain or uncordon, so the object is deleted (which
// releases its slot) and the requestor is told why.
func (r *Reconciler) nodeGone(ctx context.Context, nm *maintenancev1.NodeMaintenance) (reconcile.Result, error) {
	if err := r.Client.Delete(ctx, nm, client.Preconditions{UID: &nm.UID}); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("deleting NodeMaintenance of deleted node: %w", err))
	}
	r.Recorder.Eventf(nm, nil, corev1.EventTypeWarning, ReasonNodeDeleted, actionRelease,
		"Node %s was deleted; this NodeMaintenance is deleted", nm.Spec.NodeName)
	return reconcile.Result{}, nil
}

// finalize releases the node when the object is deleted: uncordon unless
// the node was cordoned before the maintenance or another in-progress
// object still holds it, then remove the finalizer. While additional
// requestors remain, the node stays held.
func (r *Reconciler) finalize(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node) error {
	if !nm.HasFinalizer() {
		return nil
	}
	if len(nm.Spec.AdditionalRequestors) > 0 && node != nil && nm.InProgress() {
		msg := "deleted; node held until additional requestors leave: " + strings.Join(nm.Spec.AdditionalRequestors, ", ")
		if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady); c == nil || c.Message != msg {
			cond := metav1.Condition{Type: maintenancev1.ConditionTypeReady, Status: metav1.ConditionFalse, Reason: string(nm.Phase()), Message: msg}
			if c != nil {
				cond.Status = c.Status
			}
			cond.LastTransitionTime = metav1.NewTime(r.Clock.Now())
			orig := nm.DeepCopy()
			meta.SetStatusCondition(&nm.Status.Conditions, cond)
			if err := patchStatus(ctx, r.Client, orig, nm); err != nil {
				if !apierrors.IsConflict(err) {
					return fmt.Errorf("updating status: %w", err)
				}
				statusConflicts.WithLabelValues("lifecycle").Inc()
				return nil // the newer version's event brings it back
			}
			r.own.Wrote(client.ObjectKeyFromObject(nm), orig.ResourceVersion)
			r.Recorder.Eventf(nm, node, corev1.EventTypeNormal, ReasonWaitingForRequestors, actionRelease, "%s", msg)
		}
		return nil
	}
	if node != nil && nm.InProgress() && nm.NodeUnschedulableBefore() != nil {
		if err := r.release(ctx, nm, node); err != nil {
			return err
		}
	}
	if nm.Status.Drain != nil && nm.Status.Drain.StartTime != nil && nm.Phase() == maintenancev1.PhaseDraining {
		drainDuration.Observe(r.Clock.Since(nm.Status.Drain.StartTime.Time).Seconds())
	}
	key, rvBefore := client.ObjectKeyFromObject(nm), nm.ResourceVersion
	patch := client.MergeFrom(nm.DeepCopy())
	controllerutil.RemoveFinalizer(nm, maintenancev1.Finalizer)
	if err := r.Client.Patch(ctx, nm, patch); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("removing finalizer: %w", err)
	}
	r.own.Wrote(key, rvBefore)
	return nil
}

func (r *Reconciler) release(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node) error {
	if !nm.CordonedTheNode() {
		if before := nm.NodeUnschedulableBefore(); before != nil && *before && node.Spec.Unschedulable {
			r.Recorder.Eventf(nm, node, corev1.EventTypeNormal, ReasonLeftCordoned, actionRelease,
				"Node %s was cordoned before the maintenance; leaving it cordoned", node.Name)
		}
		return nil
	}
	holder, err := r.otherHolder(ctx, nm)
	if err != nil {
		return err
	}
	if holder != "" {
		r.Recorder.Eventf(nm, node, corev1.EventTypeNormal, ReasonLeftCordoned, actionRelease,
			"Node %s stays cordoned: %s still holds it", node.Name, holder)
		return nil
	}
	// The node's state shows the uncordon; no event (it would be one more
	// request per maintenance, telling what the node says). Sent even when
	// the cache shows the node schedulable: it may not show this
	// maintenance's own cordon yet (a short maintenance), and a node left
	// cordoned by an ended maintenance is what this must never do.
	return r.setUnschedulable(ctx, node, false)
}

// otherHolder names another in-progress, not-deleted object on the same node.
func (r *Reconciler) otherHolder(ctx context.Context, nm *maintenancev1.NodeMaintenance) (string, error) {
	var list maintenancev1.NodeMaintenanceList
	if err := r.Client.List(ctx, &list, client.MatchingFields{indexNodeName: nm.Spec.NodeName}); err != nil {
		return "", fmt.Errorf("listing NodeMaintenance on node %s: %w", nm.Spec.NodeName, err)
	}
	for i := range list.Items {
		o := &list.Items[i]
		if o.UID != nm.UID && o.DeletionTimestamp == nil && o.InProgress() {
			return o.Namespace + "/" + o.Name, nil
		}
	}
	return "", nil
}

// setUnschedulable patches only spec.unschedulable, so it never overwrites
// other changes to the node.
func (r *Reconciler) setUnschedulable(ctx context.Context, node *corev1.Node, v bool) error {
	return requestor.SetUnschedulable(ctx, r.Client, node, v)
}

func (r *Reconciler) invalidSpec(nm *maintenancev1.NodeMaintenance, msg string, ev *pendingevents.Recorder) {
	if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeInvalidSpec); c == nil || c.Message != msg {
		ev.Eventf(nm, nil, corev1.EventTypeWarning, ReasonInvalidSpec, actionValidate, "%s; nothing is evicted until it is fixed", msg)
	}
	setCondition(nm, maintenancev1.ConditionTypeInvalidSpec, metav1.ConditionTrue, ReasonInvalidSpec, msg, r.Clock.Now())
}

// summarize joins up to n names and says how many more there are.
func summarize(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(slices.Clone(names[:n]), ", "), len(names)-n)
}

// drainDaemonSets returns the memory of the DaemonSets the drains found.
func (r *Reconciler) drainDaemonSets() *daemonSetsSeen {
	r.daemonSetsOnce.Do(func() { r.daemonSets = newDaemonSetsSeen(r.Clock) })
	return r.daemonSets
}
