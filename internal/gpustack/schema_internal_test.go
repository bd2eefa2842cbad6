package gpustack

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// The status the Reconciler compares with the one it read is the one the
// API server keeps: without the fields the served schema lacks (else
// every pass under an older schema writes it again).
func TestServedStatusLeavesOutWhatTheServedSchemaLacks(t *testing.T) {
	full := &nvidiav1.ClusterPolicyStatus{State: nvidiav1.StateReady, Namespace: "gpu-operator", ObservedGeneration: 3,
		Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "R", ObservedGeneration: 3}},
		Components: []nvidiav1.ComponentStatus{{Name: Driver, Enabled: true, NodesDesired: 2, NodesReady: 2}}}
	for name, tc := range map[string]struct {
		reports []SchemaReport
		want    func(*nvidiav1.ClusterPolicyStatus)
	}{
		"nothing missing": {want: func(*nvidiav1.ClusterPolicyStatus) {}},
		"spec fields only": {reports: []SchemaReport{{CRD: ClusterPolicyCRD, Missing: []string{"spec.driver.kernelModuleType"}}},
			want: func(*nvidiav1.ClusterPolicyStatus) {}},
		"the NVIDIADriver CRD's status fields are not the policy's": {reports: []SchemaReport{{CRD: NVIDIADriverCRD, Missing: []string{"status.components"}}},
			want: func(*nvidiav1.ClusterPolicyStatus) {}},
		"status fields": {reports: []SchemaReport{{CRD: ClusterPolicyCRD, Missing: []string{"spec.x", "status.components", "status.conditions[].observedGeneration", "status.observedGeneration"}}},
			want: func(s *nvidiav1.ClusterPolicyStatus) {
				s.Components, s.ObservedGeneration, s.Conditions[0].ObservedGeneration = nil, 0, 0
			}},
		"the whole status": {reports: []SchemaReport{{CRD: ClusterPolicyCRD, Missing: []string{"status"}}},
			want: func(s *nvidiav1.ClusterPolicyStatus) { *s = nvidiav1.ClusterPolicyStatus{} }},
	} {
		t.Run(name, func(t *testing.T) {
			in := full.DeepCopy()
			got, err := servedStatus(in, tc.reports)
			if err != nil {
				t.Fatal(err)
			}
			want := full.DeepCopy()
			tc.want(want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(full, in); diff != "" {
				t.Errorf("the status passed in was changed:\n%s", diff)
			}
		})
	}
}

func TestStripSchemaCRDKeepsTheVersionsSchemas(t *testing.T) {
	schema := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object"}}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: ClusterPolicyCRD, UID: "u", ResourceVersion: "5", Generation: 2,
			Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "helm"}}},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "nvidia.com", Scope: apiextensionsv1.ClusterScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true, Schema: schema,
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{{Name: "State"}}}}},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{StoredVersions: []string{"v1"}},
	}
	got, err := stripSchemaCRD(crd)
	if err != nil {
		t.Fatal(err)
	}
	want := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: ClusterPolicyCRD, UID: "u", ResourceVersion: "5", Generation: 2},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "nvidia.com", Scope: apiextensionsv1.ClusterScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true, Schema: schema}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
