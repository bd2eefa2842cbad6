// Package gpustack deploys the GPU software stack of a ClusterPolicy:
// labels GPU nodes (labels.go, pure), renders each component's objects from
// manifests embedded in the binary (render.go, pure) and applies them with
// per-node readiness gating (controller.go).
package gpustack

import (
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// The components, their keys and the labels that show them are the GPU
// stack's API (api/nvidia/v1/stack.go), which the fleet view reads without
// linking this controller. These names keep the controller's code short.

// Component is one part of the GPU stack.
type Component = nvidiav1.Component

// Component keys.
const (
	Driver             = nvidiav1.Driver
	ContainerToolkit   = nvidiav1.ContainerToolkit
	DevicePlugin       = nvidiav1.DevicePlugin
	Validator          = nvidiav1.Validator
	DCGM               = nvidiav1.DCGM
	DCGMExporter       = nvidiav1.DCGMExporter
	GFD                = nvidiav1.GFD
	MIGManager         = nvidiav1.MIGManager
	NodeStatusExporter = nvidiav1.NodeStatusExporter
)

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

// ValidatorEnabled reports whether the operator validator runs. It is the
// one answer the renderer, the node labels and driver upgrades (which wait
// for the validator only when it runs) all use.
func ValidatorEnabled(s *nvidiav1.ClusterPolicySpec) bool {
	return validatorComponent().Enabled(s)
}

func validatorComponent() Component {
	for _, c := range nvidiav1.Components {
		if c.Key == Validator {
			return c
		}
	}
	panic("the validator is not a component") // nvidiav1.Components is a constant table
}
