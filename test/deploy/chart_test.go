package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/gpufleet/gpufleet/internal/devcluster"
)

// helmBin is bin/helm, built by `make tools`. Unit runs (-short) skip the
// chart tests when it has not been built; full runs fail.
func helmBin(t *testing.T) string {
	t.Helper()
	dir, err := devcluster.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "helm")
	if _, err := os.Stat(bin); err != nil {
		if testing.Short() {
			t.Skipf("%s not built (make tools)", bin)
		}
		t.Fatalf("%s not built: run `make tools` (hack/build-tools.sh helm)", bin)
	}
	return bin
}

func chartDir(t *testing.T) string {
	t.Helper()
	root, err := devcluster.SourceRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "charts", "gpufleet")
}

// crdChartDir is charts/gpufleet-crds: the CRDs as templates, for upgrades.
func crdChartDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(filepath.Dir(chartDir(t)), "gpufleet-crds")
}

// helmRun runs bin/helm with its state in a temporary directory and returns
// its standard output.
func helmRun(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), helmBin(t), args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes()
}

// renderChart runs `helm template` with the CRDs and the given flags.
func renderChart(t *testing.T, release string, flags ...string) []*unstructured.Unstructured {
	t.Helper()
	args := append([]string{"template", release, chartDir(t), "--namespace", ns, "--include-crds"}, flags...)
	return decodeAll(t, helmRun(t, args...))
}

func decodeAll(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatalf("decoding: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, normalized(t, m))
	}
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// withoutHooks drops Helm hooks (the pre-delete uninstall hook has no
// kustomize counterpart: `kubectl gpufleet uninstall` serves those users).
func withoutHooks(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	return slices.DeleteFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetAnnotations()["helm.sh/hook"] != "" })
}

func names(objs []*unstructured.Unstructured) map[string][]string {
	kinds := map[string][]string{}
	for _, o := range objs {
		kinds[o.GetKind()] = append(kinds[o.GetKind()], o.GetName())
	}
	for k := range kinds {
		slices.Sort(kinds[k])
	}
	return kinds
}

// TestChartMatchesTheGeneratedManifests: with the default values the chart
// ships the same objects as config/default (but the Namespace, which helm
// creates), the CRDs exactly as generated, the operator rules exactly as
// generated, and the same operator and agent containers.
func TestChartMatchesTheGeneratedManifests(t *testing.T) {
	chart := withoutHooks(renderChart(t, "gpufleet"))
	kust := render(t)
	got, want := names(chart), names(kust)
	delete(want, "Namespace")
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("chart objects %v, config/default %v", got, want)
	}
	for _, o := range chart {
		if o.GetKind() == "CustomResourceDefinition" || strings.HasPrefix(o.GetKind(), "Cluster") || strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") {
			if o.GetNamespace() != "" {
				t.Errorf("cluster-scoped %s %s has namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
			}
			continue
		}
		if o.GetNamespace() != ns {
			t.Errorf("%s %s in namespace %q, want the release namespace", o.GetKind(), o.GetName(), o.GetNamespace())
		}
	}
	for _, k := range kust {
		if k.GetKind() == "Namespace" {
			continue
		}
		c := find(chart, k.GetKind(), k.GetName())
		if c == nil {
			continue // reported above
		}
		switch k.GetKind() {
		case "CustomResourceDefinition":
			if !equality.Semantic.DeepEqual(c.Object, k.Object) {
				t.Errorf("CRD %s in the chart differs from config/crd/bases: run make generate", k.GetName())
			}
		case "ClusterRole", "Role":
			same(t, c, k, "rules")
		case "Deployment", "DaemonSet":
			for _, f := range [][]string{{"spec", "template", "spec", "securityContext"}, {"spec", "template", "spec", "hostPID"},
				{"spec", "template", "spec", "priorityClassName"}, {"spec", "template", "spec", "tolerations"}, {"spec", "replicas"}} {
				same(t, c, k, f...)
			}
			cc, kc := container(t, c), container(t, k)
			for _, f := range []string{"command", "env", "ports", "livenessProbe", "readinessProbe", "resources", "securityContext"} {
				if !equality.Semantic.DeepEqual(cc[f], kc[f]) {
					t.Errorf("%s %s container %s: chart %v, config/default %v", k.GetKind(), k.GetName(), f, cc[f], kc[f])
				}
			}
		}
	}
	dep := container(t, find(chart, "Deployment", "gpufleet-operator"))
	args, _ := dep["args"].([]any)
	for _, a := range []string{"--leader-elect", "--leader-election-id=gpufleet-operator", "--metrics-bind-address=:8080"} {
		if !slices.Contains(args, any(a)) {
			t.Errorf("operator args %v lack %s", args, a)
		}
	}
}

func same(t *testing.T, chart, kust *unstructured.Unstructured, fields ...string) {
	t.Helper()
	c, _, _ := unstructured.NestedFieldNoCopy(chart.Object, fields...)
	k, _, _ := unstructured.NestedFieldNoCopy(kust.Object, fields...)
	if !equality.Semantic.DeepEqual(c, k) {
		t.Errorf("%s %s .%s: chart %v, config/default %v", kust.GetKind(), kust.GetName(), strings.Join(fields, "."), c, k)
	}
}

func container(t *testing.T, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%s %s: %d containers", o.GetKind(), o.GetName(), len(cs))
	}
	return cs[0].(map[string]any)
}

// TestChartValues: the values users set change what they say.
func TestChartValues(t *testing.T) {
	objs := renderChart(t, "prod",
		"--set", "agent.enabled=false",
		"--set", "operator.replicas=3",
		"--set", "operator.leaderElection.enabled=false",
		"--set", "operator.capabilities={maintenance,repair}",
		"--set", "image.tag=v1.2.3",
		"--set", "maintenanceOperatorConfig.create=true",
		"--set", "maintenanceOperatorConfig.spec.maxParallelOperations=10%",
		"--set", "maintenanceOperatorConfig.spec.maxUnavailable=2",
		"--set", "uninstall.timeout=5m")
	kinds := names(withoutHooks(slices.Clone(objs)))
	if got := kinds["DaemonSet"]; len(got) != 0 {
		t.Errorf("agent disabled, DaemonSets %v", got)
	}
	if got, want := kinds["ClusterRole"], []string{"prod-gpufleet-metrics-reader", "prod-gpufleet-operator"}; !slices.Equal(got, want) {
		t.Errorf("ClusterRoles %v, want %v", got, want)
	}
	dep := find(objs, "Deployment", "prod-gpufleet-operator")
	if dep == nil {
		t.Fatalf("no Deployment prod-gpufleet-operator in %v", kinds)
	}
	if r, _, _ := unstructured.NestedInt64(dep.Object, "spec", "replicas"); r != 3 {
		t.Errorf("replicas %d, want 3", r)
	}
	c := container(t, dep)
	if c["image"] != "ghcr.io/gpufleet/gpufleet:v1.2.3" {
		t.Errorf("image %v", c["image"])
	}
	args, _ := c["args"].([]any)
	if slices.Contains(args, any("--leader-elect")) {
		t.Errorf("leader election disabled, args %v", args)
	}
	if !slices.Contains(args, any("--capabilities=maintenance,repair")) {
		t.Errorf("args %v lack the capabilities", args)
	}
	sa, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "spec", "serviceAccountName")
	if sa != "prod-gpufleet-operator" {
		t.Errorf("serviceAccountName %q", sa)
	}
	cfg := find(objs, "MaintenanceOperatorConfig", "default")
	if cfg == nil {
		t.Fatalf("no MaintenanceOperatorConfig in %v", kinds)
	}
	spec, _, _ := unstructured.NestedMap(cfg.Object, "spec")
	if want := map[string]any{"maxParallelOperations": "10%", "maxUnavailable": int64(2)}; !equality.Semantic.DeepEqual(spec, want) {
		t.Errorf("MaintenanceOperatorConfig spec %v, want %v", spec, want)
	}

	// The pre-delete hook runs the release's image against its operator.
	job := find(objs, "Job", "prod-gpufleet-uninstall")
	if job == nil || job.GetAnnotations()["helm.sh/hook"] != "pre-delete" {
		t.Fatalf("no pre-delete Job prod-gpufleet-uninstall in %v", kinds)
	}
	jc := container(t, job)
	if jc["image"] != "ghcr.io/gpufleet/gpufleet:v1.2.3" {
		t.Errorf("hook image %v", jc["image"])
	}
	jargs, _ := jc["args"].([]any)
	for _, a := range []string{"--deployment=prod-gpufleet-operator", "--lease=prod-gpufleet-operator", "--timeout=5m", "--namespace=" + ns} {
		if !slices.Contains(jargs, any(a)) {
			t.Errorf("hook args %v lack %s", jargs, a)
		}
	}
	for _, o := range renderChart(t, "prod", "--set", "uninstall.releaseNodes=false") {
		if o.GetAnnotations()["helm.sh/hook"] != "" {
			t.Errorf("uninstall.releaseNodes=false still renders hook %s %s", o.GetKind(), o.GetName())
		}
	}

	// Not created by default.
	if find(renderChart(t, "gpufleet"), "MaintenanceOperatorConfig", "default") != nil {
		t.Error("MaintenanceOperatorConfig rendered without maintenanceOperatorConfig.create")
	}

}

// TestChartAgent: the agent DaemonSet's binary, GPU sources and footprint.
// By default: /gpufleet-agent, no dcgm-exporter, the kubelet's
// pod-resources socket mounted read-only, memory sized for its measured
// RSS; agent.dcgmURL and agent.podResourcesDir change what they say.
func TestChartAgent(t *testing.T) {
	agentOf := func(objs []*unstructured.Unstructured) (*unstructured.Unstructured, map[string]any, []any) {
		t.Helper()
		ds := find(objs, "DaemonSet", "gpufleet-agent")
		if ds == nil {
			t.Fatalf("no DaemonSet gpufleet-agent in %v", names(objs))
		}
		c := container(t, ds)
		args, _ := c["args"].([]any)
		return ds, c, args
	}
	ds, c, args := agentOf(renderChart(t, "gpufleet"))
	// The agent's own binary: the one gpufleet binary would cost its
	// pages on every node.
	if want := []any{"/gpufleet-agent"}; !equality.Semantic.DeepEqual(c["command"], want) {
		t.Errorf("agent command %v, want %v", c["command"], want)
	}
	if want := []any{"--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock"}; !equality.Semantic.DeepEqual(args, want) {
		t.Errorf("default args %v, want %v", args, want)
	}
	mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
	wantMount := map[string]any{"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": true}
	wantVol := map[string]any{"name": "pod-resources", "hostPath": map[string]any{"path": "/var/lib/kubelet/pod-resources"}}
	if !equality.Semantic.DeepEqual(mounts, []any{wantMount}) || !equality.Semantic.DeepEqual(vols, []any{wantVol}) {
		t.Errorf("pod-resources: mounts %v, volumes %v", mounts, vols)
	}
	// Memory for the measured RSS of 24 MB (docs/performance.md): requested, with
	// headroom in the limit.
	req, _, _ := unstructured.NestedString(c, "resources", "requests", "memory")
	lim, _, _ := unstructured.NestedString(c, "resources", "limits", "memory")
	if req != "32Mi" || lim != "64Mi" {
		t.Errorf("agent memory request %q, limit %q; want 32Mi, 64Mi", req, lim)
	}

	ds, c, args = agentOf(renderChart(t, "gpufleet",
		"--set", "agent.dcgmURL=http://$(HOST_IP):9400/metrics", "--set", "agent.dcgmInterval=15s",
		"--set", "agent.podResourcesDir="))
	want := []any{"--dcgm-url=http://$(HOST_IP):9400/metrics", "--dcgm-interval=15s", "--pod-resources-socket="}
	if !equality.Semantic.DeepEqual(args, want) {
		t.Errorf("args %v, want %v", args, want)
	}
	// $(HOST_IP) in the URL is expanded by the kubelet from the env.
	env, _, _ := unstructured.NestedSlice(c, "env")
	hostIP := map[string]any{"name": "HOST_IP", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "status.hostIP"}}}
	if !slices.ContainsFunc(env, func(e any) bool { return equality.Semantic.DeepEqual(e, hostIP) }) {
		t.Errorf("env %v lacks HOST_IP", env)
	}
	if _, ok := c["volumeMounts"]; ok {
		t.Errorf("podResourcesDir empty, still mounts %v", c["volumeMounts"])
	}
	if v, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes"); len(v) != 0 {
		t.Errorf("podResourcesDir empty, still volumes %v", v)
	}
}

// TestCRDChart: charts/gpufleet-crds renders exactly the generated CRDs,
// with its labels and, unless keep=false, helm.sh/resource-policy: keep.
func TestCRDChart(t *testing.T) {
	var want []*unstructured.Unstructured
	for _, o := range render(t) {
		if o.GetKind() == "CustomResourceDefinition" {
			want = append(want, o)
		}
	}
	got := decodeAll(t, helmRun(t, "template", "gpufleet-crds", crdChartDir(t)))
	if g, w := names(got), names(want); !equality.Semantic.DeepEqual(g, w) {
		t.Fatalf("gpufleet-crds renders %v, config/crd/bases has %v", g, w)
	}
	for _, k := range want {
		c := find(got, k.GetKind(), k.GetName()).DeepCopy()
		if c.GetAnnotations()["helm.sh/resource-policy"] != "keep" || c.GetLabels()["app.kubernetes.io/managed-by"] != "Helm" {
			t.Errorf("CRD %s: labels %v, annotations %v; want the chart's labels and helm.sh/resource-policy: keep", k.GetName(), c.GetLabels(), c.GetAnnotations())
		}
		c.SetLabels(nil)
		a := c.GetAnnotations()
		delete(a, "helm.sh/resource-policy")
		c.SetAnnotations(a)
		if !equality.Semantic.DeepEqual(c.Object, k.Object) {
			t.Errorf("CRD %s in charts/gpufleet-crds differs from config/crd/bases: run make generate", k.GetName())
		}
	}
	for _, o := range decodeAll(t, helmRun(t, "template", "gpufleet-crds", crdChartDir(t), "--set", "keep=false")) {
		if _, ok := o.GetAnnotations()["helm.sh/resource-policy"]; ok {
			t.Errorf("keep=false: %s %s has helm.sh/resource-policy", o.GetKind(), o.GetName())
		}
	}
}

// TestChartLints runs `helm lint --strict` on both charts.
func TestChartLints(t *testing.T) {
	helmRun(t, "lint", "--strict", chartDir(t), crdChartDir(t))
}

// TestChartAndKustomizeShipTheSameAdmissionPolicies: the chart (defaults)
// and config/default (install.yaml is built from it) install the same
// ValidatingAdmissionPolicies and bindings, and the chart puts its
// release's ServiceAccounts into their matches.
func TestChartAndKustomizeShipTheSameAdmissionPolicies(t *testing.T) {
	chart, kust := names(renderChart(t, "prod")), names(render(t))
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		got, want := slices.Sorted(slices.Values(chart[kind])), slices.Sorted(slices.Values(kust[kind]))
		if !slices.Equal(got, want) || len(want) < 3 {
			t.Errorf("%s: chart %v, config/default %v", kind, got, want)
		}
	}
	for _, o := range renderChart(t, "prod") {
		if o.GetKind() != "ValidatingAdmissionPolicy" {
			continue
		}
		data, _ := json.Marshal(o.Object)
		if strings.Contains(string(data), ":gpufleet-operator')") || strings.Contains(string(data), ":gpufleet-agent')") {
			t.Errorf("%s matches the default ServiceAccount names, not the release's: %s", o.GetName(), data)
		}
	}
}
