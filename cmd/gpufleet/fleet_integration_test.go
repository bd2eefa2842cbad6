package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/fleet"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// env is the local cluster of this package's integration tests: four GPU
// nodes in two pools.
var env *devcluster.Env

func TestMain(m *testing.M) {
	scheme, err := operator.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(devtest.Main(m, devcluster.GPUNodes(4, 2), operator.DefaultNamespace, scheme, func(e *devcluster.Env) { env = e }))
}

// kubeconfigFor writes a kubeconfig with cfg's server and credentials.
func kubeconfigFor(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData,
		ClientCertificate: cfg.CertFile, ClientKey: cfg.KeyFile, Token: cfg.BearerToken}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestFleetCommands runs status and explain against the local cluster: a
// node in maintenance (through the operator), one being repaired, one with
// a faulty GPU; then as a user RBAC allows only nodes and pods; then with
// the GPUFault CRD removed.
func TestFleetCommands(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	kube := env.Kube
	devtest.StartOperator(t, env.OperatorConfig, operator.Options{Namespace: operator.DefaultNamespace, Capabilities: []string{"maintenance"}})

	nm := &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "fleet-test-gpu-000"},
		Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "fleet-test.example.com", NodeName: "gpu-000", DrainSpec: &maintenancev1.DrainSpec{}},
	}
	if err := kube.Create(ctx, nm); err != nil {
		t.Fatal(err)
	}
	repair := &repairv1.NodeRepair{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-001-kubelet-down"},
		Spec: repairv1.NodeRepairSpec{NodeName: "gpu-001", Pool: "pool-b", Policy: "default", Actions: []repairv1.Action{repairv1.ActionRestartKubelet},
			Fault: repairv1.Fault{Rule: "kubelet-down", ConditionType: "Ready", Status: "Unknown", Since: metav1.Now()}},
	}
	if err := kube.Create(ctx, repair); err != nil {
		t.Fatal(err)
	}
	repair.Status.Phase = repairv1.PhaseRepairing
	repair.Status.Timeline = []repairv1.TimelineEntry{{Time: metav1.Now(), Step: "RestartKubelet", Outcome: "Requested"}}
	if err := kube.Status().Update(ctx, repair); err != nil {
		t.Fatal(err)
	}
	gpuFault := &repairv1.GPUFault{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-002-gpu-3"},
		Spec:       repairv1.GPUFaultSpec{NodeName: "gpu-002", GPU: repairv1.GPURef{Index: ptr.To[int32](3), PCIBusID: "0000:1b:00.0"}},
	}
	if err := kube.Create(ctx, gpuFault); err != nil {
		t.Fatal(err)
	}
	gpuFault.Status = repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU, Faults: []repairv1.GPUFaultEntry{{
		Code: 48, Class: repairv1.GPUClassResetGPU, FirstSeen: metav1.Now(), LastSeen: metav1.Now(), Count: 1, Active: true}}}
	if err := kube.Status().Update(ctx, gpuFault); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the maintenance of gpu-000 to be Ready", func() bool {
		got := &maintenancev1.NodeMaintenance{}
		return kube.Get(ctx, client.ObjectKeyFromObject(nm), got) == nil && got.IsReady()
	})

	admin := kubeconfigFor(t, env.Config)
	out := mustRun(t, "status", "--kubeconfig", admin)
	wantLines(t, out,
		"gpu-000 pool-a in maintenance 0/8 - fleet-test.example.com Ready -",
		"gpu-001 pool-b repairing 0/8 - - Repairing kubelet-down for",
		"gpu-002 pool-a ready 0/8 1 faulty - - -",
		"gpu-003 pool-b ready 0/8 - - -",
		"4 nodes: 2 ready for work, 1 in maintenance, 1 repairing, 0 degraded; GPUs 32, 0 in use, 1 faulty",
	)
	out = mustRun(t, "status", "--kubeconfig", admin, "--problems", "-o", "wide", "--sort-by", "state")
	wantLines(t, out, "gpu-001 pool-b repairing", "gpu-000 pool-a in maintenance", "gpu-002 pool-a ready", "3 nodes:")
	if strings.Contains(out, "gpu-003") {
		t.Errorf("--problems shows gpu-003, which has none:\n%s", out)
	}
	out = mustRun(t, "status", "--kubeconfig", admin, "--pool", "pool-b", "-l", "kubernetes.io/os=linux", "-o", "json")
	var f fleet.Fleet
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if len(f.Rows) != 2 || f.Rows[0].Node != "gpu-001" || f.Rows[0].Repair == nil || f.Rows[1].Node != "gpu-003" {
		t.Errorf("-o json --pool pool-b: %+v", f.Rows)
	}

	// explain: the maintenance, its phases and the operator's events.
	var story string
	waitFor(t, "the Ready event in explain gpu-000", func() bool {
		story = mustRun(t, "explain", "gpu-000", "--kubeconfig", admin)
		return strings.Contains(story, "event Ready: ")
	})
	wantLines(t, story, "State: in maintenance", "NodeMaintenance default/fleet-test-gpu-000 phase Ready",
		"NodeMaintenance default/fleet-test-gpu-000 requested by fleet-test.example.com: cordon, drain", "Node gpu-000 created")
	wantLines(t, mustRun(t, "explain", "gpu-001", "--kubeconfig", admin),
		"Repair: Repairing kubelet-down for", "NodeRepair gpu-001-kubelet-down RestartKubelet: Requested")
	if _, err := run(t, "explain", "gpu-999", "--kubeconfig", admin); err == nil || !strings.Contains(err.Error(), `node "gpu-999" not found`) {
		t.Errorf("explain of an unknown node: %v", err)
	}

	t.Run("as kubectl plugin", func(t *testing.T) {
		testKubectlPlugin(t, admin)
	})

	t.Run("RBAC allows only nodes and pods", func(t *testing.T) {
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "fleet-nodes-only"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes", "pods"}, Verbs: []string{"get", "list"}}}}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "fleet-nodes-only"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "fleet-viewer"}},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}}
		for _, o := range []client.Object{role, binding} {
			if err := kube.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		cfg, err := env.ConfigFor("fleet-viewer")
		if err != nil {
			t.Fatal(err)
		}
		viewer := kubeconfigFor(t, cfg)
		var out string
		waitFor(t, "the viewer's role to apply", func() bool {
			out, err = run(t, "status", "--kubeconfig", viewer)
			return err == nil
		})
		wantLines(t, out, "gpu-000 pool-a cordoned 0/8 - - -", "note: nodemaintenances: forbidden to you by RBAC; shown as -",
			"note: gpufaults: forbidden to you by RBAC; shown as -")
	})

	t.Run("GPUFault CRD not installed", func(t *testing.T) {
		crds, err := apiextensionsclient.NewForConfig(env.Config)
		if err != nil {
			t.Fatal(err)
		}
		if err := crds.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, "gpufaults.repair.gpufleet.dev", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var out string
		waitFor(t, "status to note the missing GPUFault CRD", func() bool {
			out = mustRun(t, "status", "--kubeconfig", admin)
			return strings.Contains(out, "note: gpufaults: not installed")
		})
		wantLines(t, out, "gpu-002 pool-a ready 0/8 - - -", "gpu-001 pool-b repairing")
	})
}

// testKubectlPlugin builds the binary, links it as kubectl-gpufleet and
// runs `kubectl gpufleet status` with the kubectl of bin/.
func testKubectlPlugin(t *testing.T, kubeconfig string) {
	root, err := devcluster.SourceRoot()
	if err != nil {
		t.Fatal(err)
	}
	binDir, err := devcluster.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(binDir, "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("%v: build it with make tools", err)
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "gpufleet"), "./cmd/gpufleet")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if err := os.Symlink("gpufleet", filepath.Join(dir, pluginName)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(kubectl, "gpufleet", "status", "--kubeconfig", kubeconfig)
	cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl gpufleet status: %v\n%s", err, out)
	}
	wantLines(t, string(out), "gpu-000 pool-a in maintenance", "4 nodes:")
	cmd = exec.Command(kubectl, "gpufleet", "--help")
	cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "kubectl gpufleet [command]") || regexp.MustCompile(`(?m)^\s+(operator|agent|dev|sim)\s`).MatchString(string(out)) {
		t.Errorf("kubectl gpufleet --help: %v\n%s", err, out)
	}
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(t, args...)
	if err != nil {
		t.Fatalf("gpufleet %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// wantLines checks that each want appears in out, with runs of blanks
// between words taken as one space.
func wantLines(t *testing.T, out string, want ...string) {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	flat := strings.Join(lines, "\n")
	for _, w := range want {
		if !strings.Contains(flat, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
