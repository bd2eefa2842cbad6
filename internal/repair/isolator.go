package repair

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// +kubebuilder:rbac:groups=resource.k8s.io,resources=devicetaintrules,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=repair.gpufleet.dev,resources=gpufaults,verbs=get;list;watch;patch

// Isolation of a GPU, as the isolator reports it on the GPUFault record
// (annotation AnnotationIsolation) and in events.
const (
	// AnnotationIsolation on a GPUFault says how its GPU is kept from new
	// pods, or why it is not.
	AnnotationIsolation = "repair.gpufleet.dev/isolation"
	// LabelIsolates on a DeviceTaintRule names the GPUFault it is for.
	LabelIsolates = repairv1.LabelIsolates
	// TaintKey of the device taint; its value is the GPU's fault class.
	TaintKey = "repair.gpufleet.dev/gpu-fault"

	ReasonIsolated = "GPUIsolated"
	ReasonReturned = "GPUReturnedToService"
	actionIsolate  = "Isolate"
)

// Isolator keeps a faulty GPU from new pods as soon as its node's agent
// reports it out of service, before any repair and whatever the repair
// limits: the GPU's DRA device gets a DeviceTaintRule with effect
// NoSchedule, so the scheduler allocates it to no new claim while the
// node's other GPUs stay in service, and pods already using it keep
// running until the repair drains them through a NodeMaintenance. When the
// GPU is back in service the rule is deleted. A GPU that is not published
// through DRA relies on the device plugin's own health marking; a node
// that no policy selects, or only a dry-run policy, is not isolated (a dry
// run reports what it would do).
type Isolator struct {
	Client   client.Client
	Recorder events.EventRecorder
}

// isolation is what the isolator decided for one GPU.
type isolation struct {
	rule *resourcev1.DeviceTaintRule // nil: no rule
	// note is the AnnotationIsolation value ("" when in service).
	note string
}

// Reconcile converges the DeviceTaintRule of one GPUFault record.
func (r *Isolator) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	gf := &repairv1.GPUFault{}
	if err := r.Client.Get(ctx, req.NamespacedName, gf); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		// The record is gone (e.g. the GPU was replaced): its rule goes now
		// rather than when the garbage collector gets to its owner reference.
		gf.Name = req.Name
		rule := &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: ruleName(gf)}}
		if err := r.Client.Delete(ctx, rule); client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, fmt.Errorf("deleting DeviceTaintRule %s: %w", rule.Name, err)
		}
		return reconcile.Result{}, r.count(ctx)
	}
	if _, err := r.Converge(ctx, gf); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.count(ctx)
}

// Converge gives the GPU of record gf the isolation it needs now — a
// DeviceTaintRule while it is out of service and published through DRA,
// none once it is back — and notes it on the record. It returns the rule
// it created, nil when it created none. The repair calls it too, before
// it drains a GPU's pods (a faulty GPU is isolated first, even while the
// isolator's queue is long), so both decide alike.
func (r *Isolator) Converge(ctx context.Context, gf *repairv1.GPUFault) (created *resourcev1.DeviceTaintRule, _ error) {
	want, err := r.desired(ctx, gf)
	if err != nil {
		return nil, err
	}
	have := &resourcev1.DeviceTaintRule{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: ruleName(gf)}, have); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading DeviceTaintRule %s: %w", ruleName(gf), err)
		}
		have = nil
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: gf.Spec.NodeName}}
	log := ctrl.LoggerFrom(ctx).WithValues("node", gf.Spec.NodeName, "gpu", gf.Spec.GPU.Describe())
	switch {
	case want.rule != nil && have == nil:
		err := r.Client.Create(ctx, want.rule)
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating DeviceTaintRule %s: %w", want.rule.Name, err)
		}
		if err == nil {
			created = want.rule
			log.Info("GPU isolated", "deviceTaintRule", want.rule.Name, "class", gf.Status.Class)
			r.Recorder.Eventf(node, gf, corev1.EventTypeWarning, ReasonIsolated, actionIsolate, "%s of node %s isolated (%s): %s",
				gf.Spec.GPU.Describe(), gf.Spec.NodeName, want.note, gf.Status.Summary)
		}
	case want.rule != nil && !sameSelector(have, want.rule):
		have = have.DeepCopy()
		have.Spec = want.rule.Spec
		if err := r.Client.Update(ctx, have); err != nil {
			return nil, fmt.Errorf("updating DeviceTaintRule %s: %w", have.Name, err)
		}
	case want.rule == nil && have != nil:
		if err := r.Client.Delete(ctx, have); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("deleting DeviceTaintRule %s: %w", have.Name, err)
		}
		log.Info("GPU back in service", "deviceTaintRule", have.Name)
		r.Recorder.Eventf(node, gf, corev1.EventTypeNormal, ReasonReturned, actionIsolate, "%s of node %s is back in service (DeviceTaintRule %s deleted)",
			gf.Spec.GPU.Describe(), gf.Spec.NodeName, have.Name)
	}
	return created, r.note(ctx, gf, want.note)
}

// count sets the isolated-GPUs gauge from the rules in the cache (read
// only: no copies of the cached objects, which a burst of faults made the
// isolator's main cost).
func (r *Isolator) count(ctx context.Context) error {
	var rules resourcev1.DeviceTaintRuleList
	if err := r.Client.List(ctx, &rules, client.HasLabels{LabelIsolates}, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing DeviceTaintRules: %w", err)
	}
	gpusIsolated.Set(float64(len(rules.Items)))
	var gpus repairv1.GPUFaultList
	if err := r.Client.List(ctx, &gpus, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing GPUFaults: %w", err)
	}
	out := map[repairv1.GPUFaultClass]int{}
	for _, g := range gpus.Items {
		if !g.InService() {
			out[g.Status.Class]++
		}
	}
	for _, c := range []repairv1.GPUFaultClass{repairv1.GPUClassResetGPU, repairv1.GPUClassReboot, repairv1.GPUClassReplace} {
		gpusOutOfService.WithLabelValues(string(c)).Set(float64(out[c]))
	}
	return nil
}

// desired decides the GPU's isolation from the cache.
func (r *Isolator) desired(ctx context.Context, gf *repairv1.GPUFault) (isolation, error) {
	if gf.InService() {
		return isolation{}, nil
	}
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: gf.Spec.NodeName}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return isolation{note: "node not found"}, nil
		}
		return isolation{}, fmt.Errorf("reading node %s: %w", gf.Spec.NodeName, err)
	}
	policy, err := r.policyOf(ctx, node)
	if err != nil || policy == nil {
		return isolation{note: "no NodeRepairPolicy selects the node: not isolated"}, err
	}
	var published resourcev1.ResourceSliceList
	if err := r.Client.List(ctx, &published, client.MatchingFields{indexSliceNode: node.Name}); err != nil {
		return isolation{}, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	dev, ok := DeviceOf(published.Items, draDriver(&policy.Spec), node.Name, gf.Spec.GPU)
	switch {
	case !ok:
		return isolation{note: devicePluginNote(node, draDriver(&policy.Spec), gf.Status.Allocation)}, nil
	case policy.Spec.DryRun:
		return isolation{note: fmt.Sprintf("dry run (policy %s): would taint device %s/%s/%s", policy.Name, dev.Driver, dev.Pool, dev.Name)}, nil
	}
	rule, err := TaintRule(gf, dev)
	if err != nil {
		return isolation{note: "NOT isolated: " + err.Error()}, nil //nolint:nilerr // reported on the record: retrying would not name the device
	}
	if err := controllerutil.SetControllerReference(gf, rule, r.Client.Scheme()); err != nil {
		return isolation{}, fmt.Errorf("owning DeviceTaintRule %s: %w", rule.Name, err)
	}
	rule.OwnerReferences[0].BlockOwnerDeletion = ptr.To(false)
	return isolation{rule: rule, note: fmt.Sprintf("DeviceTaintRule %s: device %s/%s/%s NoSchedule", rule.Name, dev.Driver, dev.Pool, dev.Name)}, nil
}

// TaintRule is the DeviceTaintRule that keeps the GPU's one device from
// new pods. A rule that does not name its driver, pool and device would
// taint every matching device of the cluster (with effect NoExecute, an
// empty selector evicts every DRA pod there is): such a device gets no
// rule, and an error says why.
func TaintRule(gf *repairv1.GPUFault, dev Device) (*resourcev1.DeviceTaintRule, error) {
	if dev.Driver == "" || dev.Pool == "" || dev.Name == "" {
		return nil, fmt.Errorf("device %q of driver %q in pool %q is not fully named: a DeviceTaintRule for it would taint more than this GPU", dev.Name, dev.Driver, dev.Pool)
	}
	return &resourcev1.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: ruleName(gf), Labels: map[string]string{LabelIsolates: gf.Name}},
		Spec: resourcev1.DeviceTaintRuleSpec{
			DeviceSelector: &resourcev1.DeviceTaintSelector{Driver: ptr.To(dev.Driver), Pool: ptr.To(dev.Pool), Device: ptr.To(dev.Name)},
			Taint:          resourcev1.DeviceTaint{Key: TaintKey, Value: string(gf.Status.Class), Effect: resourcev1.DeviceTaintEffectNoSchedule},
		},
	}, nil
}

// policyOf returns the first policy (by name) selecting node, or nil.
func (r *Isolator) policyOf(ctx context.Context, node *corev1.Node) (*repairv1.NodeRepairPolicy, error) {
	var list repairv1.NodeRepairPolicyList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing NodeRepairPolicies: %w", err)
	}
	var best *repairv1.NodeRepairPolicy
	for i := range list.Items {
		if p := &list.Items[i]; p.SelectsLabels(node.Labels) && (best == nil || p.Name < best.Name) {
			best = p
		}
	}
	return best, nil
}

// note records the isolation on the GPUFault when it changed.
func (r *Isolator) note(ctx context.Context, gf *repairv1.GPUFault, note string) error {
	if gf.Annotations[AnnotationIsolation] == note {
		return nil
	}
	var v any = note
	if note == "" {
		v = nil
	}
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationIsolation: v}}})
	if err != nil {
		return err
	}
	patch := client.RawPatch(types.MergePatchType, data)
	if err := r.Client.Patch(ctx, gf, patch); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("noting the isolation of %s: %w", gf.Name, err)
	}
	return nil
}

func ruleName(gf *repairv1.GPUFault) string { return "gpufleet-" + gf.Name }

func sameSelector(a, b *resourcev1.DeviceTaintRule) bool {
	sa, sb := a.Spec.DeviceSelector, b.Spec.DeviceSelector
	if sa == nil || sb == nil {
		return sa == sb
	}
	return ptr.Deref(sa.Driver, "") == ptr.Deref(sb.Driver, "") && ptr.Deref(sa.Pool, "") == ptr.Deref(sb.Pool, "") &&
		ptr.Deref(sa.Device, "") == ptr.Deref(sb.Device, "") && a.Spec.Taint.Key == b.Spec.Taint.Key &&
		a.Spec.Taint.Value == b.Spec.Taint.Value && a.Spec.Taint.Effect == b.Spec.Taint.Effect
}

// devicePluginNote tells whether the device plugin's health marking keeps
// a faulty GPU that DRA does not publish from new pods: the kubelet gives
// out only the GPUs the plugin reports healthy, so allocatable below
// capacity means the plugin took GPUs out (gpufleet cannot tell the kubelet
// which device to skip). Otherwise it says what the repair does instead,
// as the repair does it: drain the pods the kubelet gave this GPU when the
// node agent read them (alloc), else every pod of the node requesting the
// device plugin's resource.
func devicePluginNote(node *corev1.Node, driver string, alloc *repairv1.GPUAllocation) string {
	capacity, allocatable := node.Status.Capacity[gpuResource], node.Status.Allocatable[gpuResource]
	if allocatable.Cmp(capacity) < 0 {
		return fmt.Sprintf("device plugin: %s allocatable %s of %s (the plugin took unhealthy GPUs out; not published by DRA driver %s)",
			gpuResource, allocatable.String(), capacity.String(), driver)
	}
	drains := fmt.Sprintf("which pods hold this GPU is not known yet, so the repair drains every pod of the node that requests %s before the reset", gpuResource)
	if alloc != nil {
		pods := make([]string, len(alloc.Pods))
		for i, p := range alloc.Pods {
			pods[i] = p.String()
		}
		switch len(pods) {
		case 0:
			drains = "no pod holds this GPU (the kubelet's pod-resources), so the repair drains none before the reset"
		default:
			drains = fmt.Sprintf("the repair drains only the %d pod(s) the kubelet gave this GPU (pod-resources: %s) before the reset",
				len(pods), summarizePods(pods))
		}
	}
	return fmt.Sprintf("NOT isolated: not published by DRA driver %s and the device plugin still advertises all %s %s (new pods may still be given this GPU); %s",
		driver, capacity.String(), gpuResource, drains)
}

// summarizePods names up to three pods and counts the rest.
func summarizePods(pods []string) string {
	if len(pods) <= 3 {
		return strings.Join(pods, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(pods[:3], ", "), len(pods)-3)
}

const gpuResource corev1.ResourceName = "nvidia.com/gpu"
