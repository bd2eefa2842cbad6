package gpustack

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func nm(ready bool, restartedAt string) *maintenancev1.NodeMaintenance {
	m := &maintenancev1.NodeMaintenance{}
	if restartedAt != "" {
		m.Annotations = map[string]string{annotationRestartedAt: restartedAt}
	}
	status := metav1.ConditionFalse
	if ready {
		status = metav1.ConditionTrue
	}
	m.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: status, Reason: "Ready"}}
	return m
}

func TestPlanUpgrades(t *testing.T) {
	old := func(name string) UpgradeNode {
		return UpgradeNode{Name: name, DriverPod: name + "-drv", Ready: true, ValidatorReady: true}
	}
	cur := func(name string) UpgradeNode {
		n := old(name)
		n.Current = true
		return n
	}
	withNM := func(n UpgradeNode, m *maintenancev1.NodeMaintenance) UpgradeNode {
		n.Maintenance, n.MaintenanceIsOurs = m, true
		return n
	}
	tests := map[string]struct {
		nodes   []UpgradeNode
		limit   int
		want    []UpgradeAction
		timeout time.Duration
	}{
		"up to the limit, in name order": {
			nodes: []UpgradeNode{old("c"), old("a"), old("b")}, limit: 2,
			want: []UpgradeAction{{ActRequest, "a"}, {ActRequest, "b"}},
		},
		"in-flight upgrades use the limit": {
			nodes: []UpgradeNode{withNM(old("a"), nm(false, "")), old("b")}, limit: 1,
			want: nil,
		},
		"maintenance Ready: restart the old driver pod once": {
			nodes: []UpgradeNode{withNM(old("a"), nm(true, "")), withNM(old("b"), nm(true, t0.Format(time.RFC3339)))}, limit: 2,
			want: []UpgradeAction{{ActRestartDriver, "a"}},
		},
		"new driver and validator Ready: release the node": {
			nodes: []UpgradeNode{withNM(cur("a"), nm(true, t0.Format(time.RFC3339)))}, limit: 1,
			want: []UpgradeAction{{ActFinish, "a"}},
		},
		"new driver not Ready past the timeout: fail, which frees the slot next pass": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-11*time.Minute).Format(time.RFC3339)))
				n.Ready = false
				return n
			}(), old("b")}, limit: 1, timeout: 10 * time.Minute,
			want: []UpgradeAction{{ActFail, "a"}},
		},
		"failed nodes are not retried and do not count": {
			nodes: []UpgradeNode{func() UpgradeNode { n := old("a"); n.Failed = true; return n }(), old("b")}, limit: 1,
			want: []UpgradeAction{{ActRequest, "b"}},
		},
		"a failed node that is now fine is cleared": {
			nodes: []UpgradeNode{func() UpgradeNode { n := cur("a"); n.Failed = true; return n }()}, limit: 1,
			want: []UpgradeAction{{ActClearFailed, "a"}},
		},
		"another requestor's maintenance on the node: wait": {
			nodes: []UpgradeNode{func() UpgradeNode { n := old("a"); n.Maintenance = nm(true, ""); return n }()}, limit: 1,
			want: nil,
		},
		"limit 0 pauses the rollout": {
			nodes: []UpgradeNode{old("a")}, limit: 0, want: nil,
		},
		"nodes without a driver pod are skipped": {
			nodes: []UpgradeNode{{Name: "a"}}, limit: 1, want: nil,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			timeout := tc.timeout
			if timeout == 0 {
				timeout = time.Hour
			}
			got := PlanUpgrades(tc.nodes, tc.limit, timeout, t0)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
		})
	}
}
