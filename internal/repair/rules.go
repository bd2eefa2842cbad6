// Package repair implements node auto-repair: pure fault detection and
// admission (policy.go), the repair ladder controller, and the node agent's
// executor interface.
package repair

import (
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// DefaultRules are the documented default rules (docs/repair.md); a policy without rules uses them. Reboot
// actions run only when the policy allows reboots. Each fault is matched in
// both spellings in use: the kubelet's own Ready condition and ACK's
// node-problem-detector (KubeletNotReady with reasons KubeletHung / PLEG /
// SandboxError, RuntimeOffline, NTPProblem, SystemdOffline,
// ReadonlyFilesystem), and upstream node-problem-detector
// (ContainerRuntimeUnhealthy, KubeletUnhealthy, ReadonlyFilesystem). Reasons
// and message substrings match regardless of letter case.
//
// GPU faults come from the node agent's GPUProblem condition, whose reason
// is the most severe class among the node's out-of-service GPUs: ResetGPU
// (drain the GPU's pods, reset it; a failed reset falls back to a reboot),
// Reboot, and Replace (no action: reported for a person, the GPU stays
// isolated).
func DefaultRules() []repairv1.Rule {
	restartRuntimeKubeletReboot := []repairv1.Action{repairv1.ActionRestartContainerRuntime, repairv1.ActionRestartKubelet, repairv1.ActionReboot}
	sandbox := []repairv1.Action{repairv1.ActionDeleteBrokenSandbox, repairv1.ActionRestartKubelet}
	kubeletReboot := []repairv1.Action{repairv1.ActionRestartKubelet, repairv1.ActionReboot}
	runtimeReboot := []repairv1.Action{repairv1.ActionRestartContainerRuntime, repairv1.ActionReboot}
	reboot := []repairv1.Action{repairv1.ActionReboot}
	return []repairv1.Rule{
		// Kubelet not ready: PLEG (medium risk).
		{Name: "kubelet-pleg", ConditionType: "Ready", Status: "False", MessageContains: "PLEG is not healthy", ThresholdSeconds: 180, Risk: "medium", Actions: restartRuntimeKubeletReboot},
		{Name: "kubelet-pleg-npd", ConditionType: "KubeletNotReady", Status: "True", Reason: "PLEG", ThresholdSeconds: 180, Risk: "medium", Actions: restartRuntimeKubeletReboot},
		// Kubelet not ready: sandbox errors.
		{Name: "kubelet-sandbox", ConditionType: "Ready", Status: "False", MessageContains: "sandbox", ThresholdSeconds: 180, Risk: "high", Actions: sandbox},
		{Name: "kubelet-sandbox-npd", ConditionType: "KubeletNotReady", Status: "True", Reason: "SandboxError", ThresholdSeconds: 180, Risk: "high", Actions: sandbox},
		// Kubelet not ready: hung (stopped posting status, or reported hung).
		{Name: "kubelet-hung", ConditionType: "Ready", Status: "Unknown", ThresholdSeconds: 180, Risk: "high", Actions: kubeletReboot},
		{Name: "kubelet-hung-npd", ConditionType: "KubeletNotReady", Status: "True", Reason: "KubeletHung", ThresholdSeconds: 180, Risk: "high", Actions: kubeletReboot},
		{Name: "kubelet-unhealthy", ConditionType: "KubeletUnhealthy", Status: "True", ThresholdSeconds: 180, Risk: "high", Actions: kubeletReboot},
		// Container runtime offline.
		{Name: "container-runtime-offline", ConditionType: "ContainerRuntimeUnhealthy", Status: "True", ThresholdSeconds: 90, Risk: "high", Actions: runtimeReboot},
		{Name: "container-runtime-offline-npd", ConditionType: "RuntimeOffline", Status: "True", ThresholdSeconds: 90, Risk: "high", Actions: runtimeReboot},
		{Name: "ntp-problem", ConditionType: "NTPProblem", Status: "True", ThresholdSeconds: 10, Risk: "high",
			Actions: []repairv1.Action{repairv1.ActionRestartNTP}},
		{Name: "systemd-offline", ConditionType: "SystemdOffline", Status: "True", ThresholdSeconds: 90, Risk: "high", Actions: reboot},
		{Name: "readonly-filesystem", ConditionType: "ReadonlyFilesystem", Status: "True", ThresholdSeconds: 90, Risk: "high", Actions: reboot},
		// The node's GPU services, as a node-problem-detector plugin (or any
		// monitor) reports them: restarting the service fixes the common
		// case without a reboot; Fabric Manager's link training falls back
		// to one.
		{Name: "fabric-manager", ConditionType: ConditionFabricManagerUnhealthy, Status: "True", ThresholdSeconds: 60, Risk: "high",
			Actions: []repairv1.Action{repairv1.ActionRestartFabricManager, repairv1.ActionReboot}},
		{Name: "persistenced", ConditionType: ConditionPersistencedUnhealthy, Status: "True", ThresholdSeconds: 60, Risk: "medium",
			Actions: []repairv1.Action{repairv1.ActionRestartPersistenced}},
		{Name: "dcgm", ConditionType: ConditionDCGMUnhealthy, Status: "True", ThresholdSeconds: 120, Risk: "low",
			Actions: []repairv1.Action{repairv1.ActionRestartDCGM}},
		// GPU faults found by the node agent (the GPU is isolated at once;
		// the repair starts past the threshold).
		{Name: "gpu-reset", ConditionType: repairv1.ConditionGPUProblem, Status: "True", Reason: string(repairv1.GPUClassResetGPU), ThresholdSeconds: 10, Risk: "high",
			Actions: []repairv1.Action{repairv1.ActionResetGPU, repairv1.ActionReboot}},
		{Name: "gpu-reboot", ConditionType: repairv1.ConditionGPUProblem, Status: "True", Reason: string(repairv1.GPUClassReboot), ThresholdSeconds: 10, Risk: "high", Actions: reboot},
		{Name: "gpu-replace", ConditionType: repairv1.ConditionGPUProblem, Status: "True", Reason: string(repairv1.GPUClassReplace), ThresholdSeconds: 10, Risk: "high"},
	}
}

// Node conditions of the node's GPU services the default rules repair.
const (
	ConditionFabricManagerUnhealthy = "FabricManagerUnhealthy"
	ConditionPersistencedUnhealthy  = "NVIDIAPersistencedUnhealthy"
	ConditionDCGMUnhealthy          = "DCGMHostEngineUnhealthy"
)

// RulesOf returns the policy's rules, or the defaults.
func RulesOf(p *repairv1.NodeRepairPolicySpec) []repairv1.Rule {
	if len(p.Rules) > 0 {
		return p.Rules
	}
	return DefaultRules()
}
