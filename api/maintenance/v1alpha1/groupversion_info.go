// Package v1alpha1 holds the maintenance.nvidia.com/v1alpha1 API:
// NodeMaintenance and MaintenanceOperatorConfig, wire-compatible with the
// NVIDIA Maintenance Operator so that its clients work unchanged.
//
// +kubebuilder:object:generate=true
// +groupName=maintenance.nvidia.com
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "maintenance.nvidia.com", Version: "v1alpha1"}
	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
