// Package v1 holds the nvidia.com/v1 API: ClusterPolicy, accepted as the
// NVIDIA GPU Operator's clients write it.
//
// +kubebuilder:object:generate=true
// +groupName=nvidia.com
package v1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "nvidia.com", Version: "v1"}
	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
