package maintenance

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// rack builds ready nodes of one domain ("" : no domain).
func rack(domain string, names ...string) []PlanNode {
	out := make([]PlanNode, len(names))
	for i, n := range names {
		out[i] = PlanNode{Name: n, Ready: true, Domain: domain}
	}
	return out
}

// busyRack is rack with a ComputeDomain's workload on its first node.
func busyRack(domain, computeDomain string, names ...string) []PlanNode {
	out := rack(domain, names...)
	out[0].ComputeDomain = computeDomain
	return out
}

func joinNodes(groups ...[]PlanNode) []PlanNode {
	var out []PlanNode
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

func coSchedule() *DomainLimits { return &DomainLimits{CoSchedule: true} }

// TestMakePlanDomains: co-scheduling, the domain budget, urgency across
// domains, nodes in no domain, a domain split across pools. wantWaiting
// is exact for the names listed: it is the table of the wait reasons.
func TestMakePlanDomains(t *testing.T) {
	racksAB := joinNodes(rack("rack-a", "a0", "a1", "a2"), rack("rack-b", "b0", "b1", "b2"))
	racksABC := joinNodes(racksAB, rack("rack-c", "c0", "c1"))
	nightly := Calendar{Windows: []Window{mustWindow(t, "0 1 * * *", 4*time.Hour, "UTC")}} // closed at t0
	interleaved := []PlanObject{
		pending("a0", "a0", "r", 60), pending("b0", "b0", "r", 50), pending("a1", "a1", "r", 40),
		pending("b1", "b1", "r", 30), pending("a2", "a2", "r", 20), pending("b2", "b2", "r", 10),
	}
	withDomains := func(l Limits, d *DomainLimits) Limits { l.Domains = d; return l }

	tests := map[string]struct {
		nodes         []PlanNode
		objects       []PlanObject
		limits        Limits
		wantScheduled []string // in the order chosen
		wantWaiting   map[string]string
		wantDomains   [3]int // TotalDomains, MaxDisruptedDomains, DisruptedDomains
	}{
		"without spec.domains the domain labels change nothing (node by node, by age)": {
			nodes: racksAB, objects: interleaved,
			limits:        Limits{MaxParallelOperations: num(3)},
			wantScheduled: []string{"a0", "b0", "a1"},
			wantWaiting:   map[string]string{"b1": "maxParallelOperations reached: 3/3 nodes in maintenance"},
			wantDomains:   [3]int{0, -1, 0},
		},
		"a domain that starts pulls its other pending requests right after it": {
			nodes: racksAB, objects: interleaved,
			limits:        withDomains(Limits{MaxParallelOperations: num(3)}, coSchedule()),
			wantScheduled: []string{"a0", "a1", "a2"},
			wantWaiting: map[string]string{
				"b0": "maxParallelOperations reached: 3/3 nodes in maintenance",
				"b2": "maxParallelOperations reached: 3/3 nodes in maintenance",
			},
			wantDomains: [3]int{2, -1, 0},
		},
		"a domain with a node in maintenance takes the free slots before an older request elsewhere": {
			nodes: racksAB,
			objects: []PlanObject{inProgress("a0", "a0", "r"), pending("b0", "b0", "r", 60),
				pending("a1", "a1", "r", 10), pending("a2", "a2", "r", 5)},
			limits:        withDomains(Limits{MaxParallelOperations: num(3)}, coSchedule()),
			wantScheduled: []string{"a1", "a2"},
			wantWaiting:   map[string]string{"b0": "maxParallelOperations reached: 3/3 nodes in maintenance"},
			wantDomains:   [3]int{2, -1, 1},
		},
		"a disrupted domain's request that finds no slot says it will join its domain": {
			nodes: racksAB,
			objects: []PlanObject{inProgress("a0", "a0", "r"), inProgress("b0", "b0", "r"),
				pending("a1", "a1", "r", 10), pending("a2", "a2", "r", 5)},
			limits:        withDomains(Limits{MaxParallelOperations: num(3)}, coSchedule()),
			wantScheduled: []string{"a1"},
			wantWaiting: map[string]string{
				"a2": "domain rack-a: waiting to co-schedule with a0, a1 (maxParallelOperations reached: 3/3 nodes in maintenance)",
			},
			wantDomains: [3]int{2, -1, 2},
		},
		"the wait reason names at most three of the domain's nodes": {
			nodes: rack("rack-7", "gpu-0710", "gpu-0711", "gpu-0712", "gpu-0713", "gpu-0714", "gpu-0715"),
			objects: []PlanObject{inProgress("m0", "gpu-0710", "r"), inProgress("m1", "gpu-0711", "r"),
				inProgress("m2", "gpu-0712", "r"), inProgress("m3", "gpu-0713", "r"), inProgress("m4", "gpu-0714", "r"),
				pending("w", "gpu-0715", "r", 1)},
			limits: withDomains(Limits{MaxParallelOperations: num(5)}, coSchedule()),
			wantWaiting: map[string]string{
				"w": "domain rack-7: waiting to co-schedule with gpu-0710, gpu-0711, gpu-0712 and others (maxParallelOperations reached: 5/5 nodes in maintenance)",
			},
			wantDomains: [3]int{1, -1, 1},
		},
		"maxDisruptedDomains: new domains wait, the disrupted one continues": {
			nodes: racksABC,
			objects: []PlanObject{inProgress("a0", "a0", "r"), pending("b0", "b0", "r", 60),
				pending("c0", "c0", "r", 50), pending("a1", "a1", "r", 10)},
			limits:        withDomains(Limits{MaxParallelOperations: num(10)}, &DomainLimits{MaxDisrupted: num(1), CoSchedule: true}),
			wantScheduled: []string{"a1"},
			wantWaiting: map[string]string{
				"b0": "domain rack-b: maxDisruptedDomains reached: 1/1 domains disrupted",
				"c0": "domain rack-c: maxDisruptedDomains reached: 1/1 domains disrupted",
			},
			wantDomains: [3]int{3, 1, 1},
		},
		"maxDisruptedDomains as a percentage of the domains, rounded up, counts domains started by the plan": {
			nodes: racksABC,
			objects: []PlanObject{pending("a0", "a0", "r", 60), pending("b0", "b0", "r", 50),
				pending("c0", "c0", "r", 40), pending("a1", "a1", "r", 10)},
			limits:        withDomains(Limits{MaxParallelOperations: num(10)}, &DomainLimits{MaxDisrupted: pct("50%"), CoSchedule: true}),
			wantScheduled: []string{"a0", "a1", "b0"},
			wantWaiting:   map[string]string{"c0": "domain rack-c: maxDisruptedDomains reached: 2/2 domains disrupted"},
			wantDomains:   [3]int{3, 2, 0},
		},
		"maxDisruptedDomains 0: only domains already disrupted continue; nodes in no domain are not held": {
			nodes: joinNodes(racksAB, rack("", "plain")),
			objects: []PlanObject{inProgress("a0", "a0", "r"), pending("b0", "b0", "r", 60),
				pending("plain", "plain", "r", 50), pending("a1", "a1", "r", 10)},
			limits:        withDomains(Limits{MaxParallelOperations: num(10)}, &DomainLimits{MaxDisrupted: num(0), CoSchedule: true}),
			wantScheduled: []string{"a1", "plain"},
			wantWaiting: map[string]string{
				"b0": "domain rack-b: maxDisruptedDomains is 0: maintenance continues only in domains already disrupted",
			},
			wantDomains: [3]int{2, 0, 1},
		},
		"the domain budget is checked before the node limits": {
			nodes:       racksAB,
			objects:     []PlanObject{inProgress("a0", "a0", "r"), pending("b0", "b0", "r", 60)},
			limits:      withDomains(Limits{MaxParallelOperations: num(1)}, &DomainLimits{MaxDisrupted: num(1), CoSchedule: true}),
			wantWaiting: map[string]string{"b0": "domain rack-b: maxDisruptedDomains reached: 1/1 domains disrupted"},
			wantDomains: [3]int{2, 1, 1},
		},
		"urgent requests go first, even before a disrupted domain's pending request": {
			nodes: racksAB,
			objects: []PlanObject{inProgress("a0", "a0", "r"), pending("a1", "a1", "r", 60),
				urgent(pending("b0", "b0", "repair", 1))},
			limits:        withDomains(Limits{MaxParallelOperations: num(2)}, coSchedule()),
			wantScheduled: []string{"b0"},
			wantWaiting: map[string]string{
				"a1": "domain rack-a: waiting to co-schedule with a0 (maxParallelOperations reached: 2/2 nodes in maintenance)",
			},
			wantDomains: [3]int{2, -1, 1},
		},
		"a domain an urgent request disrupts is co-scheduled before an older request of another domain": {
			nodes: racksAB,
			objects: []PlanObject{pending("a0", "a0", "r", 60), pending("b1", "b1", "r", 10),
				urgent(pending("b0", "b0", "repair", 1))},
			limits:        withDomains(Limits{MaxParallelOperations: num(2)}, coSchedule()),
			wantScheduled: []string{"b0", "b1"},
			wantWaiting:   map[string]string{"a0": "maxParallelOperations reached: 2/2 nodes in maintenance"},
			wantDomains:   [3]int{2, -1, 0},
		},
		"urgent requests obey maxDisruptedDomains": {
			nodes:       racksAB,
			objects:     []PlanObject{inProgress("a0", "a0", "r"), urgent(pending("b0", "b0", "repair", 1))},
			limits:      withDomains(Limits{MaxParallelOperations: num(5)}, &DomainLimits{MaxDisrupted: num(1), CoSchedule: true}),
			wantWaiting: map[string]string{"b0": "domain rack-b: maxDisruptedDomains reached: 1/1 domains disrupted"},
			wantDomains: [3]int{2, 1, 1},
		},
		"a node in no domain keeps its rank among undisrupted domains": {
			nodes: joinNodes(racksAB, rack("", "plain")),
			objects: []PlanObject{pending("plain", "plain", "r", 90), pending("a0", "a0", "r", 60),
				pending("b0", "b0", "r", 50), pending("a1", "a1", "r", 10)},
			limits:        withDomains(Limits{MaxParallelOperations: num(3)}, coSchedule()),
			wantScheduled: []string{"plain", "a0", "a1"},
			wantWaiting:   map[string]string{"b0": "maxParallelOperations reached: 3/3 nodes in maintenance"},
			wantDomains:   [3]int{2, -1, 0},
		},
		"a node in no domain yields a free slot to a disrupted domain": {
			nodes: joinNodes(racksAB, rack("", "plain")),
			objects: []PlanObject{inProgress("a0", "a0", "r"), pending("plain", "plain", "r", 90),
				pending("a1", "a1", "r", 10)},
			limits:        withDomains(Limits{MaxParallelOperations: num(2)}, coSchedule()),
			wantScheduled: []string{"a1"},
			wantWaiting:   map[string]string{"plain": "maxParallelOperations reached: 2/2 nodes in maintenance"},
			wantDomains:   [3]int{2, -1, 1},
		},
		"a domain split across pools: each pool's limit holds, the leftover slot goes on": {
			nodes: inPools(inPools(racksAB, "p1", 0, 1), "p2", 2),
			objects: []PlanObject{inProgress("a0", "a0", "r"), pending("b0", "b0", "r", 60),
				pending("a1", "a1", "r", 20), pending("a2", "a2", "r", 10)},
			limits: withDomains(Limits{MaxParallelOperations: num(3), Pools: []PoolLimits{
				{Name: "p1", MaxParallelOperations: num(1)}, {Name: "p2", MaxParallelOperations: num(1)}}}, coSchedule()),
			wantScheduled: []string{"a2", "b0"},
			wantWaiting: map[string]string{
				"a1": "domain rack-a: waiting to co-schedule with a0, a2 (pool p1: maxParallelOperations reached: 1/1 nodes in maintenance)",
			},
			wantDomains: [3]int{2, -1, 1},
		},
		"maxUnavailable holds while co-scheduling": {
			nodes: racksAB,
			objects: []PlanObject{inProgress("a0", "a0", "r"), pending("b0", "b0", "r", 60),
				pending("a1", "a1", "r", 20), pending("a2", "a2", "r", 10)},
			limits:        withDomains(Limits{MaxParallelOperations: num(5), MaxUnavailable: num(2)}, coSchedule()),
			wantScheduled: []string{"a1"},
			wantWaiting: map[string]string{
				"a2": "domain rack-a: waiting to co-schedule with a0, a1 (maxUnavailable budget exhausted: 2/2 nodes unavailable)",
				"b0": "maxUnavailable budget exhausted: 2/2 nodes unavailable",
			},
			wantDomains: [3]int{2, -1, 1},
		},
		"a closed window: a disrupted domain's request waits for the window like every other": {
			nodes:         racksAB,
			objects:       []PlanObject{inProgress("a0", "a0", "r"), pending("a1", "a1", "r", 20)},
			limits:        withDomains(Limits{MaxParallelOperations: num(5), Calendar: nightly}, coSchedule()),
			wantScheduled: nil,
			wantWaiting: map[string]string{
				"a1": "domain rack-a: waiting to co-schedule with a0 (outside maintenance window; next opens 2026-01-01T01:00:00Z)",
			},
			wantDomains: [3]int{2, -1, 1},
		},
		"coSchedule false: the ranking stays node by node, the domain budget applies": {
			nodes: racksABC, objects: append([]PlanObject{pending("c0", "c0", "r", 45)}, interleaved...),
			limits:        withDomains(Limits{MaxParallelOperations: num(4)}, &DomainLimits{MaxDisrupted: num(2)}),
			wantScheduled: []string{"a0", "b0", "a1", "b1"},
			wantWaiting: map[string]string{
				"c0": "domain rack-c: maxDisruptedDomains reached: 2/2 domains disrupted",
				"a2": "maxParallelOperations reached: 4/4 nodes in maintenance",
			},
			wantDomains: [3]int{3, 2, 0},
		},
		"a busy domain (a ComputeDomain's workload runs there) starts after the idle ones and says what runs there": {
			nodes:         joinNodes(busyRack("rack-a", "ml/train", "a0", "a1", "a2"), rack("rack-b", "b0", "b1", "b2")),
			objects:       interleaved,
			limits:        withDomains(Limits{MaxParallelOperations: num(3)}, coSchedule()),
			wantScheduled: []string{"b0", "b1", "b2"},
			wantWaiting: map[string]string{
				"a0": "maxParallelOperations reached: 3/3 nodes in maintenance; domain rack-a runs ComputeDomain ml/train",
			},
			wantDomains: [3]int{2, -1, 0},
		},
		"a busy domain that is disrupted already still co-schedules first": {
			nodes: joinNodes(busyRack("rack-a", "ml/train", "a0", "a1", "a2"), rack("rack-b", "b0", "b1", "b2")),
			objects: []PlanObject{inProgress("a0", "a0", "r"), pending("b0", "b0", "r", 60),
				pending("a1", "a1", "r", 10), pending("a2", "a2", "r", 5)},
			limits:        withDomains(Limits{MaxParallelOperations: num(2)}, coSchedule()),
			wantScheduled: []string{"a1"},
			wantWaiting: map[string]string{
				"a2": "domain rack-a: waiting to co-schedule with a0, a1 (maxParallelOperations reached: 2/2 nodes in maintenance); domain rack-a runs ComputeDomain ml/train",
				"b0": "maxParallelOperations reached: 2/2 nodes in maintenance",
			},
			wantDomains: [3]int{2, -1, 1},
		},
		"a busy domain is the only one with requests: it starts (busy is a preference, not a hold)": {
			nodes:         busyRack("rack-a", "ml/train", "a0", "a1"),
			objects:       []PlanObject{pending("a0", "a0", "r", 60), pending("a1", "a1", "r", 50)},
			limits:        withDomains(Limits{MaxParallelOperations: num(2)}, coSchedule()),
			wantScheduled: []string{"a0", "a1"},
			wantDomains:   [3]int{1, -1, 0},
		},
		"an undisrupted domain's requests are collected for collectSeconds, then start together": {
			nodes: racksAB,
			objects: []PlanObject{pending("a0", "a0", "r", 3), pending("a1", "a1", "r", 1),
				pending("b0", "b0", "r", 20), pending("b1", "b1", "r", 2)},
			limits:        withDomains(Limits{MaxParallelOperations: num(6)}, &DomainLimits{CoSchedule: true, Collect: 10 * time.Second}),
			wantScheduled: []string{"b0", "b1"},
			wantWaiting: map[string]string{
				"a0": "domain rack-a: collecting its requests to start them together (collectSeconds 10, until 2026-01-01T00:00:07Z)",
				"a1": "domain rack-a: collecting its requests to start them together (collectSeconds 10, until 2026-01-01T00:00:07Z)",
			},
			wantDomains: [3]int{2, -1, 0},
		},
		"a domain whose every node has a request has nothing left to collect: it starts at once": {
			nodes: joinNodes(rack("rack-a", "a0", "a1"), rack("rack-b", "b0", "b1")),
			objects: []PlanObject{pending("a0", "a0", "r", 2), pending("a1", "a1", "r", 1),
				pending("b0", "b0", "r", 1)},
			limits:        withDomains(Limits{MaxParallelOperations: num(6)}, &DomainLimits{CoSchedule: true, Collect: 10 * time.Second}),
			wantScheduled: []string{"a0", "a1"},
			wantWaiting: map[string]string{
				"b0": "domain rack-b: collecting its requests to start them together (collectSeconds 10, until 2026-01-01T00:00:09Z)",
			},
			wantDomains: [3]int{2, -1, 0},
		},
		"collecting holds neither a disrupted domain nor an urgent request (whose domain the others then join)": {
			nodes: racksAB,
			objects: []PlanObject{inProgress("a0", "a0", "r"), pending("a1", "a1", "r", 1),
				urgent(pending("b0", "b0", "r", 1)), pending("b1", "b1", "r", 1)},
			limits:        withDomains(Limits{MaxParallelOperations: num(6)}, &DomainLimits{CoSchedule: true, Collect: 10 * time.Second}),
			wantScheduled: []string{"b0", "a1", "b1"},
			wantDomains:   [3]int{2, -1, 1},
		},
		"a request of one node never drags in a node without a request": {
			nodes:         racksAB,
			objects:       []PlanObject{pending("a0", "a0", "r", 60)},
			limits:        withDomains(Limits{MaxParallelOperations: num(6)}, coSchedule()),
			wantScheduled: []string{"a0"},
			wantDomains:   [3]int{2, -1, 0},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := Snapshot{Nodes: tt.nodes, Objects: tt.objects}
			p, err := MakePlan(s, tt.limits, t0)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantScheduled, scheduledNames(p)); diff != "" {
				t.Errorf("scheduled (-want +got):\n%s", diff)
			}
			for name, want := range tt.wantWaiting {
				if got := p.Waiting["default/"+name]; got != want {
					t.Errorf("waiting %s:\n got %q\nwant %q", name, got, want)
				}
			}
			if got := [3]int{p.TotalDomains, p.MaxDisruptedDomains, p.DisruptedDomains}; got != tt.wantDomains {
				t.Errorf("domains (total, max, disrupted) = %v, want %v", got, tt.wantDomains)
			}
		})
	}
}

func TestMakePlanDomainsRejectsBadBudget(t *testing.T) {
	for _, v := range []string{"150%", "abc", "-10%"} {
		l := Limits{Domains: &DomainLimits{MaxDisrupted: pct(v)}}
		_, err := MakePlan(Snapshot{Nodes: rack("rack-a", "a0")}, l, t0)
		if err == nil {
			t.Errorf("maxDisruptedDomains %q accepted", v)
		}
	}
	if _, err := MakePlan(Snapshot{Nodes: rack("rack-a", "a0")}, Limits{Domains: &DomainLimits{MaxDisrupted: num(-1)}}, t0); err == nil {
		t.Error("maxDisruptedDomains -1 accepted")
	}
}

// A cluster whose nodes are in no domain is planned as without
// spec.domains, whatever its limits.
func TestMakePlanDomainsWithoutDomainNodes(t *testing.T) {
	for seed := range uint64(50) {
		s := randomSnapshot(30, 40, 5, seed)
		for i := range s.Objects {
			s.Objects[i].Urgent = seed>>uint(i%8)&1 == 1
		}
		l := Limits{MaxParallelOperations: num(int(seed % 7)), MaxUnavailable: num(int(seed % 5))}
		want, err := MakePlan(s, l, t0)
		if err != nil {
			t.Fatal(err)
		}
		l.Domains = &DomainLimits{MaxDisrupted: num(1), CoSchedule: true}
		got, err := MakePlan(s, l, t0)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want.Schedule, got.Schedule); diff != "" {
			t.Fatalf("seed %d: schedule (-without +with domains):\n%s", seed, diff)
		}
		if diff := cmp.Diff(want.Waiting, got.Waiting); diff != "" {
			t.Fatalf("seed %d: waiting (-without +with domains):\n%s", seed, diff)
		}
	}
}

func TestCompileConfigDomains(t *testing.T) {
	spec := &maintenancev1.MaintenanceOperatorConfigSpec{Domains: &maintenancev1.MaintenanceDomains{NodeLabel: "nvidia.com/gpu.clique"}}
	c, err := CompileConfig(spec)
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.Domains == nil || !c.Limits.Domains.CoSchedule || c.Limits.Domains.MaxDisrupted != nil {
		t.Errorf("domains = %+v, want coSchedule by default and no budget", c.Limits.Domains)
	}
	if got := c.DomainOf(map[string]string{"nvidia.com/gpu.clique": "rack-7.1", "other": "x"}); got != "rack-7.1" {
		t.Errorf("DomainOf = %q", got)
	}
	if got := c.DomainOf(map[string]string{"other": "x"}); got != "" {
		t.Errorf("DomainOf without the label = %q", got)
	}
	spec.Domains.CoSchedule = ptr.To(false)
	spec.Domains.MaxDisruptedDomains = pct("25%")
	if c, err = CompileConfig(spec); err != nil || c.Limits.Domains.CoSchedule || c.Limits.Domains.MaxDisrupted == nil {
		t.Errorf("coSchedule false, 25%%: %+v, %v", c.Limits.Domains, err)
	}
	if c, _ := CompileConfig(&maintenancev1.MaintenanceOperatorConfigSpec{}); c.Limits.Domains != nil || c.DomainOf(map[string]string{"nvidia.com/gpu.clique": "a"}) != "" {
		t.Error("without spec.domains a node has a domain")
	}
	spec.Domains.NodeLabel = "bad label"
	spec.Domains.MaxDisruptedDomains = pct("150%")
	_, err = CompileConfig(spec)
	if err == nil || !strings.Contains(err.Error(), "domains: nodeLabel") || !strings.Contains(err.Error(), "domains: maxDisruptedDomains") {
		t.Errorf("bad domains config: %v", err)
	}
}

// TestDisruptedDomains: the domains with a node in maintenance (in
// progress), before a pass; nodes in no domain and pending objects count
// for none.
func TestDisruptedDomains(t *testing.T) {
	snap := Snapshot{
		Nodes: []PlanNode{{Name: "a1", Domain: "rack-a"}, {Name: "a2", Domain: "rack-a"}, {Name: "b1", Domain: "rack-b"}, {Name: "c1", Domain: "rack-c"}, {Name: "x"}},
		Objects: []PlanObject{{Name: "1", NodeName: "a1", InProgress: true}, {Name: "2", NodeName: "a2", InProgress: true},
			{Name: "3", NodeName: "b1"}, {Name: "4", NodeName: "x", InProgress: true}, {Name: "5", NodeName: "c1", InProgress: true}},
	}
	got := disruptedDomains(snap, snap.domainOf())
	if len(got) != 2 || !got["rack-a"] || !got["rack-c"] {
		t.Errorf("disrupted %v, want rack-a and rack-c", got)
	}
}
