// Package gpustack deploys the GPU software stack of a ClusterPolicy:
// labels GPU nodes (labels.go, pure), renders each component's objects from
// manifests embedded in the binary (render.go, pure) and applies them with
// per-node readiness gating (controller.go).
package gpustack

import (
	"k8s.io/utils/ptr"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// Component is one part of the GPU stack.
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
	Spec func(*nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec
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

// LabelMIGCapable is set by GPU feature discovery on nodes whose GPUs
// support MIG; mig-manager runs only there, as in NVIDIA's GPU Operator.
const LabelMIGCapable = "nvidia.com/mig.capable"

func migCapable(nodeLabels map[string]string) bool { return nodeLabels[LabelMIGCapable] == "true" }

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
	{Key: Driver, Privileged: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.Driver.ComponentSpec }},
	{Key: ContainerToolkit, After: []string{Driver}, Privileged: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.Toolkit.ComponentSpec }},
	{Key: DevicePlugin, After: []string{Driver, ContainerToolkit}, Privileged: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.DevicePlugin.ComponentSpec }},
	{Key: Validator, After: []string{Driver, ContainerToolkit, DevicePlugin}, Privileged: true, Spec: validatorSpec},
	{Key: DCGM, After: []string{Driver, ContainerToolkit}, OffByDefault: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.DCGM.ComponentSpec }},
	{Key: DCGMExporter, After: []string{Driver, ContainerToolkit}, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.DCGMExporter.ComponentSpec }},
	{Key: GFD, After: []string{Driver, ContainerToolkit}, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.GFD.ComponentSpec }},
	{Key: MIGManager, After: []string{Driver, ContainerToolkit}, OffByDefault: true, Privileged: true, OnlyOn: migCapable, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.MIGManager.ComponentSpec }},
	{Key: NodeStatusExporter, After: []string{Driver}, OffByDefault: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.NodeStatusExporter }},
}

// validationNames are the init containers that validate a component, as
// NVIDIA's GPU Operator names them.
var validationNames = map[string]string{
	Driver:           "driver-validation",
	ContainerToolkit: "toolkit-validation",
	DevicePlugin:     "plugin-validation",
}

// validationComponent is the COMPONENT a validation init container checks
// (gpu-operator's validator: driver, toolkit, plugin).
var validationComponent = map[string]string{
	Driver:           "driver",
	ContainerToolkit: "toolkit",
	DevicePlugin:     "plugin",
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
func validatorSpec(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec {
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

// ValidatorEnabled reports whether the operator validator runs. It is the
// one answer the renderer, the node labels and driver upgrades (which wait
// for the validator only when it runs) all use.
func ValidatorEnabled(s *nvidiav1.ClusterPolicySpec) bool {
	return validatorComponent().Enabled(s)
}

func validatorComponent() Component {
	for _, c := range Components {
		if c.Key == Validator {
			return c
		}
	}
	panic("the validator is not a component") // Components is a constant table
}

// Enabled reports whether the component is enabled in the policy.
func (c Component) Enabled(p *nvidiav1.ClusterPolicySpec) bool {
	spec := c.Spec(p)
	if spec.Enabled != nil {
		return *spec.Enabled
	}
	return !c.OffByDefault
}
