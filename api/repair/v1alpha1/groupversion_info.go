// Package v1alpha1 holds gpufleet's auto-repair API (repair.gpufleet.dev):
// NodeRepairPolicy (what counts as a fault and how to repair it) and
// NodeRepair (one repair and its timeline).
//
// +kubebuilder:object:generate=true
// +groupName=repair.gpufleet.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "repair.gpufleet.dev", Version: "v1alpha1"}
	// SchemeBuilder collects what adds these types to a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})
	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// register adds objs to this group's types in a scheme.
func register(objs ...runtime.Object) {
	SchemeBuilder.Register(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, objs...)
		return nil
	})
}
