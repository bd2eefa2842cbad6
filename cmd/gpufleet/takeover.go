package main

import (
	"errors"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/gpufleet/gpufleet/internal/operator"
	"github.com/gpufleet/gpufleet/internal/takeover"
)

func newTakeoverCommand() *cobra.Command {
	var (
		from, to, deployment string
		timeout              time.Duration
		dryRun               bool
	)
	flags := genericclioptions.NewConfigFlags(true)
	cmd := &cobra.Command{
		Use:   "takeover (--from | --to) gpu-operator|maintenance-operator",
		Short: "Switch from NVIDIA's GPU Operator or Maintenance Operator to gpufleet (--from), or back (--to), without restarting what runs",
		Long: `takeover stops one operator and lets the other continue from the objects as
they are. It prints its plan first: what is stopped and how, which of the
GPU Operator's DaemonSets gpufleet adopts and whether any pod restarts
(none, on a converged stack), which components are blocked, and which
NodeMaintenance objects are in flight; with --dry-run it stops there.

--from scales the other operator's Deployment to 0 (found by its labels
in any namespace) and waits, at most --timeout, until its leader lease is
free; gpufleet's controllers then take over. --to scales gpufleet's
Deployment to 0, waits for its lease, and scales the other operator's
Deployment back up. Nothing is changed when the plan lists a problem (for
the GPU Operator: gpufleet must run in the namespace of its stack). Run it
again after any interruption; it finishes what is left.

  kubectl gpufleet takeover --from gpu-operator -n gpu-operator --dry-run
  kubectl gpufleet takeover --from gpu-operator -n gpu-operator
  kubectl gpufleet takeover --to gpu-operator -n gpu-operator`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := direction(from, to)
			if err != nil {
				return err
			}
			c, ns, err := operatorClient(cmd, flags)
			if err != nil {
				return err
			}
			return takeover.Run(cmd.Context(), takeover.Options{
				Client: c, Direction: dir, Namespace: ns, Deployment: deployment,
				Timeout: timeout, DryRun: dryRun, Out: cmd.OutOrStdout(),
			})
		},
	}
	f := cmd.Flags()
	flags.AddFlags(f)
	f.StringVar(&from, "from", "", "switch from this operator to gpufleet: gpu-operator or maintenance-operator")
	f.StringVar(&to, "to", "", "switch from gpufleet back to this operator: gpu-operator or maintenance-operator")
	f.StringVar(&deployment, "deployment", defaultOperatorName, "gpufleet's Deployment (and leader lease), in --namespace (default namespace "+operator.DefaultNamespace+")")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the stopped operator's leader lease to be free")
	f.BoolVar(&dryRun, "dry-run", false, "print the plan, change nothing")
	return cmd
}

// direction reads --from and --to: exactly one of them.
func direction(from, to string) (takeover.Direction, error) {
	switch {
	case from != "" && to != "":
		return takeover.Direction{}, errors.New("--from and --to exclude each other: name one")
	case from == "" && to == "":
		return takeover.Direction{}, errors.New("--from or --to is required (gpu-operator or maintenance-operator)")
	}
	name, back := from, false
	if to != "" {
		name, back = to, true
	}
	op, err := takeover.ParseOperator(name)
	if err != nil {
		return takeover.Direction{}, err
	}
	return takeover.Direction{Operator: op, Back: back}, nil
}
