package v1_test

import (
	"encoding/json"
	"os"
	"testing"

	"sigs.k8s.io/yaml"
)

// kubectl's client-side apply stores the whole object in an annotation,
// and annotations are limited to 256 KiB: a larger CRD could no longer be
// installed with `kubectl apply -f config/crd/bases`.
func TestClusterPolicyCRDFitsKubectlApply(t *testing.T) {
	const annotationLimit = 256 * 1024
	data, err := os.ReadFile("../../../config/crd/bases/nvidia.com_clusterpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	compact, err := json.Marshal(crd)
	if err != nil {
		t.Fatal(err)
	}
	if len(compact) >= annotationLimit {
		t.Errorf("the ClusterPolicy CRD is %d bytes as JSON, kubectl apply's last-applied annotation takes at most %d", len(compact), annotationLimit)
	}
	t.Logf("ClusterPolicy CRD: %d bytes as JSON (limit %d)", len(compact), annotationLimit)
}
