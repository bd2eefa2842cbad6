package deploy

import (
	"os"
	"path/filepath"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// previousChart is the chart as it was released before its CRDs became
// templates: `git archive cd2a234 charts/gpufleet` packaged with `helm
// package` (version 0.1.0). Its CRDs are in crds/, and its
// MaintenanceOperatorConfig has no spec.maintenanceWindows.
const previousChart = "testdata/gpufleet-0.1.0-cd2a234.tgz"

var mocGVR = schema.GroupVersionResource{Group: "maintenance.nvidia.com", Version: "v1alpha1", Resource: "maintenanceoperatorconfigs"}

// withWindows is a MaintenanceOperatorConfig that sets spec.maintenanceWindows.
func withWindows(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "maintenance.nvidia.com/v1alpha1",
		"kind":       "MaintenanceOperatorConfig",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{
			"maxParallelOperations": int64(2),
			"maintenanceWindows": []any{
				map[string]any{"name": "nights", "schedule": "0 1 * * *", "duration": "4h", "timeZone": "Europe/Berlin"},
			},
		},
	}}
}

func windowsOf(t *testing.T, dyn dynamic.Interface, name string) []any {
	t.Helper()
	u, err := dyn.Resource(mocGVR).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, _, _ := unstructured.NestedSlice(u.Object, "spec", "maintenanceWindows")
	return w
}

// TestHelmUpgradeUpgradesTheCRDs installs the previous chart (CRDs in
// crds/, which Helm never upgrades), then upgrades as docs/install.md says:
// `helm upgrade --install gpufleet-crds` (the CRDs as templates; the first
// time with --take-ownership, since Helm's crds/ left them without a
// release) and `helm upgrade gpufleet`. The new field of the
// MaintenanceOperatorConfig CRD, spec.maintenanceWindows, is pruned before
// and accepted and kept after — in the config the gpufleet chart renders
// and in one a user creates. `helm uninstall` of both releases leaves the
// CRDs and the users' objects in place.
func TestHelmUpgradeUpgradesTheCRDs(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local cluster (run without -short)")
	}
	old, err := filepath.Abs(previousChart)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); err != nil {
		t.Fatal(err)
	}
	cluster := startCluster(t)
	ctx := t.Context()
	dyn := dynamic.NewForConfigOrDie(cluster.Config)
	kc := "--kubeconfig=" + cluster.Kubeconfig

	helmRun(t, "install", "gpufleet", old, "--namespace", ns, "--create-namespace", kc)
	// The previous CRD does not know the field: the API server drops it.
	if _, err := dyn.Resource(mocGVR).Namespace(ns).Create(ctx, withWindows("before"), metav1.CreateOptions{FieldValidation: "Ignore"}); err != nil {
		t.Fatal(err)
	}
	if w := windowsOf(t, dyn, "before"); len(w) != 0 {
		t.Fatalf("the previous chart's CRD kept spec.maintenanceWindows (%v): this test no longer starts from a CRD without it", w)
	}

	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`maintenanceOperatorConfig:
  create: true
  spec:
    maxParallelOperations: 1
    maintenanceWindows:
    - {name: weekends, schedule: "0 0 * * 6", duration: 48h}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The previous chart's CRDs were created by Helm's crds/ mechanism,
	// which leaves them without a release's ownership metadata: the first
	// install of gpufleet-crds adopts them.
	helmRun(t, "upgrade", "--install", "gpufleet-crds", crdChartDir(t), "--namespace", ns, kc, "--take-ownership")
	helmRun(t, "upgrade", "gpufleet", chartDir(t), "--namespace", ns, kc, "-f", values)
	// The gpufleet chart's own config.
	if w := windowsOf(t, dyn, "default"); len(w) != 1 {
		t.Errorf("after helm upgrade the chart's MaintenanceOperatorConfig has maintenanceWindows %v, want the one of the values", w)
	}
	// A user's config, under strict field validation.
	if _, err := dyn.Resource(mocGVR).Namespace(ns).Create(ctx, withWindows("after"), metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatalf("after helm upgrade a MaintenanceOperatorConfig with maintenanceWindows is refused: %v", err)
	}
	if w := windowsOf(t, dyn, "after"); len(w) != 1 {
		t.Errorf("after helm upgrade maintenanceWindows is %v, want one window", w)
	}
	// Later upgrades need nothing more.
	helmRun(t, "upgrade", "--install", "gpufleet-crds", crdChartDir(t), "--namespace", ns, kc)
	crds := dyn.Resource(crdGVR)
	for _, name := range []string{"maintenanceoperatorconfigs.maintenance.nvidia.com", "nodemaintenances.maintenance.nvidia.com"} {
		crd, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" || crd.GetAnnotations()["meta.helm.sh/release-name"] != "gpufleet-crds" {
			t.Errorf("CRD %s annotations %v: want helm.sh/resource-policy=keep, owned by the release", name, crd.GetAnnotations())
		}
	}

	// --no-hooks: the pre-delete hook's Job cannot run on the simulated
	// nodes (TestHelmUninstallLeavesNoNodeCordoned runs its binary itself).
	for _, release := range []string{"gpufleet", "gpufleet-crds"} {
		helmRun(t, "uninstall", release, "--namespace", ns, kc, "--wait", "--no-hooks")
	}
	if _, err := crds.Get(ctx, "maintenanceoperatorconfigs.maintenance.nvidia.com", metav1.GetOptions{}); err != nil {
		t.Errorf("helm uninstall removed the CRD: %v", err)
	}
	if _, err := dyn.Resource(mocGVR).Namespace(ns).Get(ctx, "after", metav1.GetOptions{}); apierrors.IsNotFound(err) {
		t.Error("helm uninstall removed a user's MaintenanceOperatorConfig")
	} else if err != nil {
		t.Fatal(err)
	}
}
