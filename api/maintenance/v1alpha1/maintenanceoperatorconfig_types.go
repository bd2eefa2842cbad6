package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// DefaultConfigName is the name of the MaintenanceOperatorConfig that counts
// (in the operator's namespace).
const DefaultConfigName = "default"

// LogLevel is the operator's log level.
// +kubebuilder:validation:Enum=debug;info;error
type LogLevel string

// MaintenanceOperatorConfigSpec holds the cluster-wide maintenance limits.
type MaintenanceOperatorConfigSpec struct {
	// MaxParallelOperations is how many nodes may be in maintenance at once:
	// an integer or a percentage of all nodes ("10%", rounded up). 0 stops
	// new maintenance from starting. Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxParallelOperations must be a non-negative integer or a percentage between 0% and 100%"
	MaxParallelOperations *intstr.IntOrString `json:"maxParallelOperations,omitempty"`

	// MaxUnavailable is how many nodes may be unavailable (in maintenance,
	// cordoned or not Ready) before no new node may start maintenance: an
	// integer or a percentage of all nodes ("20%", rounded down). 0 lets
	// maintenance continue only on nodes that are already unavailable.
	// Unset: no limit.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnavailable must be a non-negative integer or a percentage between 0% and 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// LogLevel of the operator: debug, info or error. Default info.
	// +optional
	// +kubebuilder:default=info
	LogLevel LogLevel `json:"logLevel,omitempty"`

	// MaxNodeMaintenanceTimeSeconds: a NodeMaintenance that has been Ready
	// for longer is garbage-collected. 0 disables garbage collection.
	// Default 3600.
	// +optional
	// +kubebuilder:default=3600
	// +kubebuilder:validation:Minimum=0
	MaxNodeMaintenanceTimeSeconds *int32 `json:"maxNodeMaintenanceTimeSeconds,omitempty"`
}

// MaintenanceOperatorConfig configures the maintenance scheduler. Only the
// object named "default" in the operator's namespace is used.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=moc
// +kubebuilder:printcolumn:name="MaxParallel",type="string",JSONPath=`.spec.maxParallelOperations`
// +kubebuilder:printcolumn:name="MaxUnavailable",type="string",JSONPath=`.spec.maxUnavailable`
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type MaintenanceOperatorConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec MaintenanceOperatorConfigSpec `json:"spec,omitempty"`
}

// MaintenanceOperatorConfigList is a list of MaintenanceOperatorConfig.
//
// +kubebuilder:object:root=true
type MaintenanceOperatorConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MaintenanceOperatorConfig `json:"items"`
}

func init() {
	register(&MaintenanceOperatorConfig{}, &MaintenanceOperatorConfigList{})
}
