package gpucluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/liveowner"
	"github.com/gpufleet/gpufleet/internal/pendingevents"
	"github.com/gpufleet/gpufleet/internal/statusmemo"
)

// Reconciler deploys the GPUCluster's stack. One pass: gate on an older
// ClusterPolicy, render, label the GPU nodes, apply every object (a
// refused one is reported and retried with backoff, the others are still
// applied), write the status if it changed, then emit the events.
type Reconciler struct {
	// Client reads from the manager's cache (the stack's objects, labelled
	// managed-by gpufleet) and writes.
	Client client.Client
	// Live reads objects the cache does not hold: another operator's
	// DaemonSet (to take over), a DeviceClass someone else created.
	Live client.Reader
	// Leases reads NVIDIA's GPU Operator's leader lease (a cache of that
	// name alone; nil: not looked at).
	Leases client.Reader
	// Observer judges that lease by observation (nil: none remembered).
	Observer  *liveowner.Observer
	Namespace string
	Clock     clock.PassiveClock
	Recorder  events.EventRecorder

	// written: the statuses written, so that fields an older GPUCluster
	// schema prunes do not make every pass write again.
	written statusmemo.Memo[nvidiav1alpha1.GPUClusterStatus]
}

// Reconcile runs one pass for the GPUCluster.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	gc := &nvidiav1alpha1.GPUCluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, gc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if gc.DeletionTimestamp != nil {
		return reconcile.Result{}, nil // its objects go with it (owner references)
	}
	ev := pendingevents.New(r.Recorder)
	if h, running, err := r.previousOperator(ctx); err != nil {
		return reconcile.Result{}, err
	} else if running {
		return r.waitForPreviousOperator(ctx, gc, h, ev)
	}
	obs := Observed{Namespace: r.Namespace, Ignored: Ignored(gc), OtherNamespace: OtherNamespace(gc, r.Namespace)}
	var policies nvidiav1.ClusterPolicyList
	if err := r.Client.List(ctx, &policies); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing ClusterPolicies: %w", err)
	}
	obs.Blocking = BlockingPolicy(gc, policies.Items)
	var refusedErr error
	if obs.Blocking == nil && obs.OtherNamespace == "" {
		objs, err := Render(gc, r.Namespace)
		if err != nil {
			obs.InvalidSpec = err.Error()
		} else {
			if err := r.labelNodes(ctx, gc, &obs); err != nil {
				return reconcile.Result{}, err
			}
			if err := r.adminAccess(ctx, gc, &obs); err != nil {
				return reconcile.Result{}, err
			}
			for _, o := range objs {
				if _, ok := o.(*resourcev1.ResourceClaimTemplate); ok && obs.AdminAccessMissing {
					continue // the API server would refuse it: reported as such
				}
				if err := r.apply(ctx, o, &obs, ev, gc); err != nil {
					return reconcile.Result{}, err
				}
			}
			if err := r.observe(ctx, objs, &obs); err != nil {
				return reconcile.Result{}, err
			}
			if len(obs.Refused) > 0 {
				refusedErr = fmt.Errorf("the API server refused %d write(s) of the GPUCluster's stack: %v", len(obs.Refused), obs.Refused)
			}
		}
	}
	if err := r.writeStatus(ctx, gc, obs, ev); err != nil {
		return reconcile.Result{}, err
	}
	// A refusal is retried with the controller's backoff (not at once:
	// the same write gets the same answer).
	return reconcile.Result{}, refusedErr
}

// writeStatus writes the status only when it changed, then emits the
// pass's events (and the ones of a changed condition).
func (r *Reconciler) writeStatus(ctx context.Context, gc *nvidiav1alpha1.GPUCluster, obs Observed, ev *pendingevents.Recorder) error {
	st := Status(gc, obs, r.Clock.Now())
	if equality.Semantic.DeepEqual(st, gc.Status) || r.written.Unchanged(gc.UID, gc.ResourceVersion, st) {
		ev.Flush()
		return nil
	}
	for _, t := range []string{ConditionReady, ConditionDegraded, ConditionUnsupported} {
		was, is := meta.FindStatusCondition(gc.Status.Conditions, t), meta.FindStatusCondition(st.Conditions, t)
		if is == nil || (was != nil && was.Status == is.Status && was.Reason == is.Reason) {
			continue
		}
		typ := corev1.EventTypeNormal
		if (t == ConditionReady && is.Status == metav1.ConditionFalse && is.Reason != ReasonOperandNotReady) || (t != ConditionReady && is.Status == metav1.ConditionTrue) {
			typ = corev1.EventTypeWarning
		}
		if t == ConditionReady && is.Reason == ReasonOperandNotReady {
			continue // a rollout, not news
		}
		if t == ConditionDegraded && is.Status == metav1.ConditionFalse && was == nil {
			continue
		}
		ev.Eventf(gc, nil, typ, is.Reason, "Reconcile", "%s", is.Message)
	}
	updated := gc.DeepCopy()
	updated.Status = st
	if err := r.Client.Status().Update(ctx, updated); err != nil {
		ev.Drop()
		return fmt.Errorf("writing the GPUCluster's status: %w", err)
	}
	r.written.Written(gc.UID, updated.ResourceVersion, st)
	ev.Flush()
	return nil
}

// previousOperator reads whether NVIDIA's GPU Operator holds its leader
// lease (it reconciles GPUClusters too).
func (r *Reconciler) previousOperator(ctx context.Context) (liveowner.Holding, bool, error) {
	return r.Observer.Read(ctx, r.Leases, liveowner.GPUOperator, r.Clock.Now())
}

// waitForPreviousOperator writes that the GPU Operator runs and gpufleet
// waits (its own condition; one Warning when the wait starts) and touches
// nothing else: the GPU Operator writes the state and Ready meanwhile. It
// looks again when the lease would expire.
func (r *Reconciler) waitForPreviousOperator(ctx context.Context, gc *nvidiav1alpha1.GPUCluster, h liveowner.Holding, ev *pendingevents.Recorder) (reconcile.Result, error) {
	again := reconcile.Result{RequeueAfter: max(h.Until.Sub(r.Clock.Now()), time.Second)}
	prev := meta.FindStatusCondition(gc.Status.Conditions, gpustack.ConditionPreviousOperator)
	if prev != nil && prev.Status == metav1.ConditionTrue && h.Names(prev.Message) {
		return again, nil // the message changes with each renewal: rewritten when the holder does
	}
	updated := gc.DeepCopy()
	meta.SetStatusCondition(&updated.Status.Conditions, metav1.Condition{Type: gpustack.ConditionPreviousOperator, Status: metav1.ConditionTrue,
		Reason: gpustack.ReasonPreviousOperatorRunning, Message: h.Message(), ObservedGeneration: gc.Generation, LastTransitionTime: metav1.NewTime(r.Clock.Now())})
	if prev == nil || prev.Status != metav1.ConditionTrue {
		ev.Eventf(gc, nil, corev1.EventTypeWarning, gpustack.ReasonPreviousOperatorRunning, "Deploy", "%s", h.Message())
	}
	if err := r.Client.Status().Update(ctx, updated); err != nil {
		ev.Drop()
		return reconcile.Result{}, fmt.Errorf("writing the GPUCluster's status: %w", err)
	}
	ev.Flush()
	ctrl.LoggerFrom(ctx).Info("NVIDIA's GPU Operator is running; waiting", "lease", h.Namespace+"/"+h.Operator.Lease, "holder", h.Holder)
	return again, nil
}

// isRefusal: the API server's final no for this object as sent.
func isRefusal(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err)
}

// labelNodes applies NodeLabels to every node (a merge patch per node
// that needs one).
func (r *Reconciler) labelNodes(ctx context.Context, gc *nvidiav1alpha1.GPUCluster, obs *Observed) error {
	// Read only: the labels are written by patches built apart.
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		changes := NodeLabels(n, gc)
		if len(changes) == 0 {
			continue
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": changes}})
		if err != nil {
			return err
		}
		err = r.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}, client.RawPatch(types.MergePatchType, patch))
		switch {
		case apierrors.IsNotFound(err):
		case err != nil && isRefusal(err):
			obs.Refused = append(obs.Refused, fmt.Sprintf("labels of node %s: %v", n.Name, err))
		case err != nil:
			return fmt.Errorf("labelling node %s: %w", n.Name, err)
		}
	}
	return nil
}

// apply creates or updates one object. A DaemonSet that another operator
// left (same name) is taken over: its selector is kept, and its pod
// template too while it runs the images the GPUCluster asks for.
func (r *Reconciler) apply(ctx context.Context, want client.Object, obs *Observed, ev *pendingevents.Recorder, gc *nvidiav1alpha1.GPUCluster) error {
	what := describe(want)
	have := want.DeepCopyObject().(client.Object)
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), have)
	if apierrors.IsNotFound(err) {
		err = r.Client.Create(ctx, want.DeepCopyObject().(client.Object))
		switch {
		case err == nil:
			return nil
		case isRefusal(err):
			obs.Refused = append(obs.Refused, fmt.Sprintf("%s: %v", what, err))
			return nil
		case !apierrors.IsAlreadyExists(err):
			return fmt.Errorf("creating %s: %w", what, err)
		}
		// Not ours (not cached): read it live and take it over.
		err = r.Live.Get(ctx, client.ObjectKeyFromObject(want), have)
		if apierrors.IsNotFound(err) {
			return nil // deleted meanwhile: the next pass creates it
		}
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", what, err)
	}
	adopted := have.GetLabels()[gpustack.LabelManagedBy] != managedBy
	want = takeOver(want, have)
	if UpToDate(want, have) {
		return nil
	}
	updated := want.DeepCopyObject().(client.Object)
	updated.SetResourceVersion(have.GetResourceVersion())
	labels := maps.Clone(have.GetLabels())
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, want.GetLabels())
	updated.SetLabels(labels)
	annotations := maps.Clone(have.GetAnnotations())
	if annotations == nil {
		annotations = map[string]string{}
	}
	delete(annotations, gpustack.AnnotationPreviousHash)
	maps.Copy(annotations, want.GetAnnotations())
	updated.SetAnnotations(annotations)
	if err := r.Client.Update(ctx, updated); err != nil {
		if isRefusal(err) {
			obs.Refused = append(obs.Refused, fmt.Sprintf("%s: %v", what, err))
			return nil
		}
		return fmt.Errorf("updating %s: %w", what, err)
	}
	if adopted {
		ev.Eventf(gc, nil, corev1.EventTypeNormal, "Adopted", "Adopt", "%s is now gpufleet's (%s)", what,
			map[bool]string{true: "its pods kept: they run what the GPUCluster asks for", false: "its pods are replaced by its update strategy"}[updated.GetAnnotations()[gpustack.AnnotationAcceptedTemplate] != ""])
	}
	ctrl.LoggerFrom(ctx).Info("updated to the rendered spec", "object", what, "adopted", adopted)
	return nil
}

// takeOver is the workload (a DaemonSet or a Deployment) to write over the
// live one: the rendered one with the live selector (immutable), and the
// live pod template while it stands for the rendered one (another
// operator's running the same images, or accepted earlier for this very
// rendering). Other objects are written as rendered.
func takeOver(want, have client.Object) client.Object {
	out := want.DeepCopyObject().(client.Object)
	var sel, haveSel **metav1.LabelSelector
	var tpl, haveTpl *corev1.PodTemplateSpec
	switch w := out.(type) {
	case *appsv1.DaemonSet:
		h := have.(*appsv1.DaemonSet)
		sel, tpl, haveSel, haveTpl = &w.Spec.Selector, &w.Spec.Template, &h.Spec.Selector, &h.Spec.Template
	case *appsv1.Deployment:
		h := have.(*appsv1.Deployment)
		sel, tpl, haveSel, haveTpl = &w.Spec.Selector, &w.Spec.Template, &h.Spec.Selector, &h.Spec.Template
	default:
		return out
	}
	if *haveSel != nil && !equality.Semantic.DeepEqual(*sel, *haveSel) {
		*sel = (*haveSel).DeepCopy()
		if tpl.Labels == nil {
			tpl.Labels = map[string]string{}
		}
		maps.Copy(tpl.Labels, (*haveSel).MatchLabels)
	}
	rendered := TemplateHash(tpl)
	ours := have.GetLabels()[gpustack.LabelManagedBy] == managedBy
	if have.GetAnnotations()[gpustack.AnnotationAcceptedTemplate] != rendered && (ours || !sameImages(&tpl.Spec, &haveTpl.Spec)) {
		return out
	}
	*tpl = *haveTpl.DeepCopy()
	annotations := maps.Clone(out.GetAnnotations())
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[gpustack.AnnotationAcceptedTemplate] = rendered
	if !ours {
		annotations[gpustack.AnnotationAdoptedFrom] = "gpu-operator"
	} else if from := have.GetAnnotations()[gpustack.AnnotationAdoptedFrom]; from != "" {
		annotations[gpustack.AnnotationAdoptedFrom] = from
	}
	out.SetAnnotations(annotations)
	return out
}

// KeepsLiveTemplate reports whether taking over the live workload have
// (another operator's, or gpufleet's) as the rendered want keeps its pod
// template, so that none of its pods restarts.
func KeepsLiveTemplate(want, have client.Object) bool {
	return takeOver(want, have).GetAnnotations()[gpustack.AnnotationAcceptedTemplate] != ""
}

// sameImages: the same containers (by name) run the same images.
func sameImages(want, have *corev1.PodSpec) bool {
	images := func(cs []corev1.Container) map[string]string {
		m := map[string]string{}
		for _, c := range cs {
			m[c.Name] = c.Image
		}
		return m
	}
	return maps.Equal(images(want.Containers), images(have.Containers))
}

// UpToDate reports whether have carries everything want sets (fields the
// API server defaults are ignored), so that nothing is written when
// nothing changed.
func UpToDate(want, have client.Object) bool {
	for k, v := range want.GetLabels() {
		if have.GetLabels()[k] != v {
			return false
		}
	}
	for k, v := range want.GetAnnotations() {
		if have.GetAnnotations()[k] != v {
			return false
		}
	}
	if _, ok := have.GetAnnotations()[gpustack.AnnotationPreviousHash]; ok {
		return false
	}
	if len(want.GetOwnerReferences()) > 0 && !equality.Semantic.DeepEqual(want.GetOwnerReferences(), have.GetOwnerReferences()) {
		return false
	}
	d := equality.Semantic.DeepDerivative
	switch w := want.(type) {
	case *appsv1.DaemonSet:
		return d(w.Spec, have.(*appsv1.DaemonSet).Spec)
	case *appsv1.Deployment:
		return d(w.Spec, have.(*appsv1.Deployment).Spec)
	case *corev1.Service:
		return d(w.Spec, have.(*corev1.Service).Spec)
	case *rbacv1.ClusterRole:
		return d(w.Rules, have.(*rbacv1.ClusterRole).Rules)
	case *rbacv1.Role:
		return d(w.Rules, have.(*rbacv1.Role).Rules)
	case *rbacv1.ClusterRoleBinding:
		h := have.(*rbacv1.ClusterRoleBinding)
		return d(w.Subjects, h.Subjects) && w.RoleRef == h.RoleRef
	case *rbacv1.RoleBinding:
		h := have.(*rbacv1.RoleBinding)
		return d(w.Subjects, h.Subjects) && w.RoleRef == h.RoleRef
	case *resourcev1.DeviceClass:
		return d(w.Spec, have.(*resourcev1.DeviceClass).Spec)
	case *resourcev1.ResourceClaimTemplate:
		return d(w.Spec, have.(*resourcev1.ResourceClaimTemplate).Spec)
	default:
		return true
	}
}

// observe reads the workloads' rollout from the cache.
func (r *Reconciler) observe(ctx context.Context, objs []client.Object, obs *Observed) error {
	obs.DaemonSets, obs.Deployments = map[string]*appsv1.DaemonSet{}, map[string]*appsv1.Deployment{}
	for _, o := range objs {
		var err error
		switch o.(type) {
		case *appsv1.DaemonSet:
			ds := &appsv1.DaemonSet{}
			if err = r.Client.Get(ctx, client.ObjectKeyFromObject(o), ds); err == nil {
				obs.DaemonSets[o.GetName()] = ds
			}
		case *appsv1.Deployment:
			d := &appsv1.Deployment{}
			if err = r.Client.Get(ctx, client.ObjectKeyFromObject(o), d); err == nil {
				obs.Deployments[o.GetName()] = d
			}
		default:
			continue
		}
		obs.Want = append(obs.Want, o.GetName())
		if client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("reading %s: %w", describe(o), err)
		}
	}
	return nil
}

// adminAccess reads whether the namespace allows the monitoring pods'
// admin-access claims (from the cache: that one namespace).
func (r *Reconciler) adminAccess(ctx context.Context, gc *nvidiav1alpha1.GPUCluster, obs *Observed) error {
	if !DCGMEnabled(gc) && !ExporterEnabled(gc) {
		return nil
	}
	ns := &corev1.Namespace{}
	err := r.Client.Get(ctx, client.ObjectKey{Name: r.Namespace}, ns)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading namespace %s: %w", r.Namespace, err)
	}
	obs.AdminAccessMissing = err == nil && ns.Labels[LabelAdminAccess] != "true"
	return nil
}

// describe names an object for users: "DaemonSet ns/name".
func describe(o client.Object) string {
	kind := Kind(o)
	if o.GetNamespace() == "" {
		return kind + " " + o.GetName()
	}
	return kind + " " + o.GetNamespace() + "/" + o.GetName()
}

// Kind is an object's kind as users write it ("DaemonSet").
func Kind(o client.Object) string {
	kind := fmt.Sprintf("%T", o)
	return kind[strings.LastIndex(kind, ".")+1:]
}
