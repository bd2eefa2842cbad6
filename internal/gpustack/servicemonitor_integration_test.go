package gpustack_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// dcgm-exporter's ServiceMonitor through the operator, as it runs (its
// generated RBAC, its caches): without the Prometheus operator's CRD the
// policy says the ServiceMonitor was not created, once, and the operator
// sends nothing more about it; the CRD installed later brings the
// ServiceMonitor without a change of the policy; drift is reverted; a
// disabled ServiceMonitor is deleted; a CRD deleted again leaves no
// informer listing it.
func TestServiceMonitorThroughTheOperator(t *testing.T) {
	devtest.NeedCluster(t)
	quietClients.Do(func() { ctrl.SetLogger(logr.Discard()) })
	cleanSlate(t)
	deleteServiceMonitorCRD(t) // none left by an earlier run
	t.Cleanup(func() { deleteServiceMonitorCRD(t) })
	cfg, counter := devcluster.CountRequests(operatorCfg)
	startOperator(t, cfg)
	ctx := t.Context()
	errorsBefore := reconcileErrors(t)
	p := createPolicy(t, "cluster-policy", func(p *nvidiav1.ClusterPolicy) {
		p.Spec.DCGMExporter.ServiceMonitor = &nvidiav1.ServiceMonitorSpec{
			Enabled: ptr.To(true), Interval: "30s", HonorLabels: ptr.To(true),
			AdditionalLabels: map[string]string{"release": "prometheus"},
			Relabelings:      []nvidiav1.RelabelConfig{{SourceLabels: []string{"__meta_kubernetes_pod_node_name"}, TargetLabel: "instance"}},
		}
	})

	// No CRD: the condition says why, once.
	var cond *metav1.Condition
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		cond = meta.FindStatusCondition(getPolicy(t, p.Name).Status.Conditions, nvidiav1.ConditionServiceMonitor)
		return cond != nil, nil
	})
	if err != nil {
		t.Fatal("no ServiceMonitor condition without the ServiceMonitor CRD")
	}
	wantMsg := "ServiceMonitor " + ns + "/nvidia-dcgm-exporter not created: the API server does not serve monitoring.coreos.com/v1 ServiceMonitor"
	if cond.Status != metav1.ConditionFalse || cond.Reason != gpustack.ReasonServiceMonitorNotServed || !strings.Contains(cond.Message, wantMsg) {
		t.Errorf("ServiceMonitor condition %+v, want False %s %q", cond, gpustack.ReasonServiceMonitorNotServed, wantMsg)
	}
	// Once the stack has settled nothing brings the policy back but the
	// CRD (below).
	waitIdle(t)
	before := counter.Snapshot()
	time.Sleep(3 * time.Second)
	for k, n := range counter.Since(before) {
		if strings.Contains(k, "monitoring.coreos.com") || strings.Contains(k, "servicemonitors") || strings.Contains(k, "customresourcedefinitions") {
			t.Errorf("without the CRD the operator still sends %s (%d times)", k, n)
		}
	}
	if n := reconcileErrors(t) - errorsBefore; n != 0 {
		t.Errorf("%v reconcile errors without the ServiceMonitor CRD", n)
	}
	evs, err := cluster.Client.EventsV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=" + gpustack.ReasonServiceMonitorNotServed})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 1 || evs.Items[0].Type != "Warning" || !strings.Contains(evs.Items[0].Note, wantMsg) {
		t.Errorf("want one Warning %s event; got %d: %+v", gpustack.ReasonServiceMonitorNotServed, len(evs.Items), evs.Items)
	}

	// The CRD installed: the ServiceMonitor appears, no change of the policy.
	generation := getPolicy(t, p.Name).Generation
	installServiceMonitorCRD(t)
	sm := waitServiceMonitor(t, func(u *unstructured.Unstructured) bool { return u != nil })
	if g := getPolicy(t, p.Name).Generation; g != generation {
		t.Fatalf("the policy changed (generation %d → %d): the test must not trigger the operator itself", generation, g)
	}
	spec, _, _ := unstructured.NestedMap(sm.Object, "spec")
	want := map[string]any{
		"jobLabel":          "app",
		"namespaceSelector": map[string]any{"matchNames": []any{ns}},
		"selector":          map[string]any{"matchLabels": map[string]any{"app": "nvidia-dcgm-exporter"}},
		"endpoints": []any{map[string]any{"port": "gpu-metrics", "path": "/metrics", "interval": "30s", "honorLabels": true,
			"relabelings": []any{map[string]any{"sourceLabels": []any{"__meta_kubernetes_pod_node_name"}, "targetLabel": "instance", "action": "replace"}}}},
	}
	if got, _ := yaml.Marshal(spec); string(got) != mustYAML(t, want) {
		t.Errorf("ServiceMonitor spec:\n%s\nwant:\n%s", got, mustYAML(t, want))
	}
	if l := sm.GetLabels(); l["release"] != "prometheus" || l[gpustack.LabelManagedBy] != "gpufleet" {
		t.Errorf("ServiceMonitor labels %v, want release=prometheus and gpufleet's", l)
	}
	if refs := sm.GetOwnerReferences(); len(refs) != 1 || refs[0].Kind != "ClusterPolicy" || refs[0].Name != p.Name {
		t.Errorf("ServiceMonitor owners %v, want the ClusterPolicy", refs)
	}
	// It selects the exporter's Service, which selects the exporter's pods.
	svc, err := cluster.Client.CoreV1().Services(ns).Get(ctx, "nvidia-dcgm-exporter", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Labels["app"] != "nvidia-dcgm-exporter" || svc.Spec.Selector["app"] != "nvidia-dcgm-exporter" || svc.Spec.Ports[0].Name != "gpu-metrics" {
		t.Errorf("dcgm-exporter Service labels %v selector %v ports %v: not what the ServiceMonitor selects", svc.Labels, svc.Spec.Selector, svc.Spec.Ports)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		cond = meta.FindStatusCondition(getPolicy(t, p.Name).Status.Conditions, nvidiav1.ConditionServiceMonitor)
		return cond != nil && cond.Status == metav1.ConditionTrue, nil
	})
	if err != nil {
		t.Errorf("ServiceMonitor condition %+v, want True once it is created", cond)
	}

	// Drift is reverted, a deleted ServiceMonitor comes back (it is watched).
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u := getServiceMonitor(t)
		eps, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
		eps[0].(map[string]any)["interval"] = "5m"
		_ = unstructured.SetNestedSlice(u.Object, eps, "spec", "endpoints")
		return k8s.Update(ctx, u)
	})
	if err != nil {
		t.Fatal(err)
	}
	waitServiceMonitor(t, func(u *unstructured.Unstructured) bool {
		eps, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
		return eps[0].(map[string]any)["interval"] == "30s"
	})
	uid := getServiceMonitor(t).GetUID()
	if err := k8s.Delete(ctx, getServiceMonitor(t)); err != nil {
		t.Fatal(err)
	}
	waitServiceMonitor(t, func(u *unstructured.Unstructured) bool { return u != nil && u.GetUID() != uid })

	// Converged: nothing more is written or listed.
	time.Sleep(2 * time.Second)
	before = counter.Snapshot()
	time.Sleep(5 * time.Second)
	for k, n := range counter.Since(before) {
		if strings.Contains(k, "servicemonitors") || strings.Contains(k, "monitoring.coreos.com") {
			t.Errorf("converged, the operator sent %s (%d times)", k, n)
		}
	}

	// A relabeling the Prometheus operator's schema refuses (a source label
	// with a dash, which gpufleet's schema lets through): said in the
	// condition, not retried in a loop; fixed, it applies.
	setSourceLabel := func(l string) {
		updatePolicy(t, func(p *nvidiav1.ClusterPolicy) {
			p.Spec.DCGMExporter.ServiceMonitor.Relabelings[0].SourceLabels = []string{l}
		})
	}
	setSourceLabel("not-a-label")
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		cond = meta.FindStatusCondition(getPolicy(t, p.Name).Status.Conditions, nvidiav1.ConditionServiceMonitor)
		return cond != nil && cond.Reason == gpustack.ReasonServiceMonitorRejected, nil
	})
	if err != nil || cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, "sourceLabels") {
		t.Errorf("a ServiceMonitor the API server refuses: condition %+v, want False %s naming the field", cond, gpustack.ReasonServiceMonitorRejected)
	}
	waitIdle(t)
	if n := reconcileErrors(t) - errorsBefore; n != 0 {
		t.Errorf("%v reconcile errors for a refused ServiceMonitor", n)
	}
	setSourceLabel("__meta_kubernetes_pod_node_name")
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		cond = meta.FindStatusCondition(getPolicy(t, p.Name).Status.Conditions, nvidiav1.ConditionServiceMonitor)
		return cond != nil && cond.Status == metav1.ConditionTrue, nil
	})
	if err != nil {
		t.Errorf("condition %+v after the relabeling was fixed, want True", cond)
	}

	// Disabled: deleted, and the condition goes.
	updatePolicy(t, func(p *nvidiav1.ClusterPolicy) { p.Spec.DCGMExporter.ServiceMonitor.Enabled = ptr.To(false) })
	waitServiceMonitor(t, func(u *unstructured.Unstructured) bool { return u == nil })
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return meta.FindStatusCondition(getPolicy(t, p.Name).Status.Conditions, nvidiav1.ConditionServiceMonitor) == nil, nil
	})
	if err != nil {
		t.Errorf("ServiceMonitor condition still there after disabling it: %+v", getPolicy(t, p.Name).Status.Conditions)
	}

	// Enabled again, then the CRD deleted: not served again, and the
	// ServiceMonitor informer is gone (nothing lists the missing resource).
	updatePolicy(t, func(p *nvidiav1.ClusterPolicy) { p.Spec.DCGMExporter.ServiceMonitor.Enabled = ptr.To(true) })
	waitServiceMonitor(t, func(u *unstructured.Unstructured) bool { return u != nil })
	deleteServiceMonitorCRD(t)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		cond = meta.FindStatusCondition(getPolicy(t, p.Name).Status.Conditions, nvidiav1.ConditionServiceMonitor)
		return cond != nil && cond.Status == metav1.ConditionFalse && strings.Contains(cond.Message, "is not installed"), nil
	})
	if err != nil {
		t.Errorf("after the CRD was deleted: condition %+v, want False, not installed", cond)
	}
	time.Sleep(2 * time.Second)
	before = counter.Snapshot()
	time.Sleep(5 * time.Second)
	for k, n := range counter.Since(before) {
		if strings.Contains(k, "servicemonitors") || strings.Contains(k, "monitoring.coreos.com") {
			t.Errorf("after the CRD was deleted the operator still sends %s (%d times)", k, n)
		}
	}
	if n := reconcileErrors(t) - errorsBefore; n != 0 {
		t.Errorf("%v reconcile errors", n)
	}
}

// waitIdle waits until the ClusterPolicy controller has made no pass for
// two seconds.
func waitIdle(t *testing.T) {
	t.Helper()
	last, since := reconcilePasses(t), time.Now()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		if n := reconcilePasses(t); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) >= 2*time.Second, nil
	})
	if err != nil {
		t.Fatalf("the ClusterPolicy controller never settled: %v", err)
	}
}

// reconcileErrors is gpufleet_gpustack_reconcile_passes_total{result="error"}
// of the in-process operator.
func reconcileErrors(t *testing.T) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "gpufleet_gpustack_reconcile_passes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelValue(m, "result") == "error" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func mustYAML(t *testing.T, v any) string {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// installServiceMonitorCRD creates testdata/servicemonitor-crd.yaml and
// waits until it is established.
func installServiceMonitorCRD(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile("testdata/servicemonitor-crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(t.Context(), crd); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(crd), crd); err != nil {
			return false, err
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("ServiceMonitor CRD not established: %v", err)
	}
}

// deleteServiceMonitorCRD deletes the ServiceMonitor CRD, if any, and
// waits until it is gone.
func deleteServiceMonitorCRD(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: gpustack.ServiceMonitorCRD}}
	if err := k8s.Delete(ctx, crd); apierrors.IsNotFound(err) {
		return
	} else if err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(crd), crd)
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("ServiceMonitor CRD not deleted: %v", err)
	}
}

// getServiceMonitor reads dcgm-exporter's ServiceMonitor (nil: none).
func getServiceMonitor(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gpustack.ServiceMonitorGVK)
	err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "nvidia-dcgm-exporter"}, u)
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// waitServiceMonitor waits until dcgm-exporter's ServiceMonitor (nil: none)
// satisfies ok, and returns it.
func waitServiceMonitor(t *testing.T, ok func(*unstructured.Unstructured) bool) *unstructured.Unstructured {
	t.Helper()
	var u *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		u = getServiceMonitor(t)
		return ok(u), nil
	})
	if err != nil {
		t.Fatalf("ServiceMonitor not as expected within 30s; last seen: %v", u)
	}
	return u
}
