package gpustack

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/statusmemo"
)

// +kubebuilder:rbac:groups=nvidia.com,resources=nvidiadrivers,verbs=get;list;watch
// +kubebuilder:rbac:groups=nvidia.com,resources=nvidiadrivers/status,verbs=get;update;patch

// DriverStatusReconciler writes each NVIDIADriver's status: its nodes, how
// many run it Ready, conflicts, unsupported fields. It only reads what
// the ClusterPolicy controller deploys; it writes nothing else.
type DriverStatusReconciler struct {
	Client    client.Client
	Namespace string
	Clock     clock.PassiveClock
	Recorder  events.EventRecorder

	// written: the statuses written, so that fields an older NVIDIADriver
	// schema prunes do not make every pass write again.
	written statusmemo.Memo[nvidiav1alpha1.NVIDIADriverStatus]
}

// Reconcile writes one NVIDIADriver's status when it changed.
func (r *DriverStatusReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	d := &nvidiav1alpha1.NVIDIADriver{}
	if err := r.Client.Get(ctx, req.NamespacedName, d); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if d.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	crdOn, err := r.crdOn(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	var drivers nvidiav1alpha1.NVIDIADriverList
	var nodes corev1.NodeList
	var pods corev1.PodList
	var dss appsv1.DaemonSetList
	if err := r.Client.List(ctx, &drivers); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing NVIDIADrivers: %w", err)
	}
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil { // read only
		return reconcile.Result{}, fmt.Errorf("listing nodes: %w", err)
	}
	own := client.MatchingLabels{LabelComponent: Driver, LabelNVIDIADriver: d.Name}
	if err := r.Client.List(ctx, &pods, client.InNamespace(r.Namespace), own); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing driver pods: %w", err)
	}
	if err := r.Client.List(ctx, &dss, client.InNamespace(r.Namespace), own); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing driver DaemonSets: %w", err)
	}
	desired := map[string]string{}
	for i := range dss.Items {
		ds := &dss.Items[i]
		if len(ds.Spec.Template.Spec.Containers) > 0 {
			desired[ds.Spec.Template.Labels["app"]] = ds.Spec.Template.Spec.Containers[0].Image
		}
	}
	assign := AssignDrivers(drivers.Items, nodes.Items)
	st := DriverStatus(d, crdOn, assign, pods.Items, desired, r.Namespace, metav1.NewTime(r.Clock.Now()))
	if equality.Semantic.DeepEqual(&d.Status, &st) || r.written.Unchanged(d.UID, d.ResourceVersion, st) {
		return reconcile.Result{}, nil
	}
	updated := d.DeepCopy()
	updated.Status = st
	if err := r.Client.Status().Patch(ctx, updated, client.MergeFromWithOptions(d, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			// The cache is behind the object: the update event that
			// follows brings this driver back. Not an error.
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, fmt.Errorf("updating NVIDIADriver %s status: %w", d.Name, err)
	}
	r.written.Written(d.UID, updated.ResourceVersion, st)
	// Events only after the write succeeded, once per change.
	if c := meta.FindStatusCondition(st.Conditions, nvidiav1alpha1.ConditionConflict); c != nil &&
		!meta.IsStatusConditionTrue(d.Status.Conditions, nvidiav1alpha1.ConditionConflict) && r.Recorder != nil {
		r.Recorder.Eventf(d, nil, corev1.EventTypeWarning, ReasonDriverConflict, actionDeploy, "%s", c.Message)
	}
	return reconcile.Result{}, nil
}

// crdOn reports whether the active (oldest) ClusterPolicy hands the driver
// to NVIDIADriver objects.
func (r *DriverStatusReconciler) crdOn(ctx context.Context) (bool, error) {
	var list nvidiav1.ClusterPolicyList
	if err := r.Client.List(ctx, &list); err != nil {
		return false, fmt.Errorf("listing ClusterPolicies: %w", err)
	}
	p := OldestPolicy(list.Items)
	return p != nil && p.Spec.Driver.IsEnabled() && isTrue(p.Spec.Driver.UseNvidiaDriverCRD), nil
}

// OldestPolicy is the active ClusterPolicy: the oldest not being deleted
// (name breaks ties); nil when there is none.
func OldestPolicy(items []nvidiav1.ClusterPolicy) *nvidiav1.ClusterPolicy {
	items = slices.DeleteFunc(slices.Clone(items), func(p nvidiav1.ClusterPolicy) bool { return p.DeletionTimestamp != nil })
	if len(items) == 0 {
		return nil
	}
	slices.SortFunc(items, func(a, b nvidiav1.ClusterPolicy) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return &items[0]
}
