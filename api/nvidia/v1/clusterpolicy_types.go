package v1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// State is the overall state of a ClusterPolicy.
// +kubebuilder:validation:Enum=ready;notReady;ignored
type State string

// States.
const (
	StateReady    State = "ready"
	StateNotReady State = "notReady"
	StateIgnored  State = "ignored"
)

// Condition types of a ClusterPolicy.
const (
	ConditionReady       = "Ready"
	ConditionProgressing = "Progressing"
	ConditionDegraded    = "Degraded"
)

// ComponentSpec is what every GPU stack component has in common.
// +kubebuilder:validation:XValidation:rule="!has(self.enabled) || !self.enabled || !has(self.image) || size(self.image) > 0",message="image must not be empty when the component is enabled"
type ComponentSpec struct {
	// Enabled deploys the component. Default true.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// Repository is the image registry path, e.g. "nvcr.io/nvidia".
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Repository string `json:"repository,omitempty"`
	// Image is the image name, e.g. "k8s-device-plugin".
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Image string `json:"image,omitempty"`
	// Version is the image tag (or digest starting with "sha256:").
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Version string `json:"version,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// +optional
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
	// +optional
	Args []string `json:"args,omitempty"`
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// NodeSelector narrows the nodes (on top of the GPU deploy label).
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// SecurityContext of the main container (accepted as the NVIDIA operator
	// writes it; privileged components are privileged regardless).
	// +optional
	SecurityContext *corev1.SecurityContext `json:"securityContext,omitempty"`
}

// IsEnabled reports whether the component is enabled (default true).
func (c *ComponentSpec) IsEnabled() bool { return c == nil || c.Enabled == nil || *c.Enabled }

// DriverSpec configures the driver installer.
type DriverSpec struct {
	ComponentSpec `json:",inline"`
	// UpgradePolicy governs driver upgrades.
	// +optional
	UpgradePolicy *DriverUpgradePolicySpec `json:"upgradePolicy,omitempty"`
	// LicensingConfig and RepoConfig are accepted for compatibility.
	// +optional
	LicensingConfig *ConfigMapRef `json:"licensingConfig,omitempty"`
	// +optional
	RepoConfig *ConfigMapRef `json:"repoConfig,omitempty"`
}

// ConfigMapRef names a ConfigMap (NVIDIA operator compatibility).
type ConfigMapRef struct {
	// +optional
	ConfigMapName string `json:"configMapName,omitempty"`
	// +optional
	DestinationDir string `json:"destinationDir,omitempty"`
}

// DriverUpgradePolicySpec says how driver version changes roll out.
type DriverUpgradePolicySpec struct {
	// AutoUpgrade rolls a new driver version out node by node through
	// NodeMaintenance. Default true.
	// +optional
	AutoUpgrade *bool `json:"autoUpgrade,omitempty"`
	// MaxParallelUpgrades limits nodes upgrading at once. Default 1.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxParallelUpgrades *int32 `json:"maxParallelUpgrades,omitempty"`
	// MaxUnavailable limits nodes made unavailable by upgrades.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnavailable must be a non-negative integer or a percentage between 0% and 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// Drain settings for the upgrade's NodeMaintenance.
	// +optional
	Drain *UpgradeDrainSpec `json:"drain,omitempty"`
}

// UpgradeDrainSpec is the drain part of an upgrade.
type UpgradeDrainSpec struct {
	// +optional
	Enable *bool `json:"enable,omitempty"`
	// +optional
	Force bool `json:"force,omitempty"`
	// +optional
	PodSelector string `json:"podSelector,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`
	// +optional
	DeleteEmptyDir bool `json:"deleteEmptyDir,omitempty"`
}

// ToolkitSpec configures the container toolkit.
type ToolkitSpec struct {
	ComponentSpec `json:",inline"`
	// InstallDir on the host. Default /usr/local/nvidia.
	// +optional
	InstallDir string `json:"installDir,omitempty"`
}

// DevicePluginSpec configures the device plugin.
type DevicePluginSpec struct {
	ComponentSpec `json:",inline"`
}

// GFDSpec configures GPU feature discovery.
type GFDSpec struct {
	ComponentSpec `json:",inline"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	DiscoveryIntervalSeconds *int32 `json:"discoveryIntervalSeconds,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=none;single;mixed
	MigStrategy string `json:"migStrategy,omitempty"`
}

// OperatorSpec holds operator-wide settings.
type OperatorSpec struct {
	// DefaultRuntime is used for nodes whose runtime cannot be detected.
	// +optional
	// +kubebuilder:validation:Enum=docker;containerd;crio
	DefaultRuntime string `json:"defaultRuntime,omitempty"`
	// Validator is the NVIDIA operator 1.x place of the validator image.
	// +optional
	Validator *ComponentSpec `json:"validator,omitempty"`
}

// DaemonsetsSpec holds settings common to every DaemonSet.
type DaemonsetsSpec struct {
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// UpdateStrategy: RollingUpdate or OnDelete. Default RollingUpdate
	// (the driver always uses OnDelete: it is replaced through maintenance).
	// +optional
	// +kubebuilder:validation:Enum=RollingUpdate;OnDelete
	UpdateStrategy string `json:"updateStrategy,omitempty"`
}

// ClusterPolicySpec is the desired GPU software stack.
type ClusterPolicySpec struct {
	// +optional
	Operator OperatorSpec `json:"operator,omitempty"`
	// +optional
	Daemonsets DaemonsetsSpec `json:"daemonsets,omitempty"`
	// +optional
	Driver DriverSpec `json:"driver,omitempty"`
	// +optional
	Toolkit ToolkitSpec `json:"toolkit,omitempty"`
	// +optional
	DevicePlugin DevicePluginSpec `json:"devicePlugin,omitempty"`
	// +optional
	Validator ComponentSpec `json:"validator,omitempty"`
	// +optional
	DCGM ComponentSpec `json:"dcgm,omitempty"`
	// +optional
	DCGMExporter ComponentSpec `json:"dcgmExporter,omitempty"`
	// +optional
	GFD GFDSpec `json:"gfd,omitempty"`
	// MIGManager is off unless enabled.
	// +optional
	MIGManager ComponentSpec `json:"migManager,omitempty"`
	// NodeStatusExporter is off unless enabled.
	// +optional
	NodeStatusExporter ComponentSpec `json:"nodeStatusExporter,omitempty"`
}

// ComponentStatus is the rollout state of one component.
type ComponentStatus struct {
	Name    string `json:"name"`
	Enabled bool   `json:"enabled"`
	// NodesDesired is how many nodes should run it.
	NodesDesired int32 `json:"nodesDesired"`
	// NodesReady is how many run it Ready.
	NodesReady int32 `json:"nodesReady"`
	// Message names up to a few nodes that are not ready.
	// +optional
	Message string `json:"message,omitempty"`
}

// ClusterPolicyStatus is the observed state.
type ClusterPolicyStatus struct {
	// +optional
	State State `json:"state,omitempty"`
	// Namespace the stack is deployed in.
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Components in deployment order.
	// +optional
	// +listType=map
	// +listMapKey=name
	Components []ComponentStatus `json:"components,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// ClusterPolicy deploys the GPU software stack on the cluster's GPU nodes.
// Only the oldest ClusterPolicy is active; others are ignored.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="State",type="string",JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type ClusterPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterPolicySpec   `json:"spec,omitempty"`
	Status ClusterPolicyStatus `json:"status,omitempty"`
}

// ClusterPolicyList is a list of ClusterPolicy.
//
// +kubebuilder:object:root=true
type ClusterPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterPolicy `json:"items"`
}

func init() {
	register(&ClusterPolicy{}, &ClusterPolicyList{})
}
