package repair

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Detector watches node conditions for the policy's rules and starts
// repairs under the blast-radius limits.
type Detector struct {
	Client   client.Client
	Clock    clock.PassiveClock
	Recorder events.EventRecorder
}

// Reconcile evaluates every node of one NodeRepairPolicy (Detect) and
// writes the outcome: fault clocks, resolved failures, new NodeRepairs
// (created complete), then the policy's status; events follow the writes
// they report.
func (d *Detector) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	policy := &repairv1.NodeRepairPolicy{}
	if err := d.Client.Get(ctx, req.NamespacedName, policy); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	in, err := d.read(ctx, policy)
	if err != nil {
		if errors.Is(err, errBadSelector) {
			return reconcile.Result{}, d.writeStatus(ctx, policy, invalidSelector(policy, err, d.Clock.Now()), nil)
		}
		return reconcile.Result{}, err
	}
	det := Detect(in)
	for _, f := range det.Resolved {
		if err := d.resolve(ctx, f); err != nil {
			return reconcile.Result{}, err
		}
	}
	// The repairs first, then the fault clocks: a burst of faults on
	// hundreds of nodes writes a clock on each, and the repairs the pass
	// allows must not wait behind them. A refused write stops none of the
	// others; the pass runs again (with backoff) for what failed.
	var errs []error
	for _, r := range det.Create {
		errs = append(errs, d.create(ctx, r))
	}
	errs = append(errs, d.saveAllTracked(ctx, det.Tracked)...)
	for _, r := range det.Prune {
		// Past historyLimit: the newest stay for the fleet view's history.
		if err := d.Client.Delete(ctx, r, client.Preconditions{UID: &r.UID}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("deleting NodeRepair %s past the policy's historyLimit: %w", r.Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	err = d.writeStatus(ctx, policy, det.Status, func() {
		if c := meta.FindStatusCondition(det.Status.Conditions, conditionBusy); c != nil && c.Status == metav1.ConditionTrue {
			d.Recorder.Eventf(policy, nil, corev1.EventTypeNormal, ReasonBlocked, actionRepair, "%s", c.Message)
		}
	})
	switch {
	case apierrors.IsConflict(err):
		// The cache held an older policy (often this pass's own previous
		// status write, not seen yet): nothing is wrong; the pass runs
		// again shortly on the newer one, without an error in the log.
		retry := statusConflictRetry
		if det.Next > 0 && det.Next < retry {
			retry = det.Next
		}
		return reconcile.Result{RequeueAfter: retry}, nil
	case err != nil:
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: det.Next}, nil
}

// statusConflictRetry: how soon a pass whose status write met a newer
// policy runs again.
const statusConflictRetry = time.Second

var errBadSelector = errors.New("invalid nodeSelector")

// read gathers Detect's input from the cache.
func (d *Detector) read(ctx context.Context, policy *repairv1.NodeRepairPolicy) (DetectInput, error) {
	in := DetectInput{Policy: policy, Now: d.Clock.Now()}
	sel := labels.Everything()
	if policy.Spec.NodeSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(policy.Spec.NodeSelector)
		if err != nil {
			return in, fmt.Errorf("%w: %w", errBadSelector, err)
		}
		sel = s
	}
	// The cache's objects, not copies: Detect reads them (FuzzDetect
	// checks it changes none) and every write starts from a copy. A pass
	// over a large fleet otherwise copies every node, repair and record.
	var nodes corev1.NodeList
	if err := d.Client.List(ctx, &nodes, client.MatchingLabelsSelector{Selector: sel}, client.UnsafeDisableDeepCopy); err != nil {
		return in, fmt.Errorf("listing nodes: %w", err)
	}
	var repairs repairv1.NodeRepairList
	if err := d.Client.List(ctx, &repairs, client.UnsafeDisableDeepCopy); err != nil {
		return in, fmt.Errorf("listing NodeRepairs: %w", err)
	}
	var nms maintenancev1.NodeMaintenanceList
	if err := d.Client.List(ctx, &nms, client.UnsafeDisableDeepCopy); err != nil {
		return in, fmt.Errorf("listing NodeMaintenance: %w", err)
	}
	var gpus repairv1.GPUFaultList
	if err := d.Client.List(ctx, &gpus, client.UnsafeDisableDeepCopy); err != nil {
		return in, fmt.Errorf("listing GPUFaults: %w", err)
	}
	in.Nodes, in.Repairs, in.Maintenances, in.GPUFaults = nodes.Items, repairs.Items, nms.Items, gpus.Items
	faulty := map[string]bool{}
	for i := range gpus.Items {
		if !gpus.Items[i].InService() {
			faulty[gpus.Items[i].Spec.NodeName] = true
		}
	}
	for node := range faulty {
		// Whether the node's GPUs are published through DRA decides how
		// many faulty GPUs take the whole node (wholeNode).
		var slices resourcev1.ResourceSliceList
		if err := d.Client.List(ctx, &slices, client.MatchingFields{indexSliceNode: node}); err != nil {
			if meta.IsNoMatchError(err) {
				break // the API server does not serve DRA
			}
			return in, fmt.Errorf("listing ResourceSlices of node %s: %w", node, err)
		}
		in.Slices = append(in.Slices, slices.Items...)
	}
	return in, nil
}

// invalidSelector is the status of a policy whose node selector cannot be
// used: nothing is repaired, and the condition says why.
func invalidSelector(policy *repairv1.NodeRepairPolicy, err error, now time.Time) repairv1.NodeRepairPolicyStatus {
	status := policy.Status.DeepCopy()
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: conditionInvalid, Status: metav1.ConditionTrue,
		Reason: "InvalidNodeSelector", Message: err.Error() + "; no node is repaired until it is fixed",
		LastTransitionTime: metav1.NewTime(now), ObservedGeneration: policy.Generation})
	status.ObservedGeneration = policy.Generation
	return *status
}

// writeStatus patches the policy's status when it changed (optimistic
// lock: a concurrent change makes it fail and the pass run again), then
// calls after.
func (d *Detector) writeStatus(ctx context.Context, policy *repairv1.NodeRepairPolicy, status repairv1.NodeRepairPolicyStatus, after func()) error {
	if equality.Semantic.DeepEqual(&policy.Status, &status) {
		return nil
	}
	oldMsg := ""
	if c := meta.FindStatusCondition(policy.Status.Conditions, conditionBusy); c != nil {
		oldMsg = c.Message
	}
	p := policy.DeepCopy()
	p.Status = status
	if err := d.Client.Status().Patch(ctx, p, client.MergeFromWithOptions(policy, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("updating NodeRepairPolicy status: %w", err)
	}
	if c := meta.FindStatusCondition(status.Conditions, conditionBusy); after != nil && c != nil && c.Message != oldMsg {
		after()
	}
	return nil
}

// resolve lifts a failed repair whose fault cleared: the node loses its
// RecoveryFailed state and the record is marked resolved.
func (d *Detector) resolve(ctx context.Context, f *repairv1.NodeRepair) error {
	if err := setNodeState(ctx, d.Client, f.Spec.NodeName, ""); err != nil {
		return err
	}
	if f.Spec.Recommendation != "" {
		if err := patchMeta(ctx, d.Client, f.Spec.NodeName, "annotations", map[string]any{AnnotationRecommendation: nil}); err != nil {
			return err
		}
	}
	patch := client.MergeFrom(f.DeepCopy())
	f = f.DeepCopy()
	if f.Labels == nil {
		f.Labels = map[string]string{}
	}
	f.Labels[labelResolved] = "true"
	if err := d.Client.Patch(ctx, f, patch); err != nil {
		return fmt.Errorf("marking %s resolved: %w", f.Name, err)
	}
	log := ctrl.LoggerFrom(ctx)
	log.Info("fault of a failed repair cleared; pool no longer suspended", "node", f.Spec.NodeName, "pool", f.Spec.Pool, "repair", f.Name)
	return nil
}

// create creates one NodeRepair, complete, and reports it: a repair to run
// (event NodeRepairStart, node state Repairing), a dry-run record
// (NodeRepairStart saying so) or an ignored fault (NodeRepairIgnore only).
func (d *Detector) create(ctx context.Context, r *repairv1.NodeRepair) error {
	if err := d.Client.Create(ctx, r); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil // created by an earlier pass whose cache we have not seen yet
		}
		return fmt.Errorf("creating NodeRepair for %s: %w", r.Spec.NodeName, err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("node", r.Spec.NodeName, "repair", r.Name, "rule", r.Spec.Fault.Rule)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: r.Spec.NodeName}}
	since := d.Clock.Since(r.Spec.Fault.Since.Time).Round(time.Second)
	switch {
	case r.Spec.IgnoreReason != "":
		faultsDetected.WithLabelValues(r.Spec.Fault.Rule, outcomeIgnored).Inc()
		log.Info("not repairing node", "reason", r.Spec.IgnoreReason)
		d.Recorder.Eventf(n, r, corev1.EventTypeNormal, ReasonIgnore, actionRepair, "Not repairing node %s (%s): %s", r.Spec.NodeName, r.Spec.Fault.Rule, r.Spec.IgnoreReason)
		return nil
	case r.Spec.DryRun:
		faultsDetected.WithLabelValues(r.Spec.Fault.Rule, outcomeDryRun).Inc()
		log.Info("dry run: would repair node", "actions", r.Spec.Actions)
		d.Recorder.Eventf(n, r, corev1.EventTypeNormal, ReasonStart, actionRepair, "Dry run: would repair node %s: %s (%s) for %s; actions %v",
			r.Spec.NodeName, r.Spec.Fault.Rule, r.Spec.Fault.ConditionType, since, r.Spec.Actions)
		return nil
	}
	faultsDetected.WithLabelValues(r.Spec.Fault.Rule, outcomeRepair).Inc()
	log.Info("repairing node", "actions", r.Spec.Actions)
	why := ""
	if r.Spec.Escalation != "" {
		why = "; " + r.Spec.Escalation
	}
	d.Recorder.Eventf(n, r, corev1.EventTypeNormal, ReasonStart, actionRepair, "Repairing node %s: %s (%s) for %s; actions %v%s",
		r.Spec.NodeName, r.Spec.Fault.Rule, r.Spec.Fault.ConditionType, since, r.Spec.Actions, why)
	return setNodeState(ctx, d.Client, r.Spec.NodeName, string(repairv1.PhaseRepairing))
}

func trackedOf(n *corev1.Node) map[string]time.Time {
	raw := n.Annotations[annotationFaults]
	if raw == "" {
		return nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil
	}
	out := map[string]time.Time{}
	for k, v := range m {
		if t, err := time.Parse(time.RFC3339, v); err == nil {
			out[k] = t
		}
	}
	return out
}

// trackWriters bounds the fault clocks one pass writes at once.
const trackWriters = 16

// saveAllTracked writes the nodes' fault clocks, trackWriters at once,
// and returns the errors.
func (d *Detector) saveAllTracked(ctx context.Context, tracked map[string]map[string]time.Time) []error {
	nodes := slices.Sorted(maps.Keys(tracked))
	errs := make([]error, len(nodes))
	workqueue.ParallelizeUntil(ctx, trackWriters, len(nodes), func(i int) {
		errs[i] = d.saveTracked(ctx, nodes[i], tracked[nodes[i]])
	})
	if err := ctx.Err(); err != nil {
		errs = append(errs, err) // stopping: the writes not started did not run
	}
	return errs
}

// saveTracked writes a node's fault clock (nil or empty removes it).
func (d *Detector) saveTracked(ctx context.Context, node string, tracked map[string]time.Time) error {
	var value any
	if len(tracked) > 0 {
		m := map[string]string{}
		for k, v := range tracked {
			m[k] = v.UTC().Format(time.RFC3339)
		}
		data, err := json.Marshal(m)
		if err != nil {
			return fmt.Errorf("encoding the fault clock of %s: %w", node, err)
		}
		value = string(data)
	}
	return patchMeta(ctx, d.Client, node, "annotations", map[string]any{annotationFaults: value})
}

// setNodeState shows a repair's state on the node ("" removes it).
func setNodeState(ctx context.Context, c client.Client, node, state string) error {
	var v any = state
	if state == "" {
		v = nil
	}
	return patchMeta(ctx, c, node, "labels", map[string]any{LabelState: v})
}

// patchMeta merges labels or annotations into a node (nil removes).
func patchMeta(ctx context.Context, c client.Client, node, field string, values map[string]any) error {
	return patchNodeMeta(ctx, c, node, map[string]any{field: values})
}

// patchNodeMeta merges metadata (labels, annotations; nil removes) into a
// node in one write.
func patchNodeMeta(ctx context.Context, c client.Client, node string, meta map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := c.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("patching node %s metadata: %w", node, err)
	}
	return nil
}
