// Package crdswap plays what a Helm user of NVIDIA's GPU Operator does to
// switch to gpufleet's ClusterPolicy and NVIDIADriver CRDs, on the local
// cluster with the real helm and kubectl binaries (bin/).
package crdswap

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/operator"
)

const ns = "gpu-operator"

// olderFields are what the stand-in GPU Operator chart's CRDs lack of
// gpufleet's, by CRD.
var olderFields = map[string][]string{
	gpustack.ClusterPolicyCRD: {"spec.driver.kernelModuleType", "status.components"},
	gpustack.NVIDIADriverCRD:  {"spec.kernelModuleType"},
}

var versions = map[string]string{gpustack.ClusterPolicyCRD: "v1", gpustack.NVIDIADriverCRD: "v1alpha1"}

// TestGPUOperatorHelmUserSwapsTheCRDs: a stand-in of the GPU Operator's
// chart installs older ClusterPolicy and NVIDIADriver CRDs from its crds/
// folder (no release ownership), and a ClusterPolicy is created. Then, as
// docs/switching.md says:
//
//   - `helm upgrade --install gpufleet-crds --take-ownership` adopts both
//     CRDs (the release's annotations and labels) and installs gpufleet's
//     schema; the ClusterPolicy stays, with its spec.
//   - gpufleet, running, reports the schema as current; the GPU Operator
//     chart's upgrade hook re-applying its CRDs (played with kubectl) is
//     reported by SchemaCurrent=False and one Warning event.
//   - the no-Helm path, `kubectl apply --server-side --force-conflicts -f
//     charts/gpufleet/crds/`, puts gpufleet's schema back over the
//     Helm-owned CRDs, and the report goes; a later `helm upgrade` of
//     gpufleet-crds still works.
func TestGPUOperatorHelmUserSwapsTheCRDs(t *testing.T) {
	devtest.NeedCluster(t)
	helm, kubectl := binary(t, "helm"), binary(t, "kubectl")
	root, err := devcluster.SourceRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	cluster, err := devcluster.Start(ctx, devcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	if err := cluster.AddNodes(ctx, devcluster.GPUNodes(2, 1)...); err != nil {
		t.Fatal(err)
	}
	scheme, err := operator.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	kc := "--kubeconfig=" + cluster.Kubeconfig
	own, err := gpustack.OwnCRDs()
	if err != nil {
		t.Fatal(err)
	}

	// The GPU Operator's chart: its CRDs in crds/, installed by helm
	// install, without release ownership.
	chart := standInChart(t, own)
	run(t, helm, "install", "gpu-operator", chart, "--namespace", ns, "--create-namespace", kc)
	for name := range olderFields {
		crd := waitEstablished(t, kube, name)
		if missing := gpustack.CRDMissingFields(own[name], crd, versions[name]); !equal(missing, olderFields[name]) {
			t.Fatalf("the stand-in chart's %s lacks %v, want %v", name, missing, olderFields[name])
		}
		if crd.Annotations["meta.helm.sh/release-name"] != "" {
			t.Fatalf("the stand-in chart's %s is owned by a release: %v", name, crd.Annotations)
		}
	}
	policy := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cluster-policy"}}
	policy.Spec.Driver.Enabled = ptr.To(true)
	policy.Spec.Driver.Version = "570.172.08"
	policy.Spec.DevicePlugin.Enabled = ptr.To(true)
	if err := kube.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}

	// gpufleet-crds takes the CRDs over.
	run(t, helm, "upgrade", "--install", "gpufleet-crds", filepath.Join(root, "charts", "gpufleet-crds"), "--namespace", ns, kc, "--take-ownership")
	for name := range olderFields {
		crd := waitEstablished(t, kube, name)
		if crd.Annotations["meta.helm.sh/release-name"] != "gpufleet-crds" || crd.Annotations["meta.helm.sh/release-namespace"] != ns ||
			crd.Labels["app.kubernetes.io/managed-by"] != "Helm" {
			t.Errorf("after helm upgrade --install gpufleet-crds --take-ownership, %s has annotations %v, labels %v: want the release's",
				name, crd.Annotations, crd.Labels)
		}
		if missing := gpustack.CRDMissingFields(own[name], crd, versions[name]); len(missing) != 0 {
			t.Errorf("after helm upgrade --install gpufleet-crds, %s still lacks %v", name, missing)
		}
	}
	got := &nvidiav1.ClusterPolicy{}
	if err := kube.Get(ctx, client.ObjectKeyFromObject(policy), got); err != nil {
		t.Fatalf("the ClusterPolicy after the swap: %v", err)
	}
	if got.UID != policy.UID || got.Spec.Driver.Version != policy.Spec.Driver.Version || !ptr.Deref(got.Spec.DevicePlugin.Enabled, false) {
		t.Errorf("the ClusterPolicy changed in the swap: %+v", got.Spec.Driver)
	}

	// gpufleet, with the operator's generated RBAC.
	cfg, err := cluster.OperatorConfig(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	devtest.StartOperator(t, cfg, operator.Options{Namespace: ns, Capabilities: []string{"gpustack"}})
	waitSchemaCurrent(t, kube, metav1.ConditionTrue)

	// The GPU Operator chart's CRD upgrade hook re-applies its CRDs.
	run(t, kubectl, kc, "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(chart, "crds"))
	c := waitSchemaCurrent(t, kube, metav1.ConditionFalse)
	for _, f := range olderFields[gpustack.ClusterPolicyCRD] {
		if !strings.Contains(c.Message, f) {
			t.Errorf("SchemaCurrent does not name %s: %s", f, c.Message)
		}
	}
	if c.Reason != gpustack.ReasonOlderSchemaInstalled {
		t.Errorf("SchemaCurrent reason %s", c.Reason)
	}
	// The driver is the policy's (not NVIDIADrivers'): the NVIDIADriver
	// CRD is not reported.
	if strings.Contains(c.Message, gpustack.NVIDIADriverCRD) {
		t.Errorf("SchemaCurrent reports the NVIDIADriver CRD, not in use: %s", c.Message)
	}
	waitWarnings(t, cluster, 1)

	// Without Helm: gpufleet's CRDs applied over the Helm-owned ones.
	run(t, kubectl, kc, "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(root, "charts", "gpufleet", "crds"))
	waitSchemaCurrent(t, kube, metav1.ConditionTrue)
	for name := range olderFields {
		crd := waitEstablished(t, kube, name)
		if missing := gpustack.CRDMissingFields(own[name], crd, versions[name]); len(missing) != 0 {
			t.Errorf("after kubectl apply, %s still lacks %v", name, missing)
		}
		if crd.Annotations["meta.helm.sh/release-name"] != "gpufleet-crds" {
			t.Errorf("kubectl apply took %s from the gpufleet-crds release: %v", name, crd.Annotations)
		}
	}
	// A later upgrade of gpufleet-crds needs no flag.
	run(t, helm, "upgrade", "--install", "gpufleet-crds", filepath.Join(root, "charts", "gpufleet-crds"), "--namespace", ns, kc)
	if n := warnings(t, cluster); n != 1 {
		t.Errorf("%d %s events after gpufleet's schema came back, want still 1", n, gpustack.ReasonOlderSchemaInstalled)
	}
}

// standInChart writes a chart named gpu-operator into a temporary folder
// whose crds/ hold gpufleet's ClusterPolicy and NVIDIADriver CRDs without
// olderFields: the GPU Operator's chart as far as its CRDs go.
func standInChart(t *testing.T, own map[string]*apiextensionsv1.CustomResourceDefinition) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "gpu-operator")
	files := map[string]string{
		"Chart.yaml": "apiVersion: v2\nname: gpu-operator\nversion: 26.7.0-standin\nappVersion: v26.7.0\n",
		"templates/configmap.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpu-operator-standin\n" +
			"  namespace: {{ .Release.Namespace }}\ndata:\n  upgradeCRD: \"true\"\n",
	}
	for name, fields := range olderFields {
		crd := own[name].DeepCopy()
		for i := range crd.Spec.Versions {
			for _, f := range fields {
				if !deleteProperty(crd.Spec.Versions[i].Schema.OpenAPIV3Schema, strings.Split(f, ".")) {
					t.Fatalf("gpufleet's %s has no %s", name, f)
				}
			}
		}
		data, err := yaml.Marshal(crd)
		if err != nil {
			t.Fatal(err)
		}
		files["crds/"+name+".yaml"] = string(data)
	}
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func deleteProperty(s *apiextensionsv1.JSONSchemaProps, path []string) bool {
	child, ok := s.Properties[path[0]]
	switch {
	case !ok:
		return false
	case len(path) == 1:
		delete(s.Properties, path[0])
		return true
	}
	found := deleteProperty(&child, path[1:])
	s.Properties[path[0]] = child
	return found
}

func equal(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

// binary is bin/<name>; missing, the test fails with the command that
// builds it.
func binary(t *testing.T, name string) string {
	t.Helper()
	dir, err := devcluster.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, name)
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s not built: run `make tools` (hack/build-tools.sh %s)", bin, name)
	}
	return bin
}

// run runs a binary (helm with its state in a temporary folder) and fails
// the test if it fails.
func run(t *testing.T, bin string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v: %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
}

func waitEstablished(t *testing.T, kube client.Client, name string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := kube.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return false, nil //nolint:nilerr // retried
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD %s not established: %v", name, err)
	}
	return crd
}

// waitSchemaCurrent waits for the ClusterPolicy's SchemaCurrent condition
// to have status s and returns it.
func waitSchemaCurrent(t *testing.T, kube client.Client, s metav1.ConditionStatus) *metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		p := &nvidiav1.ClusterPolicy{}
		if err := kube.Get(ctx, client.ObjectKey{Name: "cluster-policy"}, p); err != nil {
			return false, err
		}
		c = meta.FindStatusCondition(p.Status.Conditions, gpustack.ConditionSchemaCurrent)
		return c != nil && c.Status == s, nil
	})
	if err != nil {
		t.Fatalf("SchemaCurrent never %s: %v (last %+v)", s, err, c)
	}
	return c
}

// waitWarnings waits until there are want OlderSchemaInstalled events.
func waitWarnings(t *testing.T, cluster *devcluster.Cluster, want int) {
	t.Helper()
	n := 0
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		n = warnings(t, cluster)
		return n == want, nil
	})
	if err != nil {
		t.Errorf("%d %s Warning events, want %d", n, gpustack.ReasonOlderSchemaInstalled, want)
	}
}

// warnings counts the OlderSchemaInstalled events.
func warnings(t *testing.T, cluster *devcluster.Cluster) int {
	t.Helper()
	evs, err := cluster.Client.EventsV1().Events("").List(t.Context(), metav1.ListOptions{FieldSelector: "reason=" + gpustack.ReasonOlderSchemaInstalled})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.Type == "Warning" && e.Regarding.Name == "cluster-policy" {
			n++
		}
	}
	return n
}
