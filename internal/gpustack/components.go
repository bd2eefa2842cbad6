// Package gpustack deploys the GPU software stack of a ClusterPolicy:
// labels GPU nodes (labels.go, pure), renders each component's objects from
// manifests embedded in the binary (render.go, pure) and applies them with
// per-node readiness gating (controller.go).
package gpustack

import (
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

// Components in rollout order (SPEC G3).
var Components = []Component{
	{Key: Driver, Stage: 0, Privileged: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.Driver.ComponentSpec }},
	{Key: ContainerToolkit, Stage: 1, Privileged: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.Toolkit.ComponentSpec }},
	{Key: DevicePlugin, Stage: 2, Privileged: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.DevicePlugin.ComponentSpec }},
	{Key: Validator, Stage: 3, Privileged: true, Spec: validatorSpec},
	{Key: DCGM, Stage: 4, OffByDefault: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.DCGM }},
	{Key: DCGMExporter, Stage: 4, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.DCGMExporter }},
	{Key: GFD, Stage: 5, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.GFD.ComponentSpec }},
	{Key: MIGManager, Stage: 6, OffByDefault: true, Privileged: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.MIGManager }},
	{Key: NodeStatusExporter, Stage: 6, OffByDefault: true, Spec: func(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec { return &s.NodeStatusExporter }},
}

func init() {
	for i := range Components {
		Components[i].DeployLabel = "nvidia.com/gpu.deploy." + Components[i].Key
	}
}

// validatorSpec prefers spec.validator; a policy written for NVIDIA operator
// 1.x puts the validator under spec.operator.validator.
func validatorSpec(s *nvidiav1.ClusterPolicySpec) *nvidiav1.ComponentSpec {
	if s.Validator.Image == "" && s.Operator.Validator != nil {
		return s.Operator.Validator
	}
	return &s.Validator
}

// Enabled reports whether the component is enabled in the policy.
func (c Component) Enabled(p *nvidiav1.ClusterPolicySpec) bool {
	spec := c.Spec(p)
	if spec.Enabled != nil {
		return *spec.Enabled
	}
	return !c.OffByDefault
}
