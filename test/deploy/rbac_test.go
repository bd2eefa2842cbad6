package deploy

import (
	"context"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// otherNS is a namespace that is not the operator's.
const otherNS = "someone-else"

// checkLeastPrivilege checks, with real requests of the operator's
// installed identity (saCfg, the ServiceAccount sa, whose ClusterRole is
// named after it), what its RBAC allows: what it needs in its
// own namespace and on the GPU stack's own cluster-scoped objects, and not
// Secrets, not DaemonSets or pods of another namespace, not ClusterRoles or
// bindings it does not own, not the node agent's rules. Writes are sent as
// server-side dry runs (authorized as real ones, stored never).
func checkLeastPrivilege(t *testing.T, cluster *devcluster.Cluster, saCfg *rest.Config, sa string) {
	t.Helper()
	ctx := t.Context()
	admin := cluster.Client
	op, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	dryUpdate := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	dryPatch := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	dryDelete := metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}

	// Objects the operator does not own, created by an administrator.
	if err := devcluster.EnsureNamespace(ctx, admin, otherNS); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{ns, otherNS} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "credentials"}, StringData: map[string]string{"password": "x"}}
		if _, err := admin.CoreV1().Secrets(n).Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	theirDS := daemonSet(otherNS, "their-agent")
	if _, err := admin.AppsV1().DaemonSets(otherNS).Create(ctx, theirDS, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	theirPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: otherNS, Name: "their-pod"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}}}
	if _, err := admin.CoreV1().Pods(otherNS).Create(ctx, theirPod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}}
	for _, name := range []string{"not-gpufleets", "nvidia-mig-manager"} {
		cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: otherNS, Name: "default"}}}
		if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = admin.CoreV1().Namespaces().Delete(bg, otherNS, metav1.DeleteOptions{})
		_ = admin.CoreV1().Secrets(ns).Delete(bg, "credentials", metav1.DeleteOptions{})
		for _, name := range []string{"not-gpufleets", "nvidia-mig-manager"} {
			_ = admin.RbacV1().ClusterRoles().Delete(bg, name, metav1.DeleteOptions{})
			_ = admin.RbacV1().ClusterRoleBindings().Delete(bg, name, metav1.DeleteOptions{})
		}
	})
	getCR := func(name string) *rbacv1.ClusterRole {
		cr, err := admin.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cr.Labels = map[string]string{"changed": "true"}
		return cr
	}
	getDS := func(namespace, name string) *appsv1.DaemonSet {
		ds, err := admin.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ds.Labels = map[string]string{"changed": "true"}
		return ds
	}
	label := []byte(`{"metadata":{"labels":{"changed":"true"}}}`)
	eviction := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: otherNS, Name: "their-pod"}, DeleteOptions: &dryDelete}
	adminBinding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gpufleet-escalates"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "default"}}}

	type check struct {
		name string
		do   func() error
	}
	allowed := []check{
		{"create a DaemonSet in its namespace", func() error {
			_, err := op.AppsV1().DaemonSets(ns).Create(ctx, daemonSet(ns, "nvidia-driver-daemonset"), dry)
			return err
		}},
		{"create a Service in its namespace", func() error {
			svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nvidia-dcgm-exporter"},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 9400}}}}
			_, err := op.CoreV1().Services(ns).Create(ctx, svc, dry)
			return err
		}},
		{"delete a pod in its namespace", func() error {
			err := op.CoreV1().Pods(ns).Delete(ctx, "nvidia-driver-x", dryDelete)
			if apierrors.IsNotFound(err) {
				return nil // authorized, then not found
			}
			return err
		}},
		{"list pods of every namespace", func() error {
			_, err := op.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 1})
			return err
		}},
		{"evict a pod of another namespace", func() error {
			return op.PolicyV1().Evictions(otherNS).Evict(ctx, eviction)
		}},
		{"update the GPU stack's ClusterRole", func() error {
			_, err := op.RbacV1().ClusterRoles().Update(ctx, getCR("nvidia-mig-manager"), dryUpdate)
			return err
		}},
		{"delete the GPU stack's ClusterRoleBinding", func() error {
			return op.RbacV1().ClusterRoleBindings().Delete(ctx, "nvidia-mig-manager", dryDelete)
		}},
		{"create the GPU stack's ClusterRoles (RBAC lets it grant only rules it holds)", func() error {
			return createStackRBAC(ctx, op, dry)
		}},
	}
	forbidden := []check{
		{"list Secrets in its namespace", func() error {
			_, err := op.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"get a Secret in its namespace", func() error {
			_, err := op.CoreV1().Secrets(ns).Get(ctx, "credentials", metav1.GetOptions{})
			return err
		}},
		{"list Secrets of every namespace", func() error {
			_, err := op.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"update a DaemonSet of another namespace", func() error {
			_, err := op.AppsV1().DaemonSets(otherNS).Update(ctx, getDS(otherNS, "their-agent"), dryUpdate)
			return err
		}},
		{"patch a DaemonSet of another namespace", func() error {
			_, err := op.AppsV1().DaemonSets(otherNS).Patch(ctx, "their-agent", types.MergePatchType, label, dryPatch)
			return err
		}},
		{"delete a DaemonSet of another namespace", func() error {
			return op.AppsV1().DaemonSets(otherNS).Delete(ctx, "their-agent", dryDelete)
		}},
		{"create a DaemonSet in another namespace", func() error {
			_, err := op.AppsV1().DaemonSets(otherNS).Create(ctx, daemonSet(otherNS, "gpufleet-was-here"), dry)
			return err
		}},
		{"list DaemonSets of every namespace", func() error {
			_, err := op.AppsV1().DaemonSets("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"delete a pod of another namespace", func() error {
			return op.CoreV1().Pods(otherNS).Delete(ctx, "their-pod", dryDelete)
		}},
		{"create a ServiceAccount in another namespace", func() error {
			_, err := op.CoreV1().ServiceAccounts(otherNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, dry)
			return err
		}},
		{"update a ClusterRole it does not own", func() error {
			_, err := op.RbacV1().ClusterRoles().Update(ctx, getCR("not-gpufleets"), dryUpdate)
			return err
		}},
		{"patch a ClusterRole it does not own", func() error {
			_, err := op.RbacV1().ClusterRoles().Patch(ctx, "not-gpufleets", types.MergePatchType, label, dryPatch)
			return err
		}},
		{"delete a ClusterRole it does not own", func() error {
			return op.RbacV1().ClusterRoles().Delete(ctx, "not-gpufleets", dryDelete)
		}},
		{"delete a ClusterRoleBinding it does not own", func() error {
			return op.RbacV1().ClusterRoleBindings().Delete(ctx, "not-gpufleets", dryDelete)
		}},
		{"update its own ClusterRole", func() error {
			_, err := op.RbacV1().ClusterRoles().Update(ctx, getCR(sa), dryUpdate)
			return err
		}},
		{"bind cluster-admin", func() error {
			_, err := op.RbacV1().ClusterRoleBindings().Create(ctx, adminBinding, dry)
			return err
		}},
		{"patch a node's status (the agent's right)", func() error {
			_, err := op.CoreV1().Nodes().Patch(ctx, "gpu-000", types.StrategicMergePatchType,
				[]byte(`{"status":{"conditions":[{"type":"GPUProblem","status":"False"}]}}`), dryPatch, "status")
			return err
		}},
	}
	for _, c := range allowed {
		if err := c.do(); err != nil {
			t.Errorf("the operator cannot %s: %v", c.name, err)
		}
	}
	for _, c := range forbidden {
		if err := c.do(); !apierrors.IsForbidden(err) {
			t.Errorf("the operator may %s (want Forbidden, got %v)", c.name, err)
		}
	}
}

// createStackRBAC creates, as dry runs, every ClusterRole the GPU stack
// renders (the driver manager's, mig-manager's) under a name of its own:
// the API server refuses a role that grants what its creator does not hold
// (a binding to such a role is then allowed for the same reason; it cannot
// be checked as a dry run, the role being stored never).
func createStackRBAC(ctx context.Context, op kubernetes.Interface, dry metav1.CreateOptions) error {
	policy := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cluster-policy", UID: "u"}}
	policy.Spec.MIGManager.Enabled = ptr.To(true)
	objs, err := gpustack.Render(policy, gpustack.Facts{Namespace: "gpufleet-system",
		OSFlavours: []gpustack.OSFlavour{{ID: "ubuntu", Version: "22.04"}}, Runtimes: []string{"containerd"}}, gpustack.Assets)
	if err != nil {
		return err
	}
	roles := 0
	for _, o := range objs {
		if role, ok := o.(*rbacv1.ClusterRole); ok {
			roles++
			role.OwnerReferences, role.Name = nil, "gpufleet-rbac-check-"+role.Name
			if _, err := op.RbacV1().ClusterRoles().Create(ctx, role, dry); err != nil {
				return fmt.Errorf("ClusterRole %s: %w", role.Name, err)
			}
		}
	}
	if roles < 2 {
		return fmt.Errorf("rendered %d ClusterRoles, want the driver manager's and mig-manager's", roles)
	}
	return nil
}

func daemonSet(namespace, name string) *appsv1.DaemonSet {
	labels := map[string]string{"app": name}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/agent:1"}}},
			},
		},
	}
}
