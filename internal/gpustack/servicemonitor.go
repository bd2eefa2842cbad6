package gpustack

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/pendingevents"
)

// dcgm-exporter's ServiceMonitor (dcgmExporter.serviceMonitor), for the
// Prometheus operator: the object NVIDIA's GPU Operator renders
// (assets/state-dcgm-exporter/0500_service_monitor.yaml there) with the
// policy's interval, scrapeTimeout, honorLabels, relabelings and
// additionalLabels. The Prometheus operator's API is optional: the object
// is unstructured (no Go module of it), and created only while the API
// server serves monitoring.coreos.com/v1 ServiceMonitor.

// ServiceMonitorGVK is the kind gpufleet creates for dcgm-exporter.
var ServiceMonitorGVK = schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"}

// ServiceMonitorCRD is the name of the CustomResourceDefinition that
// serves ServiceMonitorGVK.
const ServiceMonitorCRD = "servicemonitors.monitoring.coreos.com"

// dcgmExporterName names dcgm-exporter's DaemonSet, Service and
// ServiceMonitor; it is the "app" label of its pods and Service, which
// the ServiceMonitor selects (and reports as the job, jobLabel: app).
const dcgmExporterName = "nvidia-dcgm-exporter"

// Reasons of the ServiceMonitor condition (ServiceMonitorNotServed is also
// a Warning event).
const (
	ReasonServiceMonitorNotServed = "ServiceMonitorNotServed"
	// ReasonServiceMonitorRejected: the API server refused the rendered
	// ServiceMonitor (e.g. a relabeling's source label that the Prometheus
	// operator's schema does not allow, or no RBAC to write it).
	ReasonServiceMonitorRejected = "ServiceMonitorRejected"
	reasonServiceMonitorCreated  = "ServiceMonitorCreated"
)

// notServedRetry: how soon to look again when the CRD says it serves v1
// but API discovery does not show it yet.
const notServedRetry = 5 * time.Second

// RenderServiceMonitor is dcgm-exporter's ServiceMonitor as the policy asks
// for it, in namespace, or nil when it asks for none (dcgm-exporter or its
// ServiceMonitor not enabled). It is pure.
func RenderServiceMonitor(policy *nvidiav1.ClusterPolicy, namespace string) *unstructured.Unstructured {
	sm := policy.Spec.DCGMExporter.ServiceMonitor
	exporter, _ := componentByKey(DCGMExporter)
	if sm == nil || !isTrue(sm.Enabled) || !exporter.Enabled(&policy.Spec) {
		return nil
	}
	endpoint := map[string]any{"port": "gpu-metrics", "path": "/metrics"}
	if sm.Interval != "" {
		endpoint["interval"] = string(sm.Interval)
	}
	if sm.ScrapeTimeout != "" {
		endpoint["scrapeTimeout"] = string(sm.ScrapeTimeout)
	}
	if sm.HonorLabels != nil {
		endpoint["honorLabels"] = *sm.HonorLabels
	}
	if len(sm.Relabelings) > 0 {
		relabelings := make([]any, len(sm.Relabelings))
		for i, rc := range sm.Relabelings {
			relabelings[i] = relabelConfig(rc)
		}
		endpoint["relabelings"] = relabelings
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"jobLabel":          "app",
			"namespaceSelector": map[string]any{"matchNames": []any{namespace}},
			"selector":          map[string]any{"matchLabels": map[string]any{"app": dcgmExporterName}},
			"endpoints":         []any{endpoint},
		},
	}}
	u.SetGroupVersionKind(ServiceMonitorGVK)
	u.SetName(dcgmExporterName)
	u.SetNamespace(namespace)
	labels := map[string]string{"app": dcgmExporterName}
	maps.Copy(labels, sm.AdditionalLabels)
	u.SetLabels(labels)
	common(u, policy, DCGMExporter) // gpufleet's labels win over additionalLabels
	return u
}

// relabelConfig is one Prometheus relabeling in the ServiceMonitor's
// JSON shape; unset fields are left out.
func relabelConfig(rc nvidiav1.RelabelConfig) map[string]any {
	out := map[string]any{}
	if len(rc.SourceLabels) > 0 {
		labels := make([]any, len(rc.SourceLabels))
		for i, l := range rc.SourceLabels {
			labels[i] = l
		}
		out["sourceLabels"] = labels
	}
	set := func(key, v string) {
		if v != "" {
			out[key] = v
		}
	}
	if rc.Separator != nil {
		out["separator"] = *rc.Separator
	}
	set("targetLabel", rc.TargetLabel)
	set("regex", rc.Regex)
	if rc.Modulus != 0 {
		out["modulus"] = rc.Modulus
	}
	if rc.Replacement != nil {
		out["replacement"] = *rc.Replacement
	}
	set("action", rc.Action)
	return out
}

// The fields gpufleet renders in an endpoint and in a relabeling: one the
// ServiceMonitor has but the policy no longer sets is removed (unless it
// holds the API server's default).
var (
	endpointKeys = []string{"port", "path", "interval", "scrapeTimeout", "honorLabels", "relabelings"}
	relabelKeys  = []string{"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
	// relabelDefaults: the Prometheus operator's CRD defaults action.
	relabelDefaults = map[string]any{"action": "replace"}
)

// serviceMonitorUpToDate reports whether have's spec carries everything
// want's does (fields the API server adds are ignored; lists have the
// same length), and no field gpufleet renders that the policy no longer
// sets.
func serviceMonitorUpToDate(want, have *unstructured.Unstructured) bool {
	if !derivative(want.Object["spec"], have.Object["spec"]) {
		return false
	}
	wantEPs, _, _ := unstructured.NestedSlice(want.Object, "spec", "endpoints")
	haveEPs, _, _ := unstructured.NestedSlice(have.Object, "spec", "endpoints")
	for i := range wantEPs { // as many in have (derivative)
		w, _ := wantEPs[i].(map[string]any)
		h, _ := haveEPs[i].(map[string]any)
		if staleFields(w, h, endpointKeys, nil) {
			return false
		}
		wr, _ := w["relabelings"].([]any)
		hr, _ := h["relabelings"].([]any)
		for j := range min(len(wr), len(hr)) {
			if staleFields(wr[j].(map[string]any), hr[j].(map[string]any), relabelKeys, relabelDefaults) {
				return false
			}
		}
	}
	return true
}

// derivative reports whether have carries every value of want: a map may
// have more keys, a list has as many items.
func derivative(want, have any) bool {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range w {
			if hv, ok := h[k]; !ok || !derivative(v, hv) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return false
		}
		for i := range w {
			if !derivative(w[i], h[i]) {
				return false
			}
		}
		return true
	default:
		return equality.Semantic.DeepEqual(want, have)
	}
}

// staleFields reports whether have sets one of keys that want does not
// (with another value than its default).
func staleFields(want, have map[string]any, keys []string, defaults map[string]any) bool {
	for _, k := range keys {
		if _, ok := want[k]; ok {
			continue
		}
		if v, ok := have[k]; ok && (defaults[k] == nil || !equality.Semantic.DeepEqual(v, defaults[k])) {
			return true
		}
	}
	return false
}

// ServiceMonitors is what the Reconciler needs to know and read of the
// Prometheus operator's ServiceMonitors.
type ServiceMonitors struct {
	// CRDs reads the ServiceMonitor CRD (the manager caches that one CRD).
	CRDs client.Reader
	// Mapper says whether the API server serves ServiceMonitorGVK (the
	// manager's RESTMapper: it asks API discovery again for a kind it
	// does not know, so a CRD installed later is found).
	Mapper meta.RESTMapper
	// Reader reads gpufleet's ServiceMonitors (a cache of its namespace
	// and managed-by label, whose informer starts on the first read).
	Reader client.Reader
	// Watch, if set, starts watching gpufleet's ServiceMonitors once they
	// are served (drift and deletions bring the policy back); Unwatch
	// stops it when their CRD is gone, so that no informer keeps listing
	// a resource that is not served.
	Watch, Unwatch func(context.Context) error

	mu       sync.Mutex
	watching bool
}

// servedState is whether ServiceMonitors can be created.
type servedState int

const (
	notServed servedState = iota
	// notServedYet: the CRD serves v1 and is established, but API
	// discovery does not show it yet (look again shortly).
	notServedYet
	served
)

// served tells whether the API server serves ServiceMonitorGVK, and if
// not, why (for the condition). It sends no request while the CRD is
// absent: the CRD comes from the cache, the RESTMapper is asked only once
// the CRD is there.
func (m *ServiceMonitors) served(ctx context.Context) (servedState, string, error) {
	if m == nil {
		return notServed, "gpufleet does not watch the ServiceMonitor CRD", nil
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := m.CRDs.Get(ctx, client.ObjectKey{Name: ServiceMonitorCRD}, crd); apierrors.IsNotFound(err) {
		return notServed, "CustomResourceDefinition " + ServiceMonitorCRD + " is not installed", nil
	} else if err != nil {
		return notServed, "", fmt.Errorf("reading CustomResourceDefinition %s: %w", ServiceMonitorCRD, err)
	}
	switch {
	case crd.DeletionTimestamp != nil:
		return notServed, "CustomResourceDefinition " + ServiceMonitorCRD + " is being deleted", nil
	case !slices.ContainsFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool {
		return v.Name == ServiceMonitorGVK.Version && v.Served
	}):
		return notServed, "CustomResourceDefinition " + ServiceMonitorCRD + " does not serve " + ServiceMonitorGVK.Version, nil
	case !crdEstablished(crd):
		return notServed, "CustomResourceDefinition " + ServiceMonitorCRD + " is not established", nil
	}
	if _, err := m.Mapper.RESTMapping(ServiceMonitorGVK.GroupKind(), ServiceMonitorGVK.Version); meta.IsNoMatchError(err) {
		return notServedYet, "", nil
	} else if err != nil {
		return notServed, "", fmt.Errorf("API discovery of %s: %w", ServiceMonitorGVK, err)
	}
	return served, "", nil
}

func crdEstablished(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established {
			return c.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}

// watch starts (on) or stops the watch of gpufleet's ServiceMonitors when
// that changes; a failure is retried on the next pass.
func (m *ServiceMonitors) watch(ctx context.Context, on bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.watching == on {
		return nil
	}
	fn := m.Unwatch
	if on {
		fn = m.Watch
	}
	if fn != nil {
		if err := fn(ctx); err != nil {
			return fmt.Errorf("watching ServiceMonitors (%v): %w", on, err)
		}
	}
	m.watching = on
	return nil
}

// serviceMonitorRead bounds a read of the ServiceMonitor cache: its
// informer, started on the first read, waits for its first list.
const serviceMonitorRead = 30 * time.Second

// syncServiceMonitor creates, updates or deletes dcgm-exporter's
// ServiceMonitor and sets the policy's ServiceMonitor condition: True when
// it exists as asked, False when the policy asks for one the API server
// cannot take (the message says why), absent when none is asked for. It
// returns when to look again (a CRD that discovery does not show yet).
func (r *Reconciler) syncServiceMonitor(ctx context.Context, policy *nvidiav1.ClusterPolicy, status *nvidiav1.ClusterPolicyStatus, ev *pendingevents.Recorder) (time.Duration, error) {
	want := RenderServiceMonitor(policy, r.Namespace)
	state, why, err := r.Monitors.served(ctx)
	if err != nil {
		return 0, err
	}
	if r.Monitors != nil {
		if err := r.Monitors.watch(ctx, state == served); err != nil {
			return 0, err
		}
	}
	switch {
	case state == notServedYet:
		return notServedRetry, nil // the condition stays as it was
	case want == nil:
		meta.RemoveStatusCondition(&status.Conditions, nvidiav1.ConditionServiceMonitor)
		if state == served {
			return 0, r.deleteServiceMonitor(ctx)
		}
		return 0, nil
	case state == notServed:
		r.serviceMonitorFailed(policy, status, ev, ReasonServiceMonitorNotServed, fmt.Sprintf(
			"dcgmExporter.serviceMonitor.enabled: ServiceMonitor %s/%s not created: the API server does not serve %s %s (%s); it is created once that CRD is installed",
			r.Namespace, dcgmExporterName, ServiceMonitorGVK.GroupVersion(), ServiceMonitorGVK.Kind, why))
		return 0, nil
	}
	readCtx, cancel := context.WithTimeout(ctx, serviceMonitorRead)
	defer cancel()
	err = r.applyFrom(readCtx, r.Monitors.Reader, []client.Object{want})
	switch {
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsForbidden(err):
		// Retrying would fail the same way: said in the condition, tried
		// again when something changes.
		r.serviceMonitorFailed(policy, status, ev, ReasonServiceMonitorRejected, fmt.Sprintf(
			"dcgmExporter.serviceMonitor: ServiceMonitor %s/%s rejected by the API server: %v", r.Namespace, dcgmExporterName, err))
		return 0, nil
	case err != nil:
		return 0, err
	}
	r.setServiceMonitorCondition(policy, status, metav1.ConditionTrue, reasonServiceMonitorCreated,
		fmt.Sprintf("ServiceMonitor %s/%s selects the dcgm-exporter Service", r.Namespace, dcgmExporterName))
	return 0, nil
}

// serviceMonitorFailed sets the ServiceMonitor condition False, with a
// Warning event when its message changes.
func (r *Reconciler) serviceMonitorFailed(policy *nvidiav1.ClusterPolicy, status *nvidiav1.ClusterPolicyStatus, ev *pendingevents.Recorder, reason, msg string) {
	if c := meta.FindStatusCondition(policy.Status.Conditions, nvidiav1.ConditionServiceMonitor); c == nil || c.Message != msg {
		ev.Eventf(policy, nil, corev1.EventTypeWarning, reason, actionDeploy, "%s", msg)
	}
	r.setServiceMonitorCondition(policy, status, metav1.ConditionFalse, reason, msg)
}

// deleteServiceMonitor deletes gpufleet's dcgm-exporter ServiceMonitor if
// there is one (the policy no longer asks for it).
func (r *Reconciler) deleteServiceMonitor(ctx context.Context) error {
	readCtx, cancel := context.WithTimeout(ctx, serviceMonitorRead)
	defer cancel()
	have := &unstructured.Unstructured{}
	have.SetGroupVersionKind(ServiceMonitorGVK)
	err := r.Monitors.Reader.Get(readCtx, client.ObjectKey{Namespace: r.Namespace, Name: dcgmExporterName}, have)
	if apierrors.IsNotFound(err) || (err == nil && (have.GetLabels()[LabelManagedBy] != managedBy || have.GetDeletionTimestamp() != nil)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("getting ServiceMonitor %s: %w", dcgmExporterName, err)
	}
	if err := r.Client.Delete(ctx, have); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting ServiceMonitor %s: %w", dcgmExporterName, err)
	}
	ctrl.LoggerFrom(ctx).Info("deleted object no longer desired", "kind", ServiceMonitorGVK.Kind, "name", dcgmExporterName)
	return nil
}

func (r *Reconciler) setServiceMonitorCondition(policy *nvidiav1.ClusterPolicy, status *nvidiav1.ClusterPolicyStatus, s metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: nvidiav1.ConditionServiceMonitor, Status: s, Reason: reason,
		Message: msg, ObservedGeneration: policy.Generation, LastTransitionTime: metav1.NewTime(r.Clock.Now())})
}
