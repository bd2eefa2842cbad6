package gpustack

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkPlanUpgrades is one pass of the driver upgrade planner over
// 1,000, 3,000 and 10,000 GPU nodes in the middle of a rollout
// (maxParallelUpgrades 10%): a tenth upgraded, a tenth in flight, the rest
// waiting; with and without NVLink domains of 18 nodes (upgradeByDomain).
// The time per pass should grow linearly with the nodes.
func BenchmarkPlanUpgrades(b *testing.B) {
	for _, byDomain := range []bool{false, true} {
		for _, n := range []int{1000, 3000, 10000} {
			b.Run(fmt.Sprintf("nodes=%d/byDomain=%t", n, byDomain), func(b *testing.B) {
				nodes := make([]UpgradeNode, n)
				for i := range nodes {
					u := UpgradeNode{Name: fmt.Sprintf("gpu-%05d", i), DriverPod: fmt.Sprintf("driver-%05d", i),
						DriverPodCreated: t0.Add(-time.Hour), Ready: true, ValidatorReady: true}
					if byDomain {
						u.Domain = fmt.Sprintf("rack-%03d", i/18)
					}
					switch i % 10 {
					case 0: // upgraded
						u.Current = true
					case 1: // in flight: its NodeMaintenance is Ready, the driver restarted
						u.Maintenance, u.MaintenanceIsOurs = nm(true, t0.Add(-time.Minute).Format(time.RFC3339)), true
						u.Ready, u.ValidatorReady = false, false
					}
					nodes[i] = u
				}
				b.ReportAllocs()
				for b.Loop() {
					PlanUpgrades(nodes, n/10, byDomain, time.Hour, t0)
				}
			})
		}
	}
}
