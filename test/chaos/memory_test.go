package chaos

import (
	"context"
	"flag"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// BenchmarkOperatorMemory measures the operator process's memory with
// 1,000 nodes and 20,000 pods in the cluster (every capability on, caches
// synced), after 30 idle seconds. Target: under 150 MB RSS.
var heapProfile = flag.String("chaos.heap-profile", "", "write the operator's heap profile here (BenchmarkOperatorMemory)")

func BenchmarkOperatorMemory(b *testing.B) {
	ctx := context.Background()
	const nodes, pods = 1000, 20000
	scheme, _ := operator.Scheme()
	// Longer leases: 1,000 simulated kubelets renewing every 2 s would
	// saturate two cores.
	env, err := devcluster.NewEnv(ctx, devcluster.Options{NodeLeaseDuration: 40 * time.Second, NodeMonitorGracePeriod: 60 * time.Second,
		StartTimeout: 3 * time.Minute}, devcluster.GPUNodes(nodes, 10), ns, scheme)
	if err != nil {
		b.Fatal(err)
	}
	defer env.Stop()
	labels := map[string]string{"app": "fleet"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "fleet"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](pods),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{"example.com/owner": "team-a"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "main", Image: "registry.example/fleet:1", Args: []string{"--serve", "--port=8080"},
					Env: []corev1.EnvVar{{Name: "MODE", Value: "training"}, {Name: "SHARD", Value: "0"}},
				}}},
			},
		},
	}
	if _, err := env.Client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 20*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := env.Client.AppsV1().Deployments("default").Get(ctx, "fleet", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == pods, nil
	})
	if err != nil {
		b.Fatalf("%d pods never ready: %v", pods, err)
	}
	b.Logf("%d nodes, %d pods running after %s", nodes, pods, time.Since(began).Round(time.Second))
	kubeconfig, err := env.OperatorKubeconfig(ctx)
	if err != nil {
		b.Fatal(err)
	}
	addr, err := freeAddr()
	if err != nil {
		b.Fatal(err)
	}
	op := &operatorProcess{bin: buildOperatorB(b), kubeconfig: kubeconfig, dir: b.TempDir(), metricsAddr: addr}
	op.startB(b, "maintenance,gpustack,repair")
	defer op.kill()
	time.Sleep(30 * time.Second)
	rss, hwm := memoryOf(op.pid())
	cpu := cpuSecondsOf(op.pid())
	fams, err := scrape(addr)
	if err != nil {
		b.Fatal(err)
	}
	heap := gauge(fams, "go_memstats_heap_inuse_bytes") / (1 << 20)
	b.ReportMetric(float64(rss)/1024, "MB-rss")
	b.ReportMetric(float64(hwm)/1024, "MB-peak-rss")
	b.ReportMetric(heap, "MB-heap-inuse")
	b.ReportMetric(cpu, "cpu-s")
	b.Logf("operator with %d nodes and %d pods cached: RSS %d MB, peak %d MB, Go heap in use %.0f MB, %.1f CPU seconds in its first 30 s",
		nodes, pods, rss/1024, hwm/1024, heap, cpu)
	if *heapProfile != "" {
		if err := saveHeapProfile(addr, *heapProfile); err != nil {
			b.Fatal(err)
		}
		b.Logf("heap profile: %s", *heapProfile)
	}
}

func buildOperatorB(b *testing.B) string {
	root, err := devcluster.SourceRoot()
	if err != nil {
		b.Fatal(err)
	}
	bin := b.TempDir() + "/gpufleet"
	if out, err := runIn(root, "go", "build", "-o", bin, "./cmd/gpufleet"); err != nil {
		b.Fatalf("building gpufleet: %v\n%s", err, out)
	}
	return bin
}
