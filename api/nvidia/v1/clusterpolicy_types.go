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
	// ConditionUnsupportedFields is True when the policy enables a feature
	// gpufleet does not provide; its message names each such field.
	ConditionUnsupportedFields = "UnsupportedFields"
	// ConditionServiceMonitor is there when the policy asks for
	// dcgm-exporter's ServiceMonitor (dcgmExporter.serviceMonitor.enabled):
	// True once it is created, False while the API server does not serve
	// monitoring.coreos.com/v1 ServiceMonitor (the message says why).
	ConditionServiceMonitor = "ServiceMonitor"
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
	// HostNetwork runs the component's pods in the host's network namespace
	// (with dnsPolicy ClusterFirstWithHostNet, as the NVIDIA GPU Operator).
	// +optional
	HostNetwork *bool `json:"hostNetwork,omitempty"`
}

// IsEnabled reports whether the component is enabled (default true).
func (c *ComponentSpec) IsEnabled() bool { return c == nil || c.Enabled == nil || *c.Enabled }

// EnvVar is an environment variable as the NVIDIA GPU Operator takes it
// in the newer parts of the ClusterPolicy (a name and a value).
type EnvVar struct {
	Name string `json:"name"`
	// +optional
	Value string `json:"value,omitempty"`
}

// ResourceRequirements are a container's resource limits and requests.
type ResourceRequirements struct {
	// +optional
	Limits corev1.ResourceList `json:"limits,omitempty"`
	// +optional
	Requests corev1.ResourceList `json:"requests,omitempty"`
}

// EnvSpec holds extra environment variables of one part of a component.
type EnvSpec struct {
	// +optional
	Env []EnvVar `json:"env,omitempty"`
}

// ImageSpec names an auxiliary image (an init container).
type ImageSpec struct {
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Repository string `json:"repository,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Image string `json:"image,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Version string `json:"version,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// +optional
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
}

// DriverManagerSpec configures the k8s-driver-manager init container that
// prepares a node for a driver (re)install. Its env is merged over the
// defaults, except ENABLE_GPU_POD_EVICTION and ENABLE_AUTO_DRAIN, which
// gpufleet always sets to false (driver upgrades drain the node through
// NodeMaintenance); env that tries to turn them on is reported in the
// UnsupportedFields condition.
type DriverManagerSpec struct {
	ImageSpec `json:",inline"`
	// +optional
	Env []EnvVar `json:"env,omitempty"`
}

// ContainerProbeSpec tunes a probe of the driver container.
type ContainerProbeSpec struct {
	// +optional
	// +kubebuilder:validation:Minimum=0
	InitialDelaySeconds int32 `json:"initialDelaySeconds,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	PeriodSeconds int32 `json:"periodSeconds,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	SuccessThreshold int32 `json:"successThreshold,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	FailureThreshold int32 `json:"failureThreshold,omitempty"`
}

// GPUDirectRDMASpec configures GPUDirect RDMA in the driver.
type GPUDirectRDMASpec struct {
	// Enabled loads nvidia-peermem with the driver.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// UseHostMOFED uses the MOFED driver installed on the host.
	// +optional
	UseHostMOFED *bool `json:"useHostMofed,omitempty"`
}

// DriverSpec configures the driver installer.
type DriverSpec struct {
	ComponentSpec `json:",inline"`
	// UseNvidiaDriverCRD hands the driver over to NVIDIADriver objects.
	// +optional
	UseNvidiaDriverCRD *bool `json:"useNvidiaDriverCRD,omitempty"`
	// UsePrecompiled installs precompiled kernel modules.
	// +optional
	UsePrecompiled *bool `json:"usePrecompiled,omitempty"`
	// UseOpenKernelModules is deprecated in favour of kernelModuleType; true
	// means kernelModuleType open when kernelModuleType is not set.
	// +optional
	UseOpenKernelModules *bool `json:"useOpenKernelModules,omitempty"`
	// KernelModuleType: auto, open or proprietary.
	// +optional
	// +kubebuilder:validation:Enum=auto;open;proprietary
	KernelModuleType string `json:"kernelModuleType,omitempty"`
	// StartupProbe tunes the driver container's startup probe.
	// +optional
	StartupProbe *ContainerProbeSpec `json:"startupProbe,omitempty"`
	// LivenessProbe is accepted and not rendered (a failing liveness probe
	// would restart the driver outside maintenance); reported in the
	// UnsupportedFields condition when set.
	// +optional
	LivenessProbe *ContainerProbeSpec `json:"livenessProbe,omitempty"`
	// ReadinessProbe adds a readiness probe (nvidia-smi) to the driver
	// container, with these settings.
	// +optional
	ReadinessProbe *ContainerProbeSpec `json:"readinessProbe,omitempty"`
	// RDMA configures GPUDirect RDMA.
	// +optional
	RDMA *GPUDirectRDMASpec `json:"rdma,omitempty"`
	// Manager is the k8s-driver-manager init container.
	// +optional
	Manager *DriverManagerSpec `json:"manager,omitempty"`
	// UpgradePolicy governs driver upgrades.
	// +optional
	UpgradePolicy *DriverUpgradePolicySpec `json:"upgradePolicy,omitempty"`
	// RepoConfig names a ConfigMap of package repositories (not provided
	// by gpufleet: reported in the UnsupportedFields condition when set).
	// +optional
	RepoConfig *ConfigMapRef `json:"repoConfig,omitempty"`
	// CertConfig names a ConfigMap of custom certificates (not provided by
	// gpufleet: reported in the UnsupportedFields condition when set).
	// +optional
	CertConfig *NameRef `json:"certConfig,omitempty"`
	// LicensingConfig is the vGPU guest driver licensing.
	// +optional
	LicensingConfig *LicensingConfigSpec `json:"licensingConfig,omitempty"`
	// VirtualTopology is the vGPU topology daemon configuration.
	// +optional
	VirtualTopology *VirtualTopologySpec `json:"virtualTopology,omitempty"`
	// KernelModuleConfig names a ConfigMap of kernel module parameters:
	// its keys nvidia.conf, nvidia-modeset.conf, nvidia-peermem.conf and
	// nvidia-uvm.conf are mounted where the driver container reads them.
	// +optional
	KernelModuleConfig *NameRef `json:"kernelModuleConfig,omitempty"`
	// SecretEnv names a Secret whose entries become driver env variables.
	// +optional
	SecretEnv string `json:"secretEnv,omitempty"`
}

// ConfigMapRef names a ConfigMap (NVIDIA operator compatibility).
type ConfigMapRef struct {
	// +optional
	ConfigMapName string `json:"configMapName,omitempty"`
	// DestinationDir is the NVIDIA operator 1.x place of the repo files.
	// +optional
	DestinationDir string `json:"destinationDir,omitempty"`
}

// NameRef names a ConfigMap.
type NameRef struct {
	// +optional
	Name string `json:"name,omitempty"`
}

// LicensingConfigSpec is the vGPU licensing configuration.
type LicensingConfigSpec struct {
	// +optional
	ConfigMapName string `json:"configMapName,omitempty"`
	// +optional
	SecretName string `json:"secretName,omitempty"`
	// +optional
	NLSEnabled *bool `json:"nlsEnabled,omitempty"`
}

// VirtualTopologySpec names the vGPU topology daemon's ConfigMap.
type VirtualTopologySpec struct {
	// +optional
	Config string `json:"config,omitempty"`
}

// DriverUpgradePolicySpec says how driver version changes roll out.
type DriverUpgradePolicySpec struct {
	// AutoUpgrade rolls a new driver version out node by node through
	// NodeMaintenance. Default true.
	// +optional
	AutoUpgrade *bool `json:"autoUpgrade,omitempty"`
	// MaxParallelUpgrades limits nodes upgrading at once. Default 1; 0
	// means no limit of its own (as in the NVIDIA GPU Operator): only
	// maxUnavailable and the cluster's maintenance limits apply.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxParallelUpgrades *int32 `json:"maxParallelUpgrades,omitempty"`
	// MaxUnavailable limits nodes made unavailable by upgrades.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnavailable must be a non-negative integer or a percentage between 0% and 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// WaitForCompletion waits for matching pods to finish before the upgrade.
	// +optional
	WaitForCompletion *WaitForCompletionSpec `json:"waitForCompletion,omitempty"`
	// PodDeletion is how the pods using GPUs are deleted before the upgrade.
	// +optional
	PodDeletion *PodDeletionSpec `json:"podDeletion,omitempty"`
	// Drain settings for the upgrade's NodeMaintenance.
	// +optional
	Drain *UpgradeDrainSpec `json:"drain,omitempty"`
}

// WaitForCompletionSpec waits for jobs on the node to finish.
type WaitForCompletionSpec struct {
	// PodSelector is a label selector of the pods to wait for.
	// +optional
	PodSelector string `json:"podSelector,omitempty"`
	// TimeoutSeconds: 0 waits forever.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`
}

// PodDeletionSpec is the deletion of the pods that use GPUs.
type PodDeletionSpec struct {
	// +optional
	Force bool `json:"force,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`
	// +optional
	DeleteEmptyDir bool `json:"deleteEmptyDir,omitempty"`
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
	// Config names the ConfigMap of device plugin configurations.
	// +optional
	Config *DevicePluginConfig `json:"config,omitempty"`
	// MPS configures the MPS control daemon.
	// +optional
	MPS *MPSSpec `json:"mps,omitempty"`
}

// DevicePluginConfig names a ConfigMap and its default entry.
type DevicePluginConfig struct {
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	Default string `json:"default,omitempty"`
}

// MPSSpec is the MPS root on the host.
type MPSSpec struct {
	// +optional
	Root string `json:"root,omitempty"`
}

// GFDSpec configures GPU feature discovery.
type GFDSpec struct {
	ComponentSpec `json:",inline"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	DiscoveryIntervalSeconds *int32 `json:"discoveryIntervalSeconds,omitempty"`
	// MigStrategy is the NVIDIA operator 1.x place of mig.strategy.
	// +optional
	// +kubebuilder:validation:Enum=none;single;mixed
	MigStrategy string `json:"migStrategy,omitempty"`
}

// ValidatorSpec configures the operator validator; its parts (plugin,
// toolkit, driver, cuda, ...) take extra env variables.
type ValidatorSpec struct {
	ComponentSpec `json:",inline"`
	// +optional
	Plugin *EnvSpec `json:"plugin,omitempty"`
	// +optional
	Toolkit *EnvSpec `json:"toolkit,omitempty"`
	// +optional
	Driver *EnvSpec `json:"driver,omitempty"`
	// +optional
	CUDA *EnvSpec `json:"cuda,omitempty"`
	// +optional
	VFIOPCI *EnvSpec `json:"vfioPCI,omitempty"`
	// +optional
	VGPUManager *EnvSpec `json:"vgpuManager,omitempty"`
	// +optional
	VGPUDevices *EnvSpec `json:"vgpuDevices,omitempty"`
}

// DCGMSpec configures the standalone DCGM host engine.
type DCGMSpec struct {
	ComponentSpec `json:",inline"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	HostPort int32 `json:"hostPort,omitempty"`
}

// DCGMExporterSpec configures dcgm-exporter.
type DCGMExporterSpec struct {
	ComponentSpec `json:",inline"`
	// Annotations of the exporter's pods.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// Config names the ConfigMap of the metrics to export (key dcgm-metrics.csv).
	// +optional
	Config *NameRef `json:"config,omitempty"`
	// ServiceMonitor for the Prometheus operator.
	// +optional
	ServiceMonitor *ServiceMonitorSpec `json:"serviceMonitor,omitempty"`
	// Service of the exporter.
	// +optional
	Service *DCGMExporterServiceSpec `json:"service,omitempty"`
	// +optional
	HostPID *bool `json:"hostPID,omitempty"`
	// HPCJobMapping labels metrics with the jobs of an HPC workload manager.
	// +optional
	HPCJobMapping *HPCJobMappingSpec `json:"hpcJobMapping,omitempty"`
	// +optional
	EnablePodLabels *bool `json:"enablePodLabels,omitempty"`
	// +optional
	EnablePodUID *bool `json:"enablePodUID,omitempty"`
	// +optional
	PodLabelAllowlistRegex []string `json:"podLabelAllowlistRegex,omitempty"`
}

// DCGMExporterServiceSpec is the exporter's Service.
type DCGMExporterServiceSpec struct {
	// +optional
	// +kubebuilder:validation:Enum=ClusterIP;NodePort;LoadBalancer;ExternalName
	Type corev1.ServiceType `json:"type,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=Cluster;Local
	InternalTrafficPolicy *corev1.ServiceInternalTrafficPolicy `json:"internalTrafficPolicy,omitempty"`
}

// HPCJobMappingSpec is dcgm-exporter's HPC job mapping.
type HPCJobMappingSpec struct {
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// +optional
	Directory string `json:"directory,omitempty"`
}

// Duration is a Prometheus duration, e.g. "15s" or "1m30s".
// +kubebuilder:validation:Pattern=`^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`
type Duration string

// ServiceMonitorSpec configures a Prometheus operator ServiceMonitor.
type ServiceMonitorSpec struct {
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// +optional
	Interval Duration `json:"interval,omitempty"`
	// +optional
	ScrapeTimeout Duration `json:"scrapeTimeout,omitempty"`
	// +optional
	HonorLabels *bool `json:"honorLabels,omitempty"`
	// +optional
	AdditionalLabels map[string]string `json:"additionalLabels,omitempty"`
	// +optional
	Relabelings []RelabelConfig `json:"relabelings,omitempty"`
}

// RelabelConfig is a Prometheus relabeling rule.
type RelabelConfig struct {
	// +optional
	SourceLabels []string `json:"sourceLabels,omitempty"`
	// +optional
	Separator *string `json:"separator,omitempty"`
	// +optional
	TargetLabel string `json:"targetLabel,omitempty"`
	// +optional
	Regex string `json:"regex,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	Modulus int64 `json:"modulus,omitempty"`
	// +optional
	Replacement *string `json:"replacement,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=replace;Replace;keep;Keep;drop;Drop;hashmod;HashMod;labelmap;LabelMap;labeldrop;LabelDrop;labelkeep;LabelKeep;lowercase;Lowercase;uppercase;Uppercase;keepequal;KeepEqual;dropequal;DropEqual
	Action string `json:"action,omitempty"`
}

// MIGSpec is the cluster's MIG strategy for GFD and the device plugin.
type MIGSpec struct {
	// +optional
	// +kubebuilder:validation:Enum=none;single;mixed
	Strategy string `json:"strategy,omitempty"`
}

// MIGManagerSpec configures mig-manager.
type MIGManagerSpec struct {
	ComponentSpec `json:",inline"`
	// Config names the mig-parted ConfigMap (key config.yaml) and the
	// configuration applied by default.
	// +optional
	Config *MIGManagerConfigSpec `json:"config,omitempty"`
	// GPUClientsConfig names the ConfigMap of GPU clients to restart.
	// +optional
	GPUClientsConfig *NameRef `json:"gpuClientsConfig,omitempty"`
}

// MIGManagerConfigSpec names mig-manager's configuration.
type MIGManagerConfigSpec struct {
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	Default string `json:"default,omitempty"`
}

// OperatorSpec holds operator-wide settings.
type OperatorSpec struct {
	// DefaultRuntime is used for nodes whose runtime cannot be detected.
	// +optional
	// +kubebuilder:validation:Enum=docker;containerd;crio
	DefaultRuntime string `json:"defaultRuntime,omitempty"`
	// RuntimeClass is the NVIDIA runtime's handler name the toolkit
	// configures in containerd (default "nvidia"). gpufleet creates no
	// RuntimeClass object.
	// +optional
	RuntimeClass string `json:"runtimeClass,omitempty"`
	// InitContainer is deprecated in the NVIDIA GPU Operator.
	// +optional
	InitContainer *ImageSpec `json:"initContainer,omitempty"`
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// +optional
	Metrics *OperatorMetricsSpec `json:"metrics,omitempty"`
	// UseOpenShiftDriverToolkit (OpenShift only).
	// +optional
	UseOpenShiftDriverToolkit *bool `json:"use_ocp_driver_toolkit,omitempty"`
	// Validator is the NVIDIA operator 1.x place of the validator; it means
	// the same as spec.validator (which wins where both set a field).
	// +optional
	Validator *ComponentSpec `json:"validator,omitempty"`
}

// OperatorMetricsSpec configures the operator's own metrics.
type OperatorMetricsSpec struct {
	// +optional
	ServiceMonitor *ServiceMonitorSpec `json:"serviceMonitor,omitempty"`
}

// RollingUpdateSpec is the rolling update of every DaemonSet.
type RollingUpdateSpec struct {
	// MaxUnavailable: a number or a percentage of nodes, e.g. "1" or "10%"
	// (not 0: a DaemonSet's rolling update must be able to proceed).
	// +optional
	// +kubebuilder:validation:Pattern=`^([1-9][0-9]*|([1-9]|[1-9][0-9]|100)%)$`
	MaxUnavailable string `json:"maxUnavailable,omitempty"`
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
	// +optional
	RollingUpdate *RollingUpdateSpec `json:"rollingUpdate,omitempty"`
	// PodSecurityContext of every DaemonSet's pods.
	// +optional
	PodSecurityContext *corev1.PodSecurityContext `json:"podSecurityContext,omitempty"`
}

// EnabledSpec is a feature switch.
type EnabledSpec struct {
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
}

// CDISpec configures the Container Device Interface.
type CDISpec struct {
	// Enabled generates CDI specifications for the GPUs. Default true.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// Default is deprecated in the NVIDIA GPU Operator and has no effect
	// there nor here: with CDI enabled, CDI is the default mode.
	// +optional
	Default *bool `json:"default,omitempty"`
	// NRIPluginEnabled injects CDI devices through an NRI plugin.
	// +optional
	NRIPluginEnabled *bool `json:"nriPluginEnabled,omitempty"`
}

// HostPathsSpec are host paths the components use.
type HostPathsSpec struct {
	// RootFS is the host's root filesystem (chroot-able). Default "/".
	// +optional
	RootFS string `json:"rootFS,omitempty"`
	// DriverInstallDir is where the driver's files are. Default
	// "/run/nvidia/driver".
	// +optional
	DriverInstallDir string `json:"driverInstallDir,omitempty"`
	// KubeletRootDir. Default "/var/lib/kubelet".
	// +optional
	KubeletRootDir string `json:"kubeletRootDir,omitempty"`
}

// SandboxWorkloadsSpec configures GPUs for virtual machines (not provided
// by gpufleet: accepted, and reported when enabled).
type SandboxWorkloadsSpec struct {
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=container;vm-passthrough;vm-vgpu
	DefaultWorkload string `json:"defaultWorkload,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=kubevirt;kata
	Mode string `json:"mode,omitempty"`
}

// OperandSpec is a component gpufleet does not deploy (vGPU, sandbox,
// confidential computing, GPUDirect Storage): accepted as the NVIDIA GPU
// Operator defines it, and reported when enabled.
type OperandSpec struct {
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Repository string `json:"repository,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Image string `json:"image,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Version string `json:"version,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// +optional
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
	// +optional
	Resources *ResourceRequirements `json:"resources,omitempty"`
	// +optional
	Args []string `json:"args,omitempty"`
	// +optional
	Env []EnvVar `json:"env,omitempty"`
	// +optional
	HostNetwork *bool `json:"hostNetwork,omitempty"`
}

// VGPUManagerSpec is the vGPU host driver.
type VGPUManagerSpec struct {
	OperandSpec `json:",inline"`
	// +optional
	DriverManager *DriverManagerSpec `json:"driverManager,omitempty"`
	// +optional
	KernelModuleConfig *NameRef `json:"kernelModuleConfig,omitempty"`
}

// VGPUDeviceManagerSpec is the vGPU device manager.
type VGPUDeviceManagerSpec struct {
	OperandSpec `json:",inline"`
	// +optional
	Config *VGPUDevicesConfigSpec `json:"config,omitempty"`
}

// VGPUDevicesConfigSpec names the vGPU devices ConfigMap.
type VGPUDevicesConfigSpec struct {
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	Default string `json:"default,omitempty"`
}

// VFIOManagerSpec is the VFIO-PCI manager.
type VFIOManagerSpec struct {
	OperandSpec `json:",inline"`
	// +optional
	DriverManager *DriverManagerSpec `json:"driverManager,omitempty"`
}

// CCManagerSpec is the confidential computing manager.
type CCManagerSpec struct {
	OperandSpec `json:",inline"`
	// +optional
	// +kubebuilder:validation:Enum=on;off;devtools
	DefaultMode string `json:"defaultMode,omitempty"`
}

// KataManagerSpec is the Kata manager (deprecated in the NVIDIA GPU Operator).
type KataManagerSpec struct {
	OperandSpec `json:",inline"`
	// +optional
	Config *KataManagerConfig `json:"config,omitempty"`
}

// KataManagerConfig lists the Kata runtime classes to install.
type KataManagerConfig struct {
	// +optional
	ArtifactsDir string `json:"artifactsDir,omitempty"`
	// +optional
	RuntimeClasses []KataRuntimeClass `json:"runtimeClasses,omitempty"`
}

// KataRuntimeClass is one Kata runtime class and its artifacts.
type KataRuntimeClass struct {
	Name string `json:"name"`
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	Artifacts    KataArtifacts     `json:"artifacts"`
}

// KataArtifacts locates the artifacts of a Kata runtime class.
type KataArtifacts struct {
	URL string `json:"url"`
	// +optional
	PullSecret string `json:"pullSecret,omitempty"`
}

// ClusterPolicySpec is the desired GPU software stack. It accepts both the
// NVIDIA GPU Operator 1.x shape (the GPU Operator 1.6 example's) and the
// current one (v26.x).
type ClusterPolicySpec struct {
	// +optional
	Operator OperatorSpec `json:"operator,omitempty"`
	// +optional
	Daemonsets DaemonsetsSpec `json:"daemonsets,omitempty"`
	// +optional
	HostPaths HostPathsSpec `json:"hostPaths,omitempty"`
	// +optional
	Driver DriverSpec `json:"driver,omitempty"`
	// +optional
	Toolkit ToolkitSpec `json:"toolkit,omitempty"`
	// +optional
	DevicePlugin DevicePluginSpec `json:"devicePlugin,omitempty"`
	// +optional
	Validator ValidatorSpec `json:"validator,omitempty"`
	// +optional
	DCGM DCGMSpec `json:"dcgm,omitempty"`
	// +optional
	DCGMExporter DCGMExporterSpec `json:"dcgmExporter,omitempty"`
	// +optional
	GFD GFDSpec `json:"gfd,omitempty"`
	// +optional
	MIG MIGSpec `json:"mig,omitempty"`
	// MIGManager is off unless enabled.
	// +optional
	MIGManager MIGManagerSpec `json:"migManager,omitempty"`
	// NodeStatusExporter is off unless enabled.
	// +optional
	NodeStatusExporter ComponentSpec `json:"nodeStatusExporter,omitempty"`
	// PSP is deprecated (PodSecurityPolicies no longer exist).
	// +optional
	PSP EnabledSpec `json:"psp,omitempty"`
	// PSA labels the namespace for Pod Security Admission.
	// +optional
	PSA EnabledSpec `json:"psa,omitempty"`
	// +optional
	CDI CDISpec `json:"cdi,omitempty"`
	// GPUDirectStorage (nvidia-fs).
	// +optional
	GPUDirectStorage *OperandSpec `json:"gds,omitempty"`
	// +optional
	GDRCopy *OperandSpec `json:"gdrcopy,omitempty"`
	// +optional
	SandboxWorkloads SandboxWorkloadsSpec `json:"sandboxWorkloads,omitempty"`
	// +optional
	SandboxDevicePlugin OperandSpec `json:"sandboxDevicePlugin,omitempty"`
	// +optional
	KataSandboxDevicePlugin OperandSpec `json:"kataSandboxDevicePlugin,omitempty"`
	// +optional
	VGPUManager VGPUManagerSpec `json:"vgpuManager,omitempty"`
	// +optional
	VGPUDeviceManager VGPUDeviceManagerSpec `json:"vgpuDeviceManager,omitempty"`
	// +optional
	VFIOManager VFIOManagerSpec `json:"vfioManager,omitempty"`
	// +optional
	KataManager KataManagerSpec `json:"kataManager,omitempty"`
	// +optional
	CCManager CCManagerSpec `json:"ccManager,omitempty"`
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
