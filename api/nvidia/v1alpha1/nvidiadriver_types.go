package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// DriverType is the kind of driver an NVIDIADriver deploys. gpufleet
// deploys "gpu"; "vgpu" and "vgpu-host-manager" are accepted and reported
// as not supported.
type DriverType string

// Driver types.
const (
	DriverTypeGPU             DriverType = "gpu"
	DriverTypeVGPU            DriverType = "vgpu"
	DriverTypeVGPUHostManager DriverType = "vgpu-host-manager"
)

// State of an NVIDIADriver (gpu-operator's values).
// +kubebuilder:validation:Enum=ignored;ready;notReady;disabled
type State string

// States.
const (
	StateReady    State = "ready"
	StateNotReady State = "notReady"
	StateDisabled State = "disabled"
)

// NVIDIADriver condition types (besides Ready).
const (
	// ConditionConflict: some nodes are selected by this and another
	// NVIDIADriver; they get neither driver and are named in the message.
	ConditionConflict = "Conflict"
)

// NVIDIADriverSpec is one driver for the GPU nodes its nodeSelector picks
// (or, for the default driver, the GPU nodes no other NVIDIADriver picks).
// Fields gpufleet does not act on are accepted and reported in the
// UnsupportedFields condition when set.
//
// +kubebuilder:validation:XValidation:rule="has(self.default) && self.default ? !has(self.nodeSelector) || size(self.nodeSelector) == 0 : true",message="default NVIDIADriver must not use nodeSelector"
type NVIDIADriverSpec struct {
	// Default makes this the driver of the GPU nodes that no other
	// NVIDIADriver's nodeSelector matches.
	// +kubebuilder:default=false
	// +optional
	Default bool `json:"default"`
	// DriverType: gpu (deployed); vgpu and vgpu-host-manager are not
	// supported by gpufleet.
	// +kubebuilder:validation:Enum=gpu;vgpu;vgpu-host-manager
	// +kubebuilder:default=gpu
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="driverType is immutable: create a new NVIDIADriver instead"
	// +optional
	DriverType DriverType `json:"driverType"`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="usePrecompiled is immutable: create a new NVIDIADriver instead"
	// +optional
	UsePrecompiled *bool `json:"usePrecompiled,omitempty"`
	// Deprecated upstream in favour of kernelModuleType.
	// +optional
	UseOpenKernelModules *bool `json:"useOpenKernelModules,omitempty"`
	// +kubebuilder:validation:Enum=auto;open;proprietary
	// +kubebuilder:default=auto
	// +optional
	KernelModuleType string `json:"kernelModuleType,omitempty"`
	// +optional
	StartupProbe *nvidiav1.ContainerProbeSpec `json:"startupProbe,omitempty"`
	// LivenessProbe is accepted and not rendered (reported when set).
	// +optional
	LivenessProbe *nvidiav1.ContainerProbeSpec `json:"livenessProbe,omitempty"`
	// +optional
	ReadinessProbe *nvidiav1.ContainerProbeSpec `json:"readinessProbe,omitempty"`
	// +optional
	GPUDirectRDMA *nvidiav1.GPUDirectRDMASpec `json:"rdma,omitempty"`
	// +optional
	GPUDirectStorage *nvidiav1.OperandSpec `json:"gds,omitempty"`
	// +optional
	GDRCopy *nvidiav1.OperandSpec `json:"gdrcopy,omitempty"`
	// Repository of the driver image ("" = image is a full reference).
	// +optional
	Repository string `json:"repository,omitempty"`
	// Image name, or full reference when repository is empty.
	// +kubebuilder:default=nvcr.io/nvidia/driver
	// +optional
	Image string `json:"image"`
	// Version of the driver image (a tag; the node's OS is appended as
	// gpu-operator does, unless the image is a digest).
	// +optional
	Version string `json:"version,omitempty"`
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// +optional
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
	// Manager is the k8s-driver-manager init container (its eviction and
	// drain are always off: upgrades drain through NodeMaintenance).
	// +optional
	Manager nvidiav1.DriverManagerSpec `json:"manager,omitempty"`
	// +optional
	Resources *nvidiav1.ResourceRequirements `json:"resources,omitempty"`
	// +optional
	Args []string `json:"args,omitempty"`
	// +optional
	Env []nvidiav1.EnvVar `json:"env,omitempty"`
	// RepoConfig and CertConfig are accepted and not rendered (reported
	// when set).
	// +optional
	RepoConfig *nvidiav1.NameRef `json:"repoConfig,omitempty"`
	// +optional
	CertConfig *nvidiav1.NameRef `json:"certConfig,omitempty"`
	// +optional
	LicensingConfig *LicensingConfigSpec `json:"licensingConfig,omitempty"`
	// +optional
	VirtualTopologyConfig *nvidiav1.NameRef `json:"virtualTopologyConfig,omitempty"`
	// KernelModuleConfig names a ConfigMap of kernel module parameters.
	// +optional
	KernelModuleConfig *nvidiav1.NameRef `json:"kernelModuleConfig,omitempty"`
	// +optional
	SecretEnv string `json:"secretEnv,omitempty"`
	// UpgradePolicy of this driver's nodes: maxParallelUpgrades and
	// maxUnavailable count this driver's nodes; every upgrade goes through
	// a NodeMaintenance, so the cluster-wide limits apply on top.
	// +optional
	UpgradePolicy *nvidiav1.DriverUpgradePolicySpec `json:"upgradePolicy,omitempty"`
	// NodeSelector picks this driver's GPU nodes (empty only for the default).
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// NodeAffinity is added to the driver pods' scheduling constraints.
	// +optional
	NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity,omitempty"`
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// +optional
	PodSecurityContext *corev1.PodSecurityContext `json:"podSecurityContext,omitempty"`
	// +optional
	HostNetwork *bool `json:"hostNetwork,omitempty"`
}

// LicensingConfigSpec is the vGPU licensing configuration.
type LicensingConfigSpec struct {
	// +optional
	SecretName string `json:"secretName,omitempty"`
	// Deprecated upstream: the ConfigMap name.
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	NLSEnabled *bool `json:"nlsEnabled,omitempty"`
}

// NVIDIADriverStatus is what gpufleet observed of the driver.
type NVIDIADriverStatus struct {
	// State: ready when every node of this driver runs it Ready; notReady
	// otherwise; disabled when the ClusterPolicy does not hand the driver
	// to NVIDIADriver objects (driver.useNvidiaDriverCRD).
	// +optional
	State State `json:"state,omitempty"`
	// Namespace the driver is deployed in.
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// Nodes selected by this driver (conflicting nodes excluded).
	// +optional
	Nodes int32 `json:"nodes,omitempty"`
	// NodesReady run this driver's current image, Ready.
	// +optional
	NodesReady int32 `json:"nodesReady,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NVIDIADriver is one NVIDIA driver for a pool of GPU nodes, used when the
// ClusterPolicy sets driver.useNvidiaDriverCRD.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName={"nvd","nvdriver","nvdrivers"}
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Default",type=boolean,JSONPath=`.spec.default`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.nodesReady`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NVIDIADriver struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NVIDIADriverSpec   `json:"spec,omitempty"`
	Status NVIDIADriverStatus `json:"status,omitempty"`
}

// NVIDIADriverList is a list of NVIDIADriver.
//
// +kubebuilder:object:root=true
type NVIDIADriverList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NVIDIADriver `json:"items"`
}
