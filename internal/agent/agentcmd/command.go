// Package agentcmd is the node agent's command line: `gpufleet agent` in the
// gpufleet binary and the whole of the agent's own binary,
// cmd/gpufleet-agent, which the agent DaemonSet runs. It imports the agent
// and internal/cli only: whatever it links is paid for in memory on every
// GPU node (see TestAgentBinaryLinksOnlyTheAgent).
package agentcmd

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap/zapcore"

	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/cli"
)

// NewCommand is the agent command, named use ("agent" as a subcommand of
// gpufleet, "gpufleet-agent" as a binary of its own).
func NewCommand(use string) *cobra.Command {
	var kubeconfig, nodeName, namespace, kmsgPath, dcgmURL, podResources string
	var dcgmInterval time.Duration
	cmd := &cobra.Command{
		Use:   use,
		Short: "Run the node agent: execute repair actions requested for this node, report its GPU faults",
		Long: `The node agent runs on every node (a privileged DaemonSet with hostPID) and
executes the repair actions that NodeRepair objects request for its node:
restart the kubelet, the container runtime or the NTP daemon (systemd units,
through nsenter into PID 1), delete broken pod sandboxes (crictl), reset GPUs
(nvidia-smi), reboot. The set of actions is fixed; nothing from the API is
run as a command.

It also watches the node's GPUs: NVIDIA XIDs in the kernel log (--kmsg-path)
and health counters of dcgm-exporter (--dcgm-url), and writes one GPUFault
record per faulty GPU and the node's GPUProblem condition. While a GPU is out
of service it asks the kubelet's pod-resources API (--pod-resources-socket)
which pods were given it (nvidia.com/gpu, device plugin) and records them, so
that the repair drains only those pods.

"gpufleet agent" and the gpufleet-agent binary are the same command; the
DaemonSet runs the second, which links nothing but the agent.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if nodeName == "" {
				nodeName = os.Getenv("NODE_NAME")
			}
			if nodeName == "" {
				return fmt.Errorf("--node-name or $NODE_NAME is required")
			}
			if dcgmInterval <= 0 {
				return fmt.Errorf("--dcgm-interval must be positive, not %s", dcgmInterval)
			}
			// After the input checks: the logger is process-wide, and bad
			// input must change nothing (the tests run these in-process).
			cli.SetupLogging(false, zapcore.InfoLevel)
			cfg, err := cli.RestConfig(kubeconfig)
			if err != nil {
				return err
			}
			gpus := agent.NewHostGPUSource(nodeName, kmsgPath, dcgmURL, dcgmInterval)
			if podResources != "" {
				gpus.PodResources = &agent.KubeletPodResources{Socket: podResources}
			}
			if namespace == "" {
				namespace = os.Getenv("POD_NAMESPACE")
			}
			d, err := agent.New(cfg, agent.Options{NodeName: nodeName, Namespace: namespace, Executor: agent.HostExecutor{Runner: agent.ExecRunner{}},
				GPUs: gpus})
			if err != nil {
				return err
			}
			ctx, cancel := cli.SignalContext()
			defer cancel()
			return d.Start(ctx)
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "path to a kubeconfig (default: in-cluster)")
	cmd.Flags().StringVar(&nodeName, "node-name", "", "this node's name (default: $NODE_NAME)")
	cmd.Flags().StringVar(&namespace, "namespace", "", `the operator's namespace, where the NodeMaintenance objects that hold the node for a reboot or a GPU reset are (default: $POD_NAMESPACE; "" with neither: any namespace)`)
	cmd.Flags().StringVar(&kmsgPath, "kmsg-path", "/dev/kmsg", `kernel log to follow for NVIDIA XIDs ("" reads none)`)
	cmd.Flags().StringVar(&dcgmURL, "dcgm-url", "", `dcgm-exporter's metrics URL, e.g. http://localhost:9400/metrics ("" reads no counters)`)
	cmd.Flags().DurationVar(&dcgmInterval, "dcgm-interval", 30*time.Second, "how often dcgm-exporter is read")
	cmd.Flags().StringVar(&podResources, "pod-resources-socket", agent.DefaultPodResourcesSocket,
		`the kubelet's pod-resources socket, asked which pods hold a faulty GPU ("" asks nothing: the repair drains every GPU pod of the node)`)
	return cmd
}
