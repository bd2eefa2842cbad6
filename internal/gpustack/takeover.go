package gpustack

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/liveowner"
	"github.com/gpufleet/gpufleet/internal/pendingevents"
)

// Event reasons and the condition of a takeover.
const (
	// ReasonAdopted: a DaemonSet of another operator was adopted (Normal).
	ReasonAdopted = "Adopted"
	// ReasonComponentBlocked: a component is not deployed beside another
	// operator's DaemonSets that gpufleet cannot adopt (Warning).
	ReasonComponentBlocked = "ComponentBlocked"
	// ReasonPreviousOperatorRunning: NVIDIA's GPU Operator still runs;
	// gpufleet waits (Warning; reason of ConditionPreviousOperator).
	ReasonPreviousOperatorRunning = "PreviousOperatorRunning"
)

// ConditionPreviousOperator is True while NVIDIA's GPU Operator holds its
// leader lease: gpufleet then changes nothing of the stack. A condition of
// its own: the GPU Operator writes Ready and the state meanwhile.
const ConditionPreviousOperator = "PreviousOperatorRunning"

// adoptLive maps the rendered objects onto the DaemonSets that run in the
// stack's namespace (Adopt). gpufleet's own, adopted ones included, are in
// the cache; the live list (another operator's are not cached) is read on
// the first pass and whenever a rendered DaemonSet is not in the cache
// (about to be created): a converged stack costs no read. uncached names
// the rendered DaemonSets that exist but are not in the cache (another
// operator's, to adopt): apply reads them live instead of creating them.
func (r *Reconciler) adoptLive(ctx context.Context, objs []client.Object) (out []client.Object, adoptions []Adoption, blocked []Blocked, uncached map[string]bool, err error) {
	var cached appsv1.DaemonSetList
	if err := r.Client.List(ctx, &cached, client.InNamespace(r.Namespace), client.MatchingLabels{LabelManagedBy: managedBy}); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("listing DaemonSets: %w", err)
	}
	out, adoptions, blocked = Adopt(objs, cached.Items)
	r.mu.Lock()
	scanned := r.scanned
	r.mu.Unlock()
	if scanned && allCached(out, cached.Items) {
		return out, adoptions, blocked, nil, nil
	}
	var live appsv1.DaemonSetList
	if err := r.Live.List(ctx, &live, client.InNamespace(r.Namespace)); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("listing DaemonSets: %w", err)
	}
	r.mu.Lock()
	r.scanned = true
	r.mu.Unlock()
	out, adoptions, blocked = Adopt(objs, live.Items)
	inCache := map[string]bool{}
	for i := range cached.Items {
		inCache[cached.Items[i].Name] = true
	}
	uncached = map[string]bool{}
	for i := range live.Items {
		if !inCache[live.Items[i].Name] {
			uncached[live.Items[i].Name] = true
		}
	}
	return out, adoptions, blocked, uncached, nil
}

// allCached reports whether every rendered DaemonSet is among cached.
func allCached(objs []client.Object, cached []appsv1.DaemonSet) bool {
	names := map[string]bool{}
	for i := range cached {
		names[cached[i].Name] = true
	}
	for _, o := range objs {
		if _, ok := o.(*appsv1.DaemonSet); ok && !names[o.GetName()] {
			return false
		}
	}
	return true
}

// reportAdoptions emits an event for each DaemonSet taken from another
// operator in this pass.
func (r *Reconciler) reportAdoptions(ctx context.Context, policy *nvidiav1.ClusterPolicy, adoptions []Adoption, ev *pendingevents.Recorder) {
	for _, a := range adoptions {
		if a.From == "" || r.refused.has("DaemonSet "+r.Namespace+"/"+a.Live) {
			continue // adopted before, or its write was refused (reported as such)
		}
		ctrl.LoggerFrom(ctx).Info("adopting a DaemonSet of another operator", "daemonSet", a.Live, "component", a.Component, "from", a.From, "renderedName", a.Rendered)
		ev.Eventf(policy, nil, corev1.EventTypeNormal, ReasonAdopted, actionDeploy,
			"DaemonSet %s/%s (%s) adopted from %s: kept its name and selector, and its pods while they run what the policy asks for", r.Namespace, a.Live, a.Component, a.From)
	}
}

// reportProblems makes refused writes and blocked components the state of
// the policy: not ready, Degraded naming each, and a Warning event when
// that changes. It returns when to retry the first refused write.
func (r *Reconciler) reportProblems(policy *nvidiav1.ClusterPolicy, status *nvidiav1.ClusterPolicyStatus, blocked []Blocked, ev *pendingevents.Recorder) time.Duration {
	list, next := r.refused.current()
	if len(list) == 0 && len(blocked) == 0 {
		return 0
	}
	var parts []string
	reason := ReasonObjectRefused
	if len(blocked) > 0 {
		reason = ReasonComponentBlocked
		for _, b := range blocked {
			parts = append(parts, b.String())
		}
	}
	if len(list) > 0 {
		parts = append(parts, refusalsMessage(list))
	}
	msg := strings.Join(parts, "; ")
	if c := meta.FindStatusCondition(policy.Status.Conditions, nvidiav1.ConditionDegraded); c == nil || c.Message != msg {
		ev.Eventf(policy, nil, corev1.EventTypeWarning, reason, actionDeploy, "%s", msg)
	}
	status.State = nvidiav1.StateNotReady
	r.setConditions(policy, status, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionTrue, reason, msg)
	if len(list) == 0 {
		return 0
	}
	return max(next.Sub(r.Clock.Now()), time.Second)
}

// previousOperator returns the live holding of NVIDIA's GPU Operator's
// leader lease, if any (nil Leases: never looked for).
func (r *Reconciler) previousOperator(ctx context.Context) (liveowner.Holding, bool, error) {
	return r.Observer.Read(ctx, r.Leases, liveowner.GPUOperator, r.Clock.Now())
}

// waitForPreviousOperator records, in a condition of its own, that the GPU
// Operator still runs and gpufleet waits (one Warning event when that
// starts); nothing else of the status is touched: the GPU Operator writes
// it. It returns when to look again (the lease's expiry).
func (r *Reconciler) waitForPreviousOperator(ctx context.Context, policy *nvidiav1.ClusterPolicy, h liveowner.Holding, ev *pendingevents.Recorder) (time.Duration, error) {
	status := policy.Status.DeepCopy()
	msg := h.Message()
	prev := meta.FindStatusCondition(policy.Status.Conditions, ConditionPreviousOperator)
	if prev == nil || prev.Status != metav1.ConditionTrue {
		ev.Eventf(policy, nil, corev1.EventTypeWarning, ReasonPreviousOperatorRunning, actionDeploy, "%s", msg)
	}
	if prev == nil || prev.Status != metav1.ConditionTrue || prev.Reason != ReasonPreviousOperatorRunning || !h.Names(prev.Message) {
		// The message changes with each renewal; rewritten only when it
		// starts or the holder moves, not at every renewal.
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: ConditionPreviousOperator, Status: metav1.ConditionTrue,
			Reason: ReasonPreviousOperatorRunning, Message: msg, ObservedGeneration: policy.Generation, LastTransitionTime: metav1.NewTime(r.Clock.Now())})
	}
	ctrl.LoggerFrom(ctx).V(1).Info("NVIDIA's GPU Operator is running; waiting", "lease", h.Namespace+"/"+h.Operator.Lease, "holder", h.Holder)
	held, err := r.writeStatus(ctx, policy, status, ev)
	if err != nil {
		return 0, err
	}
	return minPositive(max(h.Until.Sub(r.Clock.Now()), time.Second), held), nil
}

// AnnotationOtherNamespaceCleared on a ClusterPolicy confirms that the GPU
// stack its status places in another namespace is gone (its value names
// that namespace): gpufleet then deploys into its own.
const AnnotationOtherNamespaceCleared = "gpufleet.dev/stack-removed-from-namespace"

// ReasonStackInAnotherNamespace: the policy's stack runs in another
// namespace (status.namespace) than gpufleet's (Warning).
const ReasonStackInAnotherNamespace = "StackInAnotherNamespace"

// otherNamespace is the namespace the policy's status places its stack in,
// when that is not gpufleet's and not confirmed gone ("" otherwise).
// Deploying beside it would start a second driver on every GPU node.
func (r *Reconciler) otherNamespace(policy *nvidiav1.ClusterPolicy) string {
	prev := policy.Status.Namespace
	if prev == "" || prev == r.Namespace || policy.Annotations[AnnotationOtherNamespaceCleared] == prev {
		return ""
	}
	return prev
}

// waitForOtherNamespace reports that gpufleet does not deploy while the
// policy's stack runs in another namespace.
func (r *Reconciler) waitForOtherNamespace(ctx context.Context, policy *nvidiav1.ClusterPolicy, other string, ev *pendingevents.Recorder) (time.Duration, error) {
	status := policy.Status.DeepCopy()
	msg := fmt.Sprintf("the GPU stack of this ClusterPolicy runs in namespace %s (status.namespace) and gpufleet runs in %s: "+
		"deploying here would start a second driver on every GPU node. Run gpufleet in namespace %s to adopt that stack without restarting it, "+
		"or remove that stack and annotate the ClusterPolicy %s=%s", other, r.Namespace, other, AnnotationOtherNamespaceCleared, other)
	if c := meta.FindStatusCondition(policy.Status.Conditions, nvidiav1.ConditionDegraded); c == nil || c.Message != msg {
		ev.Eventf(policy, nil, corev1.EventTypeWarning, ReasonStackInAnotherNamespace, actionDeploy, "%s", msg)
	}
	status.State = nvidiav1.StateNotReady
	r.setConditions(policy, status, metav1.ConditionFalse, metav1.ConditionFalse, metav1.ConditionTrue, ReasonStackInAnotherNamespace, msg)
	ctrl.LoggerFrom(ctx).Info("not deploying: the policy's stack runs in another namespace", "namespace", other)
	return r.writeStatus(ctx, policy, status, ev)
}
