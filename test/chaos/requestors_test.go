package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/yaml"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// TestHumansUpgradesAndRepairsShareTheLimits runs the three kinds of
// disruption at once — a human requestor's NodeMaintenance objects, a
// driver upgrade of every GPU node and reboot repairs of two faulty nodes —
// while the operator process is SIGKILLed, under the same independent
// checker: together they never exceed the cluster's limits, no pod is
// evicted outside a drain of its node, and everything finishes with every
// node schedulable again.
func TestHumansUpgradesAndRepairsShareTheLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local cluster (run without -short)")
	}
	ctrl.SetLogger(logr.Discard()) // the in-process agents
	ctx := context.Background()
	s := *seed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	rng := rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
	const nodes, humans = 12, 6
	faulty := []string{"gpu-009", "gpu-010"} // one per pool
	t.Logf("seed %d: %d GPU nodes, %d human requests, a driver upgrade of every node, reboot repairs of %v, %d kills",
		s, nodes, humans, faulty, *kills)

	bin := buildOperator(t)
	env, kubeconfig := startEnv(t, devcluster.Options{}, nodes, 2)
	workload(t, env.Cluster, nodes)
	gpuWorkload(t, env, nodes)
	setLimits(t, env.Kube)
	op := &operatorProcess{bin: bin, kubeconfig: kubeconfig, dir: t.TempDir()}
	op.startWith(t, "maintenance,gpustack,repair")
	t.Cleanup(op.kill)

	// The GPU stack first (examples/clusterpolicy.yaml), then the disruptions.
	policy := exampleClusterPolicy(t)
	if err := env.Kube.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	devtest.WaitFor(t, "the GPU stack ready", 3*time.Minute, func(ctx context.Context) (bool, string) {
		p := &nvidiav1.ClusterPolicy{}
		if err := env.Kube.Get(ctx, types.NamespacedName{Name: policy.Name}, p); err != nil {
			return false, err.Error()
		}
		return p.Status.State == nvidiav1.StateReady, fmt.Sprintf("ClusterPolicy state %q", p.Status.State)
	})
	// The node agents of the faulty nodes, simulated in this process.
	for _, n := range faulty {
		d, err := agent.New(env.Config, agent.Options{NodeName: n, Executor: devcluster.SimExecutor{Cluster: env.Cluster, RebootDowntime: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		agentCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- d.Start(agentCtx) }()
		t.Cleanup(func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("agent of %s: %v", n, err)
			}
		})
	}

	chk := newChecker(env.Cluster, env.Kube, "", maxParallel, maxUnavail)
	checkCtx, stopChecker := context.WithCancel(ctx)
	go chk.run(checkCtx)
	defer stopChecker()

	began := time.Now()
	for i := range humans {
		nm := &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: workloadNamespace, Name: fmt.Sprintf("human-%03d", i)},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: requestor, NodeName: fmt.Sprintf("gpu-%03d", i),
				DrainSpec: &maintenancev1.DrainSpec{TimeoutSeconds: ptr.To[int32](0)}},
		}
		if err := env.Kube.Create(ctx, nm); err != nil {
			t.Fatal(err)
		}
	}
	const newDriver = "550.54.15"
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := &nvidiav1.ClusterPolicy{}
		if err := env.Kube.Get(ctx, types.NamespacedName{Name: policy.Name}, p); err != nil {
			return err
		}
		p.Spec.Driver.Version = newDriver
		p.Spec.Driver.UpgradePolicy = &nvidiav1.DriverUpgradePolicySpec{MaxParallelUpgrades: ptr.To[int32](2)}
		return env.Kube.Update(ctx, p)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Kube.Create(ctx, &repairv1.NodeRepairPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-faults"},
		Spec: repairv1.NodeRepairPolicySpec{AllowReboot: true, VerificationSeconds: ptr.To[int32](1), MaxParallelPools: ptr.To[int32](2),
			Rules: []repairv1.Rule{{Name: "gpu-fault", ConditionType: "GPUFault", Status: "True", ThresholdSeconds: 1,
				Actions: []repairv1.Action{repairv1.ActionReboot}}}},
	}); err != nil {
		t.Fatal(err)
	}
	for _, n := range faulty {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, devcluster.AnnotationFixedBy, repairv1.ActionReboot)
		if _, err := env.Client.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := env.SetNodeCondition(ctx, n, corev1.NodeCondition{Type: "GPUFault", Status: corev1.ConditionTrue, Reason: "XID79"}); err != nil {
			t.Fatal(err)
		}
	}

	killed := 0
	nextKill := time.Now().Add(gap(rng))
	var missing string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, bound, true, func(ctx context.Context) (bool, error) {
		if killed < *kills && time.Now().After(nextKill) {
			op.kill()
			killed++
			time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
			op.startWith(t, "maintenance,gpustack,repair")
			nextKill = time.Now().Add(gap(rng))
		}
		// The human requestor deletes its objects once Ready; upgrades and
		// repairs release their own.
		var list maintenancev1.NodeMaintenanceList
		if err := env.Kube.List(ctx, &list); err != nil {
			return false, nil //nolint:nilerr // retried
		}
		for i := range list.Items {
			nm := &list.Items[i]
			key := nm.Namespace + "/" + nm.Name
			if nm.Namespace == workloadNamespace && nm.DeletionTimestamp == nil && chk.sawReady(key) {
				_ = env.Kube.Delete(ctx, nm)
			}
		}
		missing = everythingDone(ctx, env, list.Items, faulty, newDriver)
		return missing == "" && killed >= *kills, nil
	})
	elapsed := time.Since(began)
	stopChecker()
	if err != nil {
		t.Fatalf("not done within %s after %d kills: %s", bound, killed, missing)
	}
	op.kill()
	chk.final(ctx, t, humans)
	requestors := map[string]int{}
	chk.mu.Lock()
	for key := range chk.readySeen {
		ns, _, _ := strings.Cut(key, "/")
		requestors[ns]++
	}
	chk.mu.Unlock()
	t.Logf("humans, a driver upgrade of %d nodes and %d reboot repairs done in %s; survived %d SIGKILLs; objects Ready by namespace %v; "+
		"invariants checked on %d events; max in progress %d (limit %d), max held or cordoned %d (limit %d); %d unconfirmed blips",
		nodes, len(faulty), elapsed.Round(100*time.Millisecond), killed, requestors, chk.events, chk.maxInProgress, maxParallel,
		chk.maxUnavailable, maxUnavail, chk.transients)
	for _, v := range chk.violations() {
		t.Error(v)
	}
}

// everythingDone says what is still missing ("" when done): no
// NodeMaintenance left, every driver pod of the new version and Ready, both
// repairs Succeeded.
func everythingDone(ctx context.Context, env *devcluster.Env, nms []maintenancev1.NodeMaintenance, faulty []string, driver string) string {
	if len(nms) > 0 {
		return fmt.Sprintf("%d NodeMaintenance objects left (first %s/%s)", len(nms), nms[0].Namespace, nms[0].Name)
	}
	pods, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: gpustack.LabelComponent + "=" + gpustack.Driver})
	if err != nil {
		return err.Error()
	}
	current := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && strings.Contains(p.Spec.Containers[0].Image, ":"+driver+"-") && podutils.IsPodReady(&p) {
			current++
		}
	}
	nodes, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	if current != len(nodes.Items) {
		return fmt.Sprintf("%d/%d nodes run driver %s", current, len(nodes.Items), driver)
	}
	var repairs repairv1.NodeRepairList
	if err := env.Kube.List(ctx, &repairs); err != nil {
		return err.Error()
	}
	succeeded := map[string]bool{}
	for _, r := range repairs.Items {
		if r.Status.Phase == repairv1.PhaseSucceeded {
			succeeded[r.Spec.NodeName] = true
		}
	}
	for _, n := range faulty {
		if !succeeded[n] {
			return "no succeeded repair of " + n
		}
	}
	return ""
}

// gpuWorkload runs pods that use a GPU: the driver upgrade drains them.
func gpuWorkload(t *testing.T, env *devcluster.Env, replicas int) {
	t.Helper()
	labels := map[string]string{"app": "gpu-train"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: workloadNamespace, Name: "gpu-train"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{devcluster.AnnotationTerminateAfter: "1s"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.example/gpu-train:1",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
			},
		},
	}
	if _, err := env.Client.AppsV1().Deployments(workloadNamespace).Create(t.Context(), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	devtest.WaitFor(t, "the GPU workload ready", 2*time.Minute, func(ctx context.Context) (bool, string) {
		d, err := env.Client.AppsV1().Deployments(workloadNamespace).Get(ctx, "gpu-train", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return d.Status.ReadyReplicas == int32(replicas), fmt.Sprintf("%d of %d replicas ready", d.Status.ReadyReplicas, replicas)
	})
}

// exampleClusterPolicy reads examples/clusterpolicy.yaml, a ClusterPolicy in
// NVIDIA GPU Operator 1.6's documented format.
func exampleClusterPolicy(t *testing.T) *nvidiav1.ClusterPolicy {
	t.Helper()
	root, err := devcluster.SourceRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "examples", "clusterpolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p := &nvidiav1.ClusterPolicy{}
	if err := yaml.Unmarshal(data, p); err != nil {
		t.Fatal(err)
	}
	return p
}
