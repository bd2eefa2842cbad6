package devcluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
)

// AnnotationFixedBy on a simulated node lists the repair actions that fix
// its injected faults (comma separated, e.g. "RestartNTP" or "Reboot").
const AnnotationFixedBy = "sim.gpufleet.dev/fixed-by"

// standardConditions are the kubelet's own; everything else was injected.
var standardConditions = []corev1.NodeConditionType{corev1.NodeReady, corev1.NodeMemoryPressure, corev1.NodeDiskPressure,
	corev1.NodePIDPressure, corev1.NodeNetworkUnavailable}

// SimExecutor is the node agent's host for simulated nodes: it applies each
// action's effect to the kwok node. A reboot gives the node a new boot ID
// and makes it NotReady for RebootDowntime (which also empties the
// simulated kernel log and clears the GPUs' state, broken GPUs' excepted);
// ResetGPU resets the simulated GPUs (see SimGPUState); an action listed in
// the node's AnnotationFixedBy clears its injected faults. It is also the
// agent's GPUSource for simulated nodes (ObserveGPUs).
type SimExecutor struct {
	Cluster        *Cluster
	RebootDowntime time.Duration
}

// Execute implements the agent's Executor.
func (s SimExecutor) Execute(ctx context.Context, node *corev1.Node, a repairv1.Action, gpus []repairv1.GPURef) error {
	if a == repairv1.ActionResetGPU {
		if err := s.Cluster.resetGPUs(ctx, node.Name, gpus); err != nil {
			return err
		}
	}
	if a == repairv1.ActionValidateGPU {
		return s.Cluster.validateGPUs(ctx, node.Name, gpus, agent.ValidationLevel(ctx))
	}
	if a == repairv1.ActionReboot {
		down := s.RebootDowntime
		if down == 0 {
			down = 2 * time.Second
		}
		if err := s.Cluster.Reboot(ctx, node.Name, down); err != nil {
			return err
		}
	}
	if !slices.Contains(strings.Split(node.Annotations[AnnotationFixedBy], ","), string(a)) {
		return nil
	}
	for _, c := range node.Status.Conditions {
		if !slices.Contains(standardConditions, c.Type) {
			if err := s.Cluster.ClearNodeCondition(ctx, node.Name, c.Type); err != nil {
				return err
			}
		}
	}
	if node.Labels[LabelFrozen] != "" {
		if err := s.Cluster.ClearNodeCondition(ctx, node.Name, corev1.NodeReady); err != nil {
			return err
		}
	}
	if node.Labels[LabelKubelet] == "stopped" {
		return s.Cluster.StartKubelet(ctx, node.Name)
	}
	return nil
}

// AddInProcessAgent adds to mgr (the operator's manager, whose credentials
// it uses) the node agent of every simulated node (agent.InProcess) with
// exec, usually a SimExecutor: kwok nodes run no agent DaemonSet, so
// `gpufleet dev` and the tests run the agents in the operator's process.
// clk nil = the real clock.
func AddInProcessAgent(mgr manager.Manager, exec agent.Executor, clk clock.PassiveClock) error {
	d, err := agent.InProcess(mgr.GetConfig(), exec, clk)
	if err != nil {
		return fmt.Errorf("setting up the in-process agent: %w", err)
	}
	return mgr.Add(d)
}
