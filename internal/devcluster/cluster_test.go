package devcluster_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// One cluster for the package, started in TestMain.
var cluster *devcluster.Cluster

const gpuNodes = 8

func TestMain(m *testing.M) {
	// Child mode for TestNoOrphans: start a cluster, print the pids, die.
	if os.Getenv("DEVCLUSTER_ORPHAN_CHILD") == "1" {
		orphanChild()
		return
	}
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	ctx := context.Background()
	began := time.Now()
	var err error
	cluster, err = devcluster.Start(ctx, devcluster.Options{Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) }})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the local cluster:", err)
		os.Exit(1)
	}
	specs := devcluster.GPUNodes(gpuNodes, 2)
	specs = append(specs, devcluster.NodeSpec{Name: "cpu-000", Pool: "cpu"})
	if err := cluster.AddNodes(ctx, specs...); err != nil {
		cluster.Stop()
		fmt.Fprintln(os.Stderr, "adding nodes:", err)
		os.Exit(1)
	}
	fmt.Printf("cluster with %d nodes ready %s after start\n", len(specs), time.Since(began).Round(100*time.Millisecond))
	code := m.Run()
	cluster.Stop()
	os.Exit(code)
}

func TestDaemonSetRunsOnEveryGPUNode(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	labels := map[string]string{"app": "gpu-probe"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-probe", Namespace: "default"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{devcluster.LabelNFDNvidiaPCI: "true"},
					Containers:   []corev1.Container{{Name: "probe", Image: "registry.example/probe:1"}},
				},
			},
		},
	}
	_, err := cluster.Client.AppsV1().DaemonSets("default").Create(ctx, ds, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.AppsV1().DaemonSets("default").Delete(context.Background(), "gpu-probe", metav1.DeleteOptions{})
	})
	var got *appsv1.DaemonSet
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = cluster.Client.AppsV1().DaemonSets("default").Get(ctx, "gpu-probe", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return got.Status.DesiredNumberScheduled == gpuNodes && got.Status.NumberReady == gpuNodes, nil
	})
	if err != nil {
		t.Fatalf("DaemonSet never became ready on all %d GPU nodes: status %+v: %v", gpuNodes, got.Status, err)
	}
	pods, err := cluster.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=gpu-probe"})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]bool{}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s on %s is %s, want Running", p.Name, p.Spec.NodeName, p.Status.Phase)
		}
		if strings.HasPrefix(p.Spec.NodeName, "cpu-") {
			t.Errorf("pod %s landed on CPU node %s", p.Name, p.Spec.NodeName)
		}
		nodes[p.Spec.NodeName] = true
	}
	if len(nodes) != gpuNodes {
		t.Errorf("pods on %d distinct nodes, want %d", len(nodes), gpuNodes)
	}
}

func TestEvictionHonoursPodDisruptionBudget(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	ns := "pdb-test"
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, ns); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "trainer"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "train", Image: "registry.example/train:1"}}},
			},
		},
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(2)),
			Selector:     &metav1.LabelSelector{MatchLabels: labels},
		},
	}
	if _, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Wait until both pods run and the disruption controller has computed the budget.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "trainer", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.ObservedGeneration == p.Generation && p.Status.CurrentHealthy == 2, nil
	})
	if err != nil {
		t.Fatalf("PDB never saw 2 healthy pods: %v", err)
	}
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=trainer"})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("listing pods: %v (%d)", err, len(pods.Items))
	}
	victim := pods.Items[0]
	evict := func() error {
		return cluster.Client.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: victim.Name, Namespace: ns},
		})
	}
	err = evict()
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Code != 429 {
		t.Fatalf("eviction with no disruptions allowed: got %v, want HTTP 429", err)
	}

	// Relax the budget: one disruption allowed.
	p, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "trainer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.MinAvailable = ptr.To(intstr.FromInt32(1))
	if _, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := evict()
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("eviction never succeeded after relaxing the PDB: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, victim.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && got.UID != victim.UID, nil
	})
	if err != nil {
		t.Fatalf("evicted pod %s is still there: %v", victim.Name, err)
	}
}

func TestInjectedConditionIsVisible(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	node := "gpu-003"
	cond := corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Reason: "FilesystemIsReadOnly", Message: "/ is read-only"}
	if err := cluster.SetNodeCondition(ctx, node, cond); err != nil {
		t.Fatal(err)
	}
	got := waitCondition(t, node, "ReadonlyFilesystem", corev1.ConditionTrue, 10*time.Second)
	if got.Reason != "FilesystemIsReadOnly" {
		t.Errorf("reason = %q, want FilesystemIsReadOnly", got.Reason)
	}
	// Ready must still be True: the injected condition does not disturb the simulated kubelet.
	waitCondition(t, node, corev1.NodeReady, corev1.ConditionTrue, 10*time.Second)
	if err := cluster.ClearNodeCondition(ctx, node, "ReadonlyFilesystem"); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return findCondition(n, "ReadonlyFilesystem") == nil, nil
	})
	if err != nil {
		t.Fatalf("condition not cleared: %v", err)
	}

	// Injected NotReady persists (the node is frozen) until cleared.
	if err := cluster.SetNodeCondition(ctx, node, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "PLEG is not healthy"}); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, node, corev1.NodeReady, corev1.ConditionFalse, 10*time.Second)
	time.Sleep(2 * time.Second) // give kwok the chance to (wrongly) overwrite it
	waitCondition(t, node, corev1.NodeReady, corev1.ConditionFalse, time.Second)
	if err := cluster.ClearNodeCondition(ctx, node, corev1.NodeReady); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, node, corev1.NodeReady, corev1.ConditionTrue, 20*time.Second)
}

func TestStoppedHeartbeatMakesNodeNotReady(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	node := "gpu-005"
	if err := cluster.StopKubelet(ctx, node); err != nil {
		t.Fatal(err)
	}
	// The real node lifecycle controller must notice the expired lease.
	got := waitCondition(t, node, corev1.NodeReady, corev1.ConditionUnknown, 60*time.Second)
	if got.Reason != "NodeStatusUnknown" {
		t.Errorf("reason = %q, want NodeStatusUnknown (set by the node lifecycle controller)", got.Reason)
	}
	if err := cluster.StartKubelet(ctx, node); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, node, corev1.NodeReady, corev1.ConditionTrue, 30*time.Second)
}

func TestReboot(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	node := "gpu-006"
	before, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cluster.Reboot(ctx, node, 2*time.Second) }()
	waitCondition(t, node, corev1.NodeReady, corev1.ConditionFalse, 10*time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitCondition(t, node, corev1.NodeReady, corev1.ConditionTrue, 20*time.Second)
	after, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.Status.NodeInfo.BootID == before.Status.NodeInfo.BootID {
		t.Errorf("boot ID unchanged after reboot: %s", after.Status.NodeInfo.BootID)
	}
}

func TestSimulatedNodesLookLikeGPUNodes(t *testing.T) {
	devtest.NeedCluster(t)
	n, err := cluster.Client.CoreV1().Nodes().Get(t.Context(), "gpu-001", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels[devcluster.LabelNFDNvidiaPCI] != "true" || n.Labels[devcluster.LabelNFDOSID] != "ubuntu" || n.Labels[devcluster.LabelPool] != "pool-b" {
		t.Errorf("labels = %v", n.Labels)
	}
	if q := n.Status.Allocatable[devcluster.ResourceGPU]; q.Value() != 8 {
		t.Errorf("allocatable nvidia.com/gpu = %s, want 8", q.String())
	}
	if n.Status.NodeInfo.ContainerRuntimeVersion != devcluster.RuntimeContainerd {
		t.Errorf("runtime = %q", n.Status.NodeInfo.ContainerRuntimeVersion)
	}
}

// TestNoOrphans runs a child test binary that starts a cluster and exits
// without stopping it (as a panicking test would); no process of that
// cluster may survive the child.
func TestNoOrphans(t *testing.T) {
	devtest.NeedCluster(t)
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "DEVCLUSTER_ORPHAN_CHILD=1")
	out, _ := cmd.CombinedOutput() // the child panics on purpose
	var dir string
	for _, line := range strings.Split(string(out), "\n") {
		if d, ok := strings.CutPrefix(line, "CLUSTER_DIR="); ok {
			dir = d
		}
	}
	if dir == "" {
		t.Fatalf("child did not report its cluster dir; output:\n%s", out)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return len(processesMentioning(dir)) == 0, nil
	})
	if err != nil {
		t.Fatalf("processes of the dead child's cluster still running: %v", processesMentioning(dir))
	}
	// The next Start removes the dead child's directory.
	if _, err := os.Stat(dir); err == nil {
		c, err := devcluster.Start(t.Context(), devcluster.Options{})
		if err != nil {
			t.Fatal(err)
		}
		c.Stop()
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("stale cluster dir %s not removed", dir)
		}
	}
}

func orphanChild() {
	c, err := devcluster.Start(context.Background(), devcluster.Options{})
	if err != nil {
		fmt.Println("START FAILED:", err)
		os.Exit(2)
	}
	fmt.Println("CLUSTER_DIR=" + c.Dir)
	panic("dying without Stop, as a crashing test would")
}

// processesMentioning lists /proc entries whose command line contains s.
func processesMentioning(s string) []string {
	entries, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []string
	for _, e := range entries {
		data, err := os.ReadFile(e)
		if err != nil {
			continue
		}
		if strings.Contains(string(data), s) {
			out = append(out, strings.ReplaceAll(string(data), "\x00", " "))
		}
	}
	return out
}

func TestMissingBinaryNamesBuildCommand(t *testing.T) {
	_, err := devcluster.Start(t.Context(), devcluster.Options{BinDir: t.TempDir()})
	var missing *devcluster.MissingBinariesError
	if !errors.As(err, &missing) {
		t.Fatalf("got %v, want MissingBinariesError", err)
	}
	if !strings.Contains(err.Error(), "make tools") || len(missing.Missing) != len(devcluster.Binaries) {
		t.Errorf("error should name the build command and every binary: %v", err)
	}
}

func TestFailedPartShowsItsLog(t *testing.T) {
	// A fake etcd that exits at once: the error must name it and show its output.
	dir := t.TempDir()
	for _, b := range devcluster.Binaries {
		script := "#!/bin/sh\necho 'fake " + b + " refusing to start' >&2\nexit 3\n"
		if err := os.WriteFile(filepath.Join(dir, b), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, err := devcluster.Start(t.Context(), devcluster.Options{BinDir: dir})
	if err == nil {
		t.Fatal("start with a broken etcd succeeded")
	}
	if !strings.Contains(err.Error(), "etcd did not become healthy") || !strings.Contains(err.Error(), "fake etcd refusing to start") {
		t.Errorf("error should name etcd and show its log: %v", err)
	}
}

func waitCondition(t *testing.T, node string, typ corev1.NodeConditionType, status corev1.ConditionStatus, timeout time.Duration) corev1.NodeCondition {
	t.Helper()
	var last *corev1.NodeCondition
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = findCondition(n, typ)
		return last != nil && last.Status == status, nil
	})
	if err != nil {
		t.Fatalf("node %s condition %s never became %s (last: %+v): %v", node, typ, status, last, err)
	}
	return *last
}

func findCondition(n *corev1.Node, typ corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}
