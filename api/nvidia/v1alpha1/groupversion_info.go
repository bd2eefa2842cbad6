// Package v1alpha1 holds the nvidia.com/v1alpha1 API, accepted as the
// NVIDIA GPU Operator's clients write it: NVIDIADriver, one driver per
// node pool, and GPUCluster, the stack of a cluster that allocates its
// GPUs through Dynamic Resource Allocation.
//
// +kubebuilder:object:generate=true
// +groupName=nvidia.com
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "nvidia.com", Version: "v1alpha1"}
	// SchemeBuilder collects what adds these types to a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		metav1.AddToGroupVersion(s, GroupVersion)
		s.AddKnownTypes(GroupVersion, &NVIDIADriver{}, &NVIDIADriverList{}, &GPUCluster{}, &GPUClusterList{})
		return nil
	})
	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
