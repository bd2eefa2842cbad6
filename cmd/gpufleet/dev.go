//go:build !release

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	uzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/gpufleet/gpufleet/internal/cli"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/operator"
)

func newDevCommand() *cobra.Command {
	var (
		nodes, pools int
		cpuNodes     int
		dpNodes      int
		domains      int
		binDir       string
		noOperator   bool
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Start a local cluster with simulated GPU nodes and run the operator against it",
		Long: `dev starts a real local control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) with kwok simulating GPU nodes,
installs gpufleet's CRDs, runs the operator in this process and waits for
Ctrl-C. Everything it started is stopped and removed on exit.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := cli.SetupLogging(true, zapcore.DebugLevel)
			ctx, cancel := cli.SignalContext()
			defer cancel()
			return runDev(ctx, devParams{nodes: nodes, pools: pools, cpuNodes: cpuNodes, dpNodes: dpNodes, domains: domains, binDir: binDir,
				operator: !noOperator, logLevel: level})
		},
	}
	f := cmd.Flags()
	f.IntVar(&nodes, "nodes", 8, "number of simulated GPU nodes")
	f.IntVar(&pools, "pools", 2, "number of node pools the GPU nodes are spread over")
	f.IntVar(&cpuNodes, "cpu-nodes", 0, "number of simulated nodes without GPUs")
	f.IntVar(&domains, "domains", 0, "label the GPU nodes into this many NVLink domains (nvidia.com/gpu.clique, as GPU feature discovery labels NVL72 racks): consecutive nodes share a domain")
	f.IntVar(&dpNodes, "device-plugin-nodes", 0, "number of simulated GPU nodes (dp-000, …, pool dp) whose GPUs only the device plugin gives out (nvidia.com/gpu, no DRA)")
	f.StringVar(&binDir, "bin-dir", "", "directory of the control-plane binaries (default: $GPUFLEET_BIN_DIR or bin/ of the source tree)")
	f.BoolVar(&noOperator, "no-operator", false, "start only the cluster, not the operator")
	return cmd
}

type devParams struct {
	nodes, pools, cpuNodes int
	// domains labels the GPU nodes into this many NVLink domains.
	domains int
	// dpNodes are GPU nodes of the device plugin only (no ResourceSlice).
	dpNodes  int
	binDir   string
	operator bool
	// logLevel follows the MaintenanceOperatorConfig's spec.logLevel.
	logLevel *uzap.AtomicLevel
}

func runDev(ctx context.Context, p devParams) error {
	say := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "gpufleet dev: "+format+"\n", args...) }
	opts := devcluster.Options{BinDir: p.binDir, Logf: say}
	say("starting the local control plane")
	cluster, err := devcluster.Start(ctx, opts)
	var missing *devcluster.MissingBinariesError
	if errors.As(err, &missing) {
		if buildErr := buildControlPlane(say); buildErr != nil {
			return fmt.Errorf("%w (building them failed: %w)", err, buildErr)
		}
		cluster, err = devcluster.Start(ctx, opts)
	}
	if err != nil {
		return err
	}
	defer func() {
		say("stopping the local cluster")
		cluster.Stop()
	}()

	specs := devcluster.GPUNodes(p.nodes, p.pools)
	devcluster.InDomains(specs, p.domains)
	for i := range p.cpuNodes {
		specs = append(specs, devcluster.NodeSpec{Name: fmt.Sprintf("cpu-%03d", i), Pool: "cpu"})
	}
	for i := range p.dpNodes {
		specs = append(specs, devcluster.NodeSpec{Name: fmt.Sprintf("dp-%03d", i), Pool: "dp", GPUs: 8, DevicePluginOnly: true})
	}
	began := time.Now()
	if err := cluster.AddNodes(ctx, specs...); err != nil {
		return err
	}
	say("%d simulated node(s) Ready in %s", len(specs), time.Since(began).Round(100*time.Millisecond))

	if err := devcluster.InstallCRDs(ctx, cluster.Config); err != nil {
		return err
	}
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, operator.DefaultNamespace); err != nil {
		return err
	}

	opCtx, stopOperator := context.WithCancel(ctx)
	defer stopOperator()
	errc := make(chan error, 1)
	if p.operator {
		// The operator runs with exactly the RBAC it declares, not as admin.
		cfg, err := cluster.OperatorConfig(ctx)
		if err != nil {
			return err
		}
		mgr, err := operator.New(cfg, operator.Options{
			Namespace: operator.DefaultNamespace, MetricsAddr: "127.0.0.1:8080", ProbeAddr: "0", LogLevel: p.logLevel,
		})
		if err != nil {
			return err
		}
		// The simulated nodes' agent, in this process: repair actions
		// change the kwok nodes.
		if err := devcluster.AddInProcessAgent(mgr, devcluster.SimExecutor{Cluster: cluster}, nil); err != nil {
			return err
		}
		go func() { errc <- mgr.Start(opCtx) }()
		if p.domains > 0 {
			// A multi-node NVLink job on the first domain's nodes.
			var nodes []string
			for _, s := range specs {
				if s.Labels[devcluster.LabelGPUClique] == "rack-0" {
					nodes = append(nodes, s.Name)
				}
			}
			if _, err := cluster.StartComputeDomain(ctx, "ml", "train", nodes); err != nil {
				return err
			}
			say("ComputeDomain ml/train (a multi-node NVLink job) runs on the %d node(s) of domain rack-0", len(nodes))
		}
		say("operator running (capabilities: %v), metrics on http://127.0.0.1:8080/metrics", operator.CapabilityNames())
	}

	fmt.Printf(`
The local cluster is up. In another terminal:

  export KUBECONFIG=%[1]s
  export PATH=%[2]s:$PATH   # kubectl built by make tools
  kubectl get nodes -L gpufleet.dev/pool
  kubectl apply -f examples/maintenance.yaml   # a MaintenanceOperatorConfig and two NodeMaintenance objects
  kubectl get nodemaintenances -w
  # with --domains 3 (NVLink domains rack-0…2; ComputeDomain ml/train runs on rack-0):
  kubectl apply -f examples/maintenance-domains.yaml; kubectl get nodemaintenances   # rack-0 goes last, its wait reasons name ml/train
  %[2]s/gpufleet sim computedomain train --end   # the job ends: rack-0 is no longer busy
  kubectl apply -f examples/clusterpolicy.yaml # the GPU stack, deployed node by node
  kubectl get clusterpolicy cluster-policy -o yaml; kubectl get pods -n gpufleet-system -o wide

GPU faults (auto-repair with DRA; the simulated nodes publish their GPUs in ResourceSlices):
  kubectl apply -f examples/repair-gpu.yaml    # a NodeRepairPolicy and 12 pods with one GPU claim each
  kubectl get pods -o wide; kubectl get resourceclaims -o wide
  %[2]s/gpufleet sim xid gpu-000 3 48          # uncorrectable ECC error on GPU 3 of gpu-000
  kubectl get gpufaults; kubectl get devicetaintrules   # isolated at once
  kubectl get noderepairs -w                    # only the pods on GPU 3 drained (NodeMaintenance, no cordon), reset, back in service
  %[2]s/gpufleet sim gpu gpu-001 2 --dbe 4 --reset-fails   # a reset that fails: the node is rebooted
  %[2]s/gpufleet sim gpu gpu-002 4 --dbe 2 --fails-validation   # reset, fails its validation (stays isolated): reboot, validated
  %[2]s/gpufleet sim xid gpu-002 1 13          # an application's error: recorded, not repaired
  kubectl get resourceslice gpu-000-gpu.nvidia.com -o jsonpath='{.spec.devices[3].taints}'   # the DRA driver's own taint, until the repair restarts its plugin
  %[2]s/gpufleet sim condition gpu-003 FabricManagerUnhealthy --fixed-by RestartFabricManager   # default rule: Fabric Manager restarted, no reboot
%[4]s
See the fleet (every node's pool, GPUs, GPU stack, maintenance and repair):
  %[2]s/gpufleet status                         # or, with ln -s gpufleet kubectl-gpufleet on the PATH: kubectl gpufleet status
  %[2]s/gpufleet status --problems -o wide; %[2]s/gpufleet explain gpu-000
  %[2]s/gpufleet ui                             # the live view in the browser: http://127.0.0.1:8090/

Logs of the control plane are in %[3]s. Press Ctrl-C to stop and clean up.
`, cluster.Kubeconfig, binDirOf(p.binDir), cluster.Dir, devicePluginHelp(p.dpNodes, binDirOf(p.binDir)))

	select {
	case <-ctx.Done():
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("operator stopped: %w", err)
		}
		return nil
	}
	// Stop the operator before the cluster it talks to.
	stopOperator()
	if p.operator {
		select {
		case err := <-errc:
			if err != nil {
				say("operator stopped with an error: %v", err)
			}
		case <-time.After(15 * time.Second):
			say("operator did not stop within 15s")
		}
	}
	return nil
}

// devicePluginHelp is the device-plugin walkthrough of the start-up
// message (docs/getting-started.md).
func devicePluginHelp(dpNodes int, binDir string) string {
	if dpNodes == 0 {
		return `
GPU faults with the device plugin (nvidia.com/gpu, no DRA): start with --device-plugin-nodes 1
`
	}
	return fmt.Sprintf(`
GPU faults with the device plugin (nvidia.com/gpu, no DRA) on dp-000:
  kubectl apply -f examples/repair-gpu-device-plugin.yaml   # the NodeRepairPolicy and 6 pods with nvidia.com/gpu: 1 on pool dp
  kubectl get pods -l app=dp-training -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,GPUS:.metadata.annotations.sim\.gpufleet\.dev/gpus'
  %[1]s/gpufleet sim xid dp-000 3 48           # uncorrectable ECC error on GPU 3: only the pod given GPU 3 is drained (no cordon), GPU 3 reset
  kubectl get gpufaults -w; kubectl get noderepairs -w
  for i in 0 1 2 4; do %[1]s/gpufleet sim xid dp-000 $i 48; done   # 4 of 8 GPUs (gpu.wholeNodeAfter 50%%): the whole node is cordoned, drained, rebooted
  kubectl get noderepairs -o custom-columns='NAME:.metadata.name,PHASE:.status.phase,ESCALATION:.spec.escalation'
`, binDir)
}

func binDirOf(dir string) string {
	if dir != "" {
		return dir
	}
	if env := os.Getenv("GPUFLEET_BIN_DIR"); env != "" {
		return env
	}
	if root, err := devcluster.SourceRoot(); err == nil {
		return filepath.Join(root, "bin")
	}
	return "bin"
}

// buildControlPlane runs the project's tool build when the binaries are
// missing and we are inside the source tree.
func buildControlPlane(say func(string, ...any)) error {
	root, err := devcluster.SourceRoot()
	if err != nil {
		return err
	}
	say("control-plane binaries are missing; building them from the Go module proxy (first time only, ~15 minutes on 2 cores)")
	c := exec.Command(filepath.Join(root, "hack", "build-tools.sh"), "controlplane")
	c.Dir = root
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	return c.Run()
}
