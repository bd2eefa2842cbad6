package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpufleet/gpufleet/internal/operator"
	"github.com/gpufleet/gpufleet/internal/uninstall"
)

// defaultOperatorName names the operator's Deployment and lease in
// install.yaml and kustomize (the chart's are "<release>-gpufleet-operator",
// and its pre-delete hook passes them).
const defaultOperatorName = "gpufleet-operator"

func newUninstallCommand() *cobra.Command {
	var (
		deployment, lease string
		timeout           time.Duration
		dryRun            bool
	)
	flags := genericclioptions.NewConfigFlags(true)
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Stop the operator and release every NodeMaintenance, before the operator's manifests are deleted",
		Long: `uninstall makes removing gpufleet safe: it scales the operator's Deployment
to 0 and waits until its pods are gone and its leader lease is free (at most
--timeout; past it the replicas are restored and nothing is released).
First it looks for gpufleet's operator in every namespace (Deployments and
pods that run it, whatever they are called, and held leases of gpufleet's):
if it runs anywhere but the Deployment named here — another namespace,
another release name, a second gpufleet — or if it cannot look there, it
says what it found and changes nothing. Then
it releases every NodeMaintenance as the operator would: a node that a
maintenance cordoned is uncordoned (one cordoned before its maintenance
stays cordoned), the objects are deleted and their finalizers removed, so
the CRDs can be deleted later. Requestors lose their nodes: an upgrade or
a repair in progress stops where it is. GPUs isolated by auto-repair stay
isolated (their DeviceTaintRules are listed). Run it again after any
interruption; it finishes what is left.

The Helm chart runs it as a pre-delete hook. With install.yaml or
kustomize, run it before deleting the manifests:

  kubectl gpufleet uninstall -n gpufleet-system
  kubectl delete -f install.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ns, err := operatorClient(cmd, flags)
			if err != nil {
				return err
			}
			return uninstall.Run(cmd.Context(), uninstall.Options{
				Client: c, Namespace: ns, Deployment: deployment, Lease: lease,
				Timeout: timeout, DryRun: dryRun, Out: cmd.OutOrStdout(),
			})
		},
	}
	f := cmd.Flags()
	flags.AddFlags(f)
	f.StringVar(&deployment, "deployment", defaultOperatorName, "the operator's Deployment, in --namespace (default namespace "+operator.DefaultNamespace+")")
	f.StringVar(&lease, "lease", "", "the operator's leader-election lease (default: the Deployment's name)")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the operator to stop")
	f.BoolVar(&dryRun, "dry-run", false, "print what would be done, change nothing")
	return cmd
}

// operatorClient connects to the cluster of the command's kubeconfig flags
// with the operator's scheme; ns is --namespace, else the operator's
// default namespace.
func operatorClient(cmd *cobra.Command, flags *genericclioptions.ConfigFlags) (client.Client, string, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, "", fmt.Errorf("loading the kubeconfig: %w", err)
	}
	ns := operator.DefaultNamespace
	if cmd.Flags().Changed("namespace") {
		ns = *flags.Namespace
	}
	scheme, err := operator.Scheme()
	if err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", fmt.Errorf("connecting to the cluster: %w", err)
	}
	return c, ns, nil
}
