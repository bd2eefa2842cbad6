package repair

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// BenchmarkDetect is one pass of the repair detector over a fleet of 1,000,
// 3,000 and 10,000 nodes in 16 pools, 1% of them past their fault's
// threshold, maxParallelPools 4: the time per pass should grow linearly
// with the nodes.
func BenchmarkDetect(b *testing.B) {
	for _, n := range []int{1000, 3000, 10000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			policy := testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.MaxParallelPools = ptr.To[int32](4) })
			nodes := make([]corev1.Node, 0, n)
			for i := range n {
				name, pool := fmt.Sprintf("gpu-%05d", i), fmt.Sprintf("pool-%02d", i%16)
				if i%100 == 0 {
					nodes = append(nodes, faultyNode(name, pool, t0.Add(-time.Hour)))
					continue
				}
				nodes = append(nodes, healthyNode(name, pool))
			}
			in := DetectInput{Policy: policy, Nodes: nodes, Now: t0}
			b.ReportAllocs()
			for b.Loop() {
				Detect(in)
			}
		})
	}
}
