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
	// Stage orders the rollout: a node gets the deploy labels of stage k
	// only once its pods of every enabled component of earlier stages are
	// Ready.
	Stage int
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

// Components in rollout order (SPEC G3).
var Components = []Component{
	{Key: Driver, Stage: 0, Privileged: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.Driver.ComponentSpec }},
	{Key: ContainerToolkit, Stage: 1, Privileged: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.Toolkit.ComponentSpec }},
	{Key: DevicePlugin, Stage: 2, Privileged: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.DevicePlugin.ComponentSpec }},
	{Key: Validator, Stage: 3, Privileged: true, Spec: validatorSpec},
	{Key: DCGM, Stage: 4, OffByDefault: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.DCGM.ComponentSpec }},
	{Key: DCGMExporter, Stage: 4, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.DCGMExporter.ComponentSpec }},
	{Key: GFD, Stage: 5, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.GFD.ComponentSpec }},
	{Key: MIGManager, Stage: 6, OffByDefault: true, Privileged: true, OnlyOn: migCapable, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.MIGManager.ComponentSpec }},
	{Key: NodeStatusExporter, Stage: 6, OffByDefault: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.NodeStatusExporter }},
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
