package gpustack

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/liveowner"
	"github.com/gpufleet/gpufleet/internal/ownwrites"
	"github.com/gpufleet/gpufleet/internal/pendingevents"
)

// Event reasons.
const (
	ReasonRenderFailed = "RenderFailed" // Warning
	ReasonIgnored      = "Ignored"
	// ReasonGPUClusterPresent: an older GPUCluster runs the DRA stack.
	ReasonGPUClusterPresent = "GPUClusterPresent"
	ReasonNodeDegraded      = "NodeDegraded" // Warning
	ReasonStackReady        = "StackReady"
	// ReasonObjectRefused: the API server refused a write of the stack
	// (Warning; the reason of the Degraded condition while it lasts).
	ReasonObjectRefused = "ObjectRefused"
	// ReasonUnsupportedFields: the policy enables a feature gpufleet does
	// not provide (Warning; also the reason of the condition when True).
	ReasonUnsupportedFields  = "UnsupportedFields"
	reasonAllFieldsSupported = "AllFieldsSupported"
	actionDeploy             = "Deploy"
)

// Reconciler deploys the active ClusterPolicy's GPU stack.
type Reconciler struct {
	Client client.Client
	// Live reads from the API server: the cache holds only objects labelled
	// managed-by gpufleet, so an object of ours whose label was removed is
	// found here.
	Live      client.Reader
	Namespace string
	Clock     clock.PassiveClock
	Recorder  events.EventRecorder
	// Leases reads the leader-election Lease of NVIDIA's GPU Operator
	// (nil: not looked for): while it is held gpufleet waits.
	Leases client.Reader
	// Observer judges that lease by observation (shared with the
	// GPUCluster controller and the fence; nil: none remembered).
	Observer *liveowner.Observer
	// Assets are the component manifests (default: the embedded ones).
	Assets fs.FS
	// Schemas compares the served ClusterPolicy and NVIDIADriver schemas
	// with gpufleet's (nil: not compared, no SchemaCurrent condition).
	Schemas *ServedSchemas
	// Monitors finds out whether the API server serves ServiceMonitors and
	// reads gpufleet's (nil: never served; dcgmExporter.serviceMonitor is
	// then reported as not created).
	Monitors *ServiceMonitors
	// DegradedAfter: a component pod not Ready for this long marks its node
	// Degraded (before that the rollout is just Progressing).
	DegradedAfter time.Duration
	// UpgradeTimeout: a node whose new driver is not Ready this long after
	// its old driver pod was deleted fails its upgrade (0 = 10 minutes).
	UpgradeTimeout time.Duration
	// StatusInterval coalesces status writes: a change of the per-component
	// counts only is written at most once per interval (with the changes
	// that came meanwhile); a change of state or condition is written at
	// once. 0 writes every change at once.
	StatusInterval time.Duration
	// PassInterval coalesces reconcile passes: a pass of a policy starts at
	// most once per interval; the events that came meanwhile are served by
	// the next one (each pass lists every node and stack pod, so on a large
	// cluster a pass per pod event costs more than the events are worth).
	// 0 runs a pass per request.
	PassInterval time.Duration

	// own records this process's status writes until the cache shows them.
	own ownwrites.Record
	mu  sync.Mutex
	// lastWrite is when each policy's status was last written.
	lastWrite map[string]time.Time
	// lastPass is when each policy's last pass started.
	lastPass map[string]time.Time
	// refused are the writes the API server refused (refusals.go).
	refused refusals
	// failures holds back the coalesced passes of a failing policy.
	failures passBackoff
	// scanned: the live DaemonSets of the namespace were read once
	// (takeover.go).
	scanned bool
}

// Reconcile converges one ClusterPolicy: objects, node labels, status. A
// conflict (someone changed an object since the cache read it) is
// expected: the pass is retried with the newer version, quietly.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if wait := r.passWait(req.Name); wait > 0 {
		reconcilePasses.WithLabelValues(passDeferred).Inc()
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	res, result, err := r.reconcile(ctx, req)
	switch {
	case apierrors.IsConflict(err):
		ctrl.LoggerFrom(ctx).V(1).Info("conflict with a newer version; retrying", "reason", err.Error())
		reconcilePasses.WithLabelValues(passConflict).Inc()
		return reconcile.Result{RequeueAfter: conflictRetry}, nil
	case err != nil:
		reconcilePasses.WithLabelValues(passError).Inc()
		if r.PassInterval > 0 {
			// The controller's backoff would be reset by the next
			// deferred pass: hold the policy's passes back here.
			r.failures.failed(req.Name, r.Clock)
		}
		return res, err
	}
	r.failures.succeeded(req.Name)
	reconcilePasses.WithLabelValues(result).Inc()
	return res, nil
}

// passWait is how long a pass of the policy must wait for PassInterval
// (0: start it now, and it counts from now).
func (r *Reconciler) passWait(policy string) time.Duration {
	if r.PassInterval <= 0 {
		return 0
	}
	now := r.Clock.Now()
	if wait := r.failures.wait(policy, now); wait > 0 {
		return wait
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if wait := r.lastPass[policy].Add(r.PassInterval).Sub(now); wait > 0 {
		return wait
	}
	if r.lastPass == nil {
		r.lastPass = map[string]time.Time{}
	}
	r.lastPass[policy] = now
	return 0
}

// conflictRetry and cacheRetry: how soon a pass is retried after a
// conflict, and when the cache has not yet shown the last status write.
const (
	conflictRetry = 500 * time.Millisecond
	cacheRetry    = 200 * time.Millisecond
)

func (r *Reconciler) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, string, error) {
	policy := &nvidiav1.ClusterPolicy{}
	if err := r.Client.Get(ctx, req.NamespacedName, policy); err != nil {
		if apierrors.IsNotFound(err) {
			nodesDegraded.forget(req.Name)
		}
		return reconcile.Result{}, passConverged, client.IgnoreNotFound(err)
	}
	if policy.DeletionTimestamp != nil {
		nodesDegraded.forget(policy.Name)
		return reconcile.Result{}, passConverged, nil // owner references garbage-collect the stack
	}
	if r.own.Behind(req.NamespacedName, policy.ResourceVersion) {
		// Computed from this copy, the status would undo our last write
		// (and repeat its events); its watch event is on the way.
		return reconcile.Result{RequeueAfter: cacheRetry}, passWaiting, nil
	}
	ev := pendingevents.New(r.Recorder) // status events, emitted after the status write
	wrote := writeCount.Load()
	result := func(held time.Duration) string {
		switch {
		case held > 0:
			return passCoalesced
		case writeCount.Load() != wrote:
			return passWrote
		default:
			return passConverged
		}
	}
	active, err := r.activePolicy(ctx)
	if err != nil {
		return reconcile.Result{}, "", err
	}
	if active != policy.Name {
		nodesDegraded.forget(policy.Name)
		held, err := r.ignore(ctx, policy, ReasonIgnored, fmt.Sprintf("ClusterPolicy %s is active; only the oldest ClusterPolicy is used", active), ev)
		return reconcile.Result{RequeueAfter: held}, result(held), err
	}
	if gc, err := r.olderGPUCluster(ctx, policy); err != nil {
		return reconcile.Result{}, "", err
	} else if gc != nil {
		nodesDegraded.forget(policy.Name)
		msg := fmt.Sprintf("GPUCluster %s (created %s) runs the DRA stack; the device plugin beside NVIDIA's DRA driver would offer the same GPUs a second time. Nothing of this ClusterPolicy is deployed while it exists: delete the GPUCluster to switch back to the device plugin",
			gc.Name, gc.CreationTimestamp.UTC().Format(time.RFC3339))
		held, err := r.ignore(ctx, policy, ReasonGPUClusterPresent, msg, ev)
		return reconcile.Result{RequeueAfter: held}, result(held), err
	}
	if h, running, err := r.previousOperator(ctx); err != nil {
		return reconcile.Result{}, "", err
	} else if running {
		requeue, err := r.waitForPreviousOperator(ctx, policy, h, ev)
		return reconcile.Result{RequeueAfter: requeue}, result(0), err
	}
	if other := r.otherNamespace(policy); other != "" {
		held, err := r.waitForOtherNamespace(ctx, policy, other, ev)
		return reconcile.Result{RequeueAfter: held}, result(held), err
	}
	// Read only (every node of the cluster; a copy of each at every pass
	// cost more than the rest of the pass at 10,000 nodes): the labels are
	// written by patches built apart (labelNodes).
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return reconcile.Result{}, "", fmt.Errorf("listing nodes: %w", err)
	}
	status := policy.Status.DeepCopy()
	meta.RemoveStatusCondition(&status.Conditions, ConditionPreviousOperator)
	status.Namespace = r.Namespace
	r.setUnsupported(policy, status, ev)
	facts := FactsOf(&nodes, r.Namespace, policy.Spec.Operator.DefaultRuntime)
	drivers, err := r.nvidiaDrivers(ctx, policy)
	if err != nil {
		return reconcile.Result{}, "", err
	}
	facts.Drivers = drivers
	assign := AssignDrivers(drivers, nodes.Items)
	objs, err := Render(policy, facts, r.Assets)
	if err != nil {
		if c := meta.FindStatusCondition(policy.Status.Conditions, nvidiav1.ConditionDegraded); c == nil || c.Message != err.Error() {
			ev.Eventf(policy, nil, corev1.EventTypeWarning, ReasonRenderFailed, actionDeploy, "%v", err)
		}
		r.setConditions(policy, status, metav1.ConditionFalse, metav1.ConditionFalse, metav1.ConditionTrue, ReasonRenderFailed, err.Error())
		status.State = nvidiav1.StateNotReady
		held, err := r.writeStatus(ctx, policy, status, ev)
		return reconcile.Result{RequeueAfter: held}, result(held), err
	}
	objs, adoptions, blocked, uncached, err := r.adoptLive(ctx, objs)
	if err != nil {
		return reconcile.Result{}, "", err
	}
	touched := map[string]bool{}
	if err := r.apply(ctx, objs, uncached, touched); err != nil {
		return reconcile.Result{}, "", err
	}
	r.reportAdoptions(ctx, policy, adoptions, ev)
	if err := r.prune(ctx, objs, touched); err != nil {
		return reconcile.Result{}, "", err
	}
	if err := r.labelNodes(ctx, &nodes, policy, assign, touched); err != nil {
		return reconcile.Result{}, "", err
	}
	r.refused.keepOnly(touched)
	pods, stackPods, err := r.componentPods(ctx)
	if err != nil {
		return reconcile.Result{}, "", err
	}
	upgradeRequeue, err := r.upgradeDrivers(ctx, policy, &nodes, driverImages(objs), stackPods, drivers, assign)
	if err != nil {
		return reconcile.Result{}, "", err
	}
	monitorRequeue, err := r.syncServiceMonitor(ctx, policy, status, ev)
	if err != nil {
		return reconcile.Result{}, "", err
	}
	requeue := minPositive(minPositive(r.computeStatus(policy, status, &nodes, pods, ev), upgradeRequeue), monitorRequeue)
	requeue = minPositive(requeue, r.reportProblems(policy, status, blocked, ev))
	held, err := r.writeStatus(ctx, policy, status, ev)
	if err != nil {
		return reconcile.Result{}, "", err
	}
	return reconcile.Result{RequeueAfter: minPositive(requeue, held)}, result(held), nil
}

// activePolicy is the oldest ClusterPolicy (name breaks ties).
func (r *Reconciler) activePolicy(ctx context.Context) (string, error) {
	var list nvidiav1.ClusterPolicyList
	if err := r.Client.List(ctx, &list); err != nil {
		return "", fmt.Errorf("listing ClusterPolicies: %w", err)
	}
	if p := OldestPolicy(list.Items); p != nil {
		return p.Name, nil
	}
	return "", nil
}

// olderGPUCluster is the GPUCluster created before the policy (at the same
// second the policy wins), or nil; none when the API server does not serve
// GPUCluster. NVIDIA's GPU Operator refuses both at once; gpufleet keeps
// the older running and holds the newer, so that creating one never stops
// a running stack.
func (r *Reconciler) olderGPUCluster(ctx context.Context, policy *nvidiav1.ClusterPolicy) (*nvidiav1alpha1.GPUCluster, error) {
	var list nvidiav1alpha1.GPUClusterList
	if err := r.Client.List(ctx, &list); meta.IsNoMatchError(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("listing GPUClusters: %w", err)
	}
	for i := range list.Items {
		if gc := &list.Items[i]; gc.CreationTimestamp.Before(&policy.CreationTimestamp) && gc.DeletionTimestamp == nil {
			return gc, nil
		}
	}
	return nil, nil
}

// ignore holds a policy that is not deployed, saying why.
func (r *Reconciler) ignore(ctx context.Context, policy *nvidiav1.ClusterPolicy, reason, msg string, ev *pendingevents.Recorder) (time.Duration, error) {
	status := policy.Status.DeepCopy()
	status.State = nvidiav1.StateIgnored
	status.Components = nil
	meta.RemoveStatusCondition(&status.Conditions, nvidiav1.ConditionServiceMonitor) // the active policy's
	r.setUnsupported(policy, status, ev)
	r.setConditions(policy, status, metav1.ConditionFalse, metav1.ConditionFalse, metav1.ConditionFalse, reason, msg)
	if policy.Status.State != nvidiav1.StateIgnored || !hasReason(policy.Status.Conditions, reason) {
		ev.Eventf(policy, nil, corev1.EventTypeNormal, reason, actionDeploy, "%s", msg)
	}
	return r.writeStatus(ctx, policy, status, ev)
}

// nvidiaDrivers lists the NVIDIADriver objects, sorted by name, when the
// policy hands the driver to them (none otherwise).
func (r *Reconciler) nvidiaDrivers(ctx context.Context, policy *nvidiav1.ClusterPolicy) ([]nvidiav1alpha1.NVIDIADriver, error) {
	if !isTrue(policy.Spec.Driver.UseNvidiaDriverCRD) {
		return nil, nil
	}
	var list nvidiav1alpha1.NVIDIADriverList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing NVIDIADrivers: %w", err)
	}
	slices.SortFunc(list.Items, func(a, b nvidiav1alpha1.NVIDIADriver) int { return strings.Compare(a.Name, b.Name) })
	return list.Items, nil
}

// FactsOf collects the OS flavours and runtimes of the GPU nodes.
func FactsOf(nodes *corev1.NodeList, ns, defaultRuntime string) Facts {
	f := Facts{Namespace: ns}
	seenOS, seenRT := map[OSFlavour]bool{}, map[string]bool{}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if !nvidiav1.HasNvidiaGPU(n.Labels) {
			continue
		}
		if os, ok := NodeOS(n.Labels); ok && !seenOS[os] {
			seenOS[os] = true
			f.OSFlavours = append(f.OSFlavours, os)
		}
		// The runtime as detected now, not its node label: the label is
		// written later in this pass, and the first pass must render the
		// toolkit for it too.
		if rt := Runtime(n, defaultRuntime); !seenRT[rt] {
			seenRT[rt] = true
			f.Runtimes = append(f.Runtimes, rt)
		}
	}
	return f
}

// apply creates missing objects and reverts drift in existing ones; an
// object that already matches is not written. An object the API server
// refuses does not stop the others (refusals.go). The DaemonSets named in
// uncached exist but are not cached (to adopt): they are read live.
func (r *Reconciler) apply(ctx context.Context, objs []client.Object, uncached, touched map[string]bool) error {
	for _, want := range objs {
		from := client.Reader(r.Client)
		if _, ok := want.(*appsv1.DaemonSet); ok && uncached[want.GetName()] {
			from = r.Live
		}
		err := r.try(ctx, describeObject(want), desiredHash(want), touched, func() error {
			return r.applyFrom(ctx, from, []client.Object{want})
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// try runs one write of the object what (as rendered: desired) unless the
// API server refused it unchanged and its backoff is not over. A refusal
// is recorded and reported, not returned; any other error is.
func (r *Reconciler) try(ctx context.Context, what string, desired uint64, touched map[string]bool, write func() error) error {
	touched[what] = true
	now := r.Clock.Now()
	if !r.refused.allowed(what, desired, now) {
		return nil
	}
	err := write()
	switch {
	case err == nil:
		r.refused.accepted(what)
		return nil
	case isRefusal(err):
		at := r.refused.refused(what, desired, err, now)
		ctrl.LoggerFrom(ctx).Error(err, "the API server refused a write of the GPU stack; the rest of the stack goes on, this write is retried later",
			"object", what, "retryIn", at.Sub(now).String())
		return nil
	default:
		return err
	}
}

// describeObject names an object for users: "DaemonSet ns/name".
func describeObject(o client.Object) string {
	kind := kindName(o)
	if i := strings.LastIndex(kind, "."); i >= 0 {
		kind = kind[i+1:]
	}
	if o.GetNamespace() == "" {
		return kind + " " + o.GetName()
	}
	return kind + " " + o.GetNamespace() + "/" + o.GetName()
}

// applyFrom is apply with the objects' current state read from cached (the
// manager's client does not cache unstructured objects).
func (r *Reconciler) applyFrom(ctx context.Context, cached client.Reader, objs []client.Object) error {
	for _, want := range objs {
		have := want.DeepCopyObject().(client.Object)
		if u, ok := want.(*unstructured.Unstructured); ok {
			fresh := &unstructured.Unstructured{}
			fresh.SetGroupVersionKind(u.GroupVersionKind())
			have = fresh
		}
		err := cached.Get(ctx, client.ObjectKeyFromObject(want), have)
		if apierrors.IsNotFound(err) {
			err = r.Client.Create(ctx, want.DeepCopyObject().(client.Object))
			if !apierrors.IsAlreadyExists(err) {
				if err != nil {
					return fmt.Errorf("creating %s %s: %w", kindName(want), want.GetName(), err)
				}
				continue
			}
			// It exists but the cache does not hold it: its managed-by
			// label was removed (or the cache is behind). Read it live and
			// take it back.
			err = r.Live.Get(ctx, client.ObjectKeyFromObject(want), have)
			if apierrors.IsNotFound(err) {
				continue // deleted meanwhile: the next pass creates it
			}
		}
		if err != nil {
			return fmt.Errorf("getting %s %s: %w", kindName(want), want.GetName(), err)
		}
		if ds, ok := want.(*appsv1.DaemonSet); ok {
			want = takeOver(ds, have.(*appsv1.DaemonSet))
		}
		if upToDate(want, have) {
			continue
		}
		updated := want.DeepCopyObject().(client.Object)
		updated.SetResourceVersion(have.GetResourceVersion())
		labels := maps.Clone(have.GetLabels())
		if labels == nil {
			labels = map[string]string{}
		}
		maps.Copy(labels, want.GetLabels())
		updated.SetLabels(labels)
		updated.SetAnnotations(mergedAnnotations(want, have))
		if err := r.Client.Update(ctx, updated); err != nil {
			return fmt.Errorf("updating %s %s: %w", kindName(want), want.GetName(), err)
		}
		ctrl.LoggerFrom(ctx).Info("updated to the rendered spec (a policy change, drift reverted, or adopted)", "kind", kindName(want), "name", want.GetName())
	}
	return nil
}

// takeOver is the DaemonSet to write over the live one: the rendered one,
// with the live selector (immutable), and the live pod template while it
// stands for the rendered one: on adoption from another operator when it
// runs what the policy asks for (runsWhatIsAsked), and after that as long
// as the rendered template is the one it was accepted for. Replacing it
// would restart every pod of the component for no change of what runs.
func takeOver(want, have *appsv1.DaemonSet) *appsv1.DaemonSet {
	out := want.DeepCopy()
	if have.Spec.Selector != nil && !equality.Semantic.DeepEqual(want.Spec.Selector, have.Spec.Selector) {
		out.Spec.Selector = have.Spec.Selector.DeepCopy()
		if out.Spec.Template.Labels == nil {
			out.Spec.Template.Labels = map[string]string{}
		}
		maps.Copy(out.Spec.Template.Labels, have.Spec.Selector.MatchLabels)
	}
	rendered := fmt.Sprintf("%016x", desiredHash(out.Spec.Template))
	accepted := have.Annotations[AnnotationAcceptedTemplate] == rendered ||
		(!isOurs(have.Labels) && runsWhatIsAsked(&out.Spec.Template, &have.Spec.Template))
	if accepted {
		out.Spec.Template = *have.Spec.Template.DeepCopy()
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		out.Annotations[AnnotationAcceptedTemplate] = rendered
	}
	return out
}

// mergedAnnotations are the live object's annotations (the API server's
// and others') with the rendered ones, less the bookkeeping of another
// operator and an accepted template the rendered object no longer has.
func mergedAnnotations(want, have client.Object) map[string]string {
	out := maps.Clone(have.GetAnnotations())
	if out == nil {
		out = map[string]string{}
	}
	delete(out, AnnotationPreviousHash)
	delete(out, AnnotationAcceptedTemplate)
	maps.Copy(out, want.GetAnnotations())
	if len(out) == 0 {
		return nil
	}
	return out
}

// kindName names an object's kind in messages: its Go type, or the kind of
// an unstructured object.
func kindName(o client.Object) string {
	if u, ok := o.(*unstructured.Unstructured); ok {
		return u.GetKind()
	}
	return fmt.Sprintf("%T", o)
}

// upToDate reports whether have carries everything want sets (fields the
// API server defaults are ignored).
func upToDate(want, have client.Object) bool {
	for k, v := range want.GetLabels() {
		if have.GetLabels()[k] != v {
			return false
		}
	}
	if !equality.Semantic.DeepEqual(want.GetOwnerReferences(), have.GetOwnerReferences()) {
		return false
	}
	for k, v := range want.GetAnnotations() {
		if have.GetAnnotations()[k] != v {
			return false
		}
	}
	if _, ok := have.GetAnnotations()[AnnotationPreviousHash]; ok {
		return false
	}
	if _, ok := want.GetAnnotations()[AnnotationAcceptedTemplate]; !ok && have.GetAnnotations()[AnnotationAcceptedTemplate] != "" {
		return false
	}
	switch w := want.(type) {
	case *appsv1.DaemonSet:
		return equality.Semantic.DeepDerivative(w.Spec, have.(*appsv1.DaemonSet).Spec)
	case *corev1.Service:
		return equality.Semantic.DeepDerivative(w.Spec, have.(*corev1.Service).Spec)
	case *rbacv1.ClusterRole:
		return equality.Semantic.DeepDerivative(w.Rules, have.(*rbacv1.ClusterRole).Rules)
	case *rbacv1.ClusterRoleBinding:
		h := have.(*rbacv1.ClusterRoleBinding)
		return equality.Semantic.DeepDerivative(w.Subjects, h.Subjects) && w.RoleRef == h.RoleRef
	case *unstructured.Unstructured:
		return serviceMonitorUpToDate(w, have.(*unstructured.Unstructured))
	default:
		return true
	}
}

// managedKinds are the kinds the stack is made of, for pruning.
func managedKinds() []client.ObjectList {
	return []client.ObjectList{&appsv1.DaemonSetList{}, &corev1.ServiceList{}, &corev1.ServiceAccountList{},
		&rbacv1.ClusterRoleList{}, &rbacv1.ClusterRoleBindingList{}}
}

// prune deletes managed objects that are no longer desired (disabled
// components, OS flavours or runtimes no GPU node has any more).
func (r *Reconciler) prune(ctx context.Context, objs []client.Object, touched map[string]bool) error {
	want := map[string]bool{}
	for _, o := range objs {
		want[fmt.Sprintf("%T/%s/%s", o, o.GetNamespace(), o.GetName())] = true
	}
	sel := client.MatchingLabels{LabelManagedBy: managedBy, LabelPartOf: partOf}
	for _, list := range managedKinds() {
		if err := r.Client.List(ctx, list, sel); err != nil {
			return fmt.Errorf("listing %T: %w", list, err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return err
		}
		for _, item := range items {
			o := item.(client.Object)
			if want[fmt.Sprintf("%T/%s/%s", o, o.GetNamespace(), o.GetName())] || o.GetDeletionTimestamp() != nil {
				continue
			}
			deleted := false
			err := r.try(ctx, describeObject(o)+" (delete)", 0, touched, func() error {
				err := r.Client.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground))
				if client.IgnoreNotFound(err) != nil {
					return fmt.Errorf("deleting %T %s: %w", o, o.GetName(), err)
				}
				deleted = true
				return nil
			})
			if err != nil {
				return err
			}
			if deleted {
				ctrl.LoggerFrom(ctx).Info("deleted object no longer desired", "kind", fmt.Sprintf("%T", o), "name", o.GetName())
			}
		}
	}
	return nil
}

// podState is one component pod on one node.
type podState struct {
	ready bool
	// since is when the pod could start: its creation, or when its init
	// containers completed (for the Degraded threshold).
	since time.Time
	// readyAt is when it became Ready (zero when not Ready).
	readyAt time.Time
	// unschedulable is the scheduler's reason when the pod cannot be placed
	// on its node ("" otherwise).
	unschedulable string
}

// componentPods lists the stack's pods and indexes them by node and component.
func (r *Reconciler) componentPods(ctx context.Context) (map[string]map[string]podState, []corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(r.Namespace)); err != nil {
		return nil, nil, fmt.Errorf("listing stack pods: %w", err)
	}
	stack := pods.Items[:0]
	for _, p := range pods.Items {
		if nvidiav1.PodComponent(p.Labels) != "" {
			stack = append(stack, p)
		}
	}
	pods.Items = stack
	out := map[string]map[string]podState{}
	for i := range pods.Items {
		p := &pods.Items[i]
		comp := nvidiav1.PodComponent(p.Labels)
		node := p.Spec.NodeName
		st := podState{ready: podutils.IsPodReady(p), since: p.CreationTimestamp.Time}
		for _, c := range p.Status.Conditions {
			switch {
			case c.Type == corev1.PodInitialized && c.Status == corev1.ConditionTrue && c.LastTransitionTime.After(st.since):
				st.since = c.LastTransitionTime.Time
			case c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue:
				st.readyAt = c.LastTransitionTime.Time
			}
		}
		if node == "" {
			// Not scheduled yet: a DaemonSet pod names its node in its
			// affinity; the scheduler says why it cannot place it.
			node, st.unschedulable = daemonPodTarget(p), unschedulableReason(p)
		}
		if node == "" || comp == "" || p.DeletionTimestamp != nil {
			continue
		}
		if out[node] == nil {
			out[node] = map[string]podState{}
		}
		if prev, ok := out[node][comp]; ok && prev.ready {
			st = prev // any Ready pod of the component counts
		}
		out[node][comp] = st
	}
	return out, pods.Items, nil
}

// labelNodes applies the deploy labels and each node's NVIDIADriver
// label, patching only what changes.
func (r *Reconciler) labelNodes(ctx context.Context, nodes *corev1.NodeList, policy *nvidiav1.ClusterPolicy, assign DriverAssignment, touched map[string]bool) error {
	crdOn := isTrue(policy.Spec.Driver.UseNvidiaDriverCRD)
	for i := range nodes.Items {
		n := &nodes.Items[i]
		changes := NodeLabels(n, &policy.Spec)
		maps.Copy(changes, DriverLabel(n, crdOn, assign))
		if len(changes) == 0 {
			continue
		}
		labels := make(map[string]any, len(changes))
		for k, v := range changes {
			if v == nil {
				labels[k] = nil
			} else {
				labels[k] = *v
			}
		}
		if err := r.try(ctx, "Node "+n.Name+" (labels)", desiredHash(labels), touched, func() error {
			return r.patchNodeLabels(ctx, n.Name, labels)
		}); err != nil {
			return err
		}
	}
	return nil
}

// patchNodeLabels merges label changes (nil removes) into a node.
func (r *Reconciler) patchNodeLabels(ctx context.Context, node string, labels map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := r.Client.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("labelling node %s: %w", node, err)
	}
	return nil
}

// computeStatus fills the per-component status and conditions; it returns
// when to look again for a pod that may cross the Degraded threshold. A
// component's pod that is not Ready while a component it needs on that node
// (Component.After) is not Ready either is waiting for it, not Degraded: a
// node's Degraded report names the first component that fails there.
func (r *Reconciler) computeStatus(policy *nvidiav1.ClusterPolicy, status *nvidiav1.ClusterPolicyStatus, nodes *corev1.NodeList, pods map[string]map[string]podState, ev *pendingevents.Recorder) time.Duration {
	now := r.Clock.Now()
	var requeue time.Duration
	status.Components = nil
	allReady := true
	var degraded []string
	degradedNodes := map[string]bool{}
	for _, c := range nvidiav1.Components {
		cs := nvidiav1.ComponentStatus{Name: c.Key, Enabled: c.Enabled(&policy.Spec)}
		if !cs.Enabled {
			status.Components = append(status.Components, cs)
			continue
		}
		var waiting []string
		for i := range nodes.Items {
			n := &nodes.Items[i]
			if !deployedOn(c, &policy.Spec, n.Labels) {
				continue
			}
			cs.NodesDesired++
			st, hasPod := pods[n.Name][c.Key]
			blocker, depsReady := r.dependencies(c, &policy.Spec, n.Labels, pods[n.Name])
			// The pod has been waiting for what it needs until then: the
			// Degraded threshold counts from the later of the two.
			if depsReady.After(st.since) {
				st.since = depsReady
			}
			switch {
			case hasPod && st.ready:
				cs.NodesReady++
			case !hasPod && n.Labels[c.DeployLabel] != valueTrue:
				waiting = append(waiting, n.Name+" (not yet labelled)")
			case hasPod && st.unschedulable != "" && now.Sub(st.since) >= r.DegradedAfter:
				waiting = append(waiting, n.Name+" (pod cannot be scheduled)")
				degraded = append(degraded, c.Key+" on "+n.Name+" (cannot be scheduled: "+st.unschedulable+")")
				degradedNodes[n.Name] = true
			case blocker != "":
				waiting = append(waiting, n.Name+" (waiting for "+blocker+")")
			case hasPod && now.Sub(st.since) >= r.DegradedAfter:
				waiting = append(waiting, n.Name+" (pod not Ready)")
				degraded = append(degraded, c.Key+" on "+n.Name)
				degradedNodes[n.Name] = true
			default:
				waiting = append(waiting, n.Name+" (starting)")
				if hasPod {
					requeue = minPositive(requeue, max(r.DegradedAfter-now.Sub(st.since), time.Second))
				}
			}
		}
		sort.Strings(waiting)
		if len(waiting) > 0 {
			allReady = false
			cs.Message = summarize(waiting, 3)
		}
		status.Components = append(status.Components, cs)
	}
	nodesDegraded.set(policy.Name, float64(len(degradedNodes)))
	sort.Strings(degraded)
	switch {
	case allReady:
		if policy.Status.State != nvidiav1.StateReady {
			ev.Eventf(policy, nil, corev1.EventTypeNormal, ReasonStackReady, actionDeploy, "GPU stack ready on every GPU node")
		}
		status.State = nvidiav1.StateReady
		r.setConditions(policy, status, metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionFalse, "AllComponentsReady", "every enabled component is Ready on every GPU node")
	case len(degraded) > 0:
		status.State = nvidiav1.StateNotReady
		msg := "not Ready: " + summarize(degraded, 5)
		if c := meta.FindStatusCondition(policy.Status.Conditions, nvidiav1.ConditionDegraded); c == nil || c.Message != msg {
			ev.Eventf(policy, nil, corev1.EventTypeWarning, ReasonNodeDegraded, actionDeploy, "%s", msg)
		}
		r.setConditions(policy, status, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionTrue, "NodesDegraded", msg)
	default:
		status.State = nvidiav1.StateNotReady
		r.setConditions(policy, status, metav1.ConditionFalse, metav1.ConditionTrue, metav1.ConditionFalse, "RollingOut", "components are rolling out")
	}
	return requeue
}

// deployedOn reports whether the stack runs component c on a GPU node with
// these labels (enabled, belongs there, not opted out by an administrator).
func deployedOn(c Component, spec *nvidiav1.ClusterPolicySpec, labels map[string]string) bool {
	if !nvidiav1.HasNvidiaGPU(labels) || !c.Enabled(spec) || !c.RunsOn(labels) {
		return false
	}
	v, ok := labels[c.DeployLabel]
	return !ok || v == valueTrue
}

// dependencies returns the first component c needs on the node that the
// stack runs there and that is not Ready ("" when none: c's validation init
// containers wait for it), and when the last of them became Ready.
func (r *Reconciler) dependencies(c Component, spec *nvidiav1.ClusterPolicySpec, labels map[string]string, pods map[string]podState) (blocker string, readyAt time.Time) {
	for _, dep := range c.After {
		d, ok := componentByKey(dep)
		if !ok || !deployedOn(d, spec, labels) {
			continue
		}
		if !pods[dep].ready {
			return dep, time.Time{}
		}
		if pods[dep].readyAt.After(readyAt) {
			readyAt = pods[dep].readyAt
		}
	}
	return "", readyAt
}

func componentByKey(key string) (Component, bool) {
	for _, c := range nvidiav1.Components {
		if c.Key == key {
			return c, true
		}
	}
	return Component{}, false
}

// minPositive is the earlier of two requeue delays; 0 means none.
func minPositive(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	default:
		return min(a, b)
	}
}

// driverImages maps each driver DaemonSet's pod "app" label to its image.
func driverImages(objs []client.Object) map[string]string {
	out := map[string]string{}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok && ds.Labels[LabelComponent] == Driver {
			out[ds.Spec.Template.Labels["app"]] = ds.Spec.Template.Spec.Containers[0].Image
		}
	}
	return out
}

// setConditions sets Ready, Progressing and Degraded; the reason and
// message go on the condition that explains the state.
func (r *Reconciler) setConditions(policy *nvidiav1.ClusterPolicy, status *nvidiav1.ClusterPolicyStatus, ready, progressing, degraded metav1.ConditionStatus, reason, msg string) {
	now := metav1.NewTime(r.Clock.Now())
	set := func(typ string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: policy.Generation, LastTransitionTime: now,
		})
	}
	set(nvidiav1.ConditionReady, ready, reason, msg)
	progReason, progMsg := "Converged", ""
	if progressing == metav1.ConditionTrue {
		progReason, progMsg = reason, msg
	}
	set(nvidiav1.ConditionProgressing, progressing, progReason, progMsg)
	degReason, degMsg := "NoFailures", ""
	if degraded == metav1.ConditionTrue {
		degReason, degMsg = reason, msg
	}
	set(nvidiav1.ConditionDegraded, degraded, degReason, degMsg)
	status.ObservedGeneration = policy.Generation
}

// setUnsupported sets the UnsupportedFields condition: True naming each
// enabled field gpufleet does not provide (UnsupportedFields), else False.
// A new or changed list is also reported by a Warning event.
func (r *Reconciler) setUnsupported(policy *nvidiav1.ClusterPolicy, status *nvidiav1.ClusterPolicyStatus, ev *pendingevents.Recorder) {
	cond := metav1.Condition{Type: nvidiav1.ConditionUnsupportedFields, Status: metav1.ConditionFalse, Reason: reasonAllFieldsSupported,
		ObservedGeneration: policy.Generation, LastTransitionTime: metav1.NewTime(r.Clock.Now())}
	if msg := UnsupportedMessage(UnsupportedFields(&policy.Spec)); msg != "" {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, ReasonUnsupportedFields, msg
		if c := meta.FindStatusCondition(policy.Status.Conditions, cond.Type); c == nil || c.Message != msg {
			ev.Eventf(policy, nil, corev1.EventTypeWarning, ReasonUnsupportedFields, actionDeploy, "%s", msg)
		}
	}
	meta.SetStatusCondition(&status.Conditions, cond)
}

// writeStatus sets the SchemaCurrent condition and leaves out the status
// fields the served schema lacks (setSchemaCurrent), patches the status
// when it changed, then emits the events that report it. The patch carries the resourceVersion the status was
// computed from (optimistic lock): a policy changed meanwhile is a
// conflict, retried quietly with the newer version. The write is recorded
// until the cache shows it (Reconcile waits for that before computing the
// status again). A change of the component counts only, within
// StatusInterval of the last write, is held back: held is when to look
// again.
func (r *Reconciler) writeStatus(ctx context.Context, policy *nvidiav1.ClusterPolicy, status *nvidiav1.ClusterPolicyStatus, ev *pendingevents.Recorder) (held time.Duration, err error) {
	status, err = r.setSchemaCurrent(ctx, policy, status, ev)
	if err != nil {
		ev.Drop()
		return 0, err
	}
	if equality.Semantic.DeepEqual(&policy.Status, status) {
		ev.Flush()
		return 0, nil
	}
	key := client.ObjectKeyFromObject(policy)
	if wait := r.holdStatus(policy, status); wait > 0 {
		ev.Drop() // (none: events come with state and condition changes)
		return wait, nil
	}
	updated := policy.DeepCopy()
	updated.Status = *status
	if err := r.Client.Status().Patch(ctx, updated, client.MergeFromWithOptions(policy, client.MergeFromWithOptimisticLock{})); err != nil {
		ev.Drop()
		return 0, fmt.Errorf("updating ClusterPolicy status: %w", err)
	}
	r.own.Wrote(key, policy.ResourceVersion)
	r.mu.Lock()
	if r.lastWrite == nil {
		r.lastWrite = map[string]time.Time{}
	}
	r.lastWrite[policy.Name] = r.Clock.Now()
	r.mu.Unlock()
	ev.Flush()
	return 0, nil
}

// setSchemaCurrent sets the SchemaCurrent condition from the schemas the
// API server serves (nil Schemas: not looked at, no condition): False
// naming the fields they lack, reported by a Warning event and a log line
// when new or changed; True otherwise. The stack is not held back by it.
// It returns status without the fields the served ClusterPolicy schema
// lacks, as the API server would keep it.
func (r *Reconciler) setSchemaCurrent(ctx context.Context, policy *nvidiav1.ClusterPolicy, status *nvidiav1.ClusterPolicyStatus, ev *pendingevents.Recorder) (*nvidiav1.ClusterPolicyStatus, error) {
	if r.Schemas == nil {
		return status, nil
	}
	reports, err := r.Schemas.Reports(ctx, policy)
	if err != nil {
		return nil, err
	}
	s, reason, msg := SchemaCondition(reports)
	if s == metav1.ConditionFalse {
		if c := meta.FindStatusCondition(policy.Status.Conditions, ConditionSchemaCurrent); c == nil || c.Message != msg {
			ev.Eventf(policy, nil, corev1.EventTypeWarning, ReasonOlderSchemaInstalled, actionDeploy, "%s", msg)
			for _, rep := range reports {
				if len(rep.Missing) > 0 {
					ctrl.LoggerFrom(ctx).Info("the API server serves an older schema; its missing fields are dropped",
						"crd", rep.CRD, "version", rep.Version, "missing", len(rep.Missing), "first", summarize(rep.Missing, 5))
				}
			}
		}
	}
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: ConditionSchemaCurrent, Status: s, Reason: reason, Message: msg,
		ObservedGeneration: policy.Generation, LastTransitionTime: metav1.NewTime(r.Clock.Now())})
	return servedStatus(status, reports)
}

// holdStatus is how long to hold back a status change that only updates
// the component counts (0: write now).
func (r *Reconciler) holdStatus(policy *nvidiav1.ClusterPolicy, status *nvidiav1.ClusterPolicyStatus) time.Duration {
	if r.StatusInterval <= 0 || policy.Status.State != status.State ||
		!equality.Semantic.DeepEqual(policy.Status.Conditions, status.Conditions) {
		return 0
	}
	r.mu.Lock()
	last, ok := r.lastWrite[policy.Name]
	r.mu.Unlock()
	if !ok {
		return 0
	}
	if since := r.Clock.Now().Sub(last); since < r.StatusInterval {
		return r.StatusInterval - since
	}
	return 0
}

func summarize(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:n], ", "), len(items)-n)
}

// daemonPodTarget is the node a DaemonSet pod is made for: the DaemonSet
// controller pins it with a required node affinity on metadata.name.
func daemonPodTarget(p *corev1.Pod) string {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == metav1.ObjectNameField && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}

// unschedulableReason is the scheduler's message for a pod it could not
// place ("" if it has not given up on it).
func unschedulableReason(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			if c.Message == "" {
				return c.Reason
			}
			return c.Message
		}
	}
	return ""
}

// hasReason reports whether a condition has the reason.
func hasReason(conds []metav1.Condition, reason string) bool {
	return slices.ContainsFunc(conds, func(c metav1.Condition) bool { return c.Reason == reason })
}
