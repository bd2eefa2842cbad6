package gpustack_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/operator"
)

const ns = "gpu-operator"

var (
	cluster     *devcluster.Cluster
	k8s         client.Client
	operatorCfg *rest.Config
)

func TestMain(m *testing.M) {
	// 8 GPU nodes: 5 ubuntu 22.04 + containerd, 2 ubuntu 20.04 + docker,
	// 1 whose stack never comes up; plus 2 CPU-only nodes.
	var specs []devcluster.NodeSpec
	for i := range 5 {
		specs = append(specs, devcluster.NodeSpec{Name: fmt.Sprintf("gpu-%03d", i), Pool: "a", GPUs: 8})
	}
	for i := 5; i < 7; i++ {
		specs = append(specs, devcluster.NodeSpec{Name: fmt.Sprintf("gpu-%03d", i), Pool: "b", GPUs: 8,
			OSVersion: "20.04", Runtime: devcluster.RuntimeDocker})
	}
	specs = append(specs, devcluster.NodeSpec{Name: devcluster.UnhealthyNodePrefix + "gpu-007", Pool: "b", GPUs: 8},
		devcluster.NodeSpec{Name: "cpu-000", Pool: "cpu"}, devcluster.NodeSpec{Name: "cpu-001", Pool: "cpu"})
	scheme, err := operator.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// BenchmarkClusterPolicyScale at hundreds of nodes needs the large
	// cluster's node leases (see devcluster.LargeCluster).
	options := func() devcluster.Options {
		if *scaleNodes > 100 {
			return devcluster.LargeCluster
		}
		return devcluster.Options{}
	}
	os.Exit(devtest.MainWith(m, options, specs, ns, scheme, func(env *devcluster.Env) {
		cluster, k8s, operatorCfg = env.Cluster, env.Kube, env.OperatorConfig
	}))
}

// startOperator runs the gpustack capability with its own RBAC identity.
func startOperator(t *testing.T, cfg *rest.Config) {
	t.Helper()
	devtest.StartOperator(t, cfg, operator.Options{Namespace: ns, Capabilities: []string{"gpustack", "maintenance"},
		GPUStackDegradedAfter: 3 * time.Second, DriverUpgradeTimeout: 5 * time.Second})
}

func v16YAML(tb testing.TB) []byte {
	tb.Helper()
	data, err := os.ReadFile("testdata/gpu-operator-1.6-clusterpolicy.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

func yamlUnmarshal(data []byte, p *nvidiav1.ClusterPolicy) error {
	if err := yaml.Unmarshal(data, p); err != nil {
		return err
	}
	p.UID = ""
	return nil
}

func keyOf(name string) types.NamespacedName { return types.NamespacedName{Name: name} }

func v16Policy(t *testing.T) *nvidiav1.ClusterPolicy {
	t.Helper()
	p := &nvidiav1.ClusterPolicy{}
	if err := yamlUnmarshal(v16YAML(t), p); err != nil {
		t.Fatal(err)
	}
	return p
}

func getPolicy(t *testing.T, name string) *nvidiav1.ClusterPolicy {
	t.Helper()
	p := &nvidiav1.ClusterPolicy{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// updatePolicy changes the active ClusterPolicy, retrying on conflicts
// with the operator's status writes.
func updatePolicy(t *testing.T, change func(*nvidiav1.ClusterPolicy)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := getPolicy(t, "cluster-policy")
		change(p)
		return k8s.Update(t.Context(), p)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func component(p *nvidiav1.ClusterPolicy, name string) nvidiav1.ComponentStatus {
	for _, c := range p.Status.Components {
		if c.Name == name {
			return c
		}
	}
	return nvidiav1.ComponentStatus{}
}

// TestV16PolicyDeploysTheStack is the main GPU stack scenario; the
// sub-steps share the deployed stack.
func TestV16PolicyDeploysTheStack(t *testing.T) {
	devtest.NeedCluster(t)
	cfg, counter := devcluster.CountRequests(operatorCfg)
	startOperator(t, cfg)
	policy := v16Policy(t)
	if err := k8s.Create(t.Context(), policy); err != nil {
		t.Fatalf("the GPU Operator 1.6 ClusterPolicy was rejected: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), policy) })

	// Healthy GPU nodes get the whole stack; the unhealthy node stays at the
	// driver step and is reported Degraded.
	healthy := []string{"gpu-000", "gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-005", "gpu-006"}
	var p *nvidiav1.ClusterPolicy
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		p = getPolicy(t, "cluster-policy")
		gfd := component(p, gpustack.GFD)
		c := meta.FindStatusCondition(p.Status.Conditions, nvidiav1.ConditionDegraded)
		return gfd.NodesReady == int32(len(healthy)) && c != nil && c.Status == metav1.ConditionTrue, nil
	})
	if err != nil {
		t.Fatalf("stack not deployed on the healthy nodes with the broken one reported: status %+v", p.Status)
	}
	// Nothing changed the policy: its objects were created once, never rewritten
	// (a renderer field the API server defaults differently would show here).
	for k, v := range counter.Snapshot() {
		if strings.HasPrefix(k, "PUT ") && !strings.HasSuffix(k, "/status") {
			t.Errorf("%d × %s during a rollout of an unchanged policy", v, k)
		}
	}
	if p.Status.State != nvidiav1.StateNotReady || p.Status.Namespace != ns {
		t.Errorf("state=%s namespace=%s, want notReady (one node is broken) in %s", p.Status.State, p.Status.Namespace, ns)
	}
	deg := meta.FindStatusCondition(p.Status.Conditions, nvidiav1.ConditionDegraded)
	if !strings.Contains(deg.Message, "driver on unhealthy-gpu-007") {
		t.Errorf("Degraded message %q does not name the driver on the broken node", deg.Message)
	}
	if d := component(p, gpustack.Driver); d.NodesDesired != 8 || d.NodesReady != 7 || !strings.Contains(d.Message, "unhealthy-gpu-007") {
		t.Errorf("driver status %+v", d)
	}

	t.Run("components start at once and come up in order on each node", func(t *testing.T) {
		pods, err := cluster.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=gpu-000"})
		if err != nil {
			t.Fatal(err)
		}
		readyAt, created := map[string]time.Time{}, map[string]time.Time{}
		var first, last time.Time
		for _, pod := range pods.Items {
			c := pod.Labels[gpustack.LabelComponent]
			created[c] = pod.CreationTimestamp.Time
			if first.IsZero() || created[c].Before(first) {
				first = created[c]
			}
			if created[c].After(last) {
				last = created[c]
			}
			for _, cond := range pod.Status.Conditions {
				if cond.Type == "Ready" && cond.Status == "True" {
					readyAt[c] = cond.LastTransitionTime.Time
				}
			}
		}
		// All at once: no pod waits for a pass of the controller (the
		// serial rollout took one label patch and one watch round trip
		// per stage).
		if d := last.Sub(first); d > 3*time.Second {
			t.Errorf("pods on gpu-000 created over %s (first %s, last %s), want at once", d, first, last)
		}
		// In order: a component is Ready only after what it needs (its
		// validation init containers wait for it).
		for _, c := range nvidiav1.Components {
			if created[c.Key].IsZero() {
				continue // not enabled by the 1.6 policy
			}
			for _, dep := range c.After {
				if readyAt[c.Key].IsZero() || readyAt[dep].IsZero() {
					t.Fatalf("%s or %s not Ready on gpu-000: %v", c.Key, dep, readyAt)
				}
				if readyAt[c.Key].Before(readyAt[dep]) {
					t.Errorf("%s Ready at %s, before %s at %s", c.Key, readyAt[c.Key], dep, readyAt[dep])
				}
			}
		}
	})

	t.Run("the broken node's later components wait in their init containers", func(t *testing.T) {
		pods, err := cluster.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/component=container-toolkit", FieldSelector: "spec.nodeName=unhealthy-gpu-007",
		})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("toolkit pods on the broken node: %v %d", err, len(pods.Items))
		}
		pod := pods.Items[0]
		initialized := false
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodInitialized && c.Status == corev1.ConditionTrue {
				initialized = true
			}
		}
		if pod.Status.Phase != corev1.PodPending || initialized {
			t.Errorf("toolkit on the broken node: phase %s, initialized %v; want Pending in its driver-validation init container", pod.Status.Phase, initialized)
		}
		tk := component(getPolicy(t, "cluster-policy"), gpustack.ContainerToolkit)
		if !strings.Contains(tk.Message, "unhealthy-gpu-007 (waiting for driver)") {
			t.Errorf("toolkit status message %q does not say the broken node waits for its driver", tk.Message)
		}
	})

	t.Run("only GPU nodes are labelled and get pods", func(t *testing.T) {
		for _, n := range []string{"cpu-000", "cpu-001"} {
			node, _ := cluster.Client.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{})
			for k := range node.Labels {
				if strings.HasPrefix(k, "nvidia.com/") {
					t.Errorf("CPU node %s labelled %s", n, k)
				}
			}
		}
		pods, err := cluster.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range pods.Items {
			if strings.HasPrefix(pod.Spec.NodeName, "cpu-") {
				t.Errorf("pod %s on CPU node %s", pod.Name, pod.Spec.NodeName)
			}
		}
	})

	t.Run("two OS versions get two driver DaemonSets; runtimes get their toolkit", func(t *testing.T) {
		want := map[string]string{
			"nvidia-driver-daemonset-ubuntu22.04": "registry.cn-beijing.aliyuncs.com/happy365/nvidia-driver:450.102.04-ubuntu22.04",
			"nvidia-driver-daemonset-ubuntu20.04": "registry.cn-beijing.aliyuncs.com/happy365/nvidia-driver:450.102.04-ubuntu20.04",
		}
		for name, img := range want {
			ds, err := cluster.Client.AppsV1().DaemonSets(ns).Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("driver DaemonSet %s: %v", name, err)
			}
			if got := ds.Spec.Template.Spec.Containers[0].Image; got != img {
				t.Errorf("%s image %s, want %s", name, got, img)
			}
		}
		for _, node := range []struct{ name, runtime string }{{"gpu-000", "containerd"}, {"gpu-005", "docker"}} {
			pods, err := cluster.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{
				LabelSelector: "app.kubernetes.io/component=container-toolkit", FieldSelector: "spec.nodeName=" + node.name,
			})
			if err != nil || len(pods.Items) != 1 {
				t.Fatalf("toolkit pods on %s: %v %d", node.name, err, len(pods.Items))
			}
			env := map[string]string{}
			for _, e := range pods.Items[0].Spec.Containers[0].Env {
				env[e.Name] = e.Value
			}
			if env["RUNTIME"] != node.runtime {
				t.Errorf("toolkit on %s configured for %q, want %q", node.name, env["RUNTIME"], node.runtime)
			}
		}
	})

	t.Run("drift is reverted and deleted objects come back", func(t *testing.T) {
		name := "nvidia-device-plugin-daemonset"
		ds, err := cluster.Client.AppsV1().DaemonSets(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := ds.Spec.Template.Spec.Containers[0].Image
		ds.Spec.Template.Spec.Containers[0].Image = "evil.example/plugin:latest"
		if _, err := cluster.Client.AppsV1().DaemonSets(ns).Update(t.Context(), ds, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
			ds, err := cluster.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && ds.Spec.Template.Spec.Containers[0].Image == want, nil
		})
		if err != nil {
			t.Fatalf("edited DaemonSet not reverted")
		}
		if err := cluster.Client.AppsV1().DaemonSets(ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
			ds, err := cluster.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && ds.DeletionTimestamp == nil, nil
		})
		if err != nil {
			t.Fatalf("deleted DaemonSet not recreated")
		}
		// Without its managed-by label the object leaves the operator's
		// cache (a delete event for it); the operator finds it live and
		// labels it again instead of failing on AlreadyExists.
		// (The operator may still be writing the recreated object.)
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			ds, err := cluster.Client.AppsV1().DaemonSets(ns).Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			delete(ds.Labels, gpustack.LabelManagedBy)
			_, err = cluster.Client.AppsV1().DaemonSets(ns).Update(t.Context(), ds, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
			ds, err := cluster.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && ds.Labels[gpustack.LabelManagedBy] != "", nil
		})
		if err != nil {
			t.Fatalf("DaemonSet whose managed-by label was removed never labelled again")
		}
	})

	t.Run("disabling a component removes its objects", func(t *testing.T) {
		updatePolicy(t, func(p *nvidiav1.ClusterPolicy) { p.Spec.DCGMExporter.Enabled = ptr.To(false) })
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
			_, errDS := cluster.Client.AppsV1().DaemonSets(ns).Get(ctx, "nvidia-dcgm-exporter", metav1.GetOptions{})
			_, errSvc := cluster.Client.CoreV1().Services(ns).Get(ctx, "nvidia-dcgm-exporter", metav1.GetOptions{})
			return apierrors.IsNotFound(errDS) && apierrors.IsNotFound(errSvc), nil
		})
		if err != nil {
			t.Fatalf("dcgm-exporter objects not removed after disabling it")
		}
	})

	t.Run("a second ClusterPolicy is ignored", func(t *testing.T) {
		second := v16Policy(t)
		second.Name = "second-policy"
		if err := k8s.Create(t.Context(), second); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = k8s.Delete(context.Background(), second) }()
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
			return getPolicy(t, "second-policy").Status.State == nvidiav1.StateIgnored, nil
		})
		if err != nil {
			t.Fatalf("second ClusterPolicy not ignored: %+v", getPolicy(t, "second-policy").Status)
		}
		c := meta.FindStatusCondition(getPolicy(t, "second-policy").Status.Conditions, nvidiav1.ConditionReady)
		if c == nil || !strings.Contains(c.Message, "cluster-policy is active") {
			t.Errorf("ignored policy's Ready condition %+v does not name the active one", c)
		}
	})

	t.Run("a node of a new OS gets its driver DaemonSet; removing it deletes it", func(t *testing.T) {
		if err := cluster.AddNodes(t.Context(), devcluster.NodeSpec{Name: "gpu-rhel", Pool: "c", GPUs: 4, OSID: "rhel", OSVersion: "9.4", Runtime: devcluster.RuntimeCRIO}); err != nil {
			t.Fatal(err)
		}
		name := "nvidia-driver-daemonset-rhel9.4"
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			ds, err := cluster.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && ds.Status.NumberReady == 1, nil
		})
		if err != nil {
			t.Fatalf("no ready %s for the new rhel node", name)
		}
		if err := cluster.Client.CoreV1().Nodes().Delete(t.Context(), "gpu-rhel", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := cluster.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Fatalf("%s not deleted after its last node went away", name)
		}
	})

	t.Run("a driver version change rolls through NodeMaintenance within the limits", func(t *testing.T) {
		ctx := t.Context()
		// Cluster-wide limits allow 3; the upgrade policy allows 2.
		cfg := &maintenancev1.MaintenanceOperatorConfig{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"},
			Spec:       maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: ptr.To(intstr.FromInt32(3))},
		}
		if err := k8s.Create(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		const limit = 2
		// An independent checker: never more than the limit in progress or cordoned.
		stop := make(chan struct{})
		violations := make(chan string, 100)
		var checked, maxSeen int
		go func() {
			for {
				select {
				case <-stop:
					close(violations)
					return
				case <-time.After(50 * time.Millisecond):
				}
				var nms maintenancev1.NodeMaintenanceList
				if err := k8s.List(context.Background(), &nms, client.InNamespace(ns)); err != nil {
					continue
				}
				inProgress := 0
				for i := range nms.Items {
					if c := meta.FindStatusCondition(nms.Items[i].Status.Conditions, "Ready"); c != nil && c.Reason != "Pending" {
						inProgress++
					}
				}
				nodes, err := cluster.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
				if err != nil {
					continue
				}
				cordoned := 0
				for _, n := range nodes.Items {
					if n.Spec.Unschedulable {
						cordoned++
					}
				}
				checked++
				maxSeen = max(maxSeen, inProgress)
				if inProgress > limit || cordoned > limit {
					violations <- fmt.Sprintf("%d upgrades in progress, %d nodes cordoned (limit %d)", inProgress, cordoned, limit)
				}
			}
		}()
		updatePolicy(t, func(p *nvidiav1.ClusterPolicy) {
			p.Spec.Driver.Version = "550.54.15"
			p.Spec.Driver.UpgradePolicy = &nvidiav1.DriverUpgradePolicySpec{MaxParallelUpgrades: ptr.To[int32](limit)}
		})
		healthy := []string{"gpu-000", "gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-005", "gpu-006"}
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			for _, n := range healthy {
				pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
					LabelSelector: "app.kubernetes.io/component=driver", FieldSelector: "spec.nodeName=" + n,
				})
				if err != nil || len(pods.Items) != 1 || !strings.Contains(pods.Items[0].Spec.Containers[0].Image, ":550.54.15-") || pods.Items[0].DeletionTimestamp != nil {
					return false, nil //nolint:nilerr // not there yet (or a transient error): keep polling
				}
			}
			var nms maintenancev1.NodeMaintenanceList
			if err := k8s.List(ctx, &nms, client.InNamespace(ns)); err != nil || len(nms.Items) != 0 {
				return false, nil //nolint:nilerr // not there yet (or a transient error): keep polling
			}
			bad, err := cluster.Client.CoreV1().Nodes().Get(ctx, "unhealthy-gpu-007", metav1.GetOptions{})
			return err == nil && bad.Labels[nvidiav1.LabelUpgradeState] == "failed", nil
		})
		close(stop)
		for v := range violations {
			t.Error(v)
		}
		if err != nil {
			t.Fatalf("rollout did not finish: %v", err)
		}
		t.Logf("limits checked %d times during the rollout; at most %d upgrades in progress at once", checked, maxSeen)
		if maxSeen == 0 {
			t.Errorf("the checker never saw an upgrade in progress")
		}
		nodes, _ := cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		for _, n := range nodes.Items {
			if n.Spec.Unschedulable {
				t.Errorf("node %s left cordoned after the rollout", n.Name)
			}
		}
		evs, _ := cluster.Client.EventsV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=" + gpustack.ReasonUpgradeFailed})
		if len(evs.Items) == 0 {
			t.Errorf("no %s Warning event for the node whose new driver never became Ready", gpustack.ReasonUpgradeFailed)
		}
	})

	t.Run("an operand pod that cannot be scheduled marks its node Degraded with the scheduler's reason", func(t *testing.T) {
		// A GPU node with room for no pod: the DaemonSets create its pods,
		// the scheduler cannot place them.
		full := devcluster.NodeSpec{Name: "full-gpu-009", Pool: "a", GPUs: 8, Capacity: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
		if err := cluster.AddNodes(t.Context(), full); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := cluster.Client.CoreV1().Nodes().Delete(context.Background(), full.Name, metav1.DeleteOptions{}); err != nil {
				t.Error(err)
			}
		}()
		var deg *metav1.Condition
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			deg = meta.FindStatusCondition(getPolicy(t, "cluster-policy").Status.Conditions, nvidiav1.ConditionDegraded)
			return deg != nil && deg.Status == metav1.ConditionTrue && strings.Contains(deg.Message, "driver on full-gpu-009 (cannot be scheduled: "), nil
		})
		if err != nil {
			t.Fatalf("Degraded does not name the unschedulable driver pod: %+v", deg)
		}
		if !strings.Contains(deg.Message, "Too many pods") {
			t.Errorf("Degraded message %q does not carry the scheduler's reason", deg.Message)
		}
		if d := component(getPolicy(t, "cluster-policy"), gpustack.Driver); !strings.Contains(d.Message, "full-gpu-009 (pod cannot be scheduled)") {
			t.Errorf("driver component message %q does not name the node", d.Message)
		}
	})

	t.Run("mig-manager runs only on MIG-capable nodes", func(t *testing.T) {
		setLabel := func(v any) {
			patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, nvidiav1.LabelMIGCapable, v)
			if _, err := cluster.Client.CoreV1().Nodes().Patch(context.Background(), "gpu-001", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		setLabel(`"true"`)
		updatePolicy(t, func(p *nvidiav1.ClusterPolicy) { p.Spec.MIGManager.Enabled = ptr.To(true) })
		defer func() {
			updatePolicy(t, func(p *nvidiav1.ClusterPolicy) { p.Spec.MIGManager.Enabled = nil })
			setLabel("null")
		}()
		var mig nvidiav1.ComponentStatus
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			mig = component(getPolicy(t, "cluster-policy"), gpustack.MIGManager)
			return mig.Enabled && mig.NodesDesired == 1 && mig.NodesReady == 1, nil
		})
		if err != nil {
			t.Fatalf("mig-manager status %+v, want desired and Ready on the one MIG-capable node", mig)
		}
		pods, err := cluster.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: gpustack.LabelComponent + "=" + gpustack.MIGManager})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName != "gpu-001" {
				t.Errorf("mig-manager pod %s on %s, which is not MIG-capable", p.Name, p.Spec.NodeName)
			}
		}
		if len(pods.Items) != 1 {
			t.Errorf("%d mig-manager pods, want 1", len(pods.Items))
		}
	})

	t.Run("without the broken node the policy is ready", func(t *testing.T) {
		if err := cluster.Client.CoreV1().Nodes().Delete(t.Context(), "unhealthy-gpu-007", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return getPolicy(t, "cluster-policy").Status.State == nvidiav1.StateReady, nil
		})
		p := getPolicy(t, "cluster-policy")
		if err != nil {
			t.Fatalf("state %s, want ready: %+v", p.Status.State, p.Status)
		}
		for _, typ := range []string{nvidiav1.ConditionReady, nvidiav1.ConditionProgressing, nvidiav1.ConditionDegraded} {
			c := meta.FindStatusCondition(p.Status.Conditions, typ)
			want := metav1.ConditionFalse
			if typ == nvidiav1.ConditionReady {
				want = metav1.ConditionTrue
			}
			if c == nil || c.Status != want || c.ObservedGeneration != p.Generation {
				t.Errorf("condition %s = %+v, want %s at generation %d", typ, c, want, p.Generation)
			}
		}
	})

	t.Run("converged: zero writes and no lists", func(t *testing.T) {
		// Let the last changes settle, then watch the operator's requests
		// while nothing changes (node heartbeats and leases keep coming).
		time.Sleep(5 * time.Second)
		before := counter.Snapshot()
		time.Sleep(10 * time.Second)
		idle := counter.Since(before)
		for k := range idle {
			if devcluster.IsWrite(k) || strings.HasPrefix(k, "LIST") {
				t.Errorf("converged operator issued %s (%d times); all requests:\n%s", k, idle[k], devcluster.FormatCounts(idle))
			}
		}
		t.Logf("requests in 10 idle seconds:\n%s", devcluster.FormatCounts(idle))
	})
}

func TestClusterPolicySchema(t *testing.T) {
	devtest.NeedCluster(t)
	tests := map[string]struct{ spec, want string }{
		"empty image while enabled":  {"  devicePlugin:\n    enabled: true\n    image: \"\"\n", "image must not be empty when the component is enabled"},
		"bad pull policy":            {"  driver:\n    imagePullPolicy: Sometimes\n", "Unsupported value: \"Sometimes\""},
		"bad default runtime":        {"  operator:\n    defaultRuntime: podman\n", "Unsupported value: \"podman\""},
		"bad mig strategy":           {"  gfd:\n    migStrategy: some\n", "Unsupported value: \"some\""},
		"bad update strategy":        {"  daemonsets:\n    updateStrategy: Sometimes\n", "Unsupported value: \"Sometimes\""},
		"negative parallel upgrades": {"  driver:\n    upgradePolicy:\n      maxParallelUpgrades: -1\n", "maxParallelUpgrades: Invalid value: -1"},
		"bad upgrade maxUnavailable": {"  driver:\n    upgradePolicy:\n      maxUnavailable: 120%\n", "maxUnavailable must be a non-negative integer or a percentage"},
		"zero discovery interval":    {"  gfd:\n    discoveryIntervalSeconds: 0\n", "discoveryIntervalSeconds: Invalid value: 0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			doc := "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata:\n  generateName: bad-\nspec:\n" + tc.spec
			// Untyped, as kubectl sends it (a typed Go client omits empty strings).
			p := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &p.Object); err != nil {
				t.Fatalf("test YAML: %v", err)
			}
			err := k8s.Create(t.Context(), p)
			if err == nil {
				_ = k8s.Delete(context.Background(), p)
				t.Fatalf("accepted: %s", tc.spec)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}
