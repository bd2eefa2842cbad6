package gpustack

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// nm is a driver upgrade's NodeMaintenance, Ready or still draining;
// restartedAt is when the upgrade restarted the node's old driver pod ("":
// not yet).
func nm(ready bool, restartedAt string) *maintenancev1.NodeMaintenance {
	phase := maintenancev1.PhaseDraining
	if ready {
		phase = maintenancev1.PhaseReady
	}
	m := testobj.NodeMaintenance("", "", testobj.Phase(phase))
	if restartedAt != "" {
		m.Annotations = map[string]string{annotationRestartedAt: restartedAt}
	}
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
	createdAt := func(n UpgradeNode, at time.Time) UpgradeNode {
		n.DriverPodCreated = at
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
			nodes: []UpgradeNode{withNM(old("a"), nm(true, "")), withNM(createdAt(old("b"), t0.Add(-time.Minute)), nm(true, t0.Add(-2*time.Minute).Format(time.RFC3339)))}, limit: 2,
			want: []UpgradeAction{{ActRestartDriver, "a"}},
		},
		"restart recorded but the old pod is still there (stopped between the writes): delete it again": {
			nodes: []UpgradeNode{withNM(createdAt(old("a"), t0.Add(-time.Hour)), nm(true, t0.Add(-time.Minute).Format(time.RFC3339)))}, limit: 1,
			want: []UpgradeAction{{ActRestartDriver, "a"}},
		},
		"restarted, still the old image past the timeout: fail (the wait is bounded)": {
			nodes: []UpgradeNode{withNM(createdAt(old("a"), t0.Add(-10*time.Minute)), nm(true, t0.Add(-11*time.Minute).Format(time.RFC3339)))}, limit: 1,
			timeout: 10 * time.Minute,
			want:    []UpgradeAction{{ActFail, "a"}},
		},
		"restarted, no driver pod yet: wait": {
			nodes: []UpgradeNode{withNM(UpgradeNode{Name: "a"}, nm(true, t0.Add(-time.Minute).Format(time.RFC3339)))}, limit: 1,
			want: nil,
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
		"the new driver cannot load, the old module is in use: drain the whole node for the reboot first": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Minute).Format(time.RFC3339)))
				n.Maintenance.Spec.DrainSpec = upgradeRequest(&nvidiav1.ClusterPolicy{}, nil, "ns", "a").Drain
				n.Ready, n.ModuleInUse = false, "nvidia-driver-ctr: Could not unload NVIDIA driver kernel modules, driver is in use"
				return n
			}()}, limit: 1,
			want: []UpgradeAction{{ActDrainNode, "a"}},
		},
		"the whole node drained for the reboot: ask for it": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Minute).Format(time.RFC3339)))
				n.Maintenance.Spec.DrainSpec = rebootDrain(nil)
				n.Ready, n.ModuleInUse = false, "nvidia-driver-ctr: Could not unload NVIDIA driver kernel modules, driver is in use"
				return n
			}()}, limit: 1,
			want: []UpgradeAction{{ActReboot, "a"}},
		},
		"the whole node's drain asked for, not yet acted on (generation ahead): wait": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Minute).Format(time.RFC3339)))
				n.Maintenance.Spec.DrainSpec = rebootDrain(nil)
				n.Maintenance.Generation, n.Maintenance.Status.ObservedGeneration = 2, 1
				n.Ready, n.ModuleInUse = false, "x: module nvidia is in use"
				return n
			}()}, limit: 1,
			want: nil,
		},
		"the whole node's drain past its timeout: the reboot goes on": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(false, t0.Add(-time.Minute).Format(time.RFC3339)))
				n.Maintenance.Spec.DrainSpec = rebootDrain(nil)
				n.Maintenance.Status.Conditions = append(n.Maintenance.Status.Conditions, metav1.Condition{Type: maintenancev1.ConditionTypeDrainBlocked,
					Status: metav1.ConditionTrue, Reason: maintenancev1.DrainBlockedReasonTimedOut})
				n.Ready, n.ModuleInUse = false, "x: module nvidia is in use"
				return n
			}()}, limit: 1,
			want: []UpgradeAction{{ActReboot, "a"}},
		},
		"the GPU pods' drain past its timeout: the node fails, its driver is not restarted under them": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(old("a"), nm(false, ""))
				n.Maintenance.Spec.DrainSpec = upgradeRequest(&nvidiav1.ClusterPolicy{}, nil, "ns", "a").Drain
				n.Maintenance.Status.Conditions = append(n.Maintenance.Status.Conditions, metav1.Condition{Type: maintenancev1.ConditionTypeDrainBlocked,
					Status: metav1.ConditionTrue, Reason: maintenancev1.DrainBlockedReasonTimedOut})
				return n
			}()}, limit: 1,
			want: []UpgradeAction{{ActFail, "a"}},
		},
		"the GPU pods' drain refused at once: wait (not a timeout)": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(old("a"), nm(false, ""))
				n.Maintenance.Spec.DrainSpec = upgradeRequest(&nvidiav1.ClusterPolicy{}, nil, "ns", "a").Drain
				n.Maintenance.Status.Conditions = append(n.Maintenance.Status.Conditions, metav1.Condition{Type: maintenancev1.ConditionTypeDrainBlocked,
					Status: metav1.ConditionTrue, Reason: maintenancev1.DrainBlockedReasonRefused})
				return n
			}()}, limit: 1,
			want: nil,
		},
		"module in use but the restart is not ours (no restart recorded): no reboot": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, ""))
				n.Ready, n.ModuleInUse = false, "x: module nvidia is in use"
				return n
			}()}, limit: 1,
			want: nil,
		},
		"rebooting: no timeout of the upgrade's own, nothing asked twice": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Ready, n.ModuleInUse = false, "x: module nvidia is in use"
				n.Reboot = &UpgradeReboot{Name: "r", Phase: repairv1.PhaseRepairing, Created: t0.Add(-50 * time.Minute)}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: nil,
		},
		"a reboot the repair controller never starts is bounded": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Ready = false
				n.Reboot = &UpgradeReboot{Name: "r", Created: t0.Add(-10 * time.Minute)}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: []UpgradeAction{{ActFail, "a"}},
		},
		"the reboot failed: the upgrade fails and releases the node": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Ready = false
				n.Reboot = &UpgradeReboot{Name: "r", Phase: repairv1.PhaseRecoveryFailed, Created: t0.Add(-30 * time.Minute), Ended: t0}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: []UpgradeAction{{ActFail, "a"}},
		},
		"rebooted, the new driver Ready: release the node": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Reboot = &UpgradeReboot{Name: "r", Phase: repairv1.PhaseSucceeded, Created: t0.Add(-30 * time.Minute), Ended: t0.Add(-time.Minute)}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: []UpgradeAction{{ActFinish, "a"}},
		},
		"rebooted, still not Ready: the timeout counts from the reboot's end, and no second reboot": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Ready, n.ModuleInUse = false, "x: module nvidia is in use"
				n.Reboot = &UpgradeReboot{Name: "r", Phase: repairv1.PhaseSucceeded, Created: t0.Add(-30 * time.Minute), Ended: t0.Add(-9 * time.Minute)}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: nil,
		},
		"rebooted, still not Ready past the timeout: fail": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Ready = false
				n.Reboot = &UpgradeReboot{Name: "r", Phase: repairv1.PhaseSucceeded, Created: t0.Add(-30 * time.Minute), Ended: t0.Add(-10 * time.Minute)}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: []UpgradeAction{{ActFail, "a"}},
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
			got := PlanUpgrades(tc.nodes, tc.limit, false, timeout, t0)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPlanUpgradesByDomain: with upgradeByDomain a domain starts while
// fewer than limit nodes are upgrading, and then every node of it that
// needs the new driver starts at once, beyond the limit if need be.
func TestPlanUpgradesByDomain(t *testing.T) {
	old := func(name, domain string) UpgradeNode {
		return UpgradeNode{Name: name, Domain: domain, DriverPod: name + "-drv", Ready: true, ValidatorReady: true}
	}
	upgrading := func(name, domain string) UpgradeNode { // waiting for its maintenance
		n := old(name, domain)
		n.Maintenance, n.MaintenanceIsOurs = nm(false, ""), true
		return n
	}
	req := func(names ...string) []UpgradeAction {
		var out []UpgradeAction
		for _, n := range names {
			out = append(out, UpgradeAction{ActRequest, n})
		}
		return out
	}
	tests := map[string]struct {
		nodes    []UpgradeNode
		limit    int
		byDomain bool
		want     []UpgradeAction
	}{
		"a domain larger than the limit starts whole": {
			nodes: []UpgradeNode{old("c", "rack-0"), old("a", "rack-0"), old("b", "rack-0")}, limit: 1, byDomain: true,
			want: req("a", "b", "c"),
		},
		"without upgradeByDomain the domains change nothing": {
			nodes: []UpgradeNode{old("c", "rack-0"), old("a", "rack-0"), old("b", "rack-0")}, limit: 1,
			want: req("a"),
		},
		"two domains: the second waits while the first holds the limit": {
			nodes: []UpgradeNode{old("a", "rack-0"), old("b", "rack-0"), old("c", "rack-1"), old("d", "rack-1")}, limit: 2, byDomain: true,
			want: req("a", "b"),
		},
		"two domains: the second starts while the limit is not reached": {
			nodes: []UpgradeNode{old("a", "rack-0"), old("b", "rack-0"), old("c", "rack-1"), old("d", "rack-1")}, limit: 3, byDomain: true,
			want: req("a", "b", "c", "d"),
		},
		"the domains interleaved by name: each starts at its first node and takes all of its nodes": {
			nodes: []UpgradeNode{old("a", "rack-1"), old("b", "rack-0"), old("c", "rack-1"), old("d", "rack-0")}, limit: 1, byDomain: true,
			want: req("a", "c"),
		},
		"nodes in no domain go one by one, within the limit": {
			nodes: []UpgradeNode{old("a", "rack-0"), old("b", "rack-0"), old("c", ""), old("d", "")}, limit: 3, byDomain: true,
			want: req("a", "b", "c"),
		},
		"a node in no domain takes the last slot: the domain waits": {
			nodes: []UpgradeNode{old("a", ""), old("b", "rack-0"), old("c", "rack-0")}, limit: 1, byDomain: true,
			want: req("a"),
		},
		"a domain counts whole from its start: a node in no domain after its first node waits": {
			nodes: []UpgradeNode{old("a", "rack-0"), old("b", ""), old("c", "rack-0")}, limit: 2, byDomain: true,
			want: req("a", "c"),
		},
		"nodes of a domain in flight count; its other nodes join it beyond the limit": {
			nodes: []UpgradeNode{upgrading("a", "rack-0"), old("b", "rack-0"), old("c", "")}, limit: 1, byDomain: true,
			want: req("b"),
		},
		"nodes of a domain in flight hold another domain back": {
			nodes: []UpgradeNode{upgrading("a", "rack-0"), upgrading("b", "rack-0"), old("c", "rack-1")}, limit: 2, byDomain: true,
			want: nil,
		},
		"a failed node in a domain is not retried; the others start": {
			nodes: []UpgradeNode{func() UpgradeNode { n := old("a", "rack-0"); n.Failed = true; return n }(), old("b", "rack-0"), old("c", "rack-0")},
			limit: 1, byDomain: true,
			want: req("b", "c"),
		},
		"a node of the domain under another requestor's maintenance, or current, stays out": {
			nodes: []UpgradeNode{func() UpgradeNode { n := old("a", "rack-0"); n.Maintenance = nm(true, ""); return n }(),
				func() UpgradeNode { n := old("b", "rack-0"); n.Current = true; return n }(), old("c", "rack-0"), old("d", "rack-0")},
			limit: 1, byDomain: true,
			want: req("c", "d"),
		},
		"limit reached: no domain starts": {
			nodes: []UpgradeNode{upgrading("a", ""), old("b", "rack-0"), old("c", "rack-0"), old("d", "")}, limit: 1, byDomain: true,
			want: nil,
		},
		"limit 0 pauses domains too": {
			nodes: []UpgradeNode{old("a", "rack-0"), old("b", "rack-0")}, limit: 0, byDomain: true,
			want: nil,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := PlanUpgrades(tc.nodes, tc.limit, tc.byDomain, time.Hour, t0)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
		})
	}
}

// FuzzPlanUpgrades checks the request rule over any mix of nodes: each
// byte is a node (its domain, and whether it is upgrading, current,
// failed, has a driver pod, is held by another requestor).
//   - Without upgradeByDomain (or with no node in a domain) the requests
//     are the first nodes in name order that need one, up to the limit
//     (the planner's behaviour without domains): the limit is never
//     exceeded.
//   - With it, a domain is never split (all of its nodes that need the
//     upgrade start together, or none), and a new domain or a node in no
//     domain never starts while limit nodes are upgrading, counting every
//     node of a domain from its start.
//   - The other actions do not depend on domains.
func FuzzPlanUpgrades(f *testing.F) {
	f.Add([]byte{0x01, 0x01, 0x01, 0x02, 0x02, 0x00}, uint8(1), true)
	f.Add([]byte{0x05, 0x01, 0x02, 0x03, 0x00, 0x00, 0x21}, uint8(2), true)
	f.Add([]byte{0x01, 0x41, 0x81, 0x11, 0x02}, uint8(1), true)
	f.Add([]byte{0x01, 0x01, 0x01}, uint8(0), false)
	f.Fuzz(func(t *testing.T, spec []byte, limit8 uint8, byDomain bool) {
		if len(spec) > 64 {
			spec = spec[:64]
		}
		limit := int(limit8 % 8)
		var nodes []UpgradeNode
		for i, b := range spec {
			n := UpgradeNode{Name: fmt.Sprintf("n-%02d", i), DriverPod: "drv", Ready: true, ValidatorReady: true}
			if d := b & 0x03; d != 0 {
				n.Domain = fmt.Sprintf("rack-%d", d)
			}
			if b&0x04 != 0 {
				n.Maintenance, n.MaintenanceIsOurs = nm(b&0x80 != 0, ""), true
			}
			n.Current = b&0x08 != 0
			n.Failed = b&0x10 != 0
			if b&0x20 != 0 {
				n.DriverPod = ""
			}
			if b&0x40 != 0 && n.Maintenance == nil {
				n.Maintenance = nm(true, "") // another requestor's
			}
			nodes = append(nodes, n)
		}
		plan := func(byDomain bool) (requested []string, others []UpgradeAction) {
			for _, a := range PlanUpgrades(slices.Clone(nodes), limit, byDomain, time.Hour, t0) {
				if a.Kind == ActRequest {
					requested = append(requested, a.Node)
				} else {
					others = append(others, a)
				}
			}
			return requested, others
		}
		slices.SortFunc(nodes, func(a, b UpgradeNode) int { return strings.Compare(a.Name, b.Name) })
		inFlight := 0
		var need []string
		inFlightDomains := map[string]bool{}
		for _, n := range nodes {
			if n.MaintenanceIsOurs {
				inFlight++
				if n.Domain != "" {
					inFlightDomains[n.Domain] = true
				}
			}
			if n.needsRequest() {
				need = append(need, n.Name)
			}
		}
		free := max(limit-inFlight, 0)
		plain, plainOthers := plan(false) // the planner without domains
		if want := need[:min(free, len(need))]; !slices.Equal(plain, want) {
			t.Fatalf("without domains: requests %v, want %v (limit %d, %d upgrading)", plain, want, limit, inFlight)
		}
		got, others := plan(byDomain)
		if diff := cmp.Diff(plainOthers, others); diff != "" {
			t.Fatalf("the other actions depend on domains (-without +with):\n%s", diff)
		}
		if !byDomain {
			return
		}
		isRequested := map[string]bool{}
		for _, n := range got {
			if isRequested[n] {
				t.Fatalf("%s requested twice: %v", n, got)
			}
			isRequested[n] = true
		}
		// Walk the requests in name order, counting every node of a domain
		// from the domain's start: nothing new starts at the limit.
		needIn := map[string]int{}
		for _, n := range nodes {
			if n.needsRequest() && n.Domain != "" {
				needIn[n.Domain]++
			}
		}
		upgrading := inFlight
		for d := range inFlightDomains {
			upgrading += needIn[d]
		}
		startedDomains := map[string]bool{}
		for _, n := range nodes {
			switch {
			case !isRequested[n.Name]:
				continue
			case !n.needsRequest():
				t.Fatalf("%s requested without needing it: %+v", n.Name, n)
			case n.Domain != "" && (inFlightDomains[n.Domain] || startedDomains[n.Domain]):
				continue // joins its domain, counted already
			}
			if upgrading >= limit {
				t.Fatalf("%s (domain %q) starts with %d upgrading, limit %d (%d upgrading before the pass): %v", n.Name, n.Domain, upgrading, limit, inFlight, got)
			}
			if n.Domain == "" {
				upgrading++
			} else {
				startedDomains[n.Domain] = true
				upgrading += needIn[n.Domain]
			}
		}
		for _, n := range nodes {
			if n.needsRequest() && n.Domain != "" && (inFlightDomains[n.Domain] || startedDomains[n.Domain]) && !isRequested[n.Name] {
				t.Fatalf("domain %s split: %s not requested with it (%v)", n.Domain, n.Name, got)
			}
		}
		anyDomain := slices.ContainsFunc(nodes, func(n UpgradeNode) bool { return n.Domain != "" })
		if !anyDomain && !slices.Equal(got, plain) {
			t.Fatalf("no node in a domain: requests %v, without upgradeByDomain %v", got, plain)
		}
	})
}

func TestUpgradeNodesReadTheDomainLabel(t *testing.T) {
	const label = "nvidia.com/gpu.clique"
	nodes := &corev1.NodeList{Items: []corev1.Node{*gpuNode(map[string]string{label: "rack-7"}, "containerd://1.7")}}
	for domainLabel, want := range map[string]string{label: "rack-7", "": "", "example.com/other": ""} {
		byNode, _ := upgradeNodes(&nvidiav1.ClusterPolicySpec{}, nodes, nil, nil, nil, domainLabel)
		if got := byNode["n"].Domain; got != want {
			t.Errorf("domain label %q: domain %q, want %q", domainLabel, got, want)
		}
	}
}

func TestDomainsChangedPassesWhatUpgradesRead(t *testing.T) {
	cfg := func(d *maintenancev1.MaintenanceDomains) *maintenancev1.MaintenanceOperatorConfig {
		return &maintenancev1.MaintenanceOperatorConfig{Spec: maintenancev1.MaintenanceOperatorConfigSpec{Domains: d}}
	}
	tests := map[string]struct {
		old, new *maintenancev1.MaintenanceOperatorConfig
		want     bool
	}{
		"upgradeByDomain turned on": {cfg(&maintenancev1.MaintenanceDomains{NodeLabel: "l"}), cfg(&maintenancev1.MaintenanceDomains{NodeLabel: "l", UpgradeByDomain: true}), true},
		"domains set":               {cfg(nil), cfg(&maintenancev1.MaintenanceDomains{NodeLabel: "l"}), true},
		"another label":             {cfg(&maintenancev1.MaintenanceDomains{NodeLabel: "l"}), cfg(&maintenancev1.MaintenanceDomains{NodeLabel: "m"}), true},
		"another field":             {cfg(&maintenancev1.MaintenanceDomains{NodeLabel: "l"}), cfg(&maintenancev1.MaintenanceDomains{NodeLabel: "l", CoSchedule: ptr.To(false)}), false},
		"no domains either way":     {cfg(nil), &maintenancev1.MaintenanceOperatorConfig{Spec: maintenancev1.MaintenanceOperatorConfigSpec{LogLevel: "debug"}}, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := domainsChanged.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}); got != tc.want {
				t.Errorf("passed %t, want %t", got, tc.want)
			}
		})
	}
}

// Regression (issue 14, item 7): a 1.x policy that disables the validator
// under spec.operator.validator rendered no validator, but driver upgrades
// read spec.validator and waited for a validator that never ran.
func TestUpgradeOfA1xPolicyWithoutValidatorDoesNotWaitForIt(t *testing.T) {
	const image = "nvcr.io/nvidia/driver:550.54.15-ubuntu22.04"
	ready := []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	nodes := &corev1.NodeList{Items: []corev1.Node{*gpuNode(nil, "containerd://1.7")}}
	driverPod := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "drv", Labels: map[string]string{LabelManagedBy: managedBy, LabelComponent: Driver, "app": "nvidia-driver-daemonset-ubuntu22.04"}},
		Spec:       corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Image: image}}},
		Status:     corev1.PodStatus{Conditions: ready},
	}
	desired := map[string]string{"nvidia-driver-daemonset-ubuntu22.04": image}
	ours := map[string]*maintenancev1.NodeMaintenance{"n": nm(true, t0.Format(time.RFC3339))}
	tests := map[string]struct {
		spec       nvidiav1.ClusterPolicySpec
		wantFinish bool
	}{
		"1.x: operator.validator.enabled false": {
			spec: nvidiav1.ClusterPolicySpec{Operator: nvidiav1.OperatorSpec{Validator: &nvidiav1.ComponentSpec{
				Enabled: ptr.To(false), Repository: "nvcr.io/nvidia/k8s", Image: "cuda-sample", Version: "vectoradd-cuda10.2"}}},
			wantFinish: true,
		},
		"validator.enabled false":            {spec: nvidiav1.ClusterPolicySpec{Validator: nvidiav1.ValidatorSpec{ComponentSpec: nvidiav1.ComponentSpec{Enabled: ptr.To(false)}}}, wantFinish: true},
		"validator on and not Ready: waits":  {spec: nvidiav1.ClusterPolicySpec{}, wantFinish: false},
		"1.x validator on, not Ready: waits": {spec: nvidiav1.ClusterPolicySpec{Operator: nvidiav1.OperatorSpec{Validator: &nvidiav1.ComponentSpec{Image: "cuda-sample"}}}, wantFinish: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			byNode, gpuNodes := upgradeNodes(&tc.spec, nodes, desired, []corev1.Pod{driverPod}, ours, "")
			if gpuNodes != 1 || byNode["n"] == nil {
				t.Fatalf("GPU nodes %d, %v", gpuNodes, byNode)
			}
			acts := PlanUpgrades([]UpgradeNode{*byNode["n"]}, 1, false, time.Hour, t0)
			finish := len(acts) == 1 && acts[0] == UpgradeAction{ActFinish, "n"}
			if finish != tc.wantFinish {
				t.Errorf("actions %v; want the upgrade finished: %v", acts, tc.wantFinish)
			}
		})
	}
}

func TestUpgradeRequestFollowsTheUpgradePolicy(t *testing.T) {
	gpuPods := []maintenancev1.PodEvictionFilterEntry{{ByResourceNameRegex: ptr.To(`^nvidia\.com/`)}, {ByDRADriverRegex: ptr.To(`^gpu\.nvidia\.com$`)}}
	tests := map[string]struct {
		policy    *nvidiav1.DriverUpgradePolicySpec
		wantDrain *maintenancev1.DrainSpec
		wantWait  *maintenancev1.WaitForPodCompletionSpec
	}{
		"no policy: delete the pods using GPUs": {
			wantDrain: &maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](300), PodEvictionFilters: gpuPods},
		},
		"the chart's defaults: podDeletion settings, drain off, nothing to wait for": {
			policy: &nvidiav1.DriverUpgradePolicySpec{
				WaitForCompletion: &nvidiav1.WaitForCompletionSpec{TimeoutSeconds: ptr.To[int32](0)},
				PodDeletion:       &nvidiav1.PodDeletionSpec{TimeoutSeconds: ptr.To[int32](300)},
				Drain:             &nvidiav1.UpgradeDrainSpec{Enable: ptr.To(false), TimeoutSeconds: ptr.To[int32](300)},
			},
			wantDrain: &maintenancev1.DrainSpec{TimeoutSeconds: ptr.To[int32](300), PodEvictionFilters: gpuPods},
		},
		"drain enabled: the node's pods of the selector, drain settings": {
			policy: &nvidiav1.DriverUpgradePolicySpec{
				PodDeletion: &nvidiav1.PodDeletionSpec{Force: true, TimeoutSeconds: ptr.To[int32](60)},
				Drain:       &nvidiav1.UpgradeDrainSpec{Enable: ptr.To(true), Force: true, DeleteEmptyDir: true, PodSelector: "tier=batch", TimeoutSeconds: ptr.To[int32](900)},
			},
			wantDrain: &maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, PodSelector: "tier=batch", TimeoutSeconds: ptr.To[int32](900)},
		},
		"wait for the training jobs first": {
			policy:    &nvidiav1.DriverUpgradePolicySpec{WaitForCompletion: &nvidiav1.WaitForCompletionSpec{PodSelector: "app=training", TimeoutSeconds: ptr.To[int32](600)}},
			wantDrain: &maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](300), PodEvictionFilters: gpuPods},
			wantWait:  &maintenancev1.WaitForPodCompletionSpec{PodSelector: "app=training", TimeoutSeconds: ptr.To[int32](600)},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &nvidiav1.ClusterPolicy{}
			p.Spec.Driver.UpgradePolicy = tc.policy
			req := upgradeRequest(p, p.Spec.Driver.UpgradePolicy, "ns", "n")
			if diff := cmp.Diff(tc.wantDrain, req.Drain); diff != "" {
				t.Errorf("drain (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantWait, req.WaitForPodCompletion); diff != "" {
				t.Errorf("wait for completion (-want +got):\n%s", diff)
			}
			if req.Cordon == nil || !*req.Cordon || req.RequestorID != UpgradeRequestor {
				t.Errorf("request %+v", req)
			}
		})
	}
}

func TestModuleInUse(t *testing.T) {
	term := func(msg string) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: msg}}
	}
	tests := map[string]struct {
		init, main []corev1.ContainerStatus
		want       string
	}{
		"the driver container's last run (the NVIDIA driver's own words)": {
			main: []corev1.ContainerStatus{{Name: "nvidia-driver-ctr", LastTerminationState: term("Unloading NVIDIA driver kernel modules...\nnvidia 56807424 113\nCould not unload NVIDIA driver kernel modules, driver is in use\n")}},
			want: "nvidia-driver-ctr: Could not unload NVIDIA driver kernel modules, driver is in use",
		},
		"the k8s-driver-manager init container, letter case aside": {
			init: []corev1.ContainerStatus{{Name: "k8s-driver-manager", State: term("Failed to unload kernel module nvidia_uvm: resource temporarily unavailable\nmore")}},
			want: "k8s-driver-manager: Failed to unload kernel module nvidia_uvm: resource temporarily unavailable",
		},
		"rmmod's words": {
			main: []corev1.ContainerStatus{{Name: "c", State: term("rmmod: ERROR: Module nvidia_drm is in use")}},
			want: "c: Module nvidia_drm is in use",
		},
		"another failure is not a module in use": {
			main: []corev1.ContainerStatus{{Name: "c", LastTerminationState: term("Could not resolve Linux kernel version")}},
		},
		"another module in use is not the driver's": {
			main: []corev1.ContainerStatus{{Name: "c", LastTerminationState: term("rmmod: ERROR: Module i2c_core is in use")}},
		},
		"no status yet": {},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &corev1.Pod{Status: corev1.PodStatus{InitContainerStatuses: tc.init, ContainerStatuses: tc.main}}
			if got := ModuleInUse(p); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func FuzzModuleInUse(f *testing.F) {
	f.Add("Could not unload NVIDIA driver kernel modules, driver is in use")
	f.Add("rmmod: ERROR: Module nvidia is in use\x00\xff")
	f.Fuzz(func(t *testing.T, msg string) {
		p := &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "c",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Message: msg}}}}}}
		if got := ModuleInUse(p); len(got) > 300 {
			t.Errorf("%d characters reported", len(got))
		}
	})
}
