package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
	"github.com/gpufleet/gpufleet/internal/fleet/ui"
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
	devtest.WaitFor(t, "the maintenance of gpu-000 to be Ready", 30*time.Second, func(ctx context.Context) (bool, string) {
		got := &maintenancev1.NodeMaintenance{}
		if err := kube.Get(ctx, client.ObjectKeyFromObject(nm), got); err != nil {
			return false, err.Error()
		}
		return got.IsReady(), fmt.Sprintf("status %+v", got.Status)
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
	devtest.WaitFor(t, "the Ready event in explain gpu-000", 30*time.Second, func(context.Context) (bool, string) {
		story = mustRun(t, "explain", "gpu-000", "--kubeconfig", admin)
		return strings.Contains(story, "event Ready: "), story
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

	t.Run("NVLink domains", func(t *testing.T) {
		testDomains(t, admin)
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
		devtest.WaitFor(t, "the viewer's role to apply", 30*time.Second, func(context.Context) (bool, string) {
			out, err = run(t, "status", "--kubeconfig", viewer)
			return err == nil, fmt.Sprint(err)
		})
		wantLines(t, out, "gpu-000 pool-a cordoned 0/8 - - -", "note: nodemaintenances: forbidden to you by RBAC; shown as -",
			"note: gpufaults: forbidden to you by RBAC; shown as -",
			"note: maintenanceoperatorconfigs: forbidden to you by RBAC; nodes are not grouped by NVLink domain")
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
		devtest.WaitFor(t, "status to note the missing GPUFault CRD", 30*time.Second, func(context.Context) (bool, string) {
			out = mustRun(t, "status", "--kubeconfig", admin)
			return strings.Contains(out, "note: gpufaults: not installed"), out
		})
		wantLines(t, out, "gpu-002 pool-a ready 0/8 - - -", "gpu-001 pool-b repairing")
	})
}

// testDomains: with spec.domains in the MaintenanceOperatorConfig, status
// groups the nodes by domain (gpu-001 and gpu-002 in rack-1, across both
// pools; gpu-000, in maintenance, in rack-2; gpu-003 in none, last) and
// summarises each domain, with the ComputeDomain whose workload runs on
// gpu-001 (its CRD is not installed: shown by UID); -o json and explain
// carry the domain. The config and the labels are removed at the end.
func testDomains(t *testing.T, kubeconfig string) {
	ctx := t.Context()
	kube := env.Kube
	const uid = "0b6c1f0e-5c3a-4d1e-9a57-2f1d6f6f2a01"
	labels := map[string]map[string]string{
		"gpu-000": {devcluster.LabelGPUClique: "rack-2"},
		"gpu-001": {devcluster.LabelGPUClique: "rack-1", fleet.LabelComputeDomain: uid},
		"gpu-002": {devcluster.LabelGPUClique: "rack-1"},
	}
	for node, add := range labels {
		set, unset := map[string]any{}, map[string]any{}
		for k, v := range add {
			set[k], unset[k] = v, nil
		}
		patchLabels(ctx, t, node, set)
		t.Cleanup(func() { patchLabels(context.Background(), t, node, unset) })
	}
	config := &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: operator.DefaultNamespace, Name: maintenancev1.DefaultConfigName},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{Domains: &maintenancev1.MaintenanceDomains{NodeLabel: devcluster.LabelGPUClique}},
	}
	if err := kube.Create(ctx, config); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := kube.Delete(context.Background(), config); client.IgnoreNotFound(err) != nil {
			t.Error(err)
		}
	})

	out := mustRun(t, "status", "--kubeconfig", kubeconfig)
	wantLines(t, out,
		"NODE POOL DOMAIN STATE GPUS STACK MAINTENANCE REPAIR",
		"gpu-001 pool-b rack-1 repairing 0/8 - - Repairing kubelet-down for",
		"gpu-002 pool-a rack-1 ready 0/8 1 faulty - - -",
		"gpu-000 pool-a rack-2 in maintenance 0/8 - fleet-test.example.com Ready -",
		"gpu-003 pool-b - ready 0/8 - - -",
		"DOMAIN NODES POOLS READY IN MAINTENANCE PENDING DISRUPTED GPUS WORKLOAD",
		"rack-1 2 pool-a,pool-b 1 0 0 no 0/16 ComputeDomain "+uid+" on 1 node(s)",
		"rack-2 1 pool-a 0 1 0 yes 0/8 -",
		"(no domain) 1 pool-b 1 0 0 - 0/8 -",
		"4 nodes: 2 ready for work, 1 in maintenance, 1 repairing, 0 degraded; GPUs 32, 0 in use, 1 faulty",
	)
	var order []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "gpu-") {
			order = append(order, f[0])
		}
	}
	if got := strings.Join(order, ","); got != "gpu-001,gpu-002,gpu-000,gpu-003" {
		t.Errorf("rows in the order %s, want gpu-001,gpu-002,gpu-000,gpu-003 (by domain, none last)\n%s", got, out)
	}

	out = mustRun(t, "status", "--kubeconfig", kubeconfig, "--pool", "pool-b", "-o", "json")
	var f fleet.Fleet
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if f.DomainLabel != devcluster.LabelGPUClique || len(f.Rows) != 2 || f.Rows[0].Domain != "rack-1" || f.Rows[0].ComputeDomain == nil ||
		f.Rows[0].ComputeDomain.UID != uid || f.Rows[1].Domain != "" {
		t.Errorf("-o json --pool pool-b: domain label %q, rows %+v", f.DomainLabel, f.Rows)
	}
	if len(f.Domains) != 2 || f.Domains[0].Name != "rack-1" || f.Domains[0].Nodes != 2 || f.Domains[1].Name != "" {
		t.Errorf("-o json --pool pool-b: domains %+v, want rack-1 (both its nodes) and the nodes in no domain", f.Domains)
	}

	wantLines(t, mustRun(t, "explain", "gpu-001", "--kubeconfig", kubeconfig), "Domain: rack-1", "ComputeDomain: "+uid)
	// Another namespace has no config: no domains.
	if out := mustRun(t, "status", "--kubeconfig", kubeconfig, "-n", "default"); strings.Contains(out, "DOMAIN") {
		t.Errorf("status -n default groups by domain, though no config is there:\n%s", out)
	}

	// The browser view: its snapshot has the domains; without
	// spec.domains an update says so (the page groups by pool again).
	_, events := uiEvents(t, operator.DefaultNamespace)
	var view fleet.Fleet
	if err := json.Unmarshal([]byte(events("snapshot")), &view); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range view.Rows {
		got = append(got, r.Node+"@"+r.Domain)
	}
	if view.DomainLabel != devcluster.LabelGPUClique || len(view.Domains) != 3 || !view.Domains[1].Disrupted ||
		strings.Join(got, ",") != "gpu-001@rack-1,gpu-002@rack-1,gpu-000@rack-2,gpu-003@" {
		t.Errorf("the view's snapshot: domain label %q, domains %+v, rows %v", view.DomainLabel, view.Domains, got)
	}
	if err := kube.Patch(ctx, config, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"domains":null}}`))); err != nil {
		t.Fatal(err)
	}
	// Other updates (the operator at work) may come first.
	for {
		var u struct {
			DomainLabel *string        `json:"domainLabel"`
			Domains     []fleet.Domain `json:"domains"`
			Changed     []fleet.Row    `json:"changed"`
		}
		if err := json.Unmarshal([]byte(events("update")), &u); err != nil {
			t.Fatal(err)
		}
		if u.DomainLabel != nil {
			continue
		}
		changed := map[string]bool{}
		for _, r := range u.Changed {
			changed[r.Node] = r.Domain == "" && r.ComputeDomain == nil
		}
		if u.Domains != nil || !changed["gpu-000"] || !changed["gpu-001"] || !changed["gpu-002"] {
			t.Errorf("the update after spec.domains was removed: domains %+v, rows %+v (want none, and gpu-000…002 without a domain)", u.Domains, u.Changed)
		}
		return
	}
}

// uiEvents serves the browser view of the local cluster (the config read
// in namespace) and returns a function that waits for the next event of
// a kind and returns its data.
func uiEvents(t *testing.T, namespace string) (*ui.Server, func(kind string) string) {
	t.Helper()
	srv, err := ui.New(env.Config, ui.Options{ConfigNamespace: namespace})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler(true))
	t.Cleanup(hs.Close)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/api/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, 16<<20)
	return srv, func(kind string) string {
		t.Helper()
		for lines.Scan() {
			if lines.Text() == "event: "+kind && lines.Scan() {
				return strings.TrimPrefix(lines.Text(), "data: ")
			}
		}
		t.Fatalf("the view's events ended before a %s event: %v", kind, lines.Err())
		return ""
	}
}

// TestFleetViewBuildsTheRowsOfTheNodesAChangeTouches: on the real
// cluster, a cordon and an uncordon each build the row of their node,
// not the fleet's four; a pod bound to a node reaches its row (found
// through the view's index of pods by node); a node created and deleted
// comes and goes.
func TestFleetViewBuildsTheRowsOfTheNodesAChangeTouches(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	srv, events := uiEvents(t, "")
	var view fleet.Fleet
	if err := json.Unmarshal([]byte(events("snapshot")), &view); err != nil {
		t.Fatal(err)
	}
	nodes := len(view.Rows)
	// next waits for the update whose rows satisfy ok.
	next := func(what string, ok func(u *fleet.Fleet, removed []string) bool) {
		t.Helper()
		for {
			var u struct {
				Changed []fleet.Row `json:"changed"`
				Removed []string    `json:"removed"`
			}
			if err := json.Unmarshal([]byte(events("update")), &u); err != nil {
				t.Fatal(err)
			}
			if ok(&fleet.Fleet{Rows: u.Changed}, u.Removed) {
				return
			}
			t.Logf("waiting for %s: an update of %d rows, %d removed", what, len(u.Changed), len(u.Removed))
		}
	}
	rowOf := func(u *fleet.Fleet, node string) *fleet.Row {
		for i := range u.Rows {
			if u.Rows[i].Node == node {
				return &u.Rows[i]
			}
		}
		return nil
	}
	for _, cordon := range []bool{true, false} {
		before := srv.RowsBuilt()
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-003"}}
		if err := env.Kube.Patch(ctx, n, client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"unschedulable":%v}}`, cordon))); err != nil {
			t.Fatal(err)
		}
		next(fmt.Sprintf("gpu-003 unschedulable=%v", cordon), func(u *fleet.Fleet, _ []string) bool {
			r := rowOf(u, "gpu-003")
			return r != nil && r.Unschedulable == cordon
		})
		if built := srv.RowsBuilt() - before; built >= int64(nodes) {
			t.Errorf("unschedulable=%v on one node built %d rows; the whole view is %d", cordon, built, nodes)
		}
		if cordon && srv.RowsBuilt() >= int64(2*nodes) {
			// The informers' initial lists are in the first view: their
			// objects are not built a second time.
			t.Errorf("the first view and one change built %d rows; want the %d of the first view and one", srv.RowsBuilt(), nodes)
		}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "view-gpu-job"},
		Spec: corev1.PodSpec{NodeName: "gpu-002", Containers: []corev1.Container{{Name: "main", Image: "registry.example/job:1",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{fleet.ResourceGPU: resource.MustParse("2")},
				Limits: corev1.ResourceList{fleet.ResourceGPU: resource.MustParse("2")}}}}}}
	if err := env.Kube.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
	next("2 GPUs in use on gpu-002", func(u *fleet.Fleet, _ []string) bool {
		r := rowOf(u, "gpu-002")
		return r != nil && r.GPUs.InUse != nil && *r.GPUs.InUse == 2
	})
	extra := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "view-extra-node", Labels: map[string]string{fleet.DefaultPoolLabel: "pool-a"}}}
	if err := env.Kube.Create(ctx, extra); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), extra) })
	next("the new node's row", func(u *fleet.Fleet, _ []string) bool { return rowOf(u, extra.Name) != nil })
	if err := env.Kube.Delete(ctx, extra); err != nil {
		t.Fatal(err)
	}
	next("the new node removed", func(_ *fleet.Fleet, removed []string) bool { return slices.Contains(removed, extra.Name) })
}

func patchLabels(ctx context.Context, t *testing.T, node string, labels map[string]any) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := env.Kube.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Errorf("labelling %s: %v", node, err)
	}
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
