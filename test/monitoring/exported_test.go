package monitoring

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/operator"
	"github.com/gpufleet/gpufleet/internal/repair"
)

const ns = "gpufleet-system"

var env *devcluster.Env

func TestMain(m *testing.M) {
	specs := []devcluster.NodeSpec{
		{Name: "a-0", Pool: "a", GPUs: 8}, {Name: "a-1", Pool: "a", GPUs: 8}, {Name: "a-2", Pool: "a", GPUs: 8},
		{Name: "b-0", Pool: "b", GPUs: 8}, {Name: "cpu-0", Pool: "cpu"},
	}
	scheme, err := operator.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(devtest.Main(m, specs, ns, scheme, func(e *devcluster.Env) { env = e }))
}

// exportedNames gathers controller-runtime's registry (the operator's
// /metrics) and returns every series name it exposes: a histogram's
// _bucket, _sum and _count, a summary's _sum and _count.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	fams, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering the operator's metrics: %v", err)
	}
	out := map[string]bool{}
	for _, f := range fams {
		if len(f.GetMetric()) == 0 {
			continue
		}
		name := f.GetName()
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			out[name], out[name+"_sum"], out[name+"_count"] = true, true, true
		default:
			out[name] = true
		}
	}
	return out
}

// TestEveryQueriedMetricIsExported runs the operator (every capability,
// with the simulated node agent) through a blocked drain, a waiting
// maintenance, a failed and a successful repair, a GPU fault, a GPU stack
// and GPU pods (device plugin and DRA), then checks that every gpufleet
// metric the dashboards and rules query has series in its registry.
func TestEveryQueriedMetricIsExported(t *testing.T) {
	devtest.NeedCluster(t)
	want := map[string][]string{}
	for name, where := range queriedMetrics(t) {
		if strings.HasPrefix(name, "gpufleet_") {
			want[name] = where
		}
	}
	ctx := t.Context()
	kube := env.Kube
	create := func(o client.Object) {
		t.Helper()
		if err := kube.Create(ctx, o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
	began := time.Now()
	devtest.StartOperator(t, env.OperatorConfig, operator.Options{Namespace: ns, GPUStackDegradedAfter: time.Second},
		func(mgr manager.Manager) error {
			return devcluster.AddInProcessAgent(mgr, devcluster.SimExecutor{Cluster: env.Cluster, RebootDowntime: time.Second}, nil)
		})

	// A GPU pod on a-0 that a PDB keeps from eviction, and a DRA pod on a-2.
	train := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train", Labels: map[string]string{"app": "train"}},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{corev1.LabelHostname: "a-0"}, Containers: []corev1.Container{{
			Name: "main", Image: "registry.example/cuda:12",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{devcluster.ResourceGPU: resource.MustParse("2")}},
		}}},
	}
	create(train)
	create(&policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}}},
	})
	if _, err := env.CreateGPUClaimPod(ctx, "default", "dra-0", "a-2"); err != nil {
		t.Fatal(err)
	}
	phases := map[string]corev1.PodPhase{}
	devtest.WaitFor(t, "the GPU pods running", 60*time.Second, func(ctx context.Context) (bool, string) {
		for _, name := range []string{"train", "dra-0"} {
			var p corev1.Pod
			if kube.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &p) != nil || p.Status.Phase != corev1.PodRunning {
				phases[name] = p.Status.Phase
				return false, fmt.Sprint(phases)
			}
			phases[name] = p.Status.Phase
		}
		return true, fmt.Sprint(phases)
	})

	// Maintenance: a-0's drain is blocked by the PDB past its 1 s
	// timeout; a-1 waits for the one slot (maxParallelOperations 1).
	upgrade := func(node string) {
		create(&maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "upgrade-" + node},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: "monitoring.example.com", NodeName: node,
				DrainSpec: &maintenancev1.DrainSpec{Force: true, TimeoutSeconds: ptr.To[int32](1)}},
		})
	}
	var a0, a1 maintenancev1.NodeMaintenance
	upgrade("a-0")
	devtest.WaitFor(t, "upgrade-a-0 in progress", 30*time.Second, func(ctx context.Context) (bool, string) {
		if err := kube.Get(ctx, client.ObjectKey{Namespace: "default", Name: "upgrade-a-0"}, &a0); err != nil {
			return false, err.Error()
		}
		return a0.InProgress(), fmt.Sprintf("upgrade-a-0 status %+v", a0.Status)
	})
	upgrade("a-1")
	devtest.WaitFor(t, "upgrade-a-0 DrainBlocked and upgrade-a-1 Pending with a reason", 60*time.Second, func(ctx context.Context) (bool, string) {
		if err := kube.Get(ctx, client.ObjectKey{Namespace: "default", Name: "upgrade-a-0"}, &a0); err != nil {
			return false, err.Error()
		}
		if err := kube.Get(ctx, client.ObjectKey{Namespace: "default", Name: "upgrade-a-1"}, &a1); err != nil {
			return false, err.Error()
		}
		c := findCondition(a1.Status.Conditions, maintenancev1.ConditionTypeReady)
		return a0.DrainTimedOut() && a1.Phase() == maintenancev1.PhasePending && c != nil && c.Message != "",
			fmt.Sprintf("upgrade-a-0 status %+v; upgrade-a-1 status %+v", a0.Status, a1.Status)
	})

	// Repair: b-0's fault needs a reboot the policy does not allow
	// (RecoveryFailed, pool b suspended); a-2's NTP restart succeeds; an
	// application XID on a GPU of a-2 is recorded.
	rules := []repairv1.Rule{
		{Name: "readonly-filesystem", ConditionType: "ReadonlyFilesystem", Status: "True", ThresholdSeconds: 1, Actions: []repairv1.Action{repairv1.ActionReboot}},
		{Name: "ntp-problem", ConditionType: "NTPProblem", Status: "True", ThresholdSeconds: 1, Actions: []repairv1.Action{repairv1.ActionRestartNTP}},
	}
	for _, r := range repair.DefaultRules() {
		if strings.HasPrefix(r.Name, "gpu-") {
			r.ThresholdSeconds = 1
			rules = append(rules, r)
		}
	}
	create(&repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"},
		Spec: repairv1.NodeRepairPolicySpec{Rules: rules, VerificationSeconds: ptr.To[int32](1)}})
	if err := env.SetNodeCondition(ctx, "b-0", corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Reason: "Injected"}); err != nil {
		t.Fatal(err)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, devcluster.AnnotationFixedBy, repairv1.ActionRestartNTP)
	if err := kube.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a-2"}}, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
		t.Fatal(err)
	}
	if err := env.SetNodeCondition(ctx, "a-2", corev1.NodeCondition{Type: "NTPProblem", Status: corev1.ConditionTrue, Reason: "Injected"}); err != nil {
		t.Fatal(err)
	}
	if err := env.InjectXID(ctx, "a-2", 3, 13); err != nil {
		t.Fatal(err)
	}

	// The GPU stack.
	policyYAML, err := os.ReadFile("../../examples/clusterpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cp := &nvidiav1.ClusterPolicy{}
	if err := yaml.Unmarshal(policyYAML, cp); err != nil {
		t.Fatal(err)
	}
	create(cp)

	var repairs repairv1.NodeRepairList
	var faults repairv1.GPUFaultList
	var got nvidiav1.ClusterPolicy
	devtest.WaitFor(t, "b-0 RecoveryFailed, a-2's NTP repair Succeeded, a GPUFault on a-2, the ClusterPolicy's status", 90*time.Second, func(ctx context.Context) (bool, string) {
		if err := kube.List(ctx, &repairs); err != nil {
			return false, err.Error()
		}
		if err := kube.List(ctx, &faults); err != nil {
			return false, err.Error()
		}
		if err := kube.Get(ctx, client.ObjectKeyFromObject(cp), &got); err != nil {
			return false, err.Error()
		}
		done := map[string]repairv1.Phase{}
		var s []string
		for _, r := range repairs.Items {
			done[r.Spec.NodeName+"/"+r.Spec.Fault.Rule] = r.Status.Phase
			s = append(s, fmt.Sprintf("%s/%s: %s %s", r.Spec.NodeName, r.Spec.Fault.Rule, r.Status.Phase, r.Status.Message))
		}
		return done["b-0/readonly-filesystem"] == repairv1.PhaseRecoveryFailed && done["a-2/ntp-problem"] == repairv1.PhaseSucceeded &&
				len(faults.Items) > 0 && got.Status.State != "",
			fmt.Sprintf("repairs %v; %d GPUFaults; ClusterPolicy state %q", s, len(faults.Items), got.Status.State)
	})
	t.Logf("scenario done after %s", time.Since(began).Round(time.Second))

	// The cached state reaches the scrape-time collectors within moments.
	var missing []string
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		exported := exportedNames(t)
		missing = missing[:0]
		for name := range want {
			if !exported[name] {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0, nil
	})
	sort.Strings(missing)
	for _, name := range missing {
		t.Errorf("%s is queried (%s) but the operator exports no series of it", name, strings.Join(want[name], "; "))
	}
	t.Logf("%d gpufleet metrics queried by the dashboards and rules, all exported: %t (checked after %s)",
		len(want), len(missing) == 0, time.Since(began).Round(time.Second))
}

func findCondition(cs []metav1.Condition, typ string) *metav1.Condition {
	i := slices.IndexFunc(cs, func(c metav1.Condition) bool { return c.Type == typ })
	if i < 0 {
		return nil
	}
	return &cs[i]
}
