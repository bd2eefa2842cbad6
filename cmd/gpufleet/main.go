// Command gpufleet is the one binary of gpufleet: the operator, the local
// development cluster and (later) the node agent.
package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/spf13/cobra"
	uzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/operator"
	"github.com/gpufleet/gpufleet/internal/version"
)

func main() {
	quietClientLogs(os.Args[1:])
	if pluginMain() {
		return
	}
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "gpufleet",
		Short:         "Keeps the GPU nodes of a Kubernetes cluster productive",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newOperatorCommand(), newDevCommand(), newAgentCommand(), newSimCommand(), newVersionCommand(),
		newStatusCommand(), newExplainCommand(), newUICommand(), newUninstallCommand())
	return root
}

// signalContext is cancelled on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// setupLogging installs the process's logger (human-readable with
// development) at level and returns the level, which may change while the
// process runs.
func setupLogging(development bool, level zapcore.Level) *uzap.AtomicLevel {
	atomic := uzap.NewAtomicLevelAt(level)
	logger := zap.New(zap.UseDevMode(development), zap.Level(atomic))
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	return &atomic
}

// logLevel is the --log-level flag's level: name, or with no name debug
// for development logs and info otherwise.
func logLevel(name string, development bool) (zapcore.Level, error) {
	switch {
	case name != "":
		return operator.ParseLogLevel(name)
	case development:
		return zapcore.DebugLevel, nil
	default:
		return zapcore.InfoLevel, nil
	}
}

func newOperatorCommand() *cobra.Command {
	var (
		kubeconfig  string
		opts        operator.Options
		development bool
		levelName   string
	)
	cmd := &cobra.Command{
		Use:   "operator",
		Short: "Run the gpufleet controllers against a cluster",
		RunE: func(cmd *cobra.Command, _ []string) error {
			level, err := logLevel(levelName, development)
			if err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			opts.LogLevel = setupLogging(development, level)
			tuneMemory()
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			if opts.Namespace == "" {
				opts.Namespace = os.Getenv("POD_NAMESPACE")
			}
			if opts.PodName == "" {
				opts.PodName = os.Getenv("POD_NAME")
			}
			mgr, err := operator.New(cfg, opts)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			return mgr.Start(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "path to a kubeconfig (default: $KUBECONFIG, in-cluster config, ~/.kube/config)")
	f.StringVar(&opts.Namespace, "namespace", "", "the operator's namespace (default: $POD_NAMESPACE, else "+operator.DefaultNamespace+")")
	f.StringVar(&opts.MetricsAddr, "metrics-bind-address", ":8080", `address of the Prometheus metrics endpoint ("0" disables it)`)
	f.StringVar(&opts.ProbeAddr, "health-probe-bind-address", ":8081", `address of /healthz and /readyz ("0" disables it)`)
	f.BoolVar(&opts.LeaderElection, "leader-elect", false, "elect a leader so only one replica is active")
	f.StringVar(&opts.LeaderElectionID, "leader-election-id", "gpufleet-operator", "name of the leader-election lease")
	f.DurationVar(&opts.LeaseDuration, "leader-elect-lease-duration", 0, "leader-election lease duration (0 = 15s)")
	f.DurationVar(&opts.RenewDeadline, "leader-elect-renew-deadline", 0, "leader-election renew deadline (0 = 10s)")
	f.DurationVar(&opts.RetryPeriod, "leader-elect-retry-period", 0, "leader-election retry period (0 = 2s)")
	f.StringSliceVar(&opts.Capabilities, "capabilities", nil, "capabilities to run, comma separated (default: all)")
	f.StringVar(&opts.PodName, "pod-name", "", "the operator's own pod, never evicted by a drain (default: $POD_NAME)")
	f.BoolVar(&opts.Profiling, "profiling", false, "serve Go's pprof handlers under /debug/pprof/ on the metrics address")
	f.BoolVar(&development, "dev-logging", false, "human-readable logs (and, without --log-level, the debug level)")
	f.StringVar(&levelName, "log-level", "", "log level: debug, info or error (default: debug with --dev-logging, else info). "+
		"Once read, spec.logLevel of the MaintenanceOperatorConfig \"default\" in the operator's namespace wins, "+
		"and changes the level while the operator runs; without that config this level applies")
	return cmd
}

// tuneMemory sets the garbage collector for a long-running controller
// whose heap is mostly its caches: GOGC defaults to 50 (the heap may grow
// to 1.5 times the live data instead of 2 times; the operator is idle most
// of the time, so the extra collections cost little CPU), and the Go
// memory limit is 90% of the container's memory limit (cgroup), so that
// the collector works harder before the kernel would kill the process.
// GOGC and GOMEMLIMIT, if set, win; AUTOMEMLIMIT=off or a ratio (0.8)
// tunes the second.
func tuneMemory() {
	log := ctrl.Log.WithName("memory")
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
	limit, err := memlimit.Set(memlimit.WithRatio(0.9), memlimit.WithProvider(memlimit.FromCgroup))
	switch {
	case err != nil:
		log.Info("no Go memory limit from the cgroup", "reason", err.Error())
	case limit != math.MaxInt64:
		log.Info("Go memory limit", "bytes", limit)
	}
}

// restConfig loads the credentials. Like controller-runtime's own loader,
// it turns client-go's client-side rate limit (5 requests/s) off and relies
// on the API server's priority and fairness: a 5/s limit would serialize a
// large cluster's maintenance behind the limiter.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := ctrl.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("finding cluster credentials: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	return cfg, nil
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the gpufleet version",
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.String())
			return err
		},
	}
}

func newAgentCommand() *cobra.Command {
	var kubeconfig, nodeName, kmsgPath, dcgmURL, podResources string
	var dcgmInterval time.Duration
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: execute repair actions requested for this node, report its GPU faults",
		Long: `agent runs on every node (a privileged DaemonSet with hostPID) and executes
the repair actions that NodeRepair objects request for its node: restart the
kubelet, the container runtime or the NTP daemon (systemd units, through
nsenter into PID 1), delete broken pod sandboxes (crictl), reset GPUs
(nvidia-smi), reboot. The set of actions is fixed; nothing from the API is
run as a command.

It also watches the node's GPUs: NVIDIA XIDs in the kernel log (--kmsg-path)
and health counters of dcgm-exporter (--dcgm-url), and writes one GPUFault
record per faulty GPU and the node's GPUProblem condition. While a GPU is out
of service it asks the kubelet's pod-resources API (--pod-resources-socket)
which pods were given it (nvidia.com/gpu, device plugin) and records them, so
that the repair drains only those pods.`,
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
			setupLogging(false, zapcore.InfoLevel)
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			gpus := agent.NewHostGPUSource(nodeName, kmsgPath, dcgmURL, dcgmInterval)
			if podResources != "" {
				gpus.PodResources = &agent.KubeletPodResources{Socket: podResources}
			}
			mgr, err := agent.NewManager(cfg, agent.Options{NodeName: nodeName, Executor: agent.HostExecutor{Runner: agent.ExecRunner{}},
				GPUs: gpus})
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			return mgr.Start(ctx)
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "path to a kubeconfig (default: in-cluster)")
	cmd.Flags().StringVar(&nodeName, "node-name", "", "this node's name (default: $NODE_NAME)")
	cmd.Flags().StringVar(&kmsgPath, "kmsg-path", "/dev/kmsg", `kernel log to follow for NVIDIA XIDs ("" reads none)`)
	cmd.Flags().StringVar(&dcgmURL, "dcgm-url", "", `dcgm-exporter's metrics URL, e.g. http://localhost:9400/metrics ("" reads no counters)`)
	cmd.Flags().DurationVar(&dcgmInterval, "dcgm-interval", 30*time.Second, "how often dcgm-exporter is read")
	cmd.Flags().StringVar(&podResources, "pod-resources-socket", agent.DefaultPodResourcesSocket,
		`the kubelet's pod-resources socket, asked which pods hold a faulty GPU ("" asks nothing: the repair drains every GPU pod of the node)`)
	return cmd
}
