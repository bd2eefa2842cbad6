package devcluster

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Env is a started cluster prepared for gpufleet: nodes added, CRDs
// installed, the operator's namespace and RBAC in place. Integration test
// packages build one in TestMain.
type Env struct {
	*Cluster
	// Kube is an admin client that knows gpufleet's types.
	Kube client.Client
	// OperatorConfig authenticates as OperatorUser, bound to the generated
	// roles (the namespaced one in the Env's namespace too).
	OperatorConfig *rest.Config
}

// NewEnv starts a cluster with the given nodes and prepares it. On error
// the cluster is stopped.
func NewEnv(ctx context.Context, opts Options, nodes []NodeSpec, namespace string, scheme *runtime.Scheme) (_ *Env, err error) {
	c, err := Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if err := c.AddNodes(ctx, nodes...); err != nil {
		return nil, err
	}
	if err := InstallCRDs(ctx, c.Config); err != nil {
		return nil, err
	}
	if err := EnsureNamespace(ctx, c.Client, namespace); err != nil {
		return nil, err
	}
	e := &Env{Cluster: c}
	if e.Kube, err = client.New(c.Config, client.Options{Scheme: scheme}); err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	if e.OperatorConfig, err = c.OperatorConfig(ctx, namespace); err != nil {
		return nil, err
	}
	return e, nil
}
