package maintenance

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubectl/pkg/drain"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/pendingevents"
)

// Drain tuning.
const (
	// terminatingGrace: on a node that is not Ready, pods still terminating
	// this long after their grace period ended are considered gone (the
	// kubelet that would remove them is unreachable).
	terminatingGrace = 10 * time.Second
	maxDrainBackoff  = 30 * time.Second
	// progressAfter: a drain that lasts longer writes its progress at
	// every step from then on (a shorter one, when it ends or is held up).
	progressAfter    = 30 * time.Second
	maxNamesInStatus = 50
	// unsyncedRetry: a node's pod watch announces its sync; this is the
	// safety net should that never come (e.g. the watch keeps failing).
	unsyncedRetry = 5 * time.Second
)

// drain performs one drain step: evict what can be evicted now, record
// progress, and come back on pod events or after a backoff.
func (r *Reconciler) drain(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node, ev *pendingevents.Recorder) (reconcile.Result, error) {
	spec := nm.Spec.DrainSpec
	now := r.Clock.Now()
	if nm.Status.Drain == nil || nm.Status.Drain.StartTime == nil {
		t := metav1.NewTime(now)
		nm.Status.Drain = &maintenancev1.DrainStatus{StartTime: &t, SpecHash: drainSpecHash(spec)}
	}
	st := nm.Status.Drain
	all, synced := r.Pods.Pods(node.Name)
	if !synced {
		return reconcile.Result{RequeueAfter: unsyncedRetry}, nil // the watch's sync brings us back
	}
	helper, err := r.drainHelper(ctx, spec, node, all)
	if err != nil {
		r.invalidSpec(nm, err.Error(), ev)
		return reconcile.Result{}, nil
	}
	clearCondition(nm, maintenancev1.ConditionTypeInvalidSpec)
	list, errs := helper.GetPodsForDeletion(node.Name)
	if len(errs) > 0 {
		// Pods of the drain that kubectl's rules forbid removing (bare
		// pods without force, local storage without deleteEmptyDir):
		// nothing is evicted, as kubectl drain does; the user must change
		// the spec or the pods. A refusal is not a timeout: only once the
		// timeout has passed may a requestor go on without the drain.
		elapsed, timeout := now.Sub(st.StartTime.Time), seconds(spec.TimeoutSeconds, 300)
		msg := fmt.Sprintf("cannot drain node %s: %s", node.Name, joinErrors(errs))
		if timeout > 0 && elapsed >= timeout {
			r.blocked(nm, node, ReasonDrainBlocked, fmt.Sprintf("drain of node %s not done after %s: %s", node.Name, timeout, msg), ev)
			return reconcile.Result{RequeueAfter: backoff(elapsed)}, nil
		}
		r.blocked(nm, node, ReasonDrainFailed, msg, ev)
		next := backoff(elapsed)
		if timeout > 0 {
			next = min(next, timeout-elapsed)
		}
		return reconcile.Result{RequeueAfter: next}, nil
	}
	pods := list.Pods()
	if st.EvictionPods == 0 && st.TotalPods == 0 {
		st.TotalPods = int32(len(all))
		st.EvictionPods = int32(len(pods))
	}

	elapsed := now.Sub(st.StartTime.Time)
	refused, retryIn, pending := r.evictAll(ctx, client.ObjectKeyFromObject(nm), pods, st.StartTime.Time, backoff(elapsed))
	remaining := podNames(pods)
	if st.WaitForEviction == nil || len(remaining) == 0 || refused > 0 || elapsed >= progressAfter {
		// Progress is written when the drain ends or is held up, and
		// while it lasts longer than progressAfter; a drain that goes
		// through is not written pod by pod (that was most of its
		// requests).
		st.WaitForEviction = truncate(remaining, maxNamesInStatus)
		st.DrainProgress = progress(st.EvictionPods, int32(len(remaining)))
	}
	if len(remaining) == 0 {
		drainDuration.Observe(elapsed.Seconds())
		clearCondition(nm, maintenancev1.ConditionTypeDrainBlocked)
		st.DrainProgress = 100
		r.enter(nm, node, maintenancev1.PhaseReady, ev)
		return reconcile.Result{}, nil
	}

	timeout := seconds(spec.TimeoutSeconds, 300)
	if timeout > 0 && elapsed >= timeout {
		r.blocked(nm, node, ReasonDrainBlocked, fmt.Sprintf("drain of node %s not done after %s; blocking pods: %s",
			node.Name, timeout, summarize(remaining, 10)), ev)
	} else if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeDrainBlocked); c != nil && c.Reason == ReasonDrainFailed {
		clearCondition(nm, maintenancev1.ConditionTypeDrainBlocked) // no longer refused: the evictions go on
	}
	if refused > 0 {
		return reconcile.Result{RequeueAfter: retryIn}, nil
	}
	// Only terminating pods and evictions in flight left: their pod
	// events, or a refusal's notification, bring us back. We also look
	// again when the timeout is due, when progress is to be written, when
	// a granted eviction should show in the watch and, on an unreachable
	// node, when the first terminating pod will be considered gone; never
	// later than maxDrainBackoff while the drain is active.
	next := maxDrainBackoff
	if pending {
		next = min(next, evictionSeenWithin)
	}
	if timeout > 0 && elapsed < timeout {
		next = min(next, timeout-elapsed)
	}
	if elapsed < progressAfter {
		next = min(next, progressAfter-elapsed)
	}
	if !nodeReady(node) {
		for i := range pods {
			if dt := pods[i].DeletionTimestamp; dt != nil {
				next = min(next, max(dt.Add(terminatingGrace+time.Second).Sub(now), time.Second))
			}
		}
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

// drainHelper configures kubectl's drain library for spec, listing the
// node's pods from all (the watched pods); an error is an invalid spec.
// The drain's own choice of pods (the operator's pod left out, the
// eviction filters) is made first: kubectl's rules (a pod without a
// controller, local storage) then apply to the pods it chose only, so a
// pod the drain never meant to evict cannot refuse it.
func (r *Reconciler) drainHelper(ctx context.Context, spec *maintenancev1.DrainSpec, node *corev1.Node, all []corev1.Pod) (*drain.Helper, error) {
	filters, err := evictionFilters(spec.PodEvictionFilters, r.claimDrivers(ctx))
	if err != nil {
		return nil, err
	}
	chosen := make([]corev1.Pod, 0, len(all))
	for i := range all {
		if r.skipOwnPod(all[i]).Delete && filters(all[i]).Delete {
			chosen = append(chosen, all[i])
		}
	}
	helper := &drain.Helper{
		Ctx:                 ctx,
		Client:              podsFrom{Interface: r.Kube, pods: chosen, daemonSets: r.drainDaemonSets()},
		Force:               spec.Force,
		IgnoreAllDaemonSets: true,
		DeleteEmptyDirData:  spec.DeleteEmptyDir,
		PodSelector:         string(spec.PodSelector),
		GracePeriodSeconds:  -1, // the pod's own terminationGracePeriodSeconds
	}
	if !nodeReady(node) {
		helper.SkipWaitForDeleteTimeoutSeconds = int(terminatingGrace / time.Second)
	}
	return helper, nil
}

// planDrain records, as the drain is entered, the pods it is to evict when
// the node's pods are known already (else its first step does): the first
// step then has nothing new to write.
func (r *Reconciler) planDrain(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node) {
	all, synced := r.Pods.Pods(node.Name)
	if !synced || nm.Status.Drain == nil {
		return
	}
	helper, err := r.drainHelper(ctx, nm.Spec.DrainSpec, node, all)
	if err != nil {
		return // the drain step reports it
	}
	list, errs := helper.GetPodsForDeletion(node.Name)
	if len(errs) > 0 {
		return
	}
	pods := list.Pods()
	st := nm.Status.Drain
	st.TotalPods, st.EvictionPods = int32(len(all)), int32(len(pods))
	st.WaitForEviction = truncate(podNames(pods), maxNamesInStatus)
	st.DrainProgress = progress(st.EvictionPods, int32(len(pods)))
}

// podNames: sorted namespace/name, nil for none (as the status reads back).
func podNames(pods []corev1.Pod) []string {
	var names []string
	for i := range pods {
		names = append(names, pods[i].Namespace+"/"+pods[i].Name)
	}
	sort.Strings(names)
	return names
}

// evictAll hands every pod of the drain that is not terminating yet to
// the evictor, which asks for their evictions in the background, as
// kubectl drain does (one request each). It reports how many were refused
// and wait for their retry, the earliest retry, and whether an eviction is
// in flight or granted but not yet shown by the watch. A refusal is
// retried after retryAfter, or at once when its budget grows.
func (r *Reconciler) evictAll(ctx context.Context, drain types.NamespacedName, pods []corev1.Pod, drainStart time.Time, retryAfter time.Duration) (refused int, retryIn time.Duration, pending bool) {
	e := r.evictions()
	now := r.Clock.Now()
	var evict []corev1.Pod
	for i := range pods {
		if pods[i].DeletionTimestamp != nil {
			continue // its deletion event brings us back
		}
		switch st, at := e.state(pods[i].UID, now); st {
		case evictionPending:
			pending = true
		case evictionRefused:
			refused++
			if d := at.Sub(now); retryIn == 0 || d < retryIn {
				retryIn = d
			}
		default:
			evict = append(evict, pods[i])
		}
	}
	budgets := r.budgetsOf(ctx, evict)
	for i := range evict {
		e.evict(drain, &evict[i], budgets[i], drainStart, retryAfter)
		pending = true
	}
	return refused, retryIn, pending
}

// budgetsOf names, for each pod, the PodDisruptionBudget that covers it
// ("" for none), from the cache. A budget the cache cannot list only costs
// speed: its pods are then evicted in parallel.
func (r *Reconciler) budgetsOf(ctx context.Context, pods []corev1.Pod) []string {
	out := make([]string, len(pods))
	byNamespace := map[string][]policyv1.PodDisruptionBudget{}
	for i := range pods {
		p := &pods[i]
		pdbs, ok := byNamespace[p.Namespace]
		if !ok {
			var list policyv1.PodDisruptionBudgetList
			if err := r.Client.List(ctx, &list, client.InNamespace(p.Namespace)); err != nil {
				ctrl.LoggerFrom(ctx).V(1).Info("listing PodDisruptionBudgets failed; evicting their pods in parallel", "namespace", p.Namespace, "error", err.Error())
			}
			pdbs = list.Items
			byNamespace[p.Namespace] = pdbs
		}
		for j := range pdbs {
			if pdbSelects(&pdbs[j], p) {
				out[i] = p.Namespace + "/" + pdbs[j].Name
				break
			}
		}
	}
	return out
}

// pdbSelects: a budget without a selector selects nothing; an empty one,
// every pod of its namespace (policy/v1).
func pdbSelects(pdb *policyv1.PodDisruptionBudget, p *corev1.Pod) bool {
	if pdb.Spec.Selector == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	return err == nil && sel.Matches(labels.Set(p.Labels))
}

// blocked sets the DrainBlocked condition, with a Warning event when its
// message changes.
func (r *Reconciler) blocked(nm *maintenancev1.NodeMaintenance, node *corev1.Node, reason, msg string, ev *pendingevents.Recorder) {
	if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeDrainBlocked); c == nil || c.Message != msg {
		ev.Eventf(nm, node, corev1.EventTypeWarning, reason, actionDrain, "%s", msg)
	}
	setCondition(nm, maintenancev1.ConditionTypeDrainBlocked, metav1.ConditionTrue, reason, msg, r.Clock.Now())
}

// skipOwnPod keeps the drain away from the operator's own pod.
func (r *Reconciler) skipOwnPod(p corev1.Pod) drain.PodDeleteStatus {
	if r.PodName != "" && p.Name == r.PodName && p.Namespace == r.Namespace {
		return drain.MakePodDeleteStatusSkip()
	}
	return drain.MakePodDeleteStatusOkay()
}

// evictionFilters compiles podEvictionFilters: a pod is drained if it
// requests a resource whose name matches a filter's byResourceNameRegex,
// or has a device allocated by a DRA driver matching its byDRADriverRegex
// (drivers names the drivers of a pod's claims). No filters: all pods.
func evictionFilters(entries []maintenancev1.PodEvictionFilterEntry, drivers func(*corev1.Pod) []string) (drain.PodFilter, error) {
	var res, draRes []*regexp.Regexp
	for i, e := range entries {
		byName, byDriver := ptr.Deref(e.ByResourceNameRegex, ""), ptr.Deref(e.ByDRADriverRegex, "")
		if byName == "" && byDriver == "" {
			return nil, fmt.Errorf("drainSpec.podEvictionFilters[%d]: byResourceNameRegex and byDRADriverRegex are both empty", i)
		}
		if byName != "" {
			re, err := regexp.Compile(byName)
			if err != nil {
				return nil, fmt.Errorf("drainSpec.podEvictionFilters[%d].byResourceNameRegex %q: %w", i, byName, err)
			}
			res = append(res, re)
		}
		if byDriver != "" {
			re, err := regexp.Compile(byDriver)
			if err != nil {
				return nil, fmt.Errorf("drainSpec.podEvictionFilters[%d].byDRADriverRegex %q: %w", i, byDriver, err)
			}
			draRes = append(draRes, re)
		}
	}
	return func(p corev1.Pod) drain.PodDeleteStatus {
		if len(entries) == 0 || podUsesResource(&p, res) || (len(draRes) > 0 && len(p.Spec.ResourceClaims) > 0 && anyMatches(drivers(&p), draRes)) {
			return drain.MakePodDeleteStatusOkay()
		}
		return drain.MakePodDeleteStatusSkip()
	}, nil
}

func anyMatches(names []string, res []*regexp.Regexp) bool {
	for _, n := range names {
		if n == unreadableClaim {
			return true
		}
		for _, re := range res {
			if re.MatchString(n) {
				return true
			}
		}
	}
	return false
}

func podUsesResource(p *corev1.Pod, res []*regexp.Regexp) bool {
	containers := append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...)
	for _, c := range containers {
		for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for name := range list {
				for _, re := range res {
					if re.MatchString(string(name)) {
						return true
					}
				}
			}
		}
	}
	return false
}

// backoff grows with the time spent draining: 1s at first, at most 30s.
func backoff(elapsed time.Duration) time.Duration {
	return min(max(elapsed/4, time.Second), maxDrainBackoff)
}

func progress(total, remaining int32) int32 {
	if total <= 0 {
		return 100
	}
	done := max(total-remaining, 0)
	return min(done*100/total, 100)
}

func truncate(names []string, n int) []string {
	if len(names) <= n {
		return names
	}
	return append(names[:n:n], fmt.Sprintf("... and %d more", len(names)-n))
}

func joinErrors(errs []error) string {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}
