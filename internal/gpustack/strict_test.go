package gpustack_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// strictDryRunCreate creates the YAML document as kubectl does by default:
// untyped, with strict field validation (an unknown field is an error),
// here as a dry run. (client.FieldValidation, not CreateOptions.Raw: the
// client overwrites Raw.FieldValidation with its own field.)
func strictDryRunCreate(t *testing.T, doc []byte) error {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(doc, &u.Object); err != nil {
		t.Fatalf("test YAML: %v", err)
	}
	u.SetName("")
	u.SetGenerateName("strict-")
	return k8s.Create(t.Context(), u, client.DryRunAll, client.FieldValidation(metav1.FieldValidationStrict))
}

// The ClusterPolicy of the gpu-operator chart's defaults, one with the
// options its users commonly set, GPU Operator 1.6's and the examples apply under
// kubectl's strict field validation.
func TestClusterPolicyStrictFieldValidation(t *testing.T) {
	devtest.NeedCluster(t)
	files := []string{"testdata/clusterpolicy-chart-default.yaml", "testdata/clusterpolicy-common-options.yaml", "testdata/gpu-operator-1.6-clusterpolicy.yaml"}
	examples, err := filepath.Glob("../../examples/clusterpolicy*.yaml")
	if err != nil || len(examples) == 0 {
		t.Fatalf("examples: %v %v", examples, err)
	}
	for _, f := range append(files, examples...) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := strictDryRunCreate(t, data); err != nil {
				t.Errorf("rejected under strict field validation: %v", err)
			}
		})
	}
	t.Run("an unknown field is rejected (the validation is strict)", func(t *testing.T) {
		data, err := os.ReadFile("testdata/clusterpolicy-chart-default.yaml")
		if err != nil {
			t.Fatal(err)
		}
		doc := strings.Replace(string(data), "  psa:\n", "  frobnicator:\n    enabled: true\n  psa:\n", 1)
		err = strictDryRunCreate(t, []byte(doc))
		if err == nil || !strings.Contains(err.Error(), `unknown field "spec.frobnicator"`) {
			t.Errorf("got %v, want the unknown field spec.frobnicator rejected", err)
		}
	})
}

// A policy enabling vGPU is accepted; its status says precisely which
// field gpufleet does not provide, once, and clears when it is disabled.
func TestReconcileReportsUnsupportedFields(t *testing.T) {
	d := newDirect(t)
	p := createPolicy(t, "cluster-policy", func(p *nvidiav1.ClusterPolicy) { p.Spec.VGPUManager.Enabled = ptr.To(true) })
	first := d.reconcile(p.Name)
	if first.err != nil {
		t.Fatalf("reconcile: %v", first)
	}
	got := getPolicy(t, p.Name)
	c := meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionUnsupportedFields)
	want := "not supported by gpufleet, accepted and not deployed: spec.vgpuManager.enabled (NVIDIA vGPU host driver)"
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != gpustack.ReasonUnsupportedFields || c.Message != want || c.ObservedGeneration != got.Generation {
		t.Errorf("condition %+v, want True %s %q at generation %d", c, gpustack.ReasonUnsupportedFields, want, got.Generation)
	}
	if ev := first.eventsWith(gpustack.ReasonUnsupportedFields); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning ") || !strings.Contains(ev[0], "spec.vgpuManager.enabled") {
		t.Errorf("want one UnsupportedFields Warning naming the field: %v", first.events)
	}
	// The stack it does provide is deployed all the same.
	if first.count("Create", "DaemonSet") == 0 {
		t.Errorf("no DaemonSet created: %s", first)
	}
	if again := d.reconcile(p.Name); len(again.eventsWith(gpustack.ReasonUnsupportedFields)) != 0 || again.statusWrites() > 1 {
		t.Errorf("the unchanged report was repeated: %s", again)
	}

	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := getPolicy(t, p.Name)
		cur.Spec.VGPUManager.Enabled = ptr.To(false)
		return k8s.Update(context.Background(), cur)
	})
	if err != nil {
		t.Fatal(err)
	}
	if off := d.reconcile(p.Name); off.err != nil {
		t.Fatalf("reconcile: %v", off)
	}
	got = getPolicy(t, p.Name)
	c = meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionUnsupportedFields)
	if c == nil || c.Status != metav1.ConditionFalse || c.Message != "" || c.ObservedGeneration != got.Generation {
		t.Errorf("after disabling vGPU: condition %+v, want False at generation %d", c, got.Generation)
	}
}

// createPolicyFile creates the ClusterPolicy of a YAML file.
func createPolicyFile(t *testing.T, path string) *nvidiav1.ClusterPolicy {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := &nvidiav1.ClusterPolicy{}
	if err := yamlUnmarshal(data, p); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(t.Context(), p); err != nil {
		t.Fatalf("creating %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := k8s.Delete(context.Background(), p); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting ClusterPolicy %s: %v", p.Name, err)
		}
	})
	return p
}

// The policies written for today's gpu-operator deploy the stack gpufleet
// provides: the API server takes every rendered object (rolling update,
// probes, pod security context, the driver manager, ConfigMap volumes), a
// second pass rewrites none of them, the status names each enabled field
// gpufleet does not act on, and the ServiceMonitor they ask for is reported
// as not created (this cluster has no ServiceMonitor CRD).
func TestReconcileGPUOperatorPolicies(t *testing.T) {
	for f, want := range map[string]string{
		"testdata/clusterpolicy-chart-default.yaml":  "",
		"testdata/clusterpolicy-common-options.yaml": gpustack.CommonOptionsUnsupported,
	} {
		t.Run(filepath.Base(f), func(t *testing.T) {
			d := newDirect(t)
			p := createPolicyFile(t, f)
			first := d.reconcile(p.Name)
			if first.err != nil {
				t.Fatalf("first reconcile: %s", first)
			}
			if n := first.count("Create", "DaemonSet"); n < 6 {
				t.Errorf("%d DaemonSets created, want the stack's: %s", n, first)
			}
			second := d.reconcile(p.Name)
			if second.err != nil || second.count("Update", "DaemonSet")+second.count("Update", "Service") != 0 {
				t.Errorf("second reconcile rewrote rendered objects (a field the API server stores differently): %s", second)
			}
			got := getPolicy(t, p.Name)
			c := meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionUnsupportedFields)
			if want == "" && (c == nil || c.Status != metav1.ConditionFalse) {
				t.Errorf("UnsupportedFields condition %+v, want False", c)
			}
			if want != "" && (c == nil || c.Status != metav1.ConditionTrue || c.Message != want) {
				t.Errorf("UnsupportedFields condition %+v, want True %q", c, want)
			}
			c = meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionServiceMonitor)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != gpustack.ReasonServiceMonitorNotServed ||
				!strings.Contains(c.Message, "monitoring.coreos.com/v1 ServiceMonitor (CustomResourceDefinition servicemonitors.monitoring.coreos.com is not installed)") {
				t.Errorf("ServiceMonitor condition %+v, want False: not served, the CRD is not installed", c)
			}
		})
	}
}
