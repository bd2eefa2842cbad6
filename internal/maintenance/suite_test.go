package maintenance_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/maintenance"
	"github.com/gpufleet/gpufleet/internal/operator"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

const (
	operatorNS = "gpufleet-system"
	testNodes  = 10
)

var (
	cluster     *devcluster.Cluster
	k8s         client.Client // admin client with our types
	operatorCfg *rest.Config  // the operator's own, RBAC-limited identity
)

func TestMain(m *testing.M) {
	if os.Getenv("GPUFLEET_TEST_LOGS") != "" {
		ctrl.SetLogger(zap.New(zap.UseDevMode(true)))
	}
	scheme, err := operator.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(devtest.Main(m, devcluster.GPUNodes(testNodes, 2), operatorNS, scheme, func(env *devcluster.Env) {
		cluster, k8s, operatorCfg = env.Cluster, env.Kube, env.OperatorConfig
		maintenance.AdminConfigForTest = env.Config // for the reconcilers tested directly (package maintenance)
	}))
}

// withOperator prepares a test that needs the operator: limits set, and on
// cleanup every NodeMaintenance removed (while the operator still runs),
// the operator stopped and every node uncordoned.
func withOperator(t *testing.T, maxParallel, maxUnavailable *intstr.IntOrString) {
	t.Helper()
	devtest.NeedCluster(t)
	t.Cleanup(func() { uncordonAll(t) })
	startOperator(t)
	t.Cleanup(func() { cleanupNMs(t) })
	setConfig(t, maxParallel, maxUnavailable)
}

// startOperator runs the maintenance capability with its own RBAC identity
// until the test ends or the returned stop is called.
func startOperator(t *testing.T) (stop func()) {
	t.Helper()
	return devtest.StartOperator(t, operatorCfg, operator.Options{Namespace: operatorNS, Capabilities: []string{"maintenance"}})
}

// setConfig writes the default MaintenanceOperatorConfig.
func setConfig(t *testing.T, maxParallel, maxUnavailable *intstr.IntOrString) {
	t.Helper()
	ctx := t.Context()
	cfg := &maintenancev1.MaintenanceOperatorConfig{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: "default"}}
	err := k8s.Get(ctx, client.ObjectKeyFromObject(cfg), cfg)
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	cfg.Spec.MaxParallelOperations = maxParallel
	cfg.Spec.MaxUnavailable = maxUnavailable
	if apierrors.IsNotFound(err) {
		err = k8s.Create(ctx, cfg)
	} else {
		err = k8s.Update(ctx, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func ios(v int) *intstr.IntOrString { x := intstr.FromInt32(int32(v)); return &x }

// newNM builds a new NodeMaintenance in the default namespace.
func newNM(name, node, requestor string) *maintenancev1.NodeMaintenance {
	return testobj.NodeMaintenance(name, node, testobj.Requestor(requestor))
}

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := k8s.Create(t.Context(), o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

// cleanupNMs deletes every NodeMaintenance and waits until they are gone
// (the operator must be running to remove finalizers).
func cleanupNMs(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := k8s.DeleteAllOf(ctx, &maintenancev1.NodeMaintenance{}, client.InNamespace("default")); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var list maintenancev1.NodeMaintenanceList
		if err := k8s.List(ctx, &list); err != nil {
			return false, err
		}
		return len(list.Items) == 0, nil
	})
	if err != nil {
		t.Errorf("NodeMaintenance objects left after cleanup: %v", err)
	}
}

func getNM(t *testing.T, name string) *maintenancev1.NodeMaintenance {
	t.Helper()
	nm := &maintenancev1.NodeMaintenance{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: "default", Name: name}, nm); err != nil {
		t.Fatal(err)
	}
	return nm
}

// waitPhase waits until the object reaches phase.
func waitPhase(t *testing.T, name string, phase maintenancev1.Phase, timeout time.Duration) *maintenancev1.NodeMaintenance {
	t.Helper()
	var nm *maintenancev1.NodeMaintenance
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		nm = &maintenancev1.NodeMaintenance{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: "default", Name: name}, nm); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return nm.Phase() == phase, nil
	})
	if err != nil {
		t.Fatalf("%s never reached phase %s (now %s, conditions %+v): %v", name, phase, nm.Phase(), nm.Status.Conditions, err)
	}
	return nm
}

func readyCondition(nm *maintenancev1.NodeMaintenance) *metav1.Condition {
	return meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady)
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := cluster.Client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func setUnschedulable(t *testing.T, node string, v bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, v)
	if _, err := cluster.Client.CoreV1().Nodes().Patch(t.Context(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// uncordonAll makes every node schedulable again (test hygiene).
func uncordonAll(t *testing.T) {
	t.Helper()
	for i := range testNodes {
		patch := `{"spec":{"unschedulable":false}}`
		_, _ = cluster.Client.CoreV1().Nodes().Patch(context.Background(), fmt.Sprintf("gpu-%03d", i), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	}
}

// deployment creates a Deployment of n pods pinned to the given nodes by
// affinity (none: anywhere) and waits until they all run.
func deployment(t *testing.T, ns, name string, n int32, annotations map[string]string, nodes ...string) {
	t.Helper()
	ctx := t.Context()
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, ns); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": name}
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.example/" + name + ":1"}}}
	if len(nodes) > 0 {
		spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
				Weight: 100,
				Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: nodes,
				}}},
			}},
		}}
	}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(n),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: annotations}, Spec: spec},
		},
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.AppsV1().Deployments(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		d, err := cluster.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == n, nil
	})
	if err != nil {
		t.Fatalf("deployment %s never got %d ready pods: %v", name, n, err)
	}
}

// podsOn returns the running (not terminating) pods of app on node.
func podsOn(t *testing.T, ns, app, node string) []corev1.Pod {
	t.Helper()
	pods, err := cluster.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{
		LabelSelector: "app=" + app, FieldSelector: "spec.nodeName=" + node,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// eventsFor lists the reasons of events regarding a NodeMaintenance.
func eventsFor(t *testing.T, name string) []string {
	t.Helper()
	evs, err := cluster.Client.EventsV1().Events("default").List(t.Context(), metav1.ListOptions{
		FieldSelector: "regarding.name=" + name,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Reason+": "+e.Note)
	}
	return out
}

// eventSeen waits up to 10 s for an event with reason about the object
// name (events are sent after the status write a test waits for).
func eventSeen(t *testing.T, name, reason string) bool {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return hasEvent(eventsFor(t, name), reason), nil
	})
	return err == nil
}

func hasEvent(events []string, reason string) bool {
	for _, e := range events {
		if strings.HasPrefix(e, reason+":") {
			return true
		}
	}
	return false
}

func keyOf(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: "default", Name: name}
}

func keyIn(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

func fmtSscan(s string, v *float64) (int, error) { return fmt.Sscan(s, v) }
