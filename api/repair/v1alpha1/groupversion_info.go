// Package v1alpha1 holds gpufleet's auto-repair API (repair.gpufleet.dev):
// NodeRepairPolicy (what counts as a fault and how to repair it) and
// NodeRepair (one repair and its timeline).
//
// +kubebuilder:object:generate=true
// +groupName=repair.gpufleet.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "repair.gpufleet.dev", Version: "v1alpha1"}
	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
