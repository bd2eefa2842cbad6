package gpustack_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/maintenance/requestor"
)

// The NVIDIADriver of the gpu-operator chart and a per-pool one apply under
// kubectl's strict validation; the schema's own rules hold.
func TestNVIDIADriverStrictFieldValidation(t *testing.T) {
	devtest.NeedCluster(t)
	for _, f := range []string{"testdata/nvidiadriver-chart-default.yaml", "testdata/nvidiadriver-pool.yaml", "../../examples/nvidiadriver.yaml"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			if err := strictDryRunCreate(t, []byte(doc)); err != nil {
				t.Errorf("%s rejected under strict field validation: %v", f, err)
			}
		}
	}
	bad := map[string]string{
		"a default driver with a nodeSelector": "spec:\n  default: true\n  nodeSelector: {a: b}\n",
		"an unknown driverType":                "spec:\n  driverType: cuda\n",
		"an unknown field":                     "spec:\n  frobnicate: true\n",
		"a bad maxUnavailable":                 "spec:\n  upgradePolicy:\n    maxUnavailable: lots\n",
	}
	for name, spec := range bad {
		doc := "apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata:\n  name: x\n" + spec
		if err := strictDryRunCreate(t, []byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// driverType is immutable.
	d := &nvidiav1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "immutable"}, Spec: nvidiav1alpha1.NVIDIADriverSpec{DriverType: "gpu", Image: "driver"}}
	if err := k8s.Create(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), d) })
	d.Spec.DriverType = nvidiav1alpha1.DriverTypeVGPU
	if err := k8s.Update(t.Context(), d); err == nil || !strings.Contains(err.Error(), "immutable") {
		t.Errorf("changing driverType: got %v, want it refused as immutable", err)
	}
}

// One driver per pool: pool b gets its NVIDIADriver, the rest the default
// one, a node two drivers select gets neither (and both say so); each
// driver upgrades under its own upgradePolicy, every node through a
// NodeMaintenance.
func TestReconcileNVIDIADriversPerPool(t *testing.T) {
	d := newDirect(t)
	nodes := listNodes(t)
	waitGarbageCollector(t, nodes.cpu[0])
	ctx := t.Context()
	newDriver := func(name string, def bool, sel map[string]string, version string) {
		nd := &nvidiav1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: nvidiav1alpha1.NVIDIADriverSpec{
			Default: def, NodeSelector: sel, DriverType: nvidiav1alpha1.DriverTypeGPU, Repository: "nvcr.io/nvidia", Image: "driver", Version: version,
			UpgradePolicy: &nvidiav1.DriverUpgradePolicySpec{MaxParallelUpgrades: ptr.To[int32](1)}}}
		if err := k8s.Create(ctx, nd); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), nd) })
	}
	newDriver("default", true, nil, "550.1")
	newDriver("pool-b", false, map[string]string{devcluster.LabelPool: "b"}, "560.1")
	newDriver("dup", false, map[string]string{"kubernetes.io/hostname": "gpu-006"}, "570.1")
	p := createPolicy(t, "cluster-policy", func(p *nvidiav1.ClusterPolicy) { p.Spec.Driver.UseNvidiaDriverCRD = ptr.To(true) })

	if first := d.reconcile(p.Name); first.err != nil {
		t.Fatalf("first reconcile: %s", first)
	}
	want := map[string]string{} // node -> driver label
	for _, n := range nodes.gpu {
		switch {
		case n == "gpu-006":
			want[n] = ""
		case nodes.items[n].Labels[devcluster.LabelPool] == "b":
			want[n] = "pool-b"
		default:
			want[n] = "default"
		}
	}
	for n, w := range want {
		if got := getNode(t, n).Labels[gpustack.LabelNVIDIADriver]; got != w {
			t.Errorf("node %s: %s=%q, want %q", n, gpustack.LabelNVIDIADriver, got, w)
		}
	}
	// Driver pods: the driver's own version on its nodes, none on gpu-006.
	healthy := nodes
	healthy.gpu = slices.DeleteFunc(slices.Clone(nodes.gpu), func(n string) bool { return n == "gpu-006" })
	pods := waitDriverPods(t, healthy, true)
	if _, ok := driverPods(t)["gpu-006"]; ok {
		t.Errorf("gpu-006, selected by two drivers, got a driver pod")
	}
	versions := map[string]string{"default": ":550.1-", "pool-b": ":560.1-"}
	for n, pod := range pods {
		if !strings.Contains(pod.Spec.Containers[0].Image, versions[want[n]]) {
			t.Errorf("driver pod on %s runs %s, want driver %s's version", n, pod.Spec.Containers[0].Image, want[n])
		}
	}

	// Status of each driver, written once, nothing on a second pass.
	sr := &gpustack.DriverStatusReconciler{Client: d.client, Namespace: ns, Clock: d.clock, Recorder: events.NewFakeRecorder(10)}
	for _, name := range []string{"default", "pool-b", "dup"} {
		if _, err := sr.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: name}}); err != nil {
			t.Fatalf("status of %s: %v", name, err)
		}
	}
	var got nvidiav1alpha1.NVIDIADriver
	if err := k8s.Get(ctx, client.ObjectKey{Name: "pool-b"}, &got); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, nvidiav1alpha1.ConditionConflict); c == nil || !strings.Contains(c.Message, "gpu-006") {
		t.Errorf("pool-b: want a Conflict condition naming gpu-006, got %+v", got.Status.Conditions)
	}
	if got.Status.Nodes != int32(len(slices.DeleteFunc(slices.Collect(maps.Values(want)), func(s string) bool { return s != "pool-b" }))) {
		t.Errorf("pool-b: status.nodes %d, want its nodes without gpu-006 (%v)", got.Status.Nodes, want)
	}
	mark := d.log.len()
	if _, err := sr.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: "pool-b"}}); err != nil {
		t.Fatal(err)
	}
	if w := d.log.since(mark); len(w) != 0 {
		t.Errorf("an unchanged driver's status was written again: %v", w)
	}

	// New versions of both drivers: each requests its own maxParallelUpgrades=1.
	for _, name := range []string{"default", "pool-b"} {
		var nd nvidiav1alpha1.NVIDIADriver
		if err := k8s.Get(ctx, client.ObjectKey{Name: name}, &nd); err != nil {
			t.Fatal(err)
		}
		nd.Spec.Version = "580.1"
		if err := k8s.Update(ctx, &nd); err != nil {
			t.Fatal(err)
		}
	}
	if up := d.reconcile(p.Name); up.err != nil {
		t.Fatalf("reconcile of the new versions: %s", up)
	}
	mine, err := requestor.Mine(ctx, k8s, ns, gpustack.UpgradeRequestor)
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for n := range mine {
		held = append(held, want[n]+"/"+n)
	}
	sort.Strings(held)
	if len(held) != 2 || !strings.HasPrefix(held[0], "default/") || !strings.HasPrefix(held[1], "pool-b/") {
		t.Errorf("upgrades requested for %v, want one node of each driver", held)
	}
}

// The ignore path: a policy that keeps its own driver section leaves every
// NVIDIADriver disabled — no node label, no driver DaemonSet of it — and
// says so in the driver's status.
func TestNVIDIADriverDisabledWithoutTheCRDSwitch(t *testing.T) {
	d := newDirect(t)
	nodes := listNodes(t)
	ctx := t.Context()
	nd := &nvidiav1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "unused"},
		Spec: nvidiav1alpha1.NVIDIADriverSpec{Default: true, DriverType: nvidiav1alpha1.DriverTypeGPU, Image: "nvcr.io/nvidia/driver", Version: "580.1"}}
	if err := k8s.Create(ctx, nd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), nd) })
	p := createPolicy(t, "cluster-policy", nil)
	if first := d.reconcile(p.Name); first.err != nil {
		t.Fatalf("first reconcile: %s", first)
	}
	for _, n := range nodes.gpu {
		if v, ok := getNode(t, n).Labels[gpustack.LabelNVIDIADriver]; ok {
			t.Errorf("node %s labelled %s=%s without useNvidiaDriverCRD", n, gpustack.LabelNVIDIADriver, v)
		}
	}
	sr := &gpustack.DriverStatusReconciler{Client: d.client, Namespace: ns, Clock: d.clock, Recorder: events.NewFakeRecorder(10)}
	if _, err := sr.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: nd.Name}}); err != nil {
		t.Fatal(err)
	}
	var got nvidiav1alpha1.NVIDIADriver
	if err := k8s.Get(ctx, client.ObjectKey{Name: nd.Name}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.State != "disabled" || got.Status.Nodes != 0 {
		t.Errorf("state %q, nodes %d; want disabled, 0", got.Status.State, got.Status.Nodes)
	}
	for node, pod := range driverPods(t) {
		if pod.Labels[gpustack.LabelNVIDIADriver] != "" {
			t.Errorf("driver pod on %s belongs to NVIDIADriver %s", node, pod.Labels[gpustack.LabelNVIDIADriver])
		}
	}
}

// NVIDIADrivers through the operator as it runs (its generated RBAC, its
// caches, the ClusterPolicy and NVIDIADriver controllers together): a
// default driver and one for pool b; each node runs its pool's driver,
// at that driver's version, and each NVIDIADriver's status counts its
// nodes and becomes ready when they all run it Ready.
func TestNVIDIADriversThroughTheOperator(t *testing.T) {
	devtest.NeedCluster(t)
	quietClients.Do(func() { ctrl.SetLogger(logr.Discard()) })
	cleanSlate(t)
	nodes := listNodes(t)
	startOperator(t, operatorCfg)
	ctx := t.Context()
	versions := map[string]string{"default": "550.1", "pool-b": "560.1"}
	for name, sel := range map[string]map[string]string{"default": nil, "pool-b": {devcluster.LabelPool: "b"}} {
		nd := &nvidiav1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: nvidiav1alpha1.NVIDIADriverSpec{
			Default: sel == nil, NodeSelector: sel, DriverType: nvidiav1alpha1.DriverTypeGPU,
			Repository: "nvcr.io/nvidia", Image: "driver", Version: versions[name]}}
		if err := k8s.Create(ctx, nd); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), nd) })
	}
	createPolicy(t, "cluster-policy", func(p *nvidiav1.ClusterPolicy) { p.Spec.Driver.UseNvidiaDriverCRD = ptr.To(true) })

	want := map[string]string{} // node → its driver
	type counts struct{ nodes, ready int32 }
	wantStatus := map[string]counts{}
	for _, n := range nodes.gpu {
		d := "default"
		if nodes.items[n].Labels[devcluster.LabelPool] == "b" {
			d = "pool-b"
		}
		want[n] = d
		c := wantStatus[d]
		c.nodes++
		if slices.Contains(nodes.healthy, n) {
			c.ready++
		}
		wantStatus[d] = c
	}
	if wantStatus["default"].nodes == 0 || wantStatus["pool-b"].nodes == 0 {
		t.Fatalf("the test needs nodes of both drivers: %v", want)
	}

	// Each node's driver pod is its driver's, at its version; Ready on
	// the healthy nodes.
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		pods := driverPods(t)
		for n, d := range want {
			pod, ok := pods[n]
			switch {
			case !ok:
				last = "no driver pod on " + n
			case pod.Labels[gpustack.LabelNVIDIADriver] != d:
				last = fmt.Sprintf("driver pod on %s belongs to %q, want %s", n, pod.Labels[gpustack.LabelNVIDIADriver], d)
			case !strings.Contains(pod.Spec.Containers[0].Image, "nvcr.io/nvidia/driver:"+versions[d]+"-"):
				last = fmt.Sprintf("driver pod on %s runs %s, want %s's version %s", n, pod.Spec.Containers[0].Image, d, versions[d])
			case slices.Contains(nodes.healthy, n) && !podutils.IsPodReady(&pod):
				last = "driver pod on " + n + " not Ready"
			default:
				continue
			}
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("driver pods: %s", last)
	}
	for n, d := range want {
		if got := getNode(t, n).Labels[gpustack.LabelNVIDIADriver]; got != d {
			t.Errorf("node %s: %s=%q, want %q", n, gpustack.LabelNVIDIADriver, got, d)
		}
	}

	// Each NVIDIADriver's status, written by the operator.
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		for name, c := range wantStatus {
			var nd nvidiav1alpha1.NVIDIADriver
			if err := k8s.Get(ctx, client.ObjectKey{Name: name}, &nd); err != nil {
				return false, err
			}
			wantState := nvidiav1alpha1.StateReady
			if c.ready < c.nodes {
				wantState = nvidiav1alpha1.StateNotReady
			}
			st := nd.Status
			if st.Nodes != c.nodes || st.NodesReady != c.ready || st.State != wantState || st.Namespace != ns {
				last = fmt.Sprintf("%s: state %q, nodes %d, ready %d, namespace %q; want %s, %d, %d, %s", name, st.State, st.Nodes, st.NodesReady, st.Namespace, wantState, c.nodes, c.ready, ns)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("NVIDIADriver status: %s", last)
	}
}
