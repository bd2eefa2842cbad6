package deploy

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
)

// TestHelmUninstallLeavesNoNodeCordoned installs the chart, lets the
// operator (as its installed ServiceAccount) take three NodeMaintenances to
// Ready, Ready on a node an administrator had cordoned before, and Pending
// (over the limit), then runs the chart's pre-delete hook: the real
// `gpufleet uninstall` binary with the Job's arguments and the hook's own
// ServiceAccount and RBAC (kwok runs no containers, so the test plays the
// Job; it also stops the in-process operator when the Deployment is scaled
// to 0, as the pod's termination would). It checks the dry run and the
// timeout (operator never stops: replicas restored, nothing released), then
// the release: no node left cordoned but the one cordoned before, no
// NodeMaintenance left, a second run finds nothing to do, and after
// `helm uninstall` the NodeMaintenance CRD deletes without a stuck
// finalizer.
func TestHelmUninstallLeavesNoNodeCordoned(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local cluster (run without -short)")
	}
	ctx := t.Context()
	cluster := startCluster(t)
	if err := cluster.AddNodes(ctx, devcluster.NodeSpec{Name: "gpu-002", Pool: "pool-a", GPUs: 8}); err != nil {
		t.Fatal(err)
	}
	helmRun(t, "install", "fleet", chartDir(t), "--namespace", ns, "--create-namespace", "--kubeconfig", cluster.Kubeconfig,
		"--set", "maintenanceOperatorConfig.create=true", "--set", "maintenanceOperatorConfig.spec.maxParallelOperations=2")
	const operatorName = "fleet-gpufleet-operator"
	kube, stopOperator := runOperatorAs(t, cluster, operatorName)

	// gpu-001 was cordoned by an administrator before its maintenance.
	if err := cordon(ctx, kube, "gpu-001", true); err != nil {
		t.Fatal(err)
	}
	mk := func(name, node string) *maintenancev1.NodeMaintenance {
		nm := &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "upgrade.example.com", NodeName: node, DrainSpec: &maintenancev1.DrainSpec{Force: true}},
		}
		if err := kube.Create(ctx, nm); err != nil {
			t.Fatal(err)
		}
		return nm
	}
	drained, cordonedBefore := mk("drained", "gpu-000"), mk("cordoned-before", "gpu-001")
	waitReady(t, kube, drained)
	waitReady(t, kube, cordonedBefore)
	pending := mk("pending", "gpu-002") // over maxParallelOperations=2
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := kube.Get(ctx, client.ObjectKeyFromObject(pending), pending)
		// Pending written by the operator (the finalizer comes with Scheduled).
		return err == nil && meta.FindStatusCondition(pending.Status.Conditions, maintenancev1.ConditionTypeReady) != nil, err
	})
	if err != nil || pending.InProgress() {
		t.Fatalf("third NodeMaintenance: want Pending, got in progress %t: %v", pending.InProgress(), err)
	}

	uninstall, byHand := hookCommand(t, cluster, operatorName)
	// A dry run changes nothing.
	out, err := uninstall("--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	for _, want := range []string{"(dry run) scale the operator Deployment", "uncordon node gpu-000", "leave node gpu-001 cordoned"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	checkState(t, kube, map[string]bool{"gpu-000": true, "gpu-001": true, "gpu-002": false}, 3, 2)

	// An administrator runs it by hand and names the wrong namespace (the
	// operator runs in the release's), or the default Deployment name (the
	// release's differs): it finds the operator where it runs, says so,
	// and changes nothing while it runs.
	for _, args := range [][]string{{"--namespace=gpu-operator"}, {"--namespace=" + ns}} {
		out, err := byHand(args...)
		want := "gpufleet's operator runs as Deployment " + ns + "/" + operatorName
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("uninstall %v with the operator running elsewhere: %v, want a refusal saying %q:\n%s", args, err, want, out)
		}
		checkState(t, kube, map[string]bool{"gpu-000": true, "gpu-001": true, "gpu-002": false}, 3, 2)
	}

	// The operator does not stop (nothing stops the in-process one yet):
	// the hook fails within its timeout, restores the replicas, releases
	// nothing.
	out, err = uninstall("--timeout=3s")
	if err == nil || !strings.Contains(out+err.Error(), "still running") {
		t.Fatalf("with the operator running: want an error naming it, got %v\n%s", err, out)
	}
	if !strings.Contains(out, "operator replicas restored") {
		t.Errorf("output lacks the restore:\n%s", out)
	}
	checkState(t, kube, map[string]bool{"gpu-000": true, "gpu-001": true, "gpu-002": false}, 3, 2)

	// Now the operator's pod terminates when the Deployment is scaled to 0.
	go func() {
		_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			d := &appsv1.Deployment{}
			if err := kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: operatorName}, d); err != nil {
				return false, nil //nolint:nilerr // keep watching
			}
			return ptr.Deref(d.Spec.Replicas, 1) == 0, nil
		})
		stopOperator()
	}()
	out, err = uninstall()
	if err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	t.Logf("gpufleet uninstall:\n%s", out)
	checkState(t, kube, map[string]bool{"gpu-000": false, "gpu-001": true, "gpu-002": false}, 0, 0)

	// Idempotent: a second run finds nothing.
	out, err = uninstall()
	if err != nil || !strings.Contains(out, "no NodeMaintenance to release") {
		t.Fatalf("second run: %v\n%s", err, out)
	}

	helmRun(t, "uninstall", "fleet", "--namespace", ns, "--kubeconfig", cluster.Kubeconfig, "--no-hooks")
	// With nothing left behind a finalizer, the CRD deletes.
	dyn := dynamic.NewForConfigOrDie(cluster.Config)
	const crd = "nodemaintenances.maintenance.nvidia.com"
	if err := dyn.Resource(crdGVR).Delete(ctx, crd, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(crdGVR).Get(ctx, crd, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("CRD %s not deleted within a minute (an object stuck behind a finalizer?)", crd)
	}
}

// hookCommand returns a function that runs the chart's pre-delete hook as
// the Job would: the hook's ServiceAccount and RBAC are applied from the
// release's hooks (`helm get hooks`), and the real binary runs with the
// Job's command and arguments and that ServiceAccount's token. byHand
// runs the same binary's uninstall as an administrator does, with the
// cluster's admin kubeconfig and only the arguments given.
func hookCommand(t *testing.T, cluster *devcluster.Cluster, operatorName string) (hook, byHand func(extra ...string) (string, error)) {
	t.Helper()
	hooks := decodeAll(t, helmRun(t, "get", "hooks", "fleet", "--namespace", ns, "--kubeconfig", cluster.Kubeconfig))
	var job *unstructured.Unstructured
	var rbac []*unstructured.Unstructured
	for _, o := range hooks {
		if o.GetAnnotations()["helm.sh/hook"] != "pre-delete" {
			continue
		}
		if o.GetKind() == "Job" {
			job = o
			continue
		}
		rbac = append(rbac, o)
	}
	if job == nil {
		t.Fatal("the release has no pre-delete Job")
	}
	apply(t, cluster.Config, rbac)
	c := container(t, job)
	command, _ := c["command"].([]any)
	args, _ := c["args"].([]any)
	if len(command) != 2 || command[0] != "/gpufleet" || command[1] != "uninstall" {
		t.Fatalf("hook command %v, want [/gpufleet uninstall]", command)
	}
	for _, want := range []string{"--namespace=" + ns, "--deployment=" + operatorName, "--lease=" + operatorName} {
		if !slices.Contains(toStrings(args), want) {
			t.Errorf("hook args %v lack %s", args, want)
		}
	}
	sa, _, _ := unstructured.NestedString(job.Object, "spec", "template", "spec", "serviceAccountName")
	cfg := saConfig(t, cluster, sa)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, cfg.CAData, 0o600); err != nil {
		t.Fatal(err)
	}
	bin := buildGpufleet(t, dir)
	run := func(argv ...string) (string, error) {
		cmd := exec.CommandContext(t.Context(), bin, append([]string{"uninstall"}, argv...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err != nil {
			return stdout.String() + stderr.String(), err
		}
		return stdout.String(), nil
	}
	hook = func(extra ...string) (string, error) {
		argv := append(toStrings(args), "--server="+cfg.Host, "--token="+cfg.BearerToken, "--certificate-authority="+ca)
		return run(append(argv, extra...)...)
	}
	byHand = func(extra ...string) (string, error) {
		return run(append([]string{"--kubeconfig=" + cluster.Kubeconfig, "--timeout=3s"}, extra...)...)
	}
	return hook, byHand
}

func toStrings(a []any) []string {
	out := make([]string, 0, len(a))
	for _, v := range a {
		s, _ := v.(string)
		out = append(out, s)
	}
	return out
}

func buildGpufleet(t *testing.T, dir string) string {
	t.Helper()
	root, err := devcluster.SourceRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "gpufleet")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./cmd/gpufleet")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func cordon(ctx context.Context, c client.Client, node string, v bool) error {
	n := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		return err
	}
	patch := client.MergeFrom(n.DeepCopy())
	n.Spec.Unschedulable = v
	return c.Patch(ctx, n, patch)
}

// checkState: each node's unschedulable flag, the number of NodeMaintenance
// objects, and the operator Deployment's replicas.
func checkState(t *testing.T, kube client.Client, cordoned map[string]bool, maintenances int, replicas int32) {
	t.Helper()
	ctx := t.Context()
	for name, want := range cordoned {
		n := &corev1.Node{}
		if err := kube.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			t.Fatal(err)
		}
		if n.Spec.Unschedulable != want {
			t.Errorf("node %s unschedulable=%t, want %t", name, n.Spec.Unschedulable, want)
		}
	}
	var list maintenancev1.NodeMaintenanceList
	if err := kube.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != maintenances {
		t.Errorf("%d NodeMaintenance objects, want %d", len(list.Items), maintenances)
	}
	d := &appsv1.Deployment{}
	if err := kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fleet-gpufleet-operator"}, d); err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(d.Spec.Replicas, 1); got != replicas {
		t.Errorf("operator Deployment has %d replicas, want %d", got, replicas)
	}
}
