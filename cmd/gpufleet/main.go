// Command gpufleet is the one binary of gpufleet: the operator, the local
// development cluster, the node agent (also built alone as
// cmd/gpufleet-agent, which the agent DaemonSet runs) and the fleet view.
package main

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/spf13/cobra"
	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpufleet/gpufleet/internal/agent/agentcmd"
	"github.com/gpufleet/gpufleet/internal/cli"
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
	root.AddCommand(newOperatorCommand(), agentcmd.NewCommand("agent"), newVersionCommand(),
		newStatusCommand(), newExplainCommand(), newUICommand(), newUninstallCommand(), newTakeoverCommand())
	root.AddCommand(devCommands()...)
	return root
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
			opts.LogLevel = cli.SetupLogging(development, level)
			tuneMemory()
			cfg, err := cli.RestConfig(kubeconfig)
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
			ctx, cancel := cli.SignalContext()
			defer cancel()
			return mgr.Start(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "path to a kubeconfig (default: $KUBECONFIG, in-cluster config, ~/.kube/config)")
	f.StringVar(&opts.Namespace, "namespace", "", "the operator's namespace (default: $POD_NAMESPACE, else "+operator.DefaultNamespace+")")
	f.StringVar(&opts.MetricsAddr, "metrics-bind-address", ":8080", `address of the Prometheus metrics endpoint ("0" disables it)`)
	f.BoolVar(&opts.MetricsSecure, "metrics-secure", true,
		"serve metrics (and --profiling) over HTTPS, each scrape's token reviewed and authorized by the API server (get on the nonResourceURL /metrics); false: plain HTTP, no authentication")
	f.StringVar(&opts.MetricsCertDir, "metrics-cert-dir", "", "directory with tls.crt and tls.key for the secure metrics endpoint (default: a self-signed certificate made at start)")
	f.StringVar(&opts.ProbeAddr, "health-probe-bind-address", ":8081", `address of /healthz and /readyz ("0" disables it)`)
	f.BoolVar(&opts.LeaderElection, "leader-elect", false, "elect a leader so only one replica is active")
	f.StringVar(&opts.LeaderElectionID, "leader-election-id", "gpufleet-operator", "name of the leader-election lease")
	f.DurationVar(&opts.LeaseDuration, "leader-elect-lease-duration", 0, "leader-election lease duration (0 = 15s)")
	f.DurationVar(&opts.RenewDeadline, "leader-elect-renew-deadline", 0, "leader-election renew deadline (0 = 10s)")
	f.DurationVar(&opts.RetryPeriod, "leader-elect-retry-period", 0, "leader-election retry period (0 = 2s)")
	f.StringSliceVar(&opts.Capabilities, "capabilities", nil, "capabilities to run, comma separated (default: all)")
	f.StringVar(&opts.PodName, "pod-name", "", "the operator's own pod, never evicted by a drain (default: $POD_NAME)")
	f.BoolVar(&opts.Profiling, "profiling", false, "serve Go's pprof handlers under /debug/pprof/ on the metrics address")
	f.StringSliceVar(&opts.MaintenanceNamespaces, "maintenance-namespaces", nil,
		"namespaces whose NodeMaintenance objects may cordon and drain nodes, comma separated, besides the operator's own (default: every namespace)")
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
