package maintenance_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// TestMaintenanceExamplesApplyStrictly: every object of the maintenance
// examples (examples/maintenance*.yaml) is accepted by the API server as
// kubectl apply sends it, with strict field validation (a dry run).
func TestMaintenanceExamplesApplyStrictly(t *testing.T) {
	devtest.NeedCluster(t)
	files, err := filepath.Glob("../../examples/maintenance*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("examples: %v %v", files, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatalf("%s, document %d: %v", f, i, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			name := u.GetName()
			u.SetName("") // a dry-run create beside what the tests made
			u.SetGenerateName("example-")
			if err := k8s.Create(t.Context(), u, client.DryRunAll, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
				t.Errorf("%s: %s %s rejected: %v", filepath.Base(f), u.GetKind(), name, err)
			}
		}
	}
}
