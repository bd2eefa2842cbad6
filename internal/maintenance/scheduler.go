package maintenance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/liveowner"
)

// scheduleWriters bounds the status writes one pass sends at once.
const scheduleWriters = 32

// schedulerKey is the one request the scheduler works on: every relevant
// change maps to it, so the work queue collapses bursts into one pass.
var schedulerKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "nodemaintenance-scheduler"}}

// Scheduler admits Pending NodeMaintenance objects under the limits of the
// MaintenanceOperatorConfig. It never plans from a cache that has not yet
// seen its previous decisions: until the cache shows an object it moved to
// Scheduled, its passes plan with the object as written.
type Scheduler struct {
	Client client.Client
	// Live reads a node from the API server when the cache shows it
	// cordoned as its maintenance is scheduled (nil: the cache is trusted).
	Live      client.Reader
	Namespace string
	Clock     clock.PassiveClock
	Recorder  events.EventRecorder
	// Reasons writes the wait reasons of Pending objects, apart from the pass.
	Reasons *WaitReasons
	// Alarm wakes the scheduler when the maintenance calendar may change
	// (a window opens or closes, an exclusion starts or ends); nil: none.
	Alarm *Alarm
	// ComputeDomains names the ComputeDomains of busy domains in wait
	// reasons (nil: their UIDs are shown).
	ComputeDomains *ComputeDomainNames
	// Leases judges whether NVIDIA's Maintenance Operator is alive (shared
	// with the lifecycle controller and the fence).
	Leases *liveowner.Observer
	// AllowedNamespaces, when set, are the only namespaces (besides the
	// operator's own) whose NodeMaintenance objects are scheduled; the
	// others wait, saying why.
	AllowedNamespaces []string

	// lastValid is the last config that could be read: it keeps applying
	// while the current one cannot (nil after a restart until one can).
	lastValid *Config

	// scheduled: objects this scheduler moved to Scheduled that the cache
	// may still show as they were before that write.
	scheduled scheduledRecord
	// pools: each node's pools, from the last passes.
	pools poolMemo
	// changedSince: when the first change not yet planned for was seen
	// (Unix nanoseconds on Clock; 0: none), for the scheduling latency.
	changedSince atomic.Int64
}

// unplanned gives back the first change of a pass that did not finish:
// the earlier of it and any change seen since.
func (s *Scheduler) unplanned(since int64) {
	for {
		cur := s.changedSince.Load()
		if (cur != 0 && cur <= since) || s.changedSince.CompareAndSwap(cur, since) {
			return
		}
	}
}

// Changed notes a change that brings a pass (the watches' handler calls
// it): the scheduling latency of the pass that plans for it counts from
// the first such change.
func (s *Scheduler) Changed() {
	s.changedSince.CompareAndSwap(0, s.Clock.Now().UnixNano())
}

// Reconcile runs one scheduling pass.
func (s *Scheduler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	holding, held, err := otherOwner(ctx, s.Client, s.Leases, s.Clock.Now())
	if err != nil {
		return reconcile.Result{}, err
	}
	if held {
		// NVIDIA's Maintenance Operator runs: nothing is scheduled (nor a
		// wait reason written) beside it; the config says why.
		log.V(1).Info("NVIDIA Maintenance Operator holds its lease; waiting", "holder", holding.Holder, "until", holding.Until)
		if err := s.writeLiveOwnerStatus(ctx, &holding); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: holding.Until.Sub(s.Clock.Now()) + liveOwnerRecheck}, nil
	}
	// The cache's objects, not copies (a pass over 10,000 nodes would
	// otherwise copy them all): the pass only reads them; schedule()
	// writes from a copy, and the wait-reason writer reads.
	var list maintenancev1.NodeMaintenanceList
	if err := s.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing NodeMaintenance: %w", err)
	}
	// The objects the last passes scheduled, as written, where the cache
	// does not show them yet: never a decision from a cache that has not
	// seen ours, and no wait for it.
	if n := s.scheduled.overlay(&list, s.Clock.Now()); n > 0 {
		log.V(1).Info("planning with scheduling decisions the cache does not show yet", "objects", n)
		plannedAheadOfCache.Add(float64(n))
	}
	// This pass plans for every change seen so far (the lists come from a
	// cache that has them, or newer).
	changedSince := s.changedSince.Swap(0)
	planned := false
	defer func() {
		if !planned && changedSince != 0 {
			s.unplanned(changedSince) // the pass that plans counts from it
		}
	}()
	var nodes corev1.NodeList
	if err := s.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing nodes: %w", err)
	}
	allowed, refused := s.allowedOnly(&list)
	cfgObj, err := s.config(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	var spec *maintenancev1.MaintenanceOperatorConfigSpec
	if cfgObj != nil {
		spec = &cfgObj.Spec
	}
	cfg, cfgErr := CompileConfig(spec)
	if cfgErr == nil {
		if cfgObj != nil {
			cfg.Generation = cfgObj.Generation
		}
		s.lastValid = &cfg
	}
	began := s.Clock.Now()
	var plan Plan
	var snap Snapshot
	if s.lastValid != nil {
		s.pools.begin(s.lastValid)
		snap = snapshot(&nodes, allowed, s.lastValid, func(uid string) string { return s.ComputeDomains.Name(ctx, uid) }, &s.pools)
		s.pools.end(len(nodes.Items))
		plan, err = MakePlan(snap, s.lastValid.Limits, began)
	} else {
		snap = snapshot(&nodes, allowed, &Config{}, nil, nil)
		err = cfgErr
	}
	planDuration.Observe(s.Clock.Since(began).Seconds())
	if err != nil {
		// No config that can be read has applied since the start (or the
		// limits do not resolve, which the schema prevents): schedule
		// nothing, and say why on every Pending object.
		log.Error(err, "invalid MaintenanceOperatorConfig; scheduling nothing")
		plan = Plan{Waiting: map[string]string{}}
		for _, o := range snap.Objects {
			if !o.InProgress {
				plan.Waiting[o.Key()] = "invalid MaintenanceOperatorConfig: " + err.Error()
			}
		}
	}
	if len(refused) > 0 {
		if plan.Waiting == nil {
			plan.Waiting = map[string]string{}
		}
		maps.Copy(plan.Waiting, refused)
	}
	s.Alarm.Set(plan.Window.NextChange)
	byKey := make(map[string]*maintenancev1.NodeMaintenance, len(list.Items))
	for i := range list.Items {
		nm := &list.Items[i]
		byKey[nm.Namespace+"/"+nm.Name] = nm
	}
	// The wait-reason writer learns the plan first, so it no longer
	// writes the objects about to be scheduled.
	s.Reasons.Set(plan.Waiting, byKey)
	domainOf := snap.domainOf()
	disrupted := disruptedDomains(snap, domainOf)
	defer func() { recordDomains(plan.TotalDomains, len(disrupted)) }()
	// Each node's state before its maintenance, from the snapshot (nil:
	// the node is gone).
	unschedulable := make(map[string]*bool, len(plan.Schedule))
	for _, o := range plan.Schedule {
		unschedulable[o.NodeName] = nil
	}
	for i := 0; len(unschedulable) > 0 && i < len(snap.Nodes); i++ {
		n := &snap.Nodes[i]
		if _, ok := unschedulable[n.Name]; ok {
			unschedulable[n.Name] = ptr.To(n.Unschedulable)
		}
	}
	// The writes of a pass go out together (a pass that opens many slots
	// at 10,000 nodes would otherwise wait for each write in turn, and
	// every release behind it).
	errs := make([]error, len(plan.Schedule))
	workqueue.ParallelizeUntil(ctx, scheduleWriters, len(plan.Schedule), func(i int) {
		o := plan.Schedule[i]
		before, err := s.unschedulableBefore(ctx, o.NodeName, unschedulable[o.NodeName])
		if err != nil {
			errs[i] = err
			return
		}
		errs[i] = s.schedule(ctx, byKey[o.Key()], before)
	})
	if err := ctx.Err(); err != nil {
		return reconcile.Result{}, err // stopping: the pieces not started did not run
	}
	var failed []error
	conflict := false
	for i, o := range plan.Schedule {
		if err := errs[i]; err != nil {
			conflict = conflict || apierrors.IsConflict(err)
			if !apierrors.IsConflict(err) {
				failed = append(failed, err)
			}
			continue
		}
		// A domain's interruption begins with the first of its nodes to
		// go into maintenance while none of them is.
		if d := domainOf[o.NodeName]; d != "" && plan.TotalDomains > 0 && !disrupted[d] {
			disrupted[d] = true
			domainInterruptions.Inc()
		}
	}
	if err := errors.Join(failed...); err != nil {
		return reconcile.Result{}, err
	}
	if conflict {
		// A copy was stale: its watch event brings a new pass (the
		// requeue is a safety net, without error backoff). The objects
		// scheduled were all in the plan.
		log.V(1).Info("conflict while scheduling; planning again")
		return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	planned = true
	if len(plan.Schedule) > 0 && changedSince != 0 {
		schedulingLatency.Observe(s.Clock.Since(time.Unix(0, changedSince)).Seconds())
	}
	if len(plan.Schedule) > 0 {
		log.Info("scheduled NodeMaintenance", "count", len(plan.Schedule), "availableSlots", plan.AvailableSlots,
			"canBecomeUnavailable", plan.CanBecomeUnavailable, "waiting", len(plan.Waiting))
	}
	// The config's own status comes last: it never delays a decision.
	if cfgObj != nil {
		if err := s.writeConfigStatus(ctx, cfgObj, cfgErr, plan.Window, nil, began); err != nil {
			return reconcile.Result{}, err
		}
	}
	if !plan.NextDomainStart.IsZero() {
		// A domain whose requests are being collected may start then.
		return reconcile.Result{RequeueAfter: max(plan.NextDomainStart.Sub(s.Clock.Now()), 10*time.Millisecond)}, nil
	}
	return reconcile.Result{}, nil
}

// allowedOnly splits the objects by AllowedNamespaces: those that may be
// scheduled (all of them, without an allow-list), and the wait reason of
// each Pending object of another namespace. An object already in progress
// there goes on (it holds its node).
func (s *Scheduler) allowedOnly(list *maintenancev1.NodeMaintenanceList) (*maintenancev1.NodeMaintenanceList, map[string]string) {
	if len(s.AllowedNamespaces) == 0 {
		return list, nil
	}
	allowed := &maintenancev1.NodeMaintenanceList{Items: make([]maintenancev1.NodeMaintenance, 0, len(list.Items))}
	refused := map[string]string{}
	for i := range list.Items {
		nm := &list.Items[i]
		if nm.Namespace == s.Namespace || slices.Contains(s.AllowedNamespaces, nm.Namespace) || nm.InProgress() {
			allowed.Items = append(allowed.Items, *nm)
			continue
		}
		refused[nm.Namespace+"/"+nm.Name] = fmt.Sprintf("namespace %s may not request maintenance: the operator schedules only those of %s and its own (--maintenance-namespaces)",
			nm.Namespace, strings.Join(s.AllowedNamespaces, ", "))
	}
	return allowed, refused
}

// disruptedDomains are the domains with a node whose maintenance is in
// progress (none without spec.domains: no node has a domain then).
func disruptedDomains(snap Snapshot, domainOf map[string]string) map[string]bool {
	out := map[string]bool{}
	for _, o := range snap.Objects {
		if d := domainOf[o.NodeName]; o.InProgress && d != "" {
			out[d] = true
		}
	}
	return out
}

// domainOf maps each node in a domain to it.
func (s Snapshot) domainOf() map[string]string {
	out := make(map[string]string, len(s.Nodes))
	for _, n := range s.Nodes {
		if n.Domain != "" {
			out[n.Name] = n.Domain
		}
	}
	return out
}

// config reads the "default" MaintenanceOperatorConfig in the operator's
// namespace; nil without one (the documented defaults apply).
func (s *Scheduler) config(ctx context.Context) (*maintenancev1.MaintenanceOperatorConfig, error) {
	var cfg maintenancev1.MaintenanceOperatorConfig
	err := s.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: maintenancev1.DefaultConfigName}, &cfg)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading MaintenanceOperatorConfig: %w", err)
	}
	return &cfg, nil
}

// unschedulableBefore is whether node was unschedulable before the
// maintenance about to be scheduled on it (cached: what the snapshot
// shows; nil: the node is gone). A node the cache shows cordoned is read
// from the API server: the cache may not show yet the uncordon of the
// maintenance that just ended on it, and that cordon taken for an
// administrator's would keep the node cordoned when this one ends.
func (s *Scheduler) unschedulableBefore(ctx context.Context, node string, cached *bool) (*bool, error) {
	if cached == nil || !*cached || s.Live == nil {
		return cached, nil
	}
	var n corev1.Node
	if err := s.Live.Get(ctx, types.NamespacedName{Name: node}, &n); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading node %s before scheduling its maintenance: %w", node, err)
	}
	return ptr.To(n.Spec.Unschedulable), nil
}

// schedule moves one object from Pending to Scheduled, recording whether
// its node was already unschedulable (the lifecycle cordons it next, and
// the record must precede the cordon). The update carries the cached
// resourceVersion: if the object changed meanwhile, the write fails with a
// conflict and the pass is retried from fresh data.
func (s *Scheduler) schedule(ctx context.Context, nm *maintenancev1.NodeMaintenance, nodeUnschedulable *bool) error {
	now := s.Clock.Now()
	orig := nm
	nm = nm.DeepCopy()
	setPhase(nm, maintenancev1.PhaseScheduled, "scheduled for maintenance", now)
	t := metav1.NewTime(now)
	nm.Status.ScheduledTime = &t
	nm.Status.ObservedGeneration = nm.Generation
	nm.Status.NodeUnschedulableBefore = nodeUnschedulable // nil: the node is gone
	key := client.ObjectKeyFromObject(nm)
	if err := patchStatus(ctx, s.Client, orig, nm); err != nil {
		if apierrors.IsConflict(err) {
			statusConflicts.WithLabelValues("scheduler").Inc()
		}
		return fmt.Errorf("scheduling %s: %w", key, err)
	}
	// The next pass plans with this write until the cache shows it
	// (passes run one at a time, so none can start before it is recorded).
	s.scheduled.wrote(nm, orig.ResourceVersion, now)
	schedulingDecisions.WithLabelValues("scheduled").Inc()
	return nil
}

// snapshot converts cached objects into the planner's input. Objects the
// lifecycle controller has not yet initialised (no phase written) are left
// out until it has: each is seen Pending before it is Scheduled. (Cleanup
// is guaranteed: the finalizer is added before anything is done to the
// node.)
// With domains, a node that runs a ComputeDomain's workload has it named
// by computeDomain (from the UID the driver's label holds).
// A memo, when given, remembers the nodes' pools between passes (begun
// under cfg).
func snapshot(nodes *corev1.NodeList, list *maintenancev1.NodeMaintenanceList, cfg *Config, computeDomain func(uid string) string, memo *poolMemo) Snapshot {
	s := Snapshot{Nodes: make([]PlanNode, 0, len(nodes.Items)), Objects: make([]PlanObject, 0, len(list.Items))}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		pn := PlanNode{Name: n.Name, Unschedulable: n.Spec.Unschedulable, Ready: nodeReady(n), Domain: cfg.DomainOf(n.Labels)}
		if memo != nil {
			pn.Pools = memo.of(cfg, n)
		} else {
			pn.Pools = cfg.PoolsOf(n.Labels)
		}
		if uid := n.Labels[LabelComputeDomain]; uid != "" && pn.Domain != "" && computeDomain != nil {
			pn.ComputeDomain = computeDomain(uid)
		}
		s.Nodes = append(s.Nodes, pn)
	}
	for i := range list.Items {
		nm := &list.Items[i]
		inProgress := nm.InProgress()
		if !inProgress && !initialised(nm) {
			continue
		}
		s.Objects = append(s.Objects, PlanObject{
			Namespace: nm.Namespace, Name: nm.Name, NodeName: nm.Spec.NodeName, RequestorID: nm.Spec.RequestorID,
			Created: nm.CreationTimestamp.Time, InProgress: inProgress, Deleting: nm.DeletionTimestamp != nil,
			Urgent: nm.Annotations[maintenancev1.AnnotationUrgent] == "true",
		})
	}
	return s
}

var allPhases = []maintenancev1.Phase{
	maintenancev1.PhasePending, maintenancev1.PhaseScheduled, maintenancev1.PhaseCordon,
	maintenancev1.PhaseWaitForPodCompletion, maintenancev1.PhaseDraining, maintenancev1.PhaseReady,
	maintenancev1.PhaseRequestorFailed,
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// notOwnWrite passes every event but the watch's echo of the scheduler's
// own Scheduled write: the pass that wrote it planned with it.
func (s *Scheduler) notOwnWrite() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		nm, ok := e.ObjectNew.(*maintenancev1.NodeMaintenance)
		return !ok || !s.scheduled.echo(nm)
	}}
}

// nodeChangeRelevant passes node changes a plan reads: labels (a node's
// pools and NVLink domain), and its readiness, schedulability or deletion
// unless a maintenance in progress holds it — a held node counts as
// unavailable and takes no new maintenance whatever its state, so the
// cordon and uncordon of a maintenance's own node bring no pass. (If the
// object is gone from the cache when the uncordon arrives, the uncordon
// passes; if not, its removal brings the pass, which reads the node as
// uncordoned.) Heartbeats never pass.
func (s *Scheduler) nodeChangeRelevant() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		if !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) {
			return true
		}
		return availabilityChanged.Update(e) && !s.nodeHeld(e.ObjectNew.GetName())
	}}
}

// nodeHeld reports whether the cache shows a maintenance in progress on
// node (false when it cannot tell).
func (s *Scheduler) nodeHeld(node string) bool {
	var list maintenancev1.NodeMaintenanceList
	if err := s.Client.List(context.Background(), &list, client.MatchingFields{indexNodeName: node}, client.UnsafeDisableDeepCopy); err != nil {
		return false
	}
	for i := range list.Items {
		if list.Items[i].InProgress() {
			return true
		}
	}
	return false
}
