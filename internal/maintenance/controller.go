package maintenance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
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
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
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

	// own: our status writes and finalizer removals the cache may not
	// show yet.
	own ownwrites.Record
	// evictor asks for the drains' evictions in the background
	// (evictions()).
	evictor     *evictor
	evictorOnce sync.Once
}

// evictions returns the evictor of the drains, made at first use.
func (r *Reconciler) evictions() *evictor {
	r.evictorOnce.Do(func() {
		r.evictor = newEvictor(r.Kube, r.Pods.Notify)
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
	if !nm.HasFinalizer() {
		controllerutil.AddFinalizer(nm, maintenancev1.Finalizer)
		if err := r.Client.Update(ctx, nm); err != nil {
			return reconcile.Result{}, fmt.Errorf("adding finalizer: %w", err)
		}
		return reconcile.Result{}, nil // the update event brings us back
	}
	orig := nm.DeepCopy()
	ev := pendingevents.New(r.Recorder) // reports of the status change, sent once it is written
	res, err := r.step(ctx, nm, node, ev)
	r.watchPods(nm)
	r.stopEvictionsUnlessDraining(nm)
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
		r.own.Wrote(client.ObjectKeyFromObject(nm), orig.ResourceVersion)
	}
	ev.Flush()
	return res, err
}

// watchPods keeps the node's pods watched while nm is about to wait for
// or drain them (from the cordon on, so the watch has synced by then), and
// releases them afterwards.
func (r *Reconciler) watchPods(nm *maintenancev1.NodeMaintenance) {
	key := client.ObjectKeyFromObject(nm)
	needs := false
	if nm.DeletionTimestamp == nil {
		switch nm.Phase() {
		case maintenancev1.PhaseScheduled, maintenancev1.PhaseCordon:
			// Scheduled with the node's state recorded: the cordon is next.
			needs = (nm.Phase() == maintenancev1.PhaseCordon || nm.Status.NodeUnschedulableBefore != nil) &&
				(nm.Spec.WaitForPodCompletion != nil || nm.Spec.DrainSpec != nil)
		case maintenancev1.PhaseWaitForPodCompletion, maintenancev1.PhaseDraining:
			needs = true
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
	switch phase {
	case maintenancev1.PhaseScheduled:
		if nm.Status.NodeUnschedulableBefore != nil {
			// The scheduler recorded the node's state with its decision:
			// cordon now.
			return r.cordon(ctx, nm, node, ev)
		}
		// Scheduled without that record (by an older version): record the
		// node's state before touching it, since a crash after the cordon
		// must not make us believe the admin had cordoned it.
		before := node.Spec.Unschedulable
		nm.Status.NodeUnschedulableBefore = &before
		setPhase(nm, maintenancev1.PhaseCordon, "cordoning node", now)
		return reconcile.Result{}, nil
	case maintenancev1.PhaseCordon:
		return r.cordon(ctx, nm, node, ev)
	case maintenancev1.PhaseWaitForPodCompletion:
		return r.waitForPods(nm, node, ev)
	case maintenancev1.PhaseDraining:
		return r.drain(ctx, nm, node, ev)
	case maintenancev1.PhaseReady, maintenancev1.PhaseRequestorFailed:
		if phase == maintenancev1.PhaseRequestorFailed {
			// The requestor withdrew its failure: the node is ready again.
			setPhase(nm, maintenancev1.PhaseReady, "node is ready for maintenance", now)
		}
		return r.collectGarbage(ctx, nm)
	default:
		return reconcile.Result{}, nil // an unknown phase written by someone else: leave it
	}
}

func (r *Reconciler) cordon(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node, ev *pendingevents.Recorder) (reconcile.Result, error) {
	if phaseAfterCordon(nm) != maintenancev1.PhaseReady {
		// The node's pods are watched from now on (watchPods): once the
		// watch has synced, the next phase is entered knowing them, and
		// its first step has nothing new to write.
		if _, synced := r.Pods.Pods(node.Name); !synced {
			return reconcile.Result{RequeueAfter: unsyncedRetry}, nil // the watch's sync brings us back
		}
	}
	if nm.CordonRequested() && !node.Spec.Unschedulable {
		if err := r.setUnschedulable(ctx, node, true); err != nil {
			return reconcile.Result{}, err
		}
	}
	r.enter(nm, node, phaseAfterCordon(nm), ev)
	if nm.Phase() == maintenancev1.PhaseDraining {
		r.planDrain(ctx, nm, node)
	}
	return reconcile.Result{}, nil
}

// enter moves to phase and records what it needs to start.
func (r *Reconciler) enter(nm *maintenancev1.NodeMaintenance, node *corev1.Node, phase maintenancev1.Phase, ev *pendingevents.Recorder) {
	now := r.Clock.Now()
	t := metav1.NewTime(now)
	switch phase {
	case maintenancev1.PhaseWaitForPodCompletion:
		nm.Status.WaitForCompletionStartTime = &t
		setPhase(nm, phase, "waiting for pods to complete", now)
		ev.Eventf(nm, node, corev1.EventTypeNormal, ReasonWaitingForPods, actionWait, "Waiting for pods on node %s to complete", node.Name)
	case maintenancev1.PhaseDraining:
		nm.Status.Drain = &maintenancev1.DrainStatus{StartTime: &t}
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
	if nm.CordonRequested() && nm.Status.NodeUnschedulableBefore != nil && !*nm.Status.NodeUnschedulableBefore {
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
func (r *Reconciler) waitForPods(nm *maintenancev1.NodeMaintenance, node *corev1.Node, ev *pendingevents.Recorder) (reconcile.Result, error) {
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
		if SurvivesDrain(p) {
			continue // they never complete on their own
		}
		waiting = append(waiting, p.Namespace+"/"+p.Name)
	}
	sort.Strings(waiting)
	nm.Status.WaitForCompletion = waiting
	if len(waiting) == 0 {
		r.enter(nm, node, nextAfterWait(nm), ev)
		return reconcile.Result{}, nil
	}
	timeout := seconds(nm.Spec.WaitForPodCompletion.TimeoutSeconds, 0)
	if timeout == 0 || nm.Status.WaitForCompletionStartTime == nil {
		return reconcile.Result{}, nil // pod events bring us back
	}
	elapsed := now.Sub(nm.Status.WaitForCompletionStartTime.Time)
	if elapsed >= timeout {
		ev.Eventf(nm, node, corev1.EventTypeWarning, ReasonPodCompletionTimeout, actionWait,
			"Gave up waiting after %s for %d pod(s) on node %s: %s", timeout, len(waiting), node.Name, summarize(waiting, 5))
		nm.Status.WaitForCompletion = nil
		r.enter(nm, node, nextAfterWait(nm), ev)
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: timeout - elapsed}, nil
}

func nextAfterWait(nm *maintenancev1.NodeMaintenance) maintenancev1.Phase {
	if nm.Spec.DrainSpec != nil {
		return maintenancev1.PhaseDraining
	}
	return maintenancev1.PhaseReady
}

// collectGarbage deletes an object that has been Ready for longer than
// maxNodeMaintenanceTimeSeconds (RequestorFailed objects are kept).
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
	if node != nil && nm.InProgress() && nm.Status.NodeUnschedulableBefore != nil {
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
	if !node.Spec.Unschedulable {
		return nil
	}
	if !nm.CordonedTheNode() {
		if before := nm.Status.NodeUnschedulableBefore; before != nil && *before {
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
	// request per maintenance, telling what the node says).
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
	return SetUnschedulable(ctx, r.Client, node, v)
}

// SetUnschedulable cordons (v true) or uncordons node with a patch of
// spec.unschedulable alone: the one way gpufleet changes it (the lifecycle
// controller, and gpufleet uninstall releasing what it cordoned).
func SetUnschedulable(ctx context.Context, c client.Client, node *corev1.Node, v bool) error {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": v}})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, node, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
		return fmt.Errorf("setting node %s unschedulable=%t: %w", node.Name, v, err)
	}
	return nil
}

func (r *Reconciler) invalidSpec(nm *maintenancev1.NodeMaintenance, msg string, ev *pendingevents.Recorder) {
	if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeInvalidSpec); c == nil || c.Message != msg {
		ev.Eventf(nm, nil, corev1.EventTypeWarning, ReasonInvalidSpec, actionValidate, "%s; nothing is evicted until it is fixed", msg)
	}
	setCondition(nm, maintenancev1.ConditionTypeInvalidSpec, metav1.ConditionTrue, ReasonInvalidSpec, msg, r.Clock.Now())
}

// SurvivesDrain reports whether a drain leaves the pod on its node (a
// DaemonSet's or a static pod's mirror).
func SurvivesDrain(p *corev1.Pod) bool {
	return isDaemonSetPod(p) || isMirrorPod(p)
}

func isDaemonSetPod(p *corev1.Pod) bool {
	c := metav1.GetControllerOf(p)
	return c != nil && c.Kind == "DaemonSet"
}

func isMirrorPod(p *corev1.Pod) bool {
	_, ok := p.Annotations[corev1.MirrorPodAnnotationKey]
	return ok
}

// summarize joins up to n names and says how many more there are.
func summarize(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(slices.Clone(names[:n]), ", "), len(names)-n)
}
