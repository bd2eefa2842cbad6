package repair_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// BenchmarkHealthyFleet500 counts the operator's API requests while 500
// more healthy simulated nodes send heartbeats (status and lease updates)
// under the default repair rules. Target: no writes, no per-node polling.
func BenchmarkHealthyFleet500(b *testing.B) {
	if env == nil {
		b.Skip("needs the local cluster")
	}
	ctx := context.Background()
	var specs []devcluster.NodeSpec
	for i := range 500 {
		specs = append(specs, devcluster.NodeSpec{Name: fmt.Sprintf("h-%03d", i), Pool: fmt.Sprintf("p%d", i%5), GPUs: 8})
	}
	if err := env.AddNodes(ctx, specs...); err != nil {
		b.Fatal(err)
	}
	cfg, counter := devcluster.CountRequests(env.OperatorConfig)
	stop := devtest.StartOperator(b, cfg, operator.Options{Namespace: ns, Capabilities: []string{"maintenance", "repair"}},
		func(mgr manager.Manager) error {
			return devcluster.AddInProcessAgent(mgr, devcluster.SimExecutor{Cluster: env.Cluster}, nil)
		})
	defer stop()

	p := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: "fleet"}, Spec: repairv1.NodeRepairPolicySpec{AllowReboot: true}}
	if err := env.Kube.Create(ctx, p); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = env.Kube.Delete(context.Background(), p) }()
	time.Sleep(10 * time.Second) // caches synced, first evaluation done
	before := counter.Snapshot()
	const window = 60 * time.Second
	time.Sleep(window)
	idle := counter.Since(before)
	total, writes := 0, 0
	for k, v := range idle {
		total += v
		if devcluster.IsWrite(k) {
			writes += v
		}
	}
	b.ReportMetric(float64(total), "requests/min")
	b.ReportMetric(float64(writes), "writes/min")
	b.Logf("%d healthy nodes heartbeating for %s under the default repair rules: %d requests, %d writes:\n%s",
		len(specs)+6, window, total, writes, devcluster.FormatCounts(idle))
	for k := range idle {
		if devcluster.IsWrite(k) || strings.HasPrefix(k, "LIST") || strings.HasPrefix(k, "GET") {
			b.Errorf("healthy fleet caused %s", k)
		}
	}
}
