package devcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"

	"github.com/gpufleet/gpufleet/config"
	agentconfig "github.com/gpufleet/gpufleet/config/agent"
)

// OperatorUser is the identity the operator runs as in the local cluster.
const OperatorUser = "gpufleet-operator"

// OperatorConfig installs the generated RBAC (config/rbac/role.yaml: the
// ClusterRole and the Role of the operator's own namespace), binds it to
// OperatorUser and returns credentials for that user, so the operator runs
// with exactly the permissions it declares — a missing RBAC marker fails
// the tests instead of passing as admin. The Role is installed in the
// namespace it was generated for and in each of namespaces (an operator run
// with another --namespace, as kustomize and the chart move it to theirs).
func (c *Cluster) OperatorConfig(ctx context.Context, namespaces ...string) (*rest.Config, error) {
	data, err := config.RBAC.ReadFile("rbac/role.yaml")
	if err != nil {
		return nil, err
	}
	subjects := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: OperatorUser}}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var doc struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta   `json:"metadata"`
			Rules           []rbacv1.PolicyRule `json:"rules"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decoding config/rbac/role.yaml: %w", err)
		}
		switch doc.Kind {
		case "ClusterRole":
			role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: doc.Metadata.Name}, Rules: doc.Rules}
			if err := apply(ctx, c.Client.RbacV1().ClusterRoles(), role); err != nil {
				return nil, err
			}
			binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name}, Subjects: subjects,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}}
			if err := apply(ctx, c.Client.RbacV1().ClusterRoleBindings(), binding); err != nil {
				return nil, err
			}
		case "Role":
			for _, ns := range slices.Compact(slices.Sorted(slices.Values(append([]string{doc.Metadata.Namespace}, namespaces...)))) {
				if err := EnsureNamespace(ctx, c.Client, ns); err != nil {
					return nil, err
				}
				role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: doc.Metadata.Name, Namespace: ns}, Rules: doc.Rules}
				if err := apply(ctx, c.Client.RbacV1().Roles(ns), role); err != nil {
					return nil, err
				}
				binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: ns}, Subjects: subjects,
					RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}}
				if err := apply(ctx, c.Client.RbacV1().RoleBindings(ns), binding); err != nil {
					return nil, err
				}
			}
		case "":
		default:
			return nil, fmt.Errorf("config/rbac/role.yaml: unexpected kind %q", doc.Kind)
		}
	}
	if err := c.bindInProcessAgentRole(ctx, subjects); err != nil {
		return nil, err
	}
	return c.ConfigFor(OperatorUser)
}

// InProcessAgentRole is the ClusterRole, a copy of the node agent's
// (config/agent/rbac.yaml), that OperatorUser holds besides the operator's
// generated role: the local cluster's nodes have no pods, so the simulated
// node agents run inside the operator's process, with its identity. The
// shipped operator never holds the agent's rules (test/deploy runs it with
// exactly the shipped RBAC).
const InProcessAgentRole = "gpufleet-operator-in-process-agents"

func (c *Cluster) bindInProcessAgentRole(ctx context.Context, subjects []rbacv1.Subject) error {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(agentconfig.RBAC), 4096)
	for {
		var doc struct {
			metav1.TypeMeta `json:",inline"`
			Rules           []rbacv1.PolicyRule `json:"rules"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return errors.New("config/agent/rbac.yaml has no ClusterRole")
		} else if err != nil {
			return fmt.Errorf("decoding config/agent/rbac.yaml: %w", err)
		}
		if doc.Kind != "ClusterRole" {
			continue
		}
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: InProcessAgentRole}, Rules: doc.Rules}
		if err := apply(ctx, c.Client.RbacV1().ClusterRoles(), role); err != nil {
			return err
		}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: InProcessAgentRole}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}}
		return apply(ctx, c.Client.RbacV1().ClusterRoleBindings(), binding)
	}
}

// rbacClient is what apply needs of a typed RBAC client.
type rbacClient[T metav1.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
}

// apply creates obj or replaces the existing object with it.
func apply[T metav1.Object](ctx context.Context, c rbacClient[T], obj T) error {
	existing, err := c.Get(ctx, obj.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.Create(ctx, obj, metav1.CreateOptions{})
	case err == nil:
		obj.SetResourceVersion(existing.GetResourceVersion())
		_, err = c.Update(ctx, obj, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("applying %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}

// OperatorKubeconfig writes a kubeconfig for OperatorUser (with the
// generated RBAC installed, as OperatorConfig) for running the operator as
// its own process.
func (c *Cluster) OperatorKubeconfig(ctx context.Context) (string, error) {
	if _, err := c.OperatorConfig(ctx); err != nil {
		return "", err
	}
	return c.componentKubeconfig("operator", OperatorUser)
}
