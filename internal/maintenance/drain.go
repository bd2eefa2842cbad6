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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubectl/pkg/drain"
	ctrl "sigs.k8s.io/controller-runtime"
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
	maxNamesInStatus = 50
	// unsyncedRetry: a node's pod watch announces its sync; this is the
	// safety net should that never come (e.g. the watch keeps failing).
	unsyncedRetry = 5 * time.Second
)

// drain performs one drain step: evict what can be evicted now, record
// progress, and come back on pod events or after a backoff.
func (r *Reconciler) drain(ctx context.Context, nm *maintenancev1.NodeMaintenance, node *corev1.Node, ev *pendingevents.Recorder) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	spec := nm.Spec.DrainSpec
	now := r.Clock.Now()
	if nm.Status.Drain == nil || nm.Status.Drain.StartTime == nil {
		t := metav1.NewTime(now)
		nm.Status.Drain = &maintenancev1.DrainStatus{StartTime: &t}
	}
	st := nm.Status.Drain
	filters, err := evictionFilters(spec.PodEvictionFilters)
	if err != nil {
		r.invalidSpec(nm, err.Error(), ev)
		return reconcile.Result{}, nil
	}
	clearCondition(nm, maintenancev1.ConditionTypeInvalidSpec)

	all, synced := r.Pods.Pods(node.Name)
	if !synced {
		return reconcile.Result{RequeueAfter: unsyncedRetry}, nil // the watch's sync brings us back
	}
	helper := &drain.Helper{
		Ctx:                 ctx,
		Client:              podsFrom{Interface: r.Kube, pods: all},
		Force:               spec.Force,
		IgnoreAllDaemonSets: true,
		DeleteEmptyDirData:  spec.DeleteEmptyDir,
		PodSelector:         string(spec.PodSelector),
		GracePeriodSeconds:  -1, // the pod's own terminationGracePeriodSeconds
		AdditionalFilters:   []drain.PodFilter{r.skipOwnPod, filters},
	}
	if !nodeReady(node) {
		helper.SkipWaitForDeleteTimeoutSeconds = int(terminatingGrace / time.Second)
	}
	list, errs := helper.GetPodsForDeletion(node.Name)
	if len(errs) > 0 {
		// Pods the drain may not remove (bare pods without force, local
		// storage without deleteEmptyDir): nothing is evicted, as kubectl
		// drain does; the user must change the spec or the pods.
		msg := fmt.Sprintf("cannot drain node %s: %s", node.Name, joinErrors(errs))
		r.blocked(nm, node, ReasonDrainFailed, msg, ev)
		return reconcile.Result{RequeueAfter: backoff(now.Sub(st.StartTime.Time))}, nil
	}
	pods := list.Pods()
	if st.EvictionPods == 0 && st.TotalPods == 0 {
		st.TotalPods = int32(len(all))
		st.EvictionPods = int32(len(pods))
	}

	var remaining []string
	refused := 0
	for i := range pods {
		p := &pods[i]
		remaining = append(remaining, p.Namespace+"/"+p.Name)
		if p.DeletionTimestamp != nil {
			continue // being terminated; its deletion event brings us back
		}
		switch err := helper.EvictPod(*p, policyv1.SchemeGroupVersion); {
		case err == nil:
			evictions.WithLabelValues("evicted").Inc()
		case apierrors.IsNotFound(err):
		case apierrors.IsTooManyRequests(err):
			refused++
			evictions.WithLabelValues("refused").Inc()
			log.V(1).Info("eviction refused", "pod", p.Namespace+"/"+p.Name, "reason", err.Error())
		default:
			refused++
			evictions.WithLabelValues("error").Inc()
			log.Info("eviction failed", "pod", p.Namespace+"/"+p.Name, "error", err.Error())
		}
	}
	sort.Strings(remaining)
	st.WaitForEviction = truncate(remaining, maxNamesInStatus)
	st.DrainProgress = progress(st.EvictionPods, int32(len(remaining)))
	if len(remaining) == 0 {
		drainDuration.Observe(now.Sub(st.StartTime.Time).Seconds())
		clearCondition(nm, maintenancev1.ConditionTypeDrainBlocked)
		st.DrainProgress = 100
		r.enter(nm, node, maintenancev1.PhaseReady, ev)
		return reconcile.Result{}, nil
	}

	elapsed := now.Sub(st.StartTime.Time)
	timeout := seconds(spec.TimeoutSeconds, 300)
	if timeout > 0 && elapsed >= timeout {
		r.blocked(nm, node, ReasonDrainBlocked, fmt.Sprintf("drain of node %s not done after %s; blocking pods: %s",
			node.Name, timeout, summarize(remaining, 10)), ev)
	}
	if refused > 0 {
		return reconcile.Result{RequeueAfter: backoff(elapsed)}, nil
	}
	// Only terminating pods left: their deletion events bring us back. We
	// also look again when the timeout is due and, on an unreachable node,
	// when the first of them will be considered gone; never later than
	// maxDrainBackoff while the drain is active.
	next := maxDrainBackoff
	if timeout > 0 && elapsed < timeout {
		next = min(next, timeout-elapsed)
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
// requests a resource whose name matches any filter. No filters: all pods.
func evictionFilters(entries []maintenancev1.PodEvictionFilterEntry) (drain.PodFilter, error) {
	var res []*regexp.Regexp
	for i, e := range entries {
		if e.ByResourceNameRegex == nil || *e.ByResourceNameRegex == "" {
			return nil, fmt.Errorf("drainSpec.podEvictionFilters[%d]: byResourceNameRegex is empty", i)
		}
		re, err := regexp.Compile(*e.ByResourceNameRegex)
		if err != nil {
			return nil, fmt.Errorf("drainSpec.podEvictionFilters[%d].byResourceNameRegex %q: %w", i, *e.ByResourceNameRegex, err)
		}
		res = append(res, re)
	}
	return func(p corev1.Pod) drain.PodDeleteStatus {
		if len(res) == 0 || podUsesResource(&p, res) {
			return drain.MakePodDeleteStatusOkay()
		}
		return drain.MakePodDeleteStatusSkip()
	}, nil
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
