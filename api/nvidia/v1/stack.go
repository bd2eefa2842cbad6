package v1

import (
	"strings"

	"k8s.io/utils/ptr"
)

// The GPU stack a ClusterPolicy deploys, as seen from outside its
// controller: the components in rollout order, the node and object labels
// that show where each one is, and the pure functions that read them. The
// controller (internal/gpustack) deploys the stack with these; the fleet
// view (internal/fleet: gpufleet status, explain, ui) reads the stack's
// state with them without linking the controller.

// Component is one part of the GPU stack.
//
// +kubebuilder:object:generate=false
type Component struct {
	// Key is the component's name in labels, status and asset file names.
	Key string
	// DeployLabel is the node label that lets the component's DaemonSet run
	// on a node: nvidia.com/gpu.deploy.<suffix>.
	DeployLabel string
	// After are the earlier components this one needs on its node. Every
	// component of a node starts at once; a component's pods begin with one
	// init container per entry that validates it (named as in NVIDIA's GPU
	// Operator: driver-validation, toolkit-validation, plugin-validation)
	// and waits until it works on the node, whoever provides it (a pod of
	// the stack, or the host when an administrator opted the node out).
	After []string
	// Spec returns the component's settings in the policy.
	Spec func(*ClusterPolicySpec) *ComponentSpec
	// OffByDefault components run only when enabled explicitly.
	OffByDefault bool
	// Privileged components run privileged with host access.
	Privileged bool
	// OnlyOn, when set, limits the component to the GPU nodes whose labels
	// it accepts (e.g. mig-manager on MIG-capable nodes); elsewhere it is
	// neither deployed nor waited for.
	OnlyOn func(nodeLabels map[string]string) bool
}

// RunsOn reports whether the component belongs on a GPU node with these labels.
func (c Component) RunsOn(nodeLabels map[string]string) bool {
	return c.OnlyOn == nil || c.OnlyOn(nodeLabels)
}

// Enabled reports whether the component is enabled in the policy.
func (c Component) Enabled(p *ClusterPolicySpec) bool {
	spec := c.Spec(p)
	if spec.Enabled != nil {
		return *spec.Enabled
	}
	return !c.OffByDefault
}

// Component keys.
const (
	Driver             = "driver"
	ContainerToolkit   = "container-toolkit"
	DevicePlugin       = "device-plugin"
	Validator          = "operator-validator"
	DCGM               = "dcgm"
	DCGMExporter       = "dcgm-exporter"
	GFD                = "gpu-feature-discovery"
	MIGManager         = "mig-manager"
	NodeStatusExporter = "node-status-exporter"
)

// Components in rollout order (docs/gpu-stack.md). The order is the one of status
// and of the dependencies (After): driver → container-toolkit →
// device-plugin → operator-validator; dcgm, dcgm-exporter,
// gpu-feature-discovery and mig-manager need driver and toolkit, the node
// status exporter the driver, as in NVIDIA's GPU Operator.
var Components = []Component{
	{Key: Driver, Privileged: true, Spec: func(s *ClusterPolicySpec) *ComponentSpec { return &s.Driver.ComponentSpec }},
	{Key: ContainerToolkit, After: []string{Driver}, Privileged: true, Spec: func(s *ClusterPolicySpec) *ComponentSpec { return &s.Toolkit.ComponentSpec }},
	{Key: DevicePlugin, After: []string{Driver, ContainerToolkit}, Privileged: true, Spec: func(s *ClusterPolicySpec) *ComponentSpec { return &s.DevicePlugin.ComponentSpec }},
	{Key: Validator, After: []string{Driver, ContainerToolkit, DevicePlugin}, Privileged: true, Spec: validatorSpec},
	{Key: DCGM, After: []string{Driver, ContainerToolkit}, OffByDefault: true, Spec: func(s *ClusterPolicySpec) *ComponentSpec { return &s.DCGM.ComponentSpec }},
	{Key: DCGMExporter, After: []string{Driver, ContainerToolkit}, Spec: func(s *ClusterPolicySpec) *ComponentSpec { return &s.DCGMExporter.ComponentSpec }},
	{Key: GFD, After: []string{Driver, ContainerToolkit}, Spec: func(s *ClusterPolicySpec) *ComponentSpec { return &s.GFD.ComponentSpec }},
	{Key: MIGManager, After: []string{Driver, ContainerToolkit}, OffByDefault: true, Privileged: true, OnlyOn: migCapable, Spec: func(s *ClusterPolicySpec) *ComponentSpec { return &s.MIGManager.ComponentSpec }},
	{Key: NodeStatusExporter, After: []string{Driver}, OffByDefault: true, Spec: func(s *ClusterPolicySpec) *ComponentSpec { return &s.NodeStatusExporter }},
}

func init() {
	for i := range Components {
		Components[i].DeployLabel = "nvidia.com/gpu.deploy." + Components[i].Key
	}
}

// validatorSpec is the validator's settings, read the same way from both
// places a policy may hold them: spec.validator (current shape) and
// spec.operator.validator (NVIDIA operator 1.x). The image settings come
// from spec.validator when it names an image, else from the 1.x place;
// enabled is spec.validator's when set, else the 1.x place's. The result
// is a copy: callers read it, never write through it.
func validatorSpec(s *ClusterPolicySpec) *ComponentSpec {
	v := s.Validator.ComponentSpec.DeepCopy()
	old := s.Operator.Validator
	if old == nil {
		return v
	}
	enabled := v.Enabled
	if v.Image == "" {
		v = old.DeepCopy()
	}
	v.Enabled = enabled
	if v.Enabled == nil && old.Enabled != nil {
		v.Enabled = ptr.To(*old.Enabled)
	}
	return v
}

// Node labels of the GPU stack.
const (
	// LabelGPUPresent marks a node where Node Feature Discovery found an
	// NVIDIA GPU (HasNvidiaGPU); the controller sets it.
	LabelGPUPresent = "nvidia.com/gpu.present"
	// LabelMIGCapable is set by GPU feature discovery on nodes whose GPUs
	// support MIG; mig-manager runs only there, as in NVIDIA's GPU Operator.
	LabelMIGCapable = "nvidia.com/mig.capable"
	// LabelUpgradeState shows a node's driver upgrade on the node:
	// upgrading, or failed (until the node's driver is current and Ready,
	// or an administrator removes the label to retry).
	LabelUpgradeState = "gpufleet.dev/driver-upgrade"
)

func migCapable(nodeLabels map[string]string) bool { return nodeLabels[LabelMIGCapable] == "true" }

// NFD labels that reveal an NVIDIA PCI device (vendor 10de).
var nvidiaPCILabels = []string{
	"feature.node.kubernetes.io/pci-10de.present",
	"feature.node.kubernetes.io/pci-0300_10de.present",
	"feature.node.kubernetes.io/pci-0302_10de.present",
}

// HasNvidiaGPU reports whether Node Feature Discovery found an NVIDIA GPU.
func HasNvidiaGPU(labels map[string]string) bool {
	for _, l := range nvidiaPCILabels {
		if labels[l] == "true" {
			return true
		}
	}
	return false
}

// DRADriver is the name of NVIDIA's DRA driver for GPUs (its
// ResourceSlices, and the driver of the devices allocated to a claim).
const DRADriver = "gpu.nvidia.com"

// Labels gpufleet puts on every object of the GPU stack it renders.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelComponent = "app.kubernetes.io/component"
	// ManagedBy is gpufleet's value of LabelManagedBy.
	ManagedBy = "gpufleet"
)

// operatorNames maps the GPU Operator's operand DaemonSets (ClusterPolicy
// mode; their pods' "app" label has the same value) to components.
var operatorNames = map[string]string{
	"nvidia-driver-daemonset":            Driver,
	"nvidia-container-toolkit-daemonset": ContainerToolkit,
	"nvidia-device-plugin-daemonset":     DevicePlugin,
	"nvidia-operator-validator":          Validator,
	"nvidia-dcgm":                        DCGM,
	"nvidia-dcgm-exporter":               DCGMExporter,
	"gpu-feature-discovery":              GFD,
	"nvidia-mig-manager":                 MIGManager,
	"nvidia-node-status-exporter":        NodeStatusExporter,
}

// operatorDriverComponent is the GPU Operator's component label of driver
// DaemonSets and pods (NVIDIADriver mode names them by hash).
const operatorDriverComponent = "nvidia-driver"

// PodComponent is the GPU stack component a pod in the stack's namespace
// belongs to ("" when none): gpufleet's label, or for a pod of an adopted
// DaemonSet whose template was kept, the GPU Operator's labels.
func PodComponent(labels map[string]string) string {
	if labels[LabelManagedBy] == ManagedBy {
		return labels[LabelComponent]
	}
	return OperatorComponent("", labels)
}

// OperatorComponent is the component of NVIDIA's GPU Operator's DaemonSet
// (by its name) or pod (by its labels), "" when it is none of the stack's.
func OperatorComponent(name string, labels map[string]string) string {
	if c, ok := operatorNames[name]; ok {
		return c
	}
	if c, ok := operatorNames[labels["app"]]; ok {
		return c
	}
	if strings.HasPrefix(name, "nvidia-driver-daemonset-") || labels[LabelComponent] == operatorDriverComponent {
		return Driver // precompiled (per kernel) and NVIDIADriver-mode drivers
	}
	return ""
}
