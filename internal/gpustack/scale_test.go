package gpustack_test

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/operator"
)

var (
	scaleNodes      = flag.Int("gpustack.nodes", 20, "GPU nodes of BenchmarkClusterPolicyScale (the test cluster's 7 healthy ones included)")
	scaleReadyAfter = flag.Duration("gpustack.ready-after", 0, "BenchmarkClusterPolicyScale: every stack pod becomes Ready this long after its init containers completed (sim.gpufleet.dev/ready-after; 0: the simulation's 0.1-0.3 s)")
)

// BenchmarkClusterPolicyScale deploys the GPU Operator 1.6 ClusterPolicy on
// -gpustack.nodes healthy simulated GPU nodes (two OS versions, two
// runtimes; plus the 2 CPU nodes of the test cluster) and reports: the
// time to state ready, the operator's API requests to get there, its
// reconcile passes, the CPU seconds of the test process (the in-process
// operator, and the simulated init containers of devcluster) from the
// policy's creation to ready, and the operator's requests per minute once
// converged and while one node's stack is stuck (target: none).
//
//	GPUFLEET_BIN_DIR=… flock /tmp/gpufleet-cluster.lock go test -run '^$' \
//	  -bench BenchmarkClusterPolicyScale -benchtime 1x ./internal/gpustack/ -args -gpustack.nodes=100
//
// -gpustack.ready-after=8s makes every stack pod take 8 s to start once its
// init containers have completed (and they complete only once the
// components they validate are Ready on the node): how long the chain of a
// node's components takes when pods do not start at once.
func BenchmarkClusterPolicyScale(b *testing.B) {
	if cluster == nil {
		b.Skip("needs the local cluster")
	}
	ctx := context.Background()
	// The test cluster's broken node comes back later as the stuck one.
	_ = cluster.Client.CoreV1().Nodes().Delete(ctx, devcluster.UnhealthyNodePrefix+"gpu-007", metav1.DeleteOptions{})
	const existing = 7 // gpu-000 … gpu-006 of TestMain
	var specs []devcluster.NodeSpec
	for i := range max(*scaleNodes-existing, 0) {
		s := devcluster.NodeSpec{Name: fmt.Sprintf("bench-%03d", i), Pool: "bench", GPUs: 8}
		if i%4 == 0 {
			s.OSVersion, s.Runtime = "20.04", devcluster.RuntimeDocker
		}
		specs = append(specs, s)
	}
	if err := cluster.AddNodes(ctx, specs...); err != nil {
		b.Fatal(err)
	}
	gpuNodes := existing + len(specs)
	cfg, counter := devcluster.CountRequests(operatorCfg)
	stop := devtest.StartOperator(b, cfg, operator.Options{Namespace: ns, Capabilities: []string{"gpustack"},
		GPUStackDegradedAfter: 10 * time.Second})
	defer stop()
	time.Sleep(2 * time.Second) // caches synced

	policy := &nvidiav1.ClusterPolicy{}
	if err := yamlUnmarshal(v16YAML(b), policy); err != nil {
		b.Fatal(err)
	}
	policy.Name = "bench-policy"
	if *scaleReadyAfter > 0 {
		if policy.Spec.Daemonsets.Annotations == nil {
			policy.Spec.Daemonsets.Annotations = map[string]string{}
		}
		policy.Spec.Daemonsets.Annotations["sim.gpufleet.dev/ready-after"] = scaleReadyAfter.String()
	}
	start, passes0, cpu0 := counter.Snapshot(), reconcilePasses(b), processCPU()
	began := time.Now()
	if err := k8s.Create(ctx, policy); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = k8s.Delete(context.Background(), policy) }()
	waitPolicy(b, 10*time.Minute, func(p *nvidiav1.ClusterPolicy) bool { return p.Status.State == nvidiav1.StateReady })
	elapsed := time.Since(began)
	cpu := processCPU() - cpu0
	passes := reconcilePasses(b) - passes0
	rollout := counter.Since(start)
	// The last status write may still be on its way through the cache;
	// give it a moment before the idle window.
	time.Sleep(3 * time.Second)
	idleStart := counter.Snapshot()
	const idleFor = 30 * time.Second
	time.Sleep(idleFor)
	idle := counter.Since(idleStart)

	// One node whose stack never comes up: Degraded, then quiet.
	stuck := devcluster.UnhealthyNodePrefix + "bench-stuck"
	if err := cluster.AddNodes(ctx, devcluster.NodeSpec{Name: stuck, Pool: "bench", GPUs: 8}); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), stuck, metav1.DeleteOptions{})
	}()
	waitPolicy(b, 2*time.Minute, func(p *nvidiav1.ClusterPolicy) bool {
		return meta.IsStatusConditionTrue(p.Status.Conditions, nvidiav1.ConditionDegraded)
	})
	time.Sleep(3 * time.Second)
	stuckStart := counter.Snapshot()
	time.Sleep(idleFor)
	stuckIdle := counter.Since(stuckStart)

	total, writes := sum(rollout, false), sum(rollout, true)
	perMin := func(m map[string]int) float64 {
		return float64(sum(m, false)) * float64(time.Minute) / float64(idleFor)
	}
	b.ReportMetric(elapsed.Seconds(), "s/to-ready")
	b.ReportMetric(float64(total), "requests/to-ready")
	b.ReportMetric(float64(writes), "writes/to-ready")
	b.ReportMetric(float64(passes), "passes/to-ready")
	b.ReportMetric(cpu.Seconds(), "cpu-s/to-ready")
	b.ReportMetric(perMin(idle), "requests/min-converged")
	b.ReportMetric(perMin(stuckIdle), "requests/min-stuck")
	b.Logf("GPU Operator 1.6 ClusterPolicy on %d GPU nodes (pods ready %s after start): ready after %s; %d requests (%d writes), %.0f reconcile passes, %.1f CPU s:\n%s",
		gpuNodes, *scaleReadyAfter, elapsed.Round(100*time.Millisecond), total, writes, passes, cpu.Seconds(), devcluster.FormatCounts(rollout))
	b.Logf("requests in %s converged:\n%s", idleFor, devcluster.FormatCounts(idle))
	b.Logf("requests in %s with %s stuck:\n%s", idleFor, stuck, devcluster.FormatCounts(stuckIdle))
	for _, m := range []map[string]int{idle, stuckIdle} {
		for k := range m {
			if devcluster.IsWrite(k) || strings.HasPrefix(k, "LIST") {
				b.Errorf("idle operator issued %s", k)
			}
		}
	}
}

func waitPolicy(b *testing.B, timeout time.Duration, done func(*nvidiav1.ClusterPolicy) bool) {
	b.Helper()
	p := &nvidiav1.ClusterPolicy{}
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := k8s.Get(ctx, keyOf("bench-policy"), p); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		return done(p), nil
	})
	if err != nil {
		pods, _ := cluster.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		phases := map[string]int{}
		for _, pod := range pods.Items {
			phase := string(pod.Status.Phase)
			if pod.Spec.NodeName == "" {
				phase += "/unscheduled"
			}
			phases[phase]++
		}
		b.Fatalf("bench-policy: condition not reached within %s; stack pods by phase %v; status %+v", timeout, phases, p.Status)
	}
}

func sum(m map[string]int, writesOnly bool) int {
	n := 0
	for k, v := range m {
		if !writesOnly || devcluster.IsWrite(k) {
			n += v
		}
	}
	return n
}

// reconcilePasses is controller-runtime's count of the ClusterPolicy
// controller's reconciles (every result).
func reconcilePasses(tb testing.TB) float64 {
	tb.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != "gpufleet_gpustack_reconcile_passes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelValue(m, "result") != "deferred" { // not a pass
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// processCPU is the user+system CPU time of this process.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
