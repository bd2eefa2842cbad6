// Package takeover switches a running cluster from NVIDIA's GPU Operator
// to gpufleet on the local control plane: the cluster state is made exactly
// as the GPU Operator (v26.7, Helm chart defaults) leaves it converged
// (devcluster.GPUOperatorStack), its pods run on simulated GPU nodes, and
// then gpufleet starts against the same ClusterPolicy. Every assertion is
// by pod UID and by count of writes.
//
//	go test ./test/takeover/ -run TestTakeOverFromTheGPUOperator -v -args -takeover.nodes=100
//
// reports the figures for 100 nodes (default 8).
package takeover_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/liveowner"
	"github.com/gpufleet/gpufleet/internal/operator"
)

const ns = "gpu-operator"

var (
	nodeCount   = flag.Int("takeover.nodes", 8, "simulated GPU nodes")
	cluster     *devcluster.Cluster
	k8s         client.Client
	operatorCfg *rest.Config
)

func TestMain(m *testing.M) {
	flag.Parse()
	var specs []devcluster.NodeSpec
	for i := range *nodeCount {
		specs = append(specs, devcluster.NodeSpec{Name: fmt.Sprintf("gpu-%03d", i), Pool: "a", GPUs: 8,
			Labels: devcluster.GPUOperatorNodeLabels(false)})
	}
	specs = append(specs, devcluster.NodeSpec{Name: "cpu-000", Pool: "cpu"})
	scheme, err := operator.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(devtest.Main(m, specs, ns, scheme, func(env *devcluster.Env) {
		cluster, k8s, operatorCfg = env.Cluster, env.Kube, env.OperatorConfig
	}))
}

// chartDefaultPolicy is the ClusterPolicy the GPU Operator's chart renders
// with its default values.
func chartDefaultPolicy(t *testing.T) *nvidiav1.ClusterPolicy {
	t.Helper()
	data, err := os.ReadFile("../../internal/gpustack/testdata/clusterpolicy-chart-default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := &nvidiav1.ClusterPolicy{}
	if err := yaml.UnmarshalStrict(data, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// previousState is the cluster as the GPU Operator left it.
type previousState struct {
	policy    *nvidiav1.ClusterPolicy
	templates map[string]corev1.PodTemplateSpec // by DaemonSet name, as the API server holds them
	selectors map[string]*metav1.LabelSelector
	pods      map[types.UID]string // stack pods: UID → "component on node"
	gpuNodes  []string
	stack     devcluster.GPUOperatorStack
}

// setUpPreviousStack creates the GPU Operator's converged stack for the
// chart-default ClusterPolicy and waits until its pods run Ready on every
// GPU node.
func setUpPreviousStack(t *testing.T) *previousState {
	t.Helper()
	ctx := t.Context()
	p := chartDefaultPolicy(t)
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), p) })
	// The GPU Operator's status: ready, its namespace, its conditions.
	now := metav1.Now()
	p.Status = nvidiav1.ClusterPolicyStatus{State: nvidiav1.StateReady, Namespace: ns, Conditions: []metav1.Condition{
		{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Reconciled", Message: "ClusterPolicy is ready as all resources have been successfully reconciled", LastTransitionTime: now},
		{Type: "Error", Status: metav1.ConditionFalse, Reason: "Ready", LastTransitionTime: now},
	}}
	if err := k8s.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	var nodes corev1.NodeList
	if err := k8s.List(ctx, &nodes); err != nil {
		t.Fatal(err)
	}
	st := &previousState{policy: p, templates: map[string]corev1.PodTemplateSpec{}, selectors: map[string]*metav1.LabelSelector{}}
	var facts gpustack.Facts
	facts.Namespace = ns
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if !nvidiav1.HasNvidiaGPU(n.Labels) {
			continue
		}
		st.gpuNodes = append(st.gpuNodes, n.Name)
		if os, ok := gpustack.NodeOS(n.Labels); ok && !slices.Contains(facts.OSFlavours, os) {
			facts.OSFlavours = append(facts.OSFlavours, os)
		}
		if rt := gpustack.Runtime(n, ""); !slices.Contains(facts.Runtimes, rt) {
			facts.Runtimes = append(facts.Runtimes, rt)
		}
		patch := client.MergeFrom(n.DeepCopy())
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		for k, v := range devcluster.GPUOperatorNodeAnnotations() {
			n.Annotations[k] = v
		}
		if err := k8s.Patch(ctx, n, patch); err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(st.gpuNodes)
	// The images the policy names: what the GPU Operator runs.
	objs, err := gpustack.Render(p, facts, gpustack.Assets)
	if err != nil {
		t.Fatal(err)
	}
	images := map[string]string{}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			images[ds.Labels[gpustack.LabelComponent]] = ds.Spec.Template.Spec.Containers[0].Image
		}
	}
	stack := devcluster.GPUOperatorStack{Namespace: ns, Images: images, ChartVersion: "v26.7.0",
		Owner: *metav1.NewControllerRef(p, nvidiav1.GroupVersion.WithKind("ClusterPolicy"))}
	st.stack = stack
	for _, o := range stack.Objects() {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
	// Converged: a Ready pod of every component on every GPU node (mig-manager
	// on none: no node is MIG-capable).
	want := len(st.gpuNodes) * (len(devcluster.GPUOperatorDaemonSetNames()) - 1)
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods := stackPods(t)
		ready := 0
		for _, p := range pods {
			if podutils.IsPodReady(&p) {
				ready++
			}
		}
		return ready == want && len(pods) == want, nil
	})
	if err != nil {
		t.Fatalf("the GPU Operator's stack did not converge: %d pods, want %d Ready", len(stackPods(t)), want)
	}
	st.pods = podSet(stackPods(t))
	var dss appsv1.DaemonSetList
	if err := k8s.List(ctx, &dss, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, ds := range dss.Items {
		st.templates[ds.Name] = ds.Spec.Template
		st.selectors[ds.Name] = ds.Spec.Selector
	}
	return st
}

// stackPods lists the pods in the namespace (the stack's: nothing else runs there).
func stackPods(t *testing.T) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := k8s.List(t.Context(), &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return nvidiav1.PodComponent(p.Labels) == "" })
}

func podSet(pods []corev1.Pod) map[types.UID]string {
	out := map[types.UID]string{}
	for _, p := range pods {
		out[p.UID] = nvidiav1.PodComponent(p.Labels) + " on " + p.Spec.NodeName
	}
	return out
}

// restarted lists, by component, the pods of before that are gone.
func restarted(before map[types.UID]string, now []corev1.Pod) map[string]int {
	cur := podSet(now)
	out := map[string]int{}
	for uid, what := range before {
		if _, ok := cur[uid]; !ok {
			out[strings.Split(what, " on ")[0]]++
		}
	}
	return out
}

// holdLease creates the GPU Operator's leader lease, held and renewed
// for an hour (as a running GPU Operator keeps it).
func holdLease(t *testing.T) *coordinationv1.Lease {
	t.Helper()
	l := devcluster.GPUOperatorLease(ns, "gpu-operator-6c8649f9d9-x7k2p_0c1d2e3f", time.Now())
	l.Spec.LeaseDurationSeconds = ptr.To[int32](3600)
	if err := k8s.Create(t.Context(), l); err != nil {
		t.Fatal(err)
	}
	return l
}

func getPolicy(t *testing.T, name string) *nvidiav1.ClusterPolicy {
	t.Helper()
	p := &nvidiav1.ClusterPolicy{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTakeOverFromTheGPUOperator(t *testing.T) {
	devtest.NeedCluster(t)
	waitClean(t)
	ctx := t.Context()
	st := setUpPreviousStack(t)
	lease := holdLease(t)

	cfg, wire := devcluster.CountRequests(operatorCfg)
	start := time.Now()
	stop := devtest.StartOperator(t, cfg, operator.Options{Namespace: ns, Capabilities: []string{"gpustack", "maintenance"},
		GPUStackDegradedAfter: time.Minute})

	// 1. The GPU Operator still runs: gpufleet waits and says so.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		c := meta.FindStatusCondition(getPolicy(t, st.policy.Name).Status.Conditions, gpustack.ConditionPreviousOperator)
		return c != nil && c.Status == metav1.ConditionTrue, nil
	})
	if err != nil {
		t.Fatalf("no %s condition while the GPU Operator's lease is held: %+v", gpustack.ConditionPreviousOperator, getPolicy(t, st.policy.Name).Status)
	}
	waiting := wire.Snapshot()
	time.Sleep(2 * time.Second) // a window in which gpufleet must write nothing
	for k, v := range wire.Since(waiting) {
		if devcluster.IsWrite(k) && !strings.Contains(k, "leases") && !strings.Contains(k, "events") {
			t.Errorf("gpufleet wrote while the GPU Operator runs: %s x%d", k, v)
		}
	}
	p := getPolicy(t, st.policy.Name)
	if p.Status.State != nvidiav1.StateReady || p.Status.Namespace != ns {
		t.Errorf("gpufleet changed the GPU Operator's status while it runs: state %q namespace %q", p.Status.State, p.Status.Namespace)
	}
	checkUntouched(t, st)

	// 2. The GPU Operator stops (controller-runtime releases its lease).
	stopped := time.Now()
	lease.Spec.HolderIdentity = ptr.To("")
	if err := k8s.Update(ctx, lease); err != nil {
		t.Fatal(err)
	}
	before := wire.Snapshot()
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		p := getPolicy(t, st.policy.Name)
		c := meta.FindStatusCondition(p.Status.Conditions, nvidiav1.ConditionReady)
		return p.Status.State == nvidiav1.StateReady && c != nil && c.Reason == "AllComponentsReady", nil
	})
	if err != nil {
		t.Fatalf("the ClusterPolicy did not become Ready under gpufleet: %+v", getPolicy(t, st.policy.Name).Status)
	}
	toReady := time.Since(stopped)
	requests := wire.Since(before)

	// 3. Nothing restarted, nothing doubled, nothing cordoned.
	pods := stackPods(t)
	if r := restarted(st.pods, pods); len(r) != 0 {
		t.Errorf("pods restarted by component: %v", r)
	}
	if len(pods) != len(st.pods) {
		t.Errorf("%d stack pods, want the GPU Operator's %d (a second pod of a component on a node?)", len(pods), len(st.pods))
	}
	perNode := map[string]int{}
	for _, p := range pods {
		perNode[nvidiav1.PodComponent(p.Labels)+" on "+p.Spec.NodeName]++
	}
	for k, n := range perNode {
		if n > 1 {
			t.Errorf("%d pods of %s", n, k)
		}
	}
	var dss appsv1.DaemonSetList
	if err := k8s.List(ctx, &dss, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	adopted, created := 0, 0
	for _, ds := range dss.Items {
		if _, ok := st.templates[ds.Name]; !ok {
			created++
			t.Errorf("gpufleet created DaemonSet %s beside the GPU Operator's", ds.Name)
			continue
		}
		if ds.Annotations[gpustack.AnnotationAdoptedFrom] != "gpu-operator" || ds.Labels[gpustack.LabelManagedBy] != "gpufleet" {
			t.Errorf("DaemonSet %s not adopted: labels %v annotations %v", ds.Name, ds.Labels, ds.Annotations)
		}
		if _, ok := ds.Annotations[gpustack.AnnotationPreviousHash]; ok {
			t.Errorf("DaemonSet %s keeps the GPU Operator's hash annotation: a switch back would not re-render it", ds.Name)
		}
		if !equality.Semantic.DeepEqual(ds.Spec.Template, st.templates[ds.Name]) {
			t.Errorf("DaemonSet %s: pod template changed", ds.Name)
		}
		adopted++
	}
	deleted := len(st.templates) - adopted
	if deleted != 0 {
		t.Errorf("%d DaemonSets of the GPU Operator deleted", deleted)
	}
	checkNoDisruption(t, st)

	// 4. Converged: no writes.
	quiet := wire.Snapshot()
	time.Sleep(3 * time.Second)
	for k, v := range wire.Since(quiet) {
		if devcluster.IsWrite(k) && !strings.Contains(k, "leases") {
			t.Errorf("write once converged: %s x%d", k, v)
		}
	}

	total, writes := 0, 0
	for k, v := range requests {
		total += v
		if devcluster.IsWrite(k) {
			writes += v
		}
	}
	t.Logf("takeover of %d GPU nodes from the GPU Operator: pods restarted by component %v; DaemonSets adopted %d, created %d, deleted %d; "+
		"Ready %.1f s after the GPU Operator stopped (%.1f s after gpufleet started), %d requests (%d writes): %s",
		len(st.gpuNodes), restarted(st.pods, pods), adopted, created, deleted, toReady.Seconds(), time.Since(start).Seconds(), total, writes,
		devcluster.FormatCounts(requests))

	// 5. The way back: gpufleet stops; what the GPU Operator finds is its
	// own DaemonSets (names, selectors, pod templates), without its hash
	// annotation, so it rewrites each from its own template: identical
	// templates, no restart.
	stop()
	if err := k8s.List(ctx, &dss, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, ds := range dss.Items {
		if !equality.Semantic.DeepEqual(ds.Spec.Selector, st.selectors[ds.Name]) || !equality.Semantic.DeepEqual(ds.Spec.Template, st.templates[ds.Name]) {
			t.Errorf("way back: DaemonSet %s no longer has the GPU Operator's selector and template", ds.Name)
		}
	}
	// The GPU Operator back: finding no hash annotation of its own, it
	// replaces each DaemonSet with the one it renders (the fixture's).
	back := 0
	for _, o := range st.stack.Objects() {
		want, ok := o.(*appsv1.DaemonSet)
		if !ok {
			continue
		}
		var have appsv1.DaemonSet
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(want), &have); err != nil {
			t.Fatal(err)
		}
		if have.Annotations[gpustack.AnnotationPreviousHash] == want.Annotations[gpustack.AnnotationPreviousHash] {
			continue // unchanged: the GPU Operator would skip it
		}
		want.ResourceVersion = have.ResourceVersion
		if err := k8s.Update(ctx, want); err != nil {
			t.Fatalf("the GPU Operator's rewrite of %s: %v", want.Name, err)
		}
		back++
	}
	time.Sleep(3 * time.Second) // the DaemonSet controller would roll now if a template changed
	if r := restarted(st.pods, stackPods(t)); len(r) != 0 {
		t.Errorf("way back: pods restarted by component when the GPU Operator rewrote its DaemonSets: %v", r)
	}
	if n := len(stackPods(t)); n != len(st.pods) {
		t.Errorf("way back: %d stack pods, want %d", n, len(st.pods))
	}
	t.Logf("way back: the GPU Operator rewrites %d DaemonSets (no hash annotation of its own); pods restarted by component: %v",
		back, restarted(st.pods, stackPods(t)))
}

// checkUntouched: while the GPU Operator runs, its objects are as it left them.
func checkUntouched(t *testing.T, st *previousState) {
	t.Helper()
	var dss appsv1.DaemonSetList
	if err := k8s.List(t.Context(), &dss, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, ds := range dss.Items {
		if _, ok := st.templates[ds.Name]; !ok || ds.Labels[gpustack.LabelManagedBy] == "gpufleet" || ds.Annotations[gpustack.AnnotationPreviousHash] == "" {
			t.Errorf("DaemonSet %s touched while the GPU Operator runs", ds.Name)
		}
	}
	if r := restarted(st.pods, stackPods(t)); len(r) != 0 {
		t.Errorf("pods restarted while the GPU Operator runs: %v", r)
	}
}

// checkNoDisruption: no node cordoned, no NodeMaintenance asked for.
func checkNoDisruption(t *testing.T, st *previousState) {
	t.Helper()
	for _, name := range st.gpuNodes {
		var n corev1.Node
		if err := k8s.Get(t.Context(), types.NamespacedName{Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		if n.Spec.Unschedulable {
			t.Errorf("node %s cordoned", name)
		}
	}
	var nms maintenancev1.NodeMaintenanceList
	if err := k8s.List(t.Context(), &nms); err != nil {
		t.Fatal(err)
	}
	for _, nm := range nms.Items {
		t.Errorf("NodeMaintenance %s/%s for %s (%s) created by a takeover", nm.Namespace, nm.Name, nm.Spec.NodeName, nm.Spec.RequestorID)
	}
}

// waitClean waits until an earlier test's stack is gone (garbage-collected
// after its ClusterPolicy was deleted) and no lease is left.
func waitClean(t *testing.T) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var dss appsv1.DaemonSetList
		var policies nvidiav1.ClusterPolicyList
		if err := k8s.List(ctx, &dss, client.InNamespace(ns)); err != nil {
			return false, nil //nolint:nilerr // the API server may be busy: keep polling
		}
		if err := k8s.List(ctx, &policies); err != nil {
			return false, nil //nolint:nilerr // as above
		}
		return len(dss.Items) == 0 && len(policies.Items) == 0 && len(stackPods(t)) == 0, nil
	})
	if err != nil {
		t.Fatalf("an earlier test's stack is still there")
	}
	_ = k8s.Delete(t.Context(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: liveowner.GPUOperator.Lease}})
}

// gpufleet installed in its default namespace while the GPU Operator's
// stack runs in its own: deploying would put a second driver on every
// node. gpufleet deploys nothing and says why.
func TestNoSecondStackBesideOneInAnotherNamespace(t *testing.T) {
	devtest.NeedCluster(t)
	waitClean(t)
	ctx := t.Context()
	st := setUpPreviousStack(t)
	const other = "gpufleet-system"
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, other); err != nil {
		t.Fatal(err)
	}
	devtest.StartOperator(t, cluster.Config, operator.Options{Namespace: other, Capabilities: []string{"gpustack"}})
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		c := meta.FindStatusCondition(getPolicy(t, st.policy.Name).Status.Conditions, nvidiav1.ConditionDegraded)
		return c != nil && c.Reason == gpustack.ReasonStackInAnotherNamespace, nil
	})
	if err != nil {
		t.Fatalf("no %s report: %+v", gpustack.ReasonStackInAnotherNamespace, getPolicy(t, st.policy.Name).Status)
	}
	time.Sleep(2 * time.Second)
	var dss appsv1.DaemonSetList
	if err := k8s.List(ctx, &dss, client.InNamespace(other)); err != nil {
		t.Fatal(err)
	}
	for _, ds := range dss.Items {
		t.Errorf("DaemonSet %s/%s created beside the GPU Operator's stack", other, ds.Name)
	}
	if p := getPolicy(t, st.policy.Name); p.Status.Namespace != ns {
		t.Errorf("status.namespace %q: the stack's namespace must stay recorded", p.Status.Namespace)
	}
	if r := restarted(st.pods, stackPods(t)); len(r) != 0 {
		t.Errorf("pods restarted: %v", r)
	}
	checkNoDisruption(t, st)
}
