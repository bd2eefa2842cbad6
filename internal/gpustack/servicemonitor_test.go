package gpustack

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

func TestRenderServiceMonitor(t *testing.T) {
	const owner = `  ownerReferences:
  - apiVersion: nvidia.com/v1
    blockOwnerDeletion: true
    controller: true
    kind: ClusterPolicy
    name: cluster-policy
    uid: uid-1
`
	const spec = `  jobLabel: app
  namespaceSelector:
    matchNames:
    - gpu-operator
  selector:
    matchLabels:
      app: nvidia-dcgm-exporter
`
	tests := map[string]struct {
		spec func(*nvidiav1.ClusterPolicySpec)
		want string // YAML; "" = no ServiceMonitor
	}{
		"no serviceMonitor section": {spec: func(*nvidiav1.ClusterPolicySpec) {}},
		"serviceMonitor not enabled": {spec: func(s *nvidiav1.ClusterPolicySpec) {
			s.DCGMExporter.ServiceMonitor = &nvidiav1.ServiceMonitorSpec{Interval: "15s"}
		}},
		"serviceMonitor disabled": {spec: func(s *nvidiav1.ClusterPolicySpec) {
			s.DCGMExporter.ServiceMonitor = &nvidiav1.ServiceMonitorSpec{Enabled: ptr.To(false)}
		}},
		"dcgm-exporter disabled": {spec: func(s *nvidiav1.ClusterPolicySpec) {
			s.DCGMExporter.Enabled = ptr.To(false)
			s.DCGMExporter.ServiceMonitor = &nvidiav1.ServiceMonitorSpec{Enabled: ptr.To(true)}
		}},
		"enabled, nothing else set: Prometheus' own interval and timeout": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.ServiceMonitor = &nvidiav1.ServiceMonitorSpec{Enabled: ptr.To(true)}
			},
			want: `apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  labels:
    app: nvidia-dcgm-exporter
    app.kubernetes.io/component: dcgm-exporter
    app.kubernetes.io/managed-by: gpufleet
    app.kubernetes.io/part-of: gpufleet-gpu-stack
  name: nvidia-dcgm-exporter
  namespace: gpu-operator
` + owner + `spec:
  endpoints:
  - path: /metrics
    port: gpu-metrics
` + spec,
		},
		"every option; additionalLabels do not replace gpufleet's": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.ServiceMonitor = &nvidiav1.ServiceMonitorSpec{
					Enabled: ptr.To(true), Interval: "30s", ScrapeTimeout: "10s", HonorLabels: ptr.To(true),
					AdditionalLabels: map[string]string{"release": "prometheus", LabelManagedBy: "someone-else"},
					Relabelings: []nvidiav1.RelabelConfig{
						{SourceLabels: []string{"__meta_kubernetes_pod_node_name"}, TargetLabel: "instance", Action: "replace"},
						{SourceLabels: []string{"a", "b"}, Separator: ptr.To(""), TargetLabel: "shard", Modulus: 4, Action: "hashmod"},
						{Regex: "pod_uid", Replacement: ptr.To(""), Action: "labeldrop"},
					},
				}
			},
			want: `apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  labels:
    app: nvidia-dcgm-exporter
    app.kubernetes.io/component: dcgm-exporter
    app.kubernetes.io/managed-by: gpufleet
    app.kubernetes.io/part-of: gpufleet-gpu-stack
    release: prometheus
  name: nvidia-dcgm-exporter
  namespace: gpu-operator
` + owner + `spec:
  endpoints:
  - honorLabels: true
    interval: 30s
    path: /metrics
    port: gpu-metrics
    relabelings:
    - action: replace
      sourceLabels:
      - __meta_kubernetes_pod_node_name
      targetLabel: instance
    - action: hashmod
      modulus: 4
      separator: ""
      sourceLabels:
      - a
      - b
      targetLabel: shard
    - action: labeldrop
      regex: pod_uid
      replacement: ""
    scrapeTimeout: 10s
` + spec,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cluster-policy", UID: "uid-1"}}
			tc.spec(&p.Spec)
			sm := RenderServiceMonitor(p, "gpu-operator")
			if tc.want == "" {
				if sm != nil {
					t.Fatalf("rendered a ServiceMonitor: %v", sm.Object)
				}
				return
			}
			if sm == nil {
				t.Fatal("no ServiceMonitor rendered")
			}
			// What the client sends: JSON-safe values only.
			if _, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sm); err != nil {
				t.Fatalf("not a valid unstructured object: %v", err)
			}
			got, err := yaml.Marshal(sm.Object)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, string(got)); diff != "" {
				t.Errorf("ServiceMonitor (-want +got):\n%s", diff)
			}
		})
	}
}

// The rendered ServiceMonitor selects the Service the renderer makes for
// dcgm-exporter, by its labels and port name, and that Service selects the
// exporter's pods.
func TestServiceMonitorSelectsTheExporterService(t *testing.T) {
	p := v16Policy(t)
	p.Spec.DCGMExporter.ServiceMonitor = &nvidiav1.ServiceMonitorSpec{Enabled: ptr.To(true)}
	sm := RenderServiceMonitor(p, "ns")
	objs, err := Render(p, Facts{Namespace: "ns", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}}, Runtimes: []string{"containerd"}}, Assets)
	if err != nil {
		t.Fatal(err)
	}
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	var selected []string
	var svc *corev1.Service
	var pods map[string]string
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Service:
			if matches(sel, o.Labels) {
				selected = append(selected, o.Name)
				svc = o
			}
		case *appsv1.DaemonSet:
			if o.Labels[LabelComponent] == DCGMExporter {
				pods = o.Spec.Template.Labels
			}
		}
	}
	if len(selected) != 1 || selected[0] != dcgmExporterName {
		t.Fatalf("the ServiceMonitor's selector %v selects Services %v, want %s", sel, selected, dcgmExporterName)
	}
	if !matches(svc.Spec.Selector, pods) {
		t.Errorf("Service selector %v does not select the exporter's pods %v", svc.Spec.Selector, pods)
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if port := eps[0].(map[string]any)["port"]; len(svc.Spec.Ports) != 1 || port != svc.Spec.Ports[0].Name {
		t.Errorf("endpoint port %v, Service ports %v", port, svc.Spec.Ports)
	}
}

func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

func TestServiceMonitorUpToDate(t *testing.T) {
	policy := func(change func(*nvidiav1.ServiceMonitorSpec)) *unstructured.Unstructured {
		p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
		sm := &nvidiav1.ServiceMonitorSpec{Enabled: ptr.To(true), Interval: "15s",
			Relabelings: []nvidiav1.RelabelConfig{{SourceLabels: []string{"a"}, TargetLabel: "b"}}}
		if change != nil {
			change(sm)
		}
		p.Spec.DCGMExporter.ServiceMonitor = sm
		return RenderServiceMonitor(p, "ns")
	}
	stored := func(change func(map[string]any)) *unstructured.Unstructured {
		u := policy(nil).DeepCopy()
		// As the API server stores it: a relabeling's action defaulted,
		// fields of its own.
		eps, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
		rl := eps[0].(map[string]any)["relabelings"].([]any)
		rl[0].(map[string]any)["action"] = "replace"
		u.SetResourceVersion("7")
		u.Object["status"] = map[string]any{"bindings": []any{}}
		if change != nil {
			change(u.Object)
		}
		return u
	}
	endpoint := func(o map[string]any) map[string]any {
		return o["spec"].(map[string]any)["endpoints"].([]any)[0].(map[string]any)
	}
	tests := map[string]struct {
		want, have *unstructured.Unstructured
		upToDate   bool
	}{
		"as stored, with defaults": {want: policy(nil), have: stored(nil), upToDate: true},
		"interval edited":          {want: policy(nil), have: stored(func(o map[string]any) { endpoint(o)["interval"] = "1m" }), upToDate: false},
		"a second endpoint added": {want: policy(nil), have: stored(func(o map[string]any) {
			spec := o["spec"].(map[string]any)
			spec["endpoints"] = append(spec["endpoints"].([]any), map[string]any{"port": "other"})
		}), upToDate: false},
		"selector edited": {want: policy(nil), have: stored(func(o map[string]any) {
			o["spec"].(map[string]any)["selector"] = map[string]any{"matchLabels": map[string]any{"app": "other"}}
		}), upToDate: false},
		"the policy no longer sets relabelings":      {want: policy(func(s *nvidiav1.ServiceMonitorSpec) { s.Relabelings = nil }), have: stored(nil), upToDate: false},
		"the policy no longer sets the interval":     {want: policy(func(s *nvidiav1.ServiceMonitorSpec) { s.Interval = "" }), have: stored(nil), upToDate: false},
		"an endpoint field gpufleet does not render": {want: policy(nil), have: stored(func(o map[string]any) { endpoint(o)["scheme"] = "https" }), upToDate: true},
		"a relabeling added": {want: policy(nil), have: stored(func(o map[string]any) {
			endpoint(o)["relabelings"] = append(endpoint(o)["relabelings"].([]any), map[string]any{"action": "labeldrop", "regex": "x"})
		}), upToDate: false},
		"a source label added": {want: policy(nil), have: stored(func(o map[string]any) {
			endpoint(o)["relabelings"].([]any)[0].(map[string]any)["sourceLabels"] = []any{"a", "c"}
		}), upToDate: false},
		"a relabeling's action the policy no longer sets": {want: policy(nil), have: stored(func(o map[string]any) {
			endpoint(o)["relabelings"].([]any)[0].(map[string]any)["action"] = "keep"
		}), upToDate: false},
		"an additional label removed from the ServiceMonitor": {want: policy(nil), have: stored(func(o map[string]any) {
			delete(o["metadata"].(map[string]any)["labels"].(map[string]any), "app")
		}), upToDate: true}, // labels are upToDate's (controller.go), not the spec's
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := serviceMonitorUpToDate(tc.want, tc.have); got != tc.upToDate {
				t.Errorf("up to date: %v, want %v", got, tc.upToDate)
			}
		})
	}
}

func TestServiceMonitorsServed(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	crd := func(served, established bool) *apiextensionsv1.CustomResourceDefinition {
		c := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: ServiceMonitorCRD},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: ServiceMonitorGVK.Group,
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: served, Storage: true}}}}
		status := apiextensionsv1.ConditionFalse
		if established {
			status = apiextensionsv1.ConditionTrue
		}
		c.Status.Conditions = []apiextensionsv1.CustomResourceDefinitionCondition{{Type: apiextensionsv1.Established, Status: status}}
		return c
	}
	known := meta.NewDefaultRESTMapper(nil)
	known.Add(ServiceMonitorGVK, meta.RESTScopeNamespace)
	unknown := meta.NewDefaultRESTMapper(nil)
	tests := map[string]struct {
		crd     *apiextensionsv1.CustomResourceDefinition
		mapper  meta.RESTMapper
		want    servedState
		wantWhy string
	}{
		"no CRD":                         {mapper: known, want: notServed, wantWhy: "is not installed"},
		"v1 not served":                  {crd: crd(false, true), mapper: known, want: notServed, wantWhy: "does not serve v1"},
		"not established":                {crd: crd(true, false), mapper: known, want: notServed, wantWhy: "is not established"},
		"discovery does not show it yet": {crd: crd(true, true), mapper: unknown, want: notServedYet},
		"served":                         {crd: crd(true, true), mapper: known, want: served},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b := fake.NewClientBuilder().WithScheme(scheme)
			if tc.crd != nil {
				b = b.WithObjects(tc.crd)
			}
			m := &ServiceMonitors{CRDs: b.Build(), Mapper: tc.mapper}
			got, why, err := m.served(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || !strings.Contains(why, tc.wantWhy) {
				t.Errorf("served %v (%q), want %v (%q)", got, why, tc.want, tc.wantWhy)
			}
		})
	}
	var none *ServiceMonitors
	if got, _, _ := none.served(t.Context()); got != notServed {
		t.Errorf("without ServiceMonitors: %v, want not served", got)
	}
}
