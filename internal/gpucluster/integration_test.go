package gpucluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpucluster"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/operator"
)

const ns = "gpu-operator"

var (
	k8s         client.Client
	operatorCfg *rest.Config
	gpuNodes    = []string{"gpu-000", "gpu-001", "gpu-002"}
)

func TestMain(m *testing.M) {
	var specs []devcluster.NodeSpec
	for _, n := range gpuNodes {
		specs = append(specs, devcluster.NodeSpec{Name: n, Pool: "a", GPUs: 8})
	}
	specs = append(specs, devcluster.NodeSpec{Name: "cpu-000", Pool: "cpu"})
	scheme, err := operator.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(devtest.Main(m, specs, ns, scheme, func(env *devcluster.Env) {
		k8s, operatorCfg = env.Kube, env.OperatorConfig
	}))
}

func startOperator(t *testing.T) {
	t.Helper()
	devtest.StartOperator(t, operatorCfg, operator.Options{Namespace: ns, Capabilities: []string{"gpustack", "maintenance"}})
}

// strictCreate creates the YAML document as kubectl does: untyped, with
// strict field validation (an unknown field is an error).
func strictCreate(t *testing.T, doc []byte, opts ...client.CreateOption) (*unstructured.Unstructured, error) {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(doc, &u.Object); err != nil {
		t.Fatalf("test YAML: %v", err)
	}
	return u, k8s.Create(t.Context(), u, append(opts, client.FieldValidation(metav1.FieldValidationStrict))...)
}

// NVIDIA's chart's GPUCluster (its defaults, and the options its users
// commonly set) is accepted under kubectl's strict field validation; the
// singleton name is enforced by the schema, and an unknown field refused.
func TestGPUClusterSchema(t *testing.T) {
	devtest.NeedCluster(t)
	for _, f := range []string{"testdata/gpucluster-chart-default.yaml", "testdata/gpucluster-common-options.yaml"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := strictCreate(t, data, client.DryRunAll); err != nil {
			t.Errorf("%s: refused: %v", f, err)
		}
	}
	data, _ := os.ReadFile("testdata/gpucluster-chart-default.yaml")
	renamed := strings.Replace(string(data), "name: gpu-cluster", "name: my-cluster", 1)
	if _, err := strictCreate(t, []byte(renamed), client.DryRunAll); err == nil || !strings.Contains(err.Error(), "singleton") {
		t.Errorf("a GPUCluster not named gpu-cluster: %v, want the singleton rule's message", err)
	}
	unknown := strings.Replace(string(data), "    computeDomains:\n", "    computeDomain:\n", 1)
	if _, err := strictCreate(t, []byte(unknown), client.DryRunAll); err == nil || !strings.Contains(err.Error(), "computeDomain") {
		t.Errorf("an unknown field: %v, want it refused", err)
	}
	// The API server's defaults: computeDomains on, the kubelet's root.
	u, err := strictCreate(t, []byte(strings.Replace(string(data), "    computeDomains:\n      enabled: true\n", "    computeDomains: {}\n", 1)), client.DryRunAll)
	if err != nil {
		t.Fatal(err)
	}
	if v, _, _ := unstructured.NestedBool(u.Object, "spec", "draDriver", "computeDomains", "enabled"); !v {
		t.Errorf("computeDomains.enabled not defaulted to true: %v", u.Object["spec"])
	}
}

func createGPUCluster(t *testing.T) *nvidiav1alpha1.GPUCluster {
	t.Helper()
	data, err := os.ReadFile("testdata/gpucluster-chart-default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	gc := &nvidiav1alpha1.GPUCluster{}
	if err := yaml.Unmarshal(data, gc); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(t.Context(), gc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, gc) })
	return gc
}

// deleteAndWait deletes obj and waits until it is gone and no DaemonSet is
// left in the namespace (the garbage collector removes what it owned), so
// that tests do not see each other's objects.
func deleteAndWait(t *testing.T, obj client.Object) {
	ctx := context.Background()
	_ = k8s.Delete(ctx, obj)
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		var list appsv1.DaemonSetList
		if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, nil //nolint:nilerr // retried until the timeout
		}
		err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
		return apierrors.IsNotFound(err) && len(list.Items) == 0, nil
	})
	if err != nil {
		t.Logf("cleanup of %s: %v", obj.GetName(), err)
	}
}

// dump logs the namespace's workloads, pods and events (a failed wait).
func dump(t *testing.T) {
	ctx := context.Background()
	var dss appsv1.DaemonSetList
	_ = k8s.List(ctx, &dss, client.InNamespace(ns))
	for _, d := range dss.Items {
		t.Logf("DaemonSet %s: %+v", d.Name, d.Status)
	}
	var pods corev1.PodList
	_ = k8s.List(ctx, &pods, client.InNamespace(ns))
	for _, p := range pods.Items {
		t.Logf("pod %s on %q: %s %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions)
	}
	var events corev1.EventList
	_ = k8s.List(ctx, &events, client.InNamespace(ns))
	for _, e := range events.Items {
		t.Logf("event %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
	}
	if gc, err := getGPUCluster(ctx); err == nil {
		t.Logf("GPUCluster status: %+v", gc.Status)
	}
}

func getGPUCluster(ctx context.Context) (*nvidiav1alpha1.GPUCluster, error) {
	gc := &nvidiav1alpha1.GPUCluster{}
	return gc, k8s.Get(ctx, client.ObjectKey{Name: nvidiav1alpha1.GPUClusterName}, gc)
}

func waitState(t *testing.T, state nvidiav1alpha1.GPUClusterState, reason string) *nvidiav1alpha1.GPUCluster {
	t.Helper()
	var gc *nvidiav1alpha1.GPUCluster
	devtest.WaitFor(t, "GPUCluster "+string(state)+"/"+reason, 90*time.Second, func(ctx context.Context) (bool, string) {
		var err error
		if gc, err = getGPUCluster(ctx); err != nil {
			return false, err.Error()
		}
		r := meta.FindStatusCondition(gc.Status.Conditions, gpucluster.ConditionReady)
		return gc.Status.State == state && r != nil && r.Reason == reason, fmt.Sprintf("state %q, conditions %+v", gc.Status.State, gc.Status.Conditions)
	}, func() { dump(t) })
	return gc
}

func setAdminAccess(t *testing.T, on bool) {
	t.Helper()
	n := &corev1.Namespace{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: ns}, n); err != nil {
		t.Fatal(err)
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	if on {
		n.Labels[gpucluster.LabelAdminAccess] = "true"
	} else {
		delete(n.Labels, gpucluster.LabelAdminAccess)
	}
	if err := k8s.Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
}

// podsOf maps node → pod UID of a DaemonSet's running pods.
func podsOf(ctx context.Context, app string) map[string]string {
	var pods corev1.PodList
	_ = k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": app})
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName != "" {
			out[p.Spec.NodeName] = string(p.UID)
		}
	}
	return out
}

// resourceVersions of the GPUCluster and the stack's objects.
func resourceVersions(ctx context.Context, t *testing.T) map[string]string {
	out := map[string]string{}
	add := func(list client.ObjectList, opts ...client.ListOption) {
		if err := k8s.List(ctx, list, opts...); err != nil {
			t.Fatal(err)
		}
		items, _ := meta.ExtractList(list)
		for _, o := range items {
			obj := o.(client.Object)
			out[fmt.Sprintf("%T/%s", o, obj.GetName())] = obj.GetResourceVersion()
		}
	}
	managed := client.MatchingLabels{gpustack.LabelManagedBy: "gpufleet"}
	add(&nvidiav1alpha1.GPUClusterList{})
	add(&appsv1.DaemonSetList{}, client.InNamespace(ns))
	add(&appsv1.DeploymentList{}, client.InNamespace(ns))
	add(&resourcev1.DeviceClassList{}, managed)
	add(&rbacv1.ClusterRoleList{}, managed)
	add(&rbacv1.ClusterRoleBindingList{}, managed)
	add(&rbacv1.RoleList{}, client.InNamespace(ns), managed)
	add(&rbacv1.RoleBindingList{}, client.InNamespace(ns), managed)
	add(&corev1.ServiceList{}, client.InNamespace(ns), managed)
	add(&corev1.ServiceAccountList{}, client.InNamespace(ns), managed)
	add(&resourcev1.ResourceClaimTemplateList{}, client.InNamespace(ns), managed)
	return out
}

// touchNode changes a label of a GPU node that means nothing to the stack:
// a pass of the GPUCluster controller, which must write nothing.
func touchNode(t *testing.T, value string) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{"test.gpufleet.dev/touch":%q}}}`, value)
	if err := k8s.Patch(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: gpuNodes[0]}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = k8s.Patch(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: gpuNodes[0]}},
			client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"test.gpufleet.dev/touch":null}}}`)))
	})
}

// A GPUCluster deploys the DRA stack on the GPU nodes only (the kubelet
// plugin, the compute-domain controller, the DeviceClasses, dcgm-exporter
// with its admin-access claim), reports Ready, and writes nothing more
// once converged. Without the admin-access label on the namespace it says
// so; with it, the exporter's pods run.
func TestGPUClusterDeploysTheDRAStack(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	setAdminAccess(t, false)
	startOperator(t)
	createGPUCluster(t)

	gc := waitState(t, nvidiav1alpha1.GPUClusterNotReady, gpucluster.ReasonOperandNotReady)
	devtest.WaitFor(t, "the missing admin-access label reported", 30*time.Second, func(ctx context.Context) (bool, string) {
		gc, _ = getGPUCluster(ctx)
		d := meta.FindStatusCondition(gc.Status.Conditions, gpucluster.ConditionDegraded)
		return d != nil && d.Reason == gpucluster.ReasonAdminAccessNotAllowed, fmt.Sprintf("%+v", gc.Status.Conditions)
	}, func() { dump(t) })
	if u := meta.FindStatusCondition(gc.Status.Conditions, gpucluster.ConditionUnsupported); u == nil || !strings.Contains(u.Message, "dcgmExporter.serviceMonitor") {
		t.Errorf("the chart's serviceMonitor is accepted and not acted on: want it reported, got %+v", u)
	}
	setAdminAccess(t, true)
	t.Cleanup(func() { setAdminAccess(t, false) })
	gc = waitState(t, nvidiav1alpha1.GPUClusterReady, gpucluster.ReasonReconciled)
	if gc.Status.Namespace != ns {
		t.Errorf("status.namespace %q", gc.Status.Namespace)
	}
	for _, app := range []string{gpucluster.KubeletPlugin, gpucluster.DCGMExporter} {
		pods := podsOf(ctx, app)
		if got := slices.Sorted(maps.Keys(pods)); !slices.Equal(got, gpuNodes) {
			t.Errorf("%s runs on %v, want the GPU nodes %v", app, got, gpuNodes)
		}
	}
	for _, name := range []string{"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com", "compute-domain-daemon.nvidia.com", "compute-domain-default-channel.nvidia.com"} {
		if err := k8s.Get(ctx, client.ObjectKey{Name: name}, &resourcev1.DeviceClass{}); err != nil {
			t.Errorf("DeviceClass %s: %v", name, err)
		}
	}
	var cpu corev1.Node
	if err := k8s.Get(ctx, client.ObjectKey{Name: "cpu-000"}, &cpu); err != nil || cpu.Labels[gpucluster.DeployDRADriver] != "" {
		t.Errorf("the CPU node got the DRA driver's deploy label: %v %v", cpu.Labels, err)
	}

	// Converged: nothing more is written, not even by a pass (a node's
	// label changed).
	before := resourceVersions(ctx, t)
	touchNode(t, "converged")
	time.Sleep(3 * time.Second)
	after := resourceVersions(ctx, t)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s written after convergence (%s → %s)", k, v, after[k])
		}
	}
}

// NVIDIA's GPU Operator refuses a ClusterPolicy and a GPUCluster together.
// gpufleet keeps the older running and holds the newer: a GPUCluster
// created beside a ClusterPolicy deploys nothing and says why; once the
// ClusterPolicy is deleted, it deploys.
func TestGPUClusterWaitsWhileAnOlderClusterPolicyExists(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	setAdminAccess(t, true)
	t.Cleanup(func() { setAdminAccess(t, false) })
	startOperator(t)
	p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cluster-policy"}}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, p) })
	time.Sleep(1100 * time.Millisecond) // creation times have a second's resolution
	createGPUCluster(t)
	gc := waitState(t, nvidiav1alpha1.GPUClusterNotReady, gpucluster.ReasonClusterPolicyPresent)
	if r := meta.FindStatusCondition(gc.Status.Conditions, gpucluster.ConditionReady); !strings.Contains(r.Message, "ClusterPolicy cluster-policy") {
		t.Errorf("message: %s", r.Message)
	}
	time.Sleep(time.Second)
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: gpucluster.KubeletPlugin}, &appsv1.DaemonSet{}); err == nil {
		t.Errorf("the DRA driver was deployed beside the ClusterPolicy's device plugin")
	}
	deleteAndWait(t, p)
	// The DRA stack needs the host's driver (a GPUCluster installs none):
	// the kubelet plugin's driver-validation waits for it. The ClusterPolicy
	// left its driver deploy label; the host's driver is marked as an
	// administrator does, with the label set to false.
	setNodeLabel(t, "nvidia.com/gpu.deploy.driver", "false")
	t.Cleanup(func() { setNodeLabel(t, "nvidia.com/gpu.deploy.driver", "") })
	waitState(t, nvidiav1alpha1.GPUClusterReady, gpucluster.ReasonReconciled)
}

// setNodeLabel sets (or, with "", removes) a label on every GPU node.
func setNodeLabel(t *testing.T, key, value string) {
	t.Helper()
	v := any(value)
	if value == "" {
		v = nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: v}}})
	for _, n := range gpuNodes {
		if err := k8s.Patch(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatal(err)
		}
	}
}

// The GPU Operator's DRA stack, as it leaves it (its DaemonSet names and
// selectors, its labels and hash annotation, pods running): gpufleet takes
// the kubelet plugin over without restarting a pod (same images), and
// creates no second DaemonSet.
func TestGPUClusterTakesOverTheGPUOperatorsKubeletPlugin(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	setAdminAccess(t, true)
	t.Cleanup(func() { setAdminAccess(t, false) })
	setNodeLabel(t, gpucluster.DeployDRADriver, "true") // as the GPU Operator's node labelling leaves them
	theirs := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: gpucluster.KubeletPlugin, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/name": "nvidia-dra-driver", "app.kubernetes.io/component": gpucluster.KubeletPlugin,
				"app": gpucluster.KubeletPlugin, "app.kubernetes.io/managed-by": "gpu-operator"},
			Annotations: map[string]string{gpustack.AnnotationPreviousHash: "5c8d7f9b"}},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": gpucluster.KubeletPlugin}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": gpucluster.KubeletPlugin, "app.kubernetes.io/name": "nvidia-dra-driver"}},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{gpucluster.DeployDRADriver: "true"},
					Containers: []corev1.Container{
						{Name: "gpus", Image: "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0", Command: []string{"gpu-kubelet-plugin"}},
						{Name: "compute-domains", Image: "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0", Command: []string{"compute-domain-kubelet-plugin"}},
					},
				}},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType},
		},
	}
	if err := k8s.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), theirs) })
	var pods map[string]string
	devtest.WaitFor(t, "the GPU Operator's kubelet plugin pods", 60*time.Second, func(ctx context.Context) (bool, string) {
		pods = podsOf(ctx, gpucluster.KubeletPlugin)
		return len(pods) == len(gpuNodes), fmt.Sprint(pods)
	}, func() { dump(t) })

	// The GPU Operator still runs (its leader lease held): gpufleet says
	// so and writes nothing else.
	lease := devcluster.GPUOperatorLease(ns, "gpu-operator-6c8649f9d9-x7k2p_0c1d2e3f", time.Now())
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](3600)
	if err := k8s.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), lease) })
	cfg, wire := devcluster.CountRequests(operatorCfg)
	devtest.StartOperator(t, cfg, operator.Options{Namespace: ns, Capabilities: []string{"gpustack", "maintenance"}})
	createGPUCluster(t)
	devtest.WaitFor(t, "PreviousOperatorRunning while the GPU Operator's lease is held", 60*time.Second, func(ctx context.Context) (bool, string) {
		gc, err := getGPUCluster(ctx)
		if err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(gc.Status.Conditions, gpustack.ConditionPreviousOperator)
		return c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, lease.Name), fmt.Sprint(gc.Status.Conditions)
	}, func() { dump(t) })
	waiting := wire.Snapshot()
	time.Sleep(2 * time.Second) // a window in which gpufleet must write nothing
	for k, v := range wire.Since(waiting) {
		if devcluster.IsWrite(k) && !strings.Contains(k, "leases") && !strings.Contains(k, "events") {
			t.Errorf("gpufleet wrote while the GPU Operator runs: %s x%d", k, v)
		}
	}
	held := &appsv1.DaemonSet{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(theirs), held); err != nil {
		t.Fatal(err)
	}
	if held.Labels[gpustack.LabelManagedBy] == "gpufleet" || held.Annotations[gpustack.AnnotationPreviousHash] == "" {
		t.Errorf("gpufleet touched the GPU Operator's DaemonSet while it runs: labels %v annotations %v", held.Labels, held.Annotations)
	}

	// The GPU Operator stops (controller-runtime releases its lease).
	released := time.Now()
	lease.Spec.HolderIdentity = ptr.To("")
	if err := k8s.Update(ctx, lease); err != nil {
		t.Fatal(err)
	}
	before := wire.Snapshot()
	gc := waitState(t, nvidiav1alpha1.GPUClusterReady, gpucluster.ReasonReconciled)
	took, sent := time.Since(released), wire.Since(before)
	writes := 0
	for k, v := range sent {
		if devcluster.IsWrite(k) {
			writes += v
		}
	}
	t.Logf("taken over: Ready %.1f s after the lease was released, %d requests (%d writes): %v", took.Seconds(), total(sent), writes, sent)
	if c := meta.FindStatusCondition(gc.Status.Conditions, gpustack.ConditionPreviousOperator); c != nil {
		t.Errorf("PreviousOperatorRunning kept after the release: %+v", c)
	}
	ds := &appsv1.DaemonSet{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(theirs), ds); err != nil {
		t.Fatal(err)
	}
	if ds.UID != theirs.UID || ds.Labels[gpustack.LabelManagedBy] != "gpufleet" || ds.Annotations[gpustack.AnnotationAdoptedFrom] == "" ||
		ds.Annotations[gpustack.AnnotationPreviousHash] != "" || ds.Annotations[gpustack.AnnotationAcceptedTemplate] == "" {
		t.Errorf("not adopted as expected: uid %s→%s labels %v annotations %v", theirs.UID, ds.UID, ds.Labels, ds.Annotations)
	}
	if after := podsOf(ctx, gpucluster.KubeletPlugin); !maps.Equal(pods, after) {
		t.Errorf("kubelet plugin pods restarted on adoption: before %v after %v", pods, after)
	}
	var list appsv1.DaemonSetList
	if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, d := range list.Items {
		if d.Name != gpucluster.KubeletPlugin && d.Spec.Template.Spec.NodeSelector[gpucluster.DeployDRADriver] != "" {
			t.Errorf("a second DaemonSet of the kubelet plugin: %s", d.Name)
		}
	}
}

// A write the API server refuses (a ClusterRoleBinding's roleRef is
// immutable) is reported, and the rest of the stack is deployed.
func TestGPUClusterARefusedObjectDoesNotStopTheStack(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	setAdminAccess(t, true)
	t.Cleanup(func() { setAdminAccess(t, false) })
	bad := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia-dra-driver-controller", Labels: map[string]string{gpustack.LabelManagedBy: "gpufleet"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "nvidia-dra-driver-controller", Namespace: ns}},
	}
	if err := k8s.Create(ctx, bad); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), bad) })
	startOperator(t)
	createGPUCluster(t)
	var gc *nvidiav1alpha1.GPUCluster
	devtest.WaitFor(t, "the refusal reported", 60*time.Second, func(ctx context.Context) (bool, string) {
		gc, _ = getGPUCluster(ctx)
		d := meta.FindStatusCondition(gc.Status.Conditions, gpucluster.ConditionDegraded)
		return d != nil && d.Reason == gpucluster.ReasonObjectRefused && strings.Contains(d.Message, "ClusterRoleBinding nvidia-dra-driver-controller"), fmt.Sprintf("%+v", gc.Status.Conditions)
	}, func() { dump(t) })
	devtest.WaitFor(t, "the rest of the stack", 60*time.Second, func(ctx context.Context) (bool, string) {
		return len(podsOf(ctx, gpucluster.KubeletPlugin)) == len(gpuNodes) && len(podsOf(ctx, gpucluster.DCGMExporter)) == len(gpuNodes), "pods not running"
	}, func() { dump(t) })
	if gc.Status.State != nvidiav1alpha1.GPUClusterNotReady {
		t.Errorf("state %s with a refused object", gc.Status.State)
	}
}

// The other way round: a ClusterPolicy created after a GPUCluster is held
// (nothing of it deployed, the reason in its status) and the GPUCluster
// keeps running; once the GPUCluster is deleted, the ClusterPolicy deploys.
func TestClusterPolicyWaitsWhileAnOlderGPUClusterExists(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	setAdminAccess(t, true)
	t.Cleanup(func() { setAdminAccess(t, false) })
	// Run last (registered before the operator starts): the ClusterPolicy
	// labelled the GPU nodes for its driver, which no longer runs; the
	// next test starts from unlabelled nodes.
	t.Cleanup(func() { removeDeployLabels(t) })
	startOperator(t)
	gc := createGPUCluster(t)
	waitState(t, nvidiav1alpha1.GPUClusterReady, gpucluster.ReasonReconciled)
	time.Sleep(1100 * time.Millisecond) // creation times have a second's resolution
	p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cluster-policy"}}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, p) })
	policyHeld := func(ctx context.Context) (bool, string) {
		got := &nvidiav1.ClusterPolicy{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
			return false, err.Error()
		}
		r := meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionReady)
		return got.Status.State == nvidiav1.StateIgnored && r != nil && r.Reason == gpustack.ReasonGPUClusterPresent &&
			strings.Contains(r.Message, "GPUCluster gpu-cluster"), fmt.Sprintf("%s %+v", got.Status.State, got.Status.Conditions)
	}
	devtest.WaitFor(t, "the ClusterPolicy held", 30*time.Second, policyHeld, func() { dump(t) })
	time.Sleep(time.Second)
	var list appsv1.DaemonSetList
	if err := k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{gpustack.LabelPartOf: "gpufleet-gpu-stack"}); err != nil || len(list.Items) != 0 {
		t.Errorf("the ClusterPolicy deployed beside the GPUCluster: %d DaemonSets (%v)", len(list.Items), err)
	}
	if got, _ := getGPUCluster(ctx); got.Status.State != nvidiav1alpha1.GPUClusterReady {
		t.Errorf("the GPUCluster stopped being ready: %+v", got.Status)
	}
	deleteAndWait(t, gc)
	devtest.WaitFor(t, "the ClusterPolicy deploys once the GPUCluster is gone", 60*time.Second, func(ctx context.Context) (bool, string) {
		var list appsv1.DaemonSetList
		_ = k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{gpustack.LabelPartOf: "gpufleet-gpu-stack"})
		return len(list.Items) > 0, "no DaemonSet of the ClusterPolicy"
	}, func() { dump(t) })
}

// removeDeployLabels removes every nvidia.com/gpu.deploy.* label of the
// GPU nodes.
func removeDeployLabels(t *testing.T) {
	t.Helper()
	for _, name := range gpuNodes {
		n := &corev1.Node{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
			t.Fatal(err)
		}
		labels := map[string]any{}
		for k := range n.Labels {
			if strings.HasPrefix(k, "nvidia.com/gpu.deploy.") {
				labels[k] = nil
			}
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
		if err := k8s.Patch(context.Background(), n, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatal(err)
		}
	}
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Under NVIDIA's own GPUCluster schema (its Helm chart puts it back), the
// API server prunes the status fields gpufleet adds (components,
// observedGeneration). The status computed then always differs from the
// one read back; gpufleet still writes it once per change, not at every
// pass.
func TestGPUClusterUnderAnOlderSchemaWritesNoStatusAgain(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	setAdminAccess(t, true)
	t.Cleanup(func() { setAdminAccess(t, false) })
	const crdName = "gpuclusters.nvidia.com"
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: crdName}, crd); err != nil {
		t.Fatal(err)
	}
	ours := crd.Spec.DeepCopy()
	for i := range crd.Spec.Versions {
		if s := crd.Spec.Versions[i].Schema; s != nil && s.OpenAPIV3Schema != nil {
			st := s.OpenAPIV3Schema.Properties["status"]
			delete(st.Properties, "components")
			delete(st.Properties, "observedGeneration")
			s.OpenAPIV3Schema.Properties["status"] = st
		}
	}
	if err := k8s.Update(ctx, crd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c := &apiextensionsv1.CustomResourceDefinition{}
			if err := k8s.Get(context.Background(), client.ObjectKey{Name: crdName}, c); err != nil {
				return err
			}
			c.Spec = *ours
			return k8s.Update(context.Background(), c)
		})
		if err != nil {
			t.Errorf("putting gpufleet's GPUCluster schema back: %v", err)
		}
	})
	cfg, wire := devcluster.CountRequests(operatorCfg)
	devtest.StartOperator(t, cfg, operator.Options{Namespace: ns, Capabilities: []string{"gpustack", "maintenance"}})
	createGPUCluster(t)
	gc := waitState(t, nvidiav1alpha1.GPUClusterReady, gpucluster.ReasonReconciled)
	if len(gc.Status.Components) != 0 {
		t.Fatalf("the older schema did not prune status.components: %+v", gc.Status.Components)
	}
	writes := func(sent map[string]int) map[string]int {
		out := map[string]int{}
		for k, n := range sent {
			if devcluster.IsWrite(k) && !strings.Contains(k, "events") {
				out[k] = n
			}
		}
		return out
	}
	// Ready is not settled: on a loaded machine the stack's pods may still
	// be starting, and their progress is a real change. Wait for 2 quiet
	// seconds first (bounded).
	before := wire.Snapshot()
	for settle := time.Now().Add(time.Minute); ; before = wire.Snapshot() {
		time.Sleep(2 * time.Second)
		w := writes(wire.Since(before))
		if len(w) == 0 {
			break
		}
		if time.Now().After(settle) {
			t.Fatalf("still writing a minute after Ready: %v", w)
		}
	}
	for i := range 3 { // passes: a node's labels change
		touchNode(t, fmt.Sprint(i))
		time.Sleep(700 * time.Millisecond)
	}
	time.Sleep(time.Second)
	sent := wire.Since(before)
	for k, n := range writes(sent) {
		t.Errorf("%s x%d in 3 passes with nothing to change (under the older schema)", k, n)
	}
	t.Logf("requests in 3 passes under the older schema: %v", sent)
}
