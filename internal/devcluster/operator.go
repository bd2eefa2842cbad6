package devcluster

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/gpufleet/gpufleet/config"
)

// OperatorUser is the identity the operator runs as in the local cluster.
const OperatorUser = "gpufleet-operator"

// OperatorConfig installs the generated ClusterRole (config/rbac/role.yaml),
// binds it to OperatorUser and returns credentials for that user, so the
// operator runs with exactly the permissions it declares — a missing RBAC
// marker fails the tests instead of passing as admin.
func (c *Cluster) OperatorConfig(ctx context.Context) (*rest.Config, error) {
	data, err := config.RBAC.ReadFile("rbac/role.yaml")
	if err != nil {
		return nil, err
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(data, role); err != nil {
		return nil, fmt.Errorf("decoding config/rbac/role.yaml: %w", err)
	}
	roles := c.Client.RbacV1().ClusterRoles()
	if existing, err := roles.Get(ctx, role.Name, metav1.GetOptions{}); err == nil {
		role.ResourceVersion = existing.ResourceVersion
		if _, err := roles.Update(ctx, role, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("updating ClusterRole %s: %w", role.Name, err)
		}
	} else if _, err := roles.Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating ClusterRole %s: %w", role.Name, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: OperatorUser}},
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("binding ClusterRole %s: %w", role.Name, err)
	}
	return c.ConfigFor(OperatorUser)
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
