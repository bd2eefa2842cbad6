// Package repair implements node auto-repair: pure fault detection and
// admission (policy.go), the repair ladder controller, and the node agent's
// executor interface.
package repair

import (
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// DefaultRules reproduce SPEC R1; a policy without rules uses them. Reboot
// actions run only when the policy allows reboots.
func DefaultRules() []repairv1.Rule {
	return []repairv1.Rule{
		{Name: "kubelet-pleg", ConditionType: "Ready", Status: "False", MessageContains: "PLEG is not healthy", ThresholdSeconds: 180, Risk: "medium",
			Actions: []repairv1.Action{repairv1.ActionRestartContainerRuntime, repairv1.ActionRestartKubelet, repairv1.ActionReboot}},
		{Name: "kubelet-sandbox", ConditionType: "Ready", Status: "False", MessageContains: "sandbox", ThresholdSeconds: 180, Risk: "high",
			Actions: []repairv1.Action{repairv1.ActionDeleteBrokenSandbox, repairv1.ActionRestartKubelet}},
		{Name: "kubelet-hung", ConditionType: "Ready", Status: "Unknown", ThresholdSeconds: 180, Risk: "high",
			Actions: []repairv1.Action{repairv1.ActionRestartKubelet, repairv1.ActionReboot}},
		{Name: "container-runtime-offline", ConditionType: "ContainerRuntimeUnhealthy", Status: "True", ThresholdSeconds: 90, Risk: "high",
			Actions: []repairv1.Action{repairv1.ActionRestartContainerRuntime, repairv1.ActionReboot}},
		{Name: "ntp-problem", ConditionType: "NTPProblem", Status: "True", ThresholdSeconds: 10, Risk: "high",
			Actions: []repairv1.Action{repairv1.ActionRestartNTP}},
		{Name: "systemd-offline", ConditionType: "SystemdOffline", Status: "True", ThresholdSeconds: 90, Risk: "high",
			Actions: []repairv1.Action{repairv1.ActionReboot}},
		{Name: "readonly-filesystem", ConditionType: "ReadonlyFilesystem", Status: "True", ThresholdSeconds: 90, Risk: "high",
			Actions: []repairv1.Action{repairv1.ActionReboot}},
	}
}

// RulesOf returns the policy's rules, or the defaults.
func RulesOf(p *repairv1.NodeRepairPolicySpec) []repairv1.Rule {
	if len(p.Rules) > 0 {
		return p.Rules
	}
	return DefaultRules()
}
