package chaos

import (
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// BenchmarkOperatorMemory measures the operator process's memory with
// 1,000 nodes and 20,000 pods in the cluster (every capability on, caches
// synced), after 30 idle seconds. Target: under 150 MB RSS.
var memoryEnv = flag.String("chaos.memory-env", ",GOGC=100",
	"comma-separated runtime settings, one operator run each (empty: the operator's own, GOGC=50; GOGC=100: Go's default)")

var heapProfile = flag.String("chaos.heap-profile", "", "write the operator's heap profile here (BenchmarkOperatorMemory)")

func BenchmarkOperatorMemory(b *testing.B) {
	ctx := context.Background()
	const nodes, pods = 1000, 20000
	env, kubeconfig := startEnv(b, largeCluster, nodes, 10)
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
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 20*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := env.Client.AppsV1().Deployments("default").Get(ctx, "fleet", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == pods, nil
	})
	if err != nil {
		b.Fatalf("%d pods never ready: %v", pods, err)
	}
	b.Logf("%d nodes, %d pods running after %s", nodes, pods, time.Since(began).Round(time.Second))
	addr, err := freeAddr()
	if err != nil {
		b.Fatal(err)
	}
	bin := buildOperator(b)
	// One operator process per runtime setting, one after the other.
	for i, setting := range strings.Split(*memoryEnv, ",") {
		name := setting
		if name == "" {
			name = "operator defaults (GOGC=50)"
		}
		op := &operatorProcess{bin: bin, kubeconfig: kubeconfig, dir: b.TempDir(), metricsAddr: addr}
		if setting != "" {
			op.env = []string{setting}
		}
		op.startWith(b, "maintenance,gpustack,repair")
		time.Sleep(30 * time.Second)
		rss30, _ := memoryOf(op.pid())
		fams, err := scrape(addr)
		if err != nil {
			op.kill()
			b.Fatal(err)
		}
		heap := gauge(fams, "go_memstats_heap_inuse_bytes") / (1 << 20)
		// The runtime forces a collection every 2 minutes and returns
		// freed memory to the OS in the background: the steady state.
		time.Sleep(2 * time.Minute)
		rss, hwm := memoryOf(op.pid())
		cpu := cpuSecondsOf(op.pid())
		if i == 0 && *heapProfile != "" {
			if err := saveHeapProfile(addr, *heapProfile); err != nil {
				b.Error(err)
			}
			b.Logf("heap profile: %s", *heapProfile)
		}
		op.kill()
		unit := func(u string) string {
			if setting == "" {
				return u
			}
			return u + "-" + strings.ReplaceAll(setting, "=", "")
		}
		b.ReportMetric(float64(rss)/1024, unit("MB-rss"))
		b.ReportMetric(float64(hwm)/1024, unit("MB-peak-rss"))
		b.Logf("%s: operator with %d nodes and %d pods in the cluster: RSS %d MB after 30 s (Go heap in use %.0f MB), %d MB after 2.5 min, peak %d MB; %.1f CPU seconds",
			name, nodes, pods, rss30/1024, heap, rss/1024, hwm/1024, cpu)
	}
}
