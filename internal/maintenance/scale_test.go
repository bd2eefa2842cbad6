package maintenance_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// BenchmarkRollout100 is the scale scenario of the maintenance issue: 100
// simulated nodes with 10 pods each, one NodeMaintenance (with drain) per
// node, maxParallelOperations 10. A simulated requestor deletes each object
// once it is Ready. It reports the time until every object was Ready once
// and the operator's API requests by verb and resource, then checks that an
// idle operator writes nothing.
func BenchmarkRollout100(b *testing.B) {
	if cluster == nil {
		b.Skip("needs the local cluster")
	}
	ctx := context.Background()
	const n, podsPerNode = 100, 10
	var specs []devcluster.NodeSpec
	var names []string
	for i := range n {
		s := devcluster.NodeSpec{Name: fmt.Sprintf("scale-%03d", i), Pool: "scale", GPUs: 8,
			Taints: []corev1.Taint{{Key: "scale", Value: "true", Effect: corev1.TaintEffectNoSchedule}}}
		specs = append(specs, s)
		names = append(names, s.Name)
	}
	if err := cluster.AddNodes(ctx, specs...); err != nil {
		b.Fatal(err)
	}
	// 10 pods per node: a Deployment tolerating the scale taint, spread by anti-affinity-free packing
	// (the scheduler spreads replicas across nodes).
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, "scale"); err != nil {
		b.Fatal(err)
	}
	labels := map[string]string{"app": "fleet"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "scale", Name: "fleet"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](n * podsPerNode),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{devcluster.LabelPool: "scale"},
					Tolerations:  []corev1.Toleration{{Key: "scale", Operator: corev1.TolerationOpExists}},
					Containers:   []corev1.Container{{Name: "main", Image: "registry.example/fleet:1"}},
				},
			},
		},
	}
	if _, err := cluster.Client.AppsV1().Deployments("scale").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := cluster.Client.AppsV1().Deployments("scale").Get(ctx, "fleet", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == n*podsPerNode, nil
	})
	if err != nil {
		b.Fatalf("fleet never ready: %v", err)
	}

	countedCfg, counter := devcluster.CountRequests(operatorCfg)
	mgr, err := operator.New(countedCfg, operator.Options{
		Namespace: operatorNS, MetricsAddr: "0", ProbeAddr: "0", Controller: config.Controller{SkipNameValidation: ptr.To(true)}, Capabilities: []string{"maintenance"},
	})
	if err != nil {
		b.Fatal(err)
	}
	opCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(opCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("operator: %v", err)
		}
	}()

	cfg := &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: "default"},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: ios(10)},
	}
	if err := k8s.Create(ctx, cfg); err != nil {
		b.Fatal(err)
	}
	time.Sleep(2 * time.Second) // informers synced
	start := counter.Snapshot()
	began := time.Now()
	for _, node := range names {
		nm := newNM("scale-"+node, node, "scale.requestor")
		nm.Spec.DrainSpec = &maintenancev1.DrainSpec{}
		if err := k8s.Create(ctx, nm); err != nil {
			b.Fatal(err)
		}
	}
	// The requestor side: delete each object once Ready.
	readyOnce := map[string]bool{}
	maxInProgress := 0
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 15*time.Minute, true, func(ctx context.Context) (bool, error) {
		var list maintenancev1.NodeMaintenanceList
		if err := k8s.List(ctx, &list, client.InNamespace("default")); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		inProgress := 0
		for i := range list.Items {
			nm := &list.Items[i]
			if !strings.HasPrefix(nm.Name, "scale-") {
				continue
			}
			if nm.InProgress() {
				inProgress++
			}
			if nm.Phase() == maintenancev1.PhaseReady && nm.DeletionTimestamp == nil {
				readyOnce[nm.Name] = true
				_ = k8s.Delete(ctx, nm)
			}
		}
		maxInProgress = max(maxInProgress, inProgress)
		return len(readyOnce) == n, nil
	})
	elapsed := time.Since(began)
	if err != nil {
		b.Fatalf("only %d/%d objects became Ready: %v", len(readyOnce), n, err)
	}
	// Wait until all are gone, then measure an idle minute's worth (10 s).
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var list maintenancev1.NodeMaintenanceList
		err := k8s.List(ctx, &list, client.InNamespace("default"))
		return err == nil && len(list.Items) == 0, nil
	})
	rollout := counter.Since(start)
	idleStart := counter.Snapshot()
	time.Sleep(10 * time.Second)
	idle := counter.Since(idleStart)

	writes, total := 0, 0
	for k, v := range rollout {
		total += v
		if devcluster.IsWrite(k) {
			writes += v
		}
	}
	b.ReportMetric(elapsed.Seconds(), "s/rollout")
	b.ReportMetric(float64(total), "requests/rollout")
	b.ReportMetric(float64(writes), "writes/rollout")
	b.ReportMetric(float64(maxInProgress), "max-in-progress")
	b.Logf("100 nodes x %d pods, 100 NodeMaintenance with drain, maxParallelOperations=10: all Ready once after %s; max in progress seen %d",
		podsPerNode, elapsed.Round(100*time.Millisecond), maxInProgress)
	b.Logf("operator API requests during the rollout (%d total, %d writes):\n%s", total, writes, devcluster.FormatCounts(rollout))
	b.Logf("operator API requests in 10 idle seconds afterwards:\n%s", devcluster.FormatCounts(idle))
	if maxInProgress > 10 {
		b.Errorf("observed %d objects in progress with maxParallelOperations=10", maxInProgress)
	}
	for k := range idle {
		if devcluster.IsWrite(k) || strings.HasPrefix(k, "LIST") {
			b.Errorf("idle operator issued %s", k)
		}
	}
	_ = cluster.Client.AppsV1().Deployments("scale").Delete(ctx, "fleet", metav1.DeleteOptions{})
}
