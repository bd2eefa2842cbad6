package gpustack_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// BenchmarkClusterPolicy100 deploys the seed ClusterPolicy on 100 more
// simulated GPU nodes (two OS versions, two runtimes) and reports the time
// to state ready, the operator's API requests to get there, and its
// requests in 30 idle seconds afterwards (target: no writes, no lists).
func BenchmarkClusterPolicy100(b *testing.B) {
	if cluster == nil {
		b.Skip("needs the local cluster")
	}
	ctx := context.Background()
	_ = cluster.Client.CoreV1().Nodes().Delete(ctx, devcluster.UnhealthyNodePrefix+"gpu-007", metav1.DeleteOptions{})
	var specs []devcluster.NodeSpec
	for i := range 100 {
		s := devcluster.NodeSpec{Name: fmt.Sprintf("bench-%03d", i), Pool: "bench", GPUs: 8}
		if i%4 == 0 {
			s.OSVersion, s.Runtime = "20.04", devcluster.RuntimeDocker
		}
		specs = append(specs, s)
	}
	if err := cluster.AddNodes(ctx, specs...); err != nil {
		b.Fatal(err)
	}
	cfg, counter := devcluster.CountRequests(operatorCfg)
	stop := devtest.StartOperator(b, cfg, operator.Options{Namespace: ns, Capabilities: []string{"gpustack"}})
	defer stop()
	time.Sleep(2 * time.Second) // caches synced

	policy := &nvidiav1.ClusterPolicy{}
	data := seedYAML(b)
	if err := yamlUnmarshal(data, policy); err != nil {
		b.Fatal(err)
	}
	policy.Name = "bench-policy"
	start := counter.Snapshot()
	began := time.Now()
	if err := k8s.Create(ctx, policy); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = k8s.Delete(context.Background(), policy) }()
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		p := &nvidiav1.ClusterPolicy{}
		if err := k8s.Get(ctx, keyOf("bench-policy"), p); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		return p.Status.State == nvidiav1.StateReady, nil
	})
	elapsed := time.Since(began)
	if err != nil {
		b.Fatalf("not ready after %s", elapsed)
	}
	rollout := counter.Since(start)
	idleStart := counter.Snapshot()
	time.Sleep(30 * time.Second)
	idle := counter.Since(idleStart)
	writes := 0
	for k, v := range rollout {
		if devcluster.IsWrite(k) {
			writes += v
		}
	}
	b.ReportMetric(elapsed.Seconds(), "s/to-ready")
	b.ReportMetric(float64(writes), "writes/to-ready")
	b.Logf("seed ClusterPolicy on %d GPU nodes: ready after %s, %d writes:\n%s", len(specs)+7, elapsed.Round(100*time.Millisecond), writes, devcluster.FormatCounts(rollout))
	b.Logf("requests in 30 idle seconds:\n%s", devcluster.FormatCounts(idle))
	for k := range idle {
		if devcluster.IsWrite(k) || strings.HasPrefix(k, "LIST") {
			b.Errorf("idle operator issued %s", k)
		}
	}
}
