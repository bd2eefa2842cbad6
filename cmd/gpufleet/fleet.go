package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpufleet/gpufleet/internal/cli"
	"github.com/gpufleet/gpufleet/internal/fleet"
	"github.com/gpufleet/gpufleet/internal/fleet/ui"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// pluginName is the executable name kubectl runs for `kubectl gpufleet`.
const pluginName = "kubectl-gpufleet"

// isPlugin reports whether the binary was invoked as the kubectl plugin
// (`ln -s gpufleet kubectl-gpufleet`).
func isPlugin(argv0 string) bool {
	return strings.TrimSuffix(filepath.Base(argv0), ".exe") == pluginName
}

// newPluginCommand is the root of `kubectl gpufleet`: the fleet commands.
func newPluginCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "gpufleet",
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl gpufleet"},
		Short:         "See the GPU fleet: every node's pool, GPUs, GPU stack, maintenance and repair",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newStatusCommand(), newExplainCommand(), newUICommand(), newUninstallCommand(), newTakeoverCommand(), newVersionCommand())
	return root
}

// quietClientLogs silences client-go's own error logs (a failed discovery,
// once per API group) for the one-shot commands status and explain: they
// return the error. klog's logger is process-wide, so main calls this
// before anything runs.
func quietClientLogs(args []string) {
	if c := commandOf(args); c == "status" || c == "explain" {
		klog.SetLogger(logr.Discard())
	}
}

// commandOf is the subcommand args name: the first word that is not a flag.
func commandOf(args []string) string {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return ""
}

// operatorNamespace is where the fleet commands read the
// MaintenanceOperatorConfig "default" (its spec.domains groups the nodes
// by NVLink domain): --namespace when given, else the operator's default
// namespace.
func operatorNamespace(cmd *cobra.Command, flags *genericclioptions.ConfigFlags) string {
	if cmd.Flags().Changed("namespace") && flags.Namespace != nil && *flags.Namespace != "" {
		return *flags.Namespace
	}
	return operator.DefaultNamespace
}

// fleetClient is a client with the user's kubeconfig (cli-runtime flags).
func fleetClient(flags *genericclioptions.ConfigFlags) (client.Client, *rest.Config, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100 // one request per kind, in parallel
	}
	// kubectl's discovery cache (~/.kube/cache): no discovery requests
	// on every run.
	mapper, err := flags.ToRESTMapper()
	if err != nil {
		return nil, nil, fmt.Errorf("discovering the cluster's APIs: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: fleet.Scheme(), Mapper: mapper})
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to the cluster: %w", err)
	}
	return c, cfg, nil
}

func newStatusCommand() *cobra.Command {
	var (
		selector, output, sortBy, poolLabel string
		pools                               []string
		problems                            bool
		timeout                             time.Duration
	)
	flags := genericclioptions.NewConfigFlags(true)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "One row per node: pool, GPUs, GPU stack, maintenance, repair, state; and a summary line",
		Long: `status lists every node with its pool, its GPUs (in use/allocatable, and
faulty ones), where its GPU stack is (driver ✓ toolkit ✓ plugin …), its
maintenance (requestor and phase, or why it waits), its open repair and its
overall state (ready, in maintenance, draining, repairing, recovery failed,
degraded stack, not ready, cordoned), then a summary line. One List request
per kind; a kind whose CRD is not installed or that RBAC forbids shows as -
with a note.

When the MaintenanceOperatorConfig "default" (in --namespace, default
gpufleet-system) has spec.domains, the rows are grouped by NVLink domain
(a DOMAIN column; nodes in no domain last; --sort-by orders them within
each domain) and a row per domain says its nodes, pools, how many are in
maintenance or wait for it, whether it is disrupted and which
ComputeDomain workloads run on it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, err := labels.Parse(selector)
			if err != nil {
				return fmt.Errorf("-l %q: %w", selector, err)
			}
			filter := fleet.Filter{Pools: pools, Problems: problems, SortBy: sortBy}
			if err := filter.Apply(&fleet.Fleet{}); err != nil {
				return err
			}
			if err := fleet.CheckOutput(output); err != nil {
				return err
			}
			c, _, err := fleetClient(flags)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			snap, err := fleet.Load(ctx, c, fleet.LoadOptions{NodeSelector: sel, PoolLabel: poolLabel, ConfigNamespace: operatorNamespace(cmd, flags)})
			if err != nil {
				return err
			}
			now := time.Now()
			f := fleet.Build(snap, now)
			if err := filter.Apply(f); err != nil {
				return err
			}
			return fleet.Write(cmd.OutOrStdout(), cmd.ErrOrStderr(), f, output, now)
		},
	}
	f := cmd.Flags()
	flags.AddFlags(f)
	f.StringVarP(&selector, "selector", "l", "", "node label selector, e.g. gpufleet.dev/pool=pool-a")
	f.StringSliceVar(&pools, "pool", nil, "only the nodes of these pools (comma separated)")
	f.BoolVar(&problems, "problems", false, "only the nodes that are not ready for work or have a problem")
	f.StringVarP(&output, "output", "o", "", "output format: wide, json or yaml (default: a table)")
	f.StringVar(&sortBy, "sort-by", fleet.SortByName, "order of the rows: "+strings.Join(fleet.SortOrders, ", "))
	f.StringVar(&poolLabel, "pool-label", fleet.DefaultPoolLabel, "the node label that names a node's pool")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}

func newExplainCommand() *cobra.Command {
	var (
		output, poolLabel string
		timeout           time.Duration
	)
	flags := genericclioptions.NewConfigFlags(true)
	cmd := &cobra.Command{
		Use:   "explain NODE",
		Short: "The node's story, newest first: maintenance, repairs, GPU faults, GPU stack and their events",
		Long: `explain tells why a node is where it is: its NodeMaintenance objects and
their phases (and why a pending one waits), its NodeRepairs and their
timelines, its GPU faults, its GPU-stack pods, its conditions, and the
events of all of these, newest first.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "" && output != fleet.OutputJSON && output != fleet.OutputYAML {
				return fmt.Errorf("-o %q: must be json or yaml (default: text)", output)
			}
			c, _, err := fleetClient(flags)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			st, err := explain(ctx, c, args[0], poolLabel, operatorNamespace(cmd, flags), time.Now())
			if err != nil {
				return err
			}
			return fleet.WriteStoryAs(cmd.OutOrStdout(), st, output, time.Now())
		},
	}
	f := cmd.Flags()
	flags.AddFlags(f)
	f.StringVarP(&output, "output", "o", "", "output format: json or yaml (default: text)")
	f.StringVar(&poolLabel, "pool-label", fleet.DefaultPoolLabel, "the node label that names a node's pool")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}

func explain(ctx context.Context, c client.Reader, node, poolLabel, configNamespace string, now time.Time) (*fleet.Story, error) {
	snap, err := fleet.Load(ctx, c, fleet.LoadOptions{Node: node, PoolLabel: poolLabel, ConfigNamespace: configNamespace})
	if err != nil {
		return nil, err
	}
	if len(snap.Nodes) == 0 {
		return nil, &fleet.ErrUnknownNode{Node: node}
	}
	if err := fleet.LoadEvents(ctx, c, snap, node); err != nil {
		return nil, err
	}
	return fleet.Explain(snap, node, now)
}

func newUICommand() *cobra.Command {
	var (
		address, poolLabel string
	)
	flags := genericclioptions.NewConfigFlags(true)
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the live fleet view in the browser (on 127.0.0.1:8090 by default)",
		Long: `ui serves a page that shows every node as a tile, grouped by pool (by
NVLink domain when the MaintenanceOperatorConfig "default" in --namespace,
default gpufleet-system, has spec.domains) and coloured by state, with the
totals, updated live from watches (server-sent events); a click on a node
shows its story (explain). It uses your kubeconfig; the page talks only to
this process and never sees your credentials. It listens on loopback unless
--address says otherwise, and has no write actions.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, cfg, err := fleetClient(flags)
			if err != nil {
				return err
			}
			cli.SetupLogging(false, zapcore.ErrorLevel) // a long-running view logs its watches' errors
			if os.Getenv("GOGC") == "" {
				debug.SetGCPercent(50) // the heap is mostly the watch caches
			}
			ctx, cancel := cli.SignalContext()
			defer cancel()
			srv, err := ui.New(cfg, ui.Options{PoolLabel: poolLabel, ConfigNamespace: operatorNamespace(cmd, flags)})
			if err != nil {
				return err
			}
			say := func(format string, args ...any) {
				_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "gpufleet ui: "+format+"\n", args...)
			}
			err = srv.ListenAndServe(ctx, address, say)
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	flags.AddFlags(f)
	f.StringVar(&address, "address", ui.DefaultAddress, "address to listen on (loopback by default; anything else exposes the view of your cluster to that network)")
	f.StringVar(&poolLabel, "pool-label", fleet.DefaultPoolLabel, "the node label that names a node's pool")
	return cmd
}

// pluginMain runs the kubectl plugin when invoked as kubectl-gpufleet.
func pluginMain() bool {
	if !isPlugin(os.Args[0]) {
		return false
	}
	if err := newPluginCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	return true
}
