package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// GPUClusterName is the name of the one GPUCluster a cluster may have.
const GPUClusterName = "gpu-cluster"

// GPUClusterSpec is the GPU software stack of a cluster that allocates its
// GPUs through Dynamic Resource Allocation: NVIDIA's DRA driver for GPUs
// (and, optionally, its compute domains), DCGM and dcgm-exporter. The
// driver itself is not part of it: it is installed on the host (or by an
// NVIDIADriver), and the DRA driver's pods wait until it works.
type GPUClusterSpec struct {
	// DRADriver is NVIDIA's DRA driver for GPUs.
	DRADriver DRADriverSpec `json:"draDriver"`
	// DCGM is the standalone DCGM host engine. Off unless enabled: the
	// exporter then uses its embedded host engine.
	// +optional
	DCGM *nvidiav1.DCGMSpec `json:"dcgm,omitempty"`
	// DCGMExporter exports GPU metrics. On unless disabled.
	// +optional
	DCGMExporter *nvidiav1.DCGMExporterSpec `json:"dcgmExporter,omitempty"`
	// HostPaths are the host paths the components use.
	// +optional
	HostPaths GPUClusterHostPathsSpec `json:"hostPaths,omitempty"`
	// Daemonsets are settings common to every workload of the stack.
	// +optional
	Daemonsets nvidiav1.DaemonsetsSpec `json:"daemonsets,omitempty"`
}

// DRADriverSpec configures NVIDIA's DRA driver. Its GPU part is always
// deployed; its compute-domain part can be turned off.
type DRADriverSpec struct {
	// Repository is the image registry path, e.g. "nvcr.io/nvidia".
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Repository string `json:"repository,omitempty"`
	// Image is the image name, e.g. "dra-driver-nvidia-gpu".
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9\-]+$`
	Image string `json:"image,omitempty"`
	// Version is the image tag (or digest starting with "sha256:").
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Version string `json:"version,omitempty"`
	// +optional
	ImagePullPolicy string `json:"imagePullPolicy,omitempty"`
	// +optional
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
	// FeatureGates turns the driver's feature gates on or off (its
	// FEATURE_GATES variable).
	// +optional
	FeatureGates map[string]bool `json:"featureGates,omitempty"`
	// GPUs configures the driver's GPU part (gpu.nvidia.com).
	// +optional
	GPUs DRADriverGPUsSpec `json:"gpus,omitempty"`
	// ComputeDomains configures the driver's compute-domain part
	// (multi-node NVLink).
	// +optional
	ComputeDomains DRADriverComputeDomainsSpec `json:"computeDomains,omitempty"`
}

// ComputeDomainsEnabled reports whether the compute-domain part is on.
func (d *DRADriverSpec) ComputeDomainsEnabled() bool {
	return d.ComputeDomains.Enabled != nil && *d.ComputeDomains.Enabled
}

// DRADriverGPUsSpec configures the GPU container of the kubelet plugin.
type DRADriverGPUsSpec struct {
	// +optional
	KubeletPlugin DRADriverKubeletPluginSpec `json:"kubeletPlugin,omitempty"`
}

// DRADriverComputeDomainsSpec configures the compute-domain part: its
// controller Deployment and its container of the kubelet plugin.
type DRADriverComputeDomainsSpec struct {
	// +optional
	// +kubebuilder:default=true
	Enabled *bool `json:"enabled,omitempty"`
	// +optional
	Controller DRADriverControllerSpec `json:"controller,omitempty"`
	// +optional
	KubeletPlugin DRADriverKubeletPluginSpec `json:"kubeletPlugin,omitempty"`
}

// DRADriverKubeletPluginSpec configures one container of the kubelet
// plugin DaemonSet.
type DRADriverKubeletPluginSpec struct {
	// +optional
	Env []nvidiav1.EnvVar `json:"env,omitempty"`
	// +optional
	Resources *nvidiav1.ResourceRequirements `json:"resources,omitempty"`
	// Healthcheck is the container's gRPC health service, probed by the
	// kubelet.
	// +optional
	Healthcheck *DRADriverHealthcheckSpec `json:"healthcheck,omitempty"`
}

// DRADriverHealthcheckSpec is a kubelet plugin container's health service.
type DRADriverHealthcheckSpec struct {
	// +optional
	// +kubebuilder:default=true
	Enabled *bool `json:"enabled,omitempty"`
	// Port; 51516 for the GPU container, 51515 for the compute-domain one
	// unless set.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port *int32 `json:"port,omitempty"`
}

// DRADriverControllerSpec configures the compute-domain controller.
type DRADriverControllerSpec struct {
	// +optional
	Env []nvidiav1.EnvVar `json:"env,omitempty"`
	// +optional
	Resources *nvidiav1.ResourceRequirements `json:"resources,omitempty"`
}

// GPUClusterHostPathsSpec are host paths the DRA stack uses (its host root
// is always "/").
type GPUClusterHostPathsSpec struct {
	// DriverInstallDir is where the driver's files are. Default
	// "/run/nvidia/driver".
	// +optional
	DriverInstallDir string `json:"driverInstallDir,omitempty"`
	// KubeletRootDir is the kubelet's root directory.
	// +optional
	// +kubebuilder:default="/var/lib/kubelet"
	KubeletRootDir string `json:"kubeletRootDir,omitempty"`
}

// GPUClusterState is the state of a GPUCluster.
// +kubebuilder:validation:Enum=ready;notReady;disabled
type GPUClusterState string

// GPUCluster states.
const (
	GPUClusterReady    GPUClusterState = "ready"
	GPUClusterNotReady GPUClusterState = "notReady"
	GPUClusterDisabled GPUClusterState = "disabled"
)

// GPUClusterStatus is the observed state of a GPUCluster.
type GPUClusterStatus struct {
	// +optional
	State GPUClusterState `json:"state,omitempty"`
	// Namespace the stack is deployed in.
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Components are the workloads of the stack and how many of their
	// pods are ready.
	// +optional
	// +listType=map
	// +listMapKey=name
	Components []nvidiav1.ComponentStatus `json:"components,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// GPUCluster deploys the DRA-based GPU software stack. There is one, named
// gpu-cluster. It is not deployed while a ClusterPolicy older than it
// exists (the device plugin and the DRA driver would offer the same GPUs
// twice).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName={"gc"}
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'gpu-cluster'",message="GPUCluster is a singleton, metadata.name must be 'gpu-cluster'"
type GPUCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GPUClusterSpec   `json:"spec,omitempty"`
	Status GPUClusterStatus `json:"status,omitempty"`
}

// GPUClusterList is a list of GPUCluster.
//
// +kubebuilder:object:root=true
type GPUClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GPUCluster `json:"items"`
}
