//go:build !release

package main

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufleet/gpufleet/internal/devcluster"
)

// newSimCommand injects faults into the simulated GPU nodes of `gpufleet
// dev` (or of any local cluster of devcluster), through the same node
// annotations the simulated kernel log and dcgm-exporter are read from.
func newSimCommand() *cobra.Command {
	var kubeconfig string
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Inject GPU faults into the simulated nodes of the local cluster (gpufleet dev)",
		Long: `sim changes the simulated GPU host of a kwok node of the local cluster: its
kernel log (NVRM Xid lines, read by the node agent's real parser) and its
GPUs' health as dcgm-exporter would report it. It talks to the cluster of
--kubeconfig or $KUBECONFIG (the one gpufleet dev prints).`,
	}
	cmd.PersistentFlags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the local cluster (default: $KUBECONFIG)")
	connect := func() (*devcluster.Cluster, error) { return devcluster.Connect(kubeconfig) }

	xid := &cobra.Command{
		Use:   "xid NODE GPU CODE",
		Short: "Write an NVRM Xid line for GPU (index) to the node's kernel log",
		Example: `  gpufleet sim xid gpu-003 3 48    # uncorrectable ECC error: isolate, drain its pods, reset
  gpufleet sim xid gpu-003 1 13    # an application's error: recorded, not repaired
  gpufleet sim xid gpu-003 5 79    # fell off the bus: reboot`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			gpu, code, err := twoInts(args[1], args[2])
			if err != nil {
				return err
			}
			c, err := connect()
			if err != nil {
				return err
			}
			return c.InjectXID(cmd.Context(), args[0], gpu, code)
		},
	}

	var state devcluster.SimGPUState
	gpu := &cobra.Command{
		Use:   "gpu NODE GPU",
		Short: "Set the health of a simulated GPU (as dcgm-exporter reports it)",
		Example: `  gpufleet sim gpu gpu-003 2 --dbe 4 --reset-fails   # ECC errors that a reset does not fix: reboot
  gpufleet sim gpu gpu-003 6 --row-remap-failure      # replace the GPU
  gpufleet sim gpu gpu-003 4 --dbe 2 --fails-validation   # reset, fails its validation: reboot, validated
  gpufleet sim gpu gpu-003 6                          # healthy again`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			i, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("GPU index %q: %w", args[1], err)
			}
			c, err := connect()
			if err != nil {
				return err
			}
			return c.SetGPUState(cmd.Context(), args[0], i, func(s *devcluster.SimGPUState) { *s = state })
		},
	}
	gpu.Flags().Uint64Var(&state.VolatileDBE, "dbe", 0, "uncorrectable (double-bit) ECC errors since the last reset")
	gpu.Flags().BoolVar(&state.RowRemapFailure, "row-remap-failure", false, "a row remapping failed")
	gpu.Flags().BoolVar(&state.RowRemapPending, "row-remap-pending", false, "a row remap waits for a reset")
	gpu.Flags().BoolVar(&state.Missing, "missing", false, "the GPU fell off the bus")
	gpu.Flags().BoolVar(&state.ResetFails, "reset-fails", false, "a reset of the GPU fails")
	gpu.Flags().BoolVar(&state.Broken, "broken", false, "neither a reset nor a reboot fixes the GPU")
	gpu.Flags().BoolVar(&state.FailsValidation, "fails-validation", false, "a reset succeeds but the GPU fails its validation, until a reboot")

	clearCmd := &cobra.Command{
		Use:   "clear NODE",
		Short: "Empty the node's simulated kernel log and make its GPUs healthy",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			return c.ClearSimGPUs(cmd.Context(), args[0])
		},
	}
	var fixedBy string
	var clearCond bool
	condition := &cobra.Command{
		Use:   "condition NODE TYPE",
		Short: "Set a node condition (status True), as a node-problem-detector plugin would; --clear removes it",
		Example: `  gpufleet sim condition gpu-003 FabricManagerUnhealthy --fixed-by RestartFabricManager   # the default fabric-manager rule restarts it
  gpufleet sim condition gpu-003 NTPProblem --fixed-by RestartNTP
  gpufleet sim condition gpu-003 FabricManagerUnhealthy --clear`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			node, typ := args[0], corev1.NodeConditionType(args[1])
			if clearCond {
				return c.ClearNodeCondition(cmd.Context(), node, typ)
			}
			if fixedBy != "" {
				patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{devcluster.AnnotationFixedBy: fixedBy}}})
				if err != nil {
					return err
				}
				if _, err := c.Client.CoreV1().Nodes().Patch(cmd.Context(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
					return fmt.Errorf("node %s: %w", node, err)
				}
			}
			return c.SetNodeCondition(cmd.Context(), node, corev1.NodeCondition{Type: typ, Status: corev1.ConditionTrue, Reason: "Simulated",
				Message: "set by gpufleet sim condition"})
		},
	}
	condition.Flags().StringVar(&fixedBy, "fixed-by", "", "the repair actions that clear the node's simulated conditions (comma separated, e.g. RestartFabricManager)")
	condition.Flags().BoolVar(&clearCond, "clear", false, "remove the condition instead")
	var cdNamespace, cdDomain string
	var cdNodes []string
	var cdEnd bool
	computeDomain := &cobra.Command{
		Use:   "computedomain NAME",
		Short: "Start (or --end) a multi-node NVLink job: a ComputeDomain with a worker pod on each node of a domain",
		Long: `computedomain starts a simulated ComputeDomain workload (NVIDIA's DRA driver's
multi-node NVLink job): the ComputeDomain object, one worker pod on each node
of --domain (nodes labelled nvidia.com/gpu.clique, see gpufleet dev --domains)
or of --nodes, and, as the driver does, the node label
resource.nvidia.com/computeDomain while a worker runs there. With
spec.domains, gpufleet schedules that domain last and names the workload in
wait reasons; with waitForComputeDomains, maintenance that waits for pods
waits for it to end. --end ends the job.`,
		Example: `  gpufleet sim computedomain train --domain rack-1
  gpufleet sim computedomain train --end`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			if cdEnd {
				return c.EndComputeDomain(cmd.Context(), cdNamespace, args[0])
			}
			nodes := cdNodes
			if cdDomain != "" {
				list, err := c.Client.CoreV1().Nodes().List(cmd.Context(), metav1.ListOptions{LabelSelector: devcluster.LabelGPUClique + "=" + cdDomain})
				if err != nil {
					return err
				}
				for _, n := range list.Items {
					nodes = append(nodes, n.Name)
				}
			}
			if len(nodes) == 0 {
				return fmt.Errorf("no nodes: give --domain (a value of %s) or --nodes", devcluster.LabelGPUClique)
			}
			uid, err := c.StartComputeDomain(cmd.Context(), cdNamespace, args[0], nodes)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "ComputeDomain %s/%s (uid %s): a worker on %v\n", cdNamespace, args[0], uid, nodes)
			return err
		},
	}
	computeDomain.Flags().StringVarP(&cdNamespace, "namespace", "n", "ml", "namespace of the ComputeDomain and its workers")
	computeDomain.Flags().StringVar(&cdDomain, "domain", "", "run on every node of this NVLink domain ("+devcluster.LabelGPUClique+")")
	computeDomain.Flags().StringSliceVar(&cdNodes, "nodes", nil, "run on these nodes")
	computeDomain.Flags().BoolVar(&cdEnd, "end", false, "end the job: delete its workers and the ComputeDomain")
	cmd.AddCommand(xid, gpu, clearCmd, condition, computeDomain)
	return cmd
}

func twoInts(a, b string) (int, int, error) {
	x, err := strconv.Atoi(a)
	if err != nil {
		return 0, 0, fmt.Errorf("GPU index %q: %w", a, err)
	}
	y, err := strconv.Atoi(b)
	if err != nil {
		return 0, 0, fmt.Errorf("XID code %q: %w", b, err)
	}
	return x, y, nil
}
