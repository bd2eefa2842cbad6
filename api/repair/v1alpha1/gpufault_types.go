package v1alpha1

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// GPU fault classes: what a fault calls for (internal/gpufault's catalogue).
// +kubebuilder:validation:Enum=Informational;Application;ResetGPU;Reboot;Replace
type GPUFaultClass string

// Classes, from the least to the most severe.
const (
	// GPUClassInformational: an event, nothing is broken. Recorded only.
	GPUClassInformational GPUFaultClass = "Informational"
	// GPUClassApplication: the application's fault; the GPU stays in
	// service. Recorded only.
	GPUClassApplication GPUFaultClass = "Application"
	// GPUClassResetGPU: reset the GPU once no pod uses it.
	GPUClassResetGPU GPUFaultClass = "ResetGPU"
	// GPUClassReboot: only a reboot of the node recovers the GPU.
	GPUClassReboot GPUFaultClass = "Reboot"
	// GPUClassReplace: the GPU needs a person (replacement, inspection).
	GPUClassReplace GPUFaultClass = "Replace"
)

// Repairs reports whether the class takes the GPU out of service (it is
// isolated and repaired, or reported for replacement).
func (c GPUFaultClass) Repairs() bool {
	return c == GPUClassResetGPU || c == GPUClassReboot || c == GPUClassReplace
}

// Rank orders the classes by severity (Informational 0 … Replace 4, -1
// for an unknown class).
func (c GPUFaultClass) Rank() int {
	switch c {
	case GPUClassInformational:
		return 0
	case GPUClassApplication:
		return 1
	case GPUClassResetGPU:
		return 2
	case GPUClassReboot:
		return 3
	case GPUClassReplace:
		return 4
	}
	return -1
}

// Node condition the node agent writes in node-problem-detector style:
// True while a GPU of the node has a fault that takes it out of service,
// with the most severe class as its reason; False (reason GPUsHealthy)
// otherwise. The default repair rules match it.
const (
	ConditionGPUProblem = "GPUProblem"
	ReasonGPUsHealthy   = "GPUsHealthy"
)

// GPURef identifies one GPU of a node.
type GPURef struct {
	// Index is nvidia-smi's index (DCGM's GPU id); unset when not known
	// (a kernel log line names the PCI address only).
	// +optional
	// +kubebuilder:validation:Minimum=0
	Index *int32 `json:"index,omitempty"`
	// UUID, e.g. GPU-5c1b7a39-....
	// +optional
	// +kubebuilder:validation:MaxLength=128
	UUID string `json:"uuid,omitempty"`
	// PCIBusID in the long form, e.g. 0000:3b:00.0 (empty: not known, as
	// for GPUs missing from their node). The node agent passes it to
	// nvidia-smi -i: nothing else than an address gets there.
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])?$`
	PCIBusID string `json:"pciBusID"`
}

// Describe names a GPU for people: "GPU 3 (GPU-5c1b…, 0000:3b:00.0)"; a
// reference without any identity is "unidentified GPUs" (the record of
// GPUs missing from a node that nothing identifies).
func (g GPURef) Describe() string {
	var ids []string
	if g.UUID != "" {
		ids = append(ids, g.UUID)
	}
	if g.PCIBusID != "" {
		ids = append(ids, g.PCIBusID)
	}
	switch {
	case len(ids) == 0:
		return "unidentified GPUs"
	case g.Index != nil:
		return fmt.Sprintf("GPU %d (%s)", *g.Index, strings.Join(ids, ", "))
	default:
		return "GPU " + strings.Join(ids, ", ")
	}
}

// GPUFaultEntry is one kind of fault seen on a GPU.
type GPUFaultEntry struct {
	// Code is the XID; 0 for a fault read from a counter.
	// +optional
	Code int32 `json:"code,omitempty"`
	// Counter is the health counter the fault was read from (a
	// dcgm-exporter metric, or GPUMissing); empty for an XID.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Counter string        `json:"counter,omitempty"`
	Class   GPUFaultClass `json:"class"`
	// Meaning in NVIDIA's words, and where NVIDIA says so.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Meaning string `json:"meaning,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Citation  string      `json:"citation,omitempty"`
	FirstSeen metav1.Time `json:"firstSeen"`
	LastSeen  metav1.Time `json:"lastSeen"`
	// Count of times it was seen (XID lines, or counter increases).
	Count int64 `json:"count"`
	// Active until a reset or reboot of the GPU cleared it.
	Active bool `json:"active"`
}

// GPUFaultSpec identifies the GPU (immutable).
type GPUFaultSpec struct {
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="nodeName is immutable"
	NodeName string `json:"nodeName"`
	GPU      GPURef `json:"gpu"`
}

// GPUFaultStatus is what the node agent found.
type GPUFaultStatus struct {
	// Class is the most severe class of the active faults that take the
	// GPU out of service (ResetGPU, Reboot, Replace); empty when none: the
	// GPU is in service.
	// +optional
	Class GPUFaultClass `json:"class,omitempty"`
	// Summary of the active faults, for kubectl (e.g. "Xid 48: DBE ECC").
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Summary string `json:"summary,omitempty"`
	// Faults seen on this GPU, one entry per XID code or counter.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Faults []GPUFaultEntry `json:"faults,omitempty"`
	// Occurrences: when the GPU was taken out of service by a fault, oldest
	// first, the last 16. The repair policy's replaceAfter counts them.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Occurrences []metav1.Time `json:"occurrences,omitempty"`
	// BootID of the node when the faults were recorded: a reboot clears
	// what the kernel log reported before it.
	// +optional
	BootID string `json:"bootID,omitempty"`
	// Allocation: the pods the kubelet gave this GPU through the device
	// plugin, as the node agent read them from the kubelet's pod-resources
	// API while the GPU was out of service. The repair drains exactly these
	// pods. Unset when not known (the GPU is in service, or the agent could
	// not read the pod-resources API): the repair of a device-plugin node
	// then drains every pod of the node that requests nvidia.com/gpu.
	// +optional
	Allocation *GPUAllocation `json:"allocation,omitempty"`
	// Validation is the GPU's last validation after a repair (policy
	// gpu.validation). A failed one keeps the GPU out of service: an
	// active fault entry with counter validation-failed, until a later
	// validation passes.
	// +optional
	Validation *GPUValidationResult `json:"validation,omitempty"`
}

// GPUAllocation says which pods hold a GPU given out by the device plugin.
type GPUAllocation struct {
	// Resource is the device plugin's extended resource (nvidia.com/gpu).
	// +kubebuilder:validation:MaxLength=253
	Resource string `json:"resource"`
	// Pods given the GPU (none: no pod holds it).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Pods []PodRef `json:"pods,omitempty"`
}

// PodRef names a pod.
type PodRef struct {
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// String is namespace/name.
func (p PodRef) String() string { return p.Namespace + "/" + p.Name }

// InService reports whether no active fault takes the GPU out of service.
func (g *GPUFault) InService() bool { return !g.Status.Class.Repairs() }

// GPUFault records the faults of one GPU, written by its node's agent
// (named <node>-<PCI bus ID>). While it shows a fault that takes the GPU
// out of service, gpufleet isolates the GPU (no new pod gets it) and the
// node's GPUProblem condition starts the repair ladder.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=gpuf
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Node",type="string",JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="GPU",type="integer",JSONPath=`.spec.gpu.index`
// +kubebuilder:printcolumn:name="PCI",type="string",JSONPath=`.spec.gpu.pciBusID`
// +kubebuilder:printcolumn:name="Class",type="string",JSONPath=`.status.class`
// +kubebuilder:printcolumn:name="Faults",type="string",JSONPath=`.status.summary`
// +kubebuilder:printcolumn:name="UUID",type="string",JSONPath=`.spec.gpu.uuid`,priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type GPUFault struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GPUFaultSpec   `json:"spec,omitempty"`
	Status GPUFaultStatus `json:"status,omitempty"`
}

// GPUFaultList is a list of GPUFault.
//
// +kubebuilder:object:root=true
type GPUFaultList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GPUFault `json:"items"`
}

// GPUSpec configures GPU fault handling in a NodeRepairPolicy.
type GPUSpec struct {
	// DRADriver is the DRA driver whose ResourceSlices publish the GPUs;
	// a faulty GPU found there is isolated with a DeviceTaintRule. Nodes
	// whose GPUs it does not publish rely on the device plugin's own
	// health marking.
	// +optional
	// +kubebuilder:default="gpu.nvidia.com"
	// +kubebuilder:validation:MaxLength=63
	DRADriver string `json:"draDriver,omitempty"`
	// ReplaceAfter: a GPU taken out of service this many times within
	// WindowSeconds is not repaired again: its repair ends RecoveryFailed
	// with a recommendation to replace it (it stays isolated).
	// +optional
	ReplaceAfter *RepeatLimit `json:"replaceAfter,omitempty"`
	// WholeNodeAfter: on a node whose GPUs are given out by the device
	// plugin (not published through DRA), once this many of the node's
	// GPUs are out of service — a count, or a percentage of the node's
	// nvidia.com/gpu capacity rounded up; default 50% — a new repair takes
	// the whole node (cordon, drain and reboot through NodeMaintenance, if
	// the policy allows reboots) instead of resetting GPUs one by one:
	// the device plugin cannot be told which GPUs to skip, so a node with
	// many faulty GPUs would keep taking GPU pods.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^[1-9][0-9]?%$|^100%$')",message="wholeNodeAfter must be a count of at least 1 or a percentage from 1% to 100%"
	WholeNodeAfter *intstr.IntOrString `json:"wholeNodeAfter,omitempty"`
	// XIDClasses overrides the catalogue's class of XID codes (e.g. treat
	// XID 94 as Reboot). The node agent applies them.
	// +optional
	// +listType=map
	// +listMapKey=code
	// +kubebuilder:validation:MaxItems=128
	XIDClasses []XIDClass `json:"xidClasses,omitempty"`
	// Validation proves that a GPU works before it returns to service after
	// a reset or a reboot (default: level Health). A GPU that fails it goes
	// up the ladder (reset, then reboot, then a recommendation to replace
	// it), never back to service.
	// +optional
	Validation *GPUValidation `json:"validation,omitempty"`
	// StackPods select the pods of the GPU stack on a node that
	// RestartGPUStackPods restarts: the device plugin and the DRA kubelet
	// plugin, which keep a GPU they found unhealthy out of service (out of
	// nvidia.com/gpu allocatable; a device taint in the ResourceSlice) until
	// they restart. A pod matching any selector counts. Empty: the pods of
	// NVIDIA's GPU Operator and gpufleet's GPU stack (label app
	// nvidia-device-plugin-daemonset or nvidia-dra-driver-kubelet-plugin),
	// of NVIDIA's device plugin chart (app.kubernetes.io/name
	// nvidia-device-plugin) and of NVIDIA's DRA driver chart
	// (dra-driver-nvidia-gpu-component, or nvidia-dra-driver-gpu-component
	// of older releases, kubelet-plugin). After a GPU passed its
	// validation, a repair restarts them when they still hold it
	// unhealthy.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.all(s, (has(s.matchLabels) && size(s.matchLabels) > 0) || (has(s.matchExpressions) && size(s.matchExpressions) > 0))",message="a stackPods selector must not be empty: it would select every pod of the node"
	StackPods []metav1.LabelSelector `json:"stackPods,omitempty"`
}

// DefaultGPUStackPods are the selectors of gpu.stackPods when it is empty.
func DefaultGPUStackPods() []metav1.LabelSelector {
	return []metav1.LabelSelector{
		{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn,
			Values: []string{"nvidia-device-plugin-daemonset", "nvidia-dra-driver-kubelet-plugin"}}}},
		{MatchLabels: map[string]string{"app.kubernetes.io/name": "nvidia-device-plugin"}},
		{MatchLabels: map[string]string{"dra-driver-nvidia-gpu-component": "kubelet-plugin"}},
		{MatchLabels: map[string]string{"nvidia-dra-driver-gpu-component": "kubelet-plugin"}},
	}
}

// StackPodSelectors are the policy's gpu.stackPods, or the defaults.
func (g *GPUSpec) StackPodSelectors() []metav1.LabelSelector {
	if g == nil || len(g.StackPods) == 0 {
		return DefaultGPUStackPods()
	}
	return g.StackPods
}

// GPUValidationLevel says how a GPU is validated before it returns to
// service.
// +kubebuilder:validation:Enum=Off;Health;Diagnostic
type GPUValidationLevel string

// Validation levels.
const (
	// GPUValidationOff returns a GPU to service once the reset succeeded.
	GPUValidationOff GPUValidationLevel = "Off"
	// GPUValidationHealth: the node agent asks the driver about that exact
	// GPU (nvidia-smi: on the bus, no uncorrectable ECC error since the
	// reset, no retired page pending, no failed row remap); seconds.
	GPUValidationHealth GPUValidationLevel = "Health"
	// GPUValidationDiagnostic: Health, then DCGM's quick diagnostic on that
	// GPU (dcgmi diag -r 1: deployment and software checks); tens of
	// seconds, needs the DCGM host engine on the node.
	GPUValidationDiagnostic GPUValidationLevel = "Diagnostic"
)

// GPUValidation configures the validation of a repaired GPU.
type GPUValidation struct {
	// +optional
	// +kubebuilder:default=Health
	Level GPUValidationLevel `json:"level,omitempty"`
	// TimeoutSeconds bounds one validation; past it, it failed.
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=3600
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
}

// LevelOf is the validation level v asks for (default Health).
func (v *GPUValidation) LevelOf() GPUValidationLevel {
	if v == nil || v.Level == "" {
		return GPUValidationHealth
	}
	return v.Level
}

// Timeout is one validation's bound (default 300 s).
func (v *GPUValidation) Timeout() int32 {
	if v == nil || v.TimeoutSeconds == 0 {
		return 300
	}
	return v.TimeoutSeconds
}

// GPUValidationResult is the last validation of a GPU.
type GPUValidationResult struct {
	Time  metav1.Time        `json:"time"`
	Level GPUValidationLevel `json:"level"`
	// Passed: the GPU works; it returned to service.
	Passed bool `json:"passed"`
	// Message: what was checked, or what failed.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// RepeatLimit is a count within a window.
type RepeatLimit struct {
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	Count int32 `json:"count"`
	// +kubebuilder:default=86400
	// +kubebuilder:validation:Minimum=60
	// +kubebuilder:validation:Maximum=2592000
	WindowSeconds int32 `json:"windowSeconds"`
}

// XIDClass sets the class of one XID code.
type XIDClass struct {
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1023
	Code  int32         `json:"code"`
	Class GPUFaultClass `json:"class"`
}

func init() {
	register(&GPUFault{}, &GPUFaultList{})
}
