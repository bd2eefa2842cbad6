package maintenance

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// inPools puts nodes idx into pool.
func inPools(ns []PlanNode, pool string, idx ...int) []PlanNode {
	out := slices.Clone(ns)
	for _, i := range idx {
		out[i].Pools = append(slices.Clone(out[i].Pools), pool)
	}
	return out
}

func urgent(o PlanObject) PlanObject { o.Urgent = true; return o }

// Windows, pools and urgency (gpufleet's additions to the Maintenance Operator's scheduling).
func TestMakePlanWindowsPoolsUrgency(t *testing.T) {
	// t0 is Thursday 2026-01-01 00:00 UTC.
	nightly := Calendar{Windows: []Window{mustWindow(t, "0 1 * * *", 4*time.Hour, "UTC")}}  // closed at t0, opens 01:00
	midnight := Calendar{Windows: []Window{mustWindow(t, "0 0 * * *", 4*time.Hour, "UTC")}} // open at t0
	freeze := Calendar{Windows: midnight.Windows, Exclusions: []Exclusion{{Name: "freeze", Start: t0.Add(-time.Hour), End: t0.Add(48 * time.Hour)}}}
	h200 := func(ns []PlanNode) []PlanNode { return inPools(ns, "h200", 0, 1, 2, 3) } // 4 of 10 nodes

	tests := map[string]struct {
		nodes         []PlanNode
		objects       []PlanObject
		limits        Limits
		wantScheduled []string
		wantWaiting   map[string]string
	}{
		"outside the window nothing new is scheduled, and the message names the next opening": {
			nodes:   nodes(10),
			limits:  Limits{MaxParallelOperations: num(5), Calendar: nightly},
			objects: []PlanObject{pending("a", "node-0", "r", 5), pending("b", "node-1", "r", 4)},
			wantWaiting: map[string]string{
				"a": "outside maintenance window; next opens 2026-01-01T01:00:00Z",
				"b": "outside maintenance window; next opens 2026-01-01T01:00:00Z",
			},
		},
		"inside the window the limits decide as before": {
			nodes:         nodes(10),
			limits:        Limits{MaxParallelOperations: num(1), Calendar: midnight},
			objects:       []PlanObject{pending("a", "node-0", "r", 5), pending("b", "node-1", "r", 4)},
			wantScheduled: []string{"a"},
			wantWaiting:   map[string]string{"b": "maxParallelOperations reached: 1/1 nodes in maintenance"},
		},
		"in-progress work is untouched outside the window (it still takes its slot)": {
			nodes:       nodes(10),
			limits:      Limits{MaxParallelOperations: num(2), Calendar: nightly},
			objects:     []PlanObject{inProgress("running", "node-0", "r"), pending("b", "node-1", "r", 4)},
			wantWaiting: map[string]string{"b": "outside maintenance window; next opens 2026-01-01T01:00:00Z"},
		},
		"an exclusion holds back work inside a window": {
			nodes:       nodes(10),
			limits:      Limits{MaxParallelOperations: num(2), Calendar: freeze},
			objects:     []PlanObject{pending("a", "node-0", "r", 4)},
			wantWaiting: map[string]string{"a": `in maintenance exclusion "freeze" until 2026-01-03T00:00:00Z; next opens 2026-01-03T00:00:00Z`},
		},
		"an urgent request of a NotReady node passes a closed window": {
			nodes:         withNotReady(nodes(10), 3),
			limits:        Limits{MaxParallelOperations: num(2), Calendar: nightly},
			objects:       []PlanObject{pending("planned", "node-0", "r", 9), urgent(pending("repair", "node-3", "repair", 1))},
			wantScheduled: []string{"repair"},
			wantWaiting:   map[string]string{"planned": "outside maintenance window; next opens 2026-01-01T01:00:00Z"},
		},
		"an urgent request of a cordoned node passes an exclusion": {
			nodes:         withUnavailable(nodes(10), 3),
			limits:        Limits{MaxParallelOperations: num(2), Calendar: freeze},
			objects:       []PlanObject{urgent(pending("repair", "node-3", "repair", 1))},
			wantScheduled: []string{"repair"},
		},
		"an urgent request of an available node waits for the window (default scope)": {
			nodes:   nodes(10),
			limits:  Limits{MaxParallelOperations: num(2), Calendar: nightly},
			objects: []PlanObject{urgent(pending("repair", "node-3", "repair", 1))},
			wantWaiting: map[string]string{"repair": "outside maintenance window; next opens 2026-01-01T01:00:00Z (urgent, but its node is available: " +
				"urgent requests pass a closed window only for nodes that are already unavailable)"},
		},
		"with urgentMaintenance AllNodes an urgent request of an available node passes": {
			nodes:         nodes(10),
			limits:        Limits{MaxParallelOperations: num(2), Calendar: nightly, UrgentScope: maintenancev1.UrgentAllNodes},
			objects:       []PlanObject{urgent(pending("repair", "node-3", "repair", 1))},
			wantScheduled: []string{"repair"},
		},
		"urgency does not pass the limits": {
			nodes:       withNotReady(nodes(10), 3),
			limits:      Limits{MaxParallelOperations: num(1), Calendar: nightly},
			objects:     []PlanObject{inProgress("running", "node-0", "r"), urgent(pending("repair", "node-3", "repair", 1))},
			wantWaiting: map[string]string{"repair": "maxParallelOperations reached: 1/1 nodes in maintenance"},
		},
		"urgent requests rank first when slots are scarce": {
			nodes:         withNotReady(nodes(10), 5),
			limits:        Limits{MaxParallelOperations: num(1)},
			objects:       []PlanObject{pending("old", "node-0", "r", 100), urgent(pending("repair", "node-5", "repair", 1))},
			wantScheduled: []string{"repair"},
			wantWaiting:   map[string]string{"old": "maxParallelOperations reached: 1/1 nodes in maintenance"},
		},
		"a pool's parallel limit holds while the cluster has room; nodes outside it go on": {
			nodes:  h200(nodes(10)),
			limits: Limits{MaxParallelOperations: num(5), Pools: []PoolLimits{{Name: "h200", MaxParallelOperations: num(1)}}},
			objects: []PlanObject{pending("h0", "node-0", "r", 9), pending("h1", "node-1", "r", 8),
				pending("c5", "node-5", "r", 7), pending("c6", "node-6", "r", 6)},
			wantScheduled: []string{"h0", "c5", "c6"},
			wantWaiting:   map[string]string{"h1": "pool h200: maxParallelOperations reached: 1/1 nodes in maintenance"},
		},
		"in-progress work counts against its pool": {
			nodes:       h200(nodes(10)),
			limits:      Limits{MaxParallelOperations: num(5), Pools: []PoolLimits{{Name: "h200", MaxParallelOperations: num(1)}}},
			objects:     []PlanObject{inProgress("running", "node-2", "r"), pending("h0", "node-0", "r", 9)},
			wantWaiting: map[string]string{"h0": "pool h200: maxParallelOperations reached: 1/1 nodes in maintenance"},
		},
		"a pool's percentage is of the pool's nodes (25% of 4 = 1 unavailable)": {
			nodes:         withNotReady(h200(nodes(10)), 3),
			limits:        Limits{MaxParallelOperations: num(5), Pools: []PoolLimits{{Name: "h200", MaxUnavailable: pct("25%")}}},
			objects:       []PlanObject{pending("h0", "node-0", "r", 9), pending("h3", "node-3", "r", 8), pending("c7", "node-7", "r", 7)},
			wantScheduled: []string{"h3", "c7"}, // h3's node is already unavailable
			wantWaiting:   map[string]string{"h0": "pool h200: maxUnavailable budget exhausted: 1/1 nodes unavailable"},
		},
		"the cluster-wide limit still holds when the pool has room": {
			nodes:         h200(nodes(10)),
			limits:        Limits{MaxParallelOperations: num(1), Pools: []PoolLimits{{Name: "h200", MaxParallelOperations: num(3)}}},
			objects:       []PlanObject{pending("h0", "node-0", "r", 9), pending("h1", "node-1", "r", 8)},
			wantScheduled: []string{"h0"},
			wantWaiting:   map[string]string{"h1": "maxParallelOperations reached: 1/1 nodes in maintenance"},
		},
		"a node in two pools needs room in both": {
			nodes: inPools(h200(nodes(10)), "rack-a", 1, 5),
			limits: Limits{MaxParallelOperations: num(5), Pools: []PoolLimits{
				{Name: "h200", MaxParallelOperations: num(2)}, {Name: "rack-a", MaxParallelOperations: num(1)}}},
			objects:       []PlanObject{pending("r5", "node-5", "r", 9), pending("h1", "node-1", "r", 8), pending("h0", "node-0", "r", 7)},
			wantScheduled: []string{"r5", "h0"},
			wantWaiting:   map[string]string{"h1": "pool rack-a: maxParallelOperations reached: 1/1 nodes in maintenance"},
		},
		"a pool with maxParallelOperations 0 is frozen": {
			nodes:         h200(nodes(10)),
			limits:        Limits{MaxParallelOperations: num(5), Pools: []PoolLimits{{Name: "h200", MaxParallelOperations: num(0)}}},
			objects:       []PlanObject{pending("h0", "node-0", "r", 9), pending("c9", "node-9", "r", 1)},
			wantScheduled: []string{"c9"},
			wantWaiting:   map[string]string{"h0": "pool h200: maxParallelOperations is 0: no new maintenance is scheduled in it"},
		},
		"a pool-blocked request does not use a cluster slot": {
			nodes:         h200(nodes(10)),
			limits:        Limits{MaxParallelOperations: num(2), Pools: []PoolLimits{{Name: "h200", MaxParallelOperations: num(1)}}},
			objects:       []PlanObject{pending("h0", "node-0", "r", 9), pending("h1", "node-1", "r", 8), pending("c9", "node-9", "r", 1)},
			wantScheduled: []string{"h0", "c9"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := MakePlan(Snapshot{Nodes: tc.nodes, Objects: tc.objects}, tc.limits, t0)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantScheduled, scheduledNames(p)); diff != "" {
				t.Errorf("scheduled (-want +got):\n%s", diff)
			}
			for n, want := range tc.wantWaiting {
				if got := p.Waiting["default/"+n]; got != want {
					t.Errorf("waiting[%s] = %q,\n want %q", n, got, want)
				}
			}
		})
	}
}

// FuzzMakePlanPools: with pools, a closed window and urgent objects, no
// pool exceeds its limits, nothing but an urgent object of an unavailable
// node starts while the window is closed, and the plan does not depend on
// the order of its input.
func FuzzMakePlanPools(f *testing.F) {
	f.Add(uint8(20), uint8(30), uint8(3), uint8(2), uint8(1), uint64(1), true)
	f.Add(uint8(5), uint8(9), uint8(0), uint8(0), uint8(3), uint64(7), false)
	f.Fuzz(func(t *testing.T, nNodes, nObjects, nInProgress, poolPar, poolUnavail uint8, seed uint64, closed bool) {
		s := randomSnapshot(int(nNodes), int(nObjects), int(nInProgress), seed)
		for i := range s.Nodes {
			if i%3 == 0 {
				s.Nodes[i].Pools = []string{"a"}
			}
			if i%4 == 0 {
				s.Nodes[i].Pools = append(s.Nodes[i].Pools, "b")
			}
		}
		for i := range s.Objects {
			s.Objects[i].Urgent = (seed>>uint(i%64))&1 == 1
		}
		l := Limits{MaxParallelOperations: num(int(nNodes)), Pools: []PoolLimits{
			{Name: "a", MaxParallelOperations: num(int(poolPar % 5))},
			{Name: "b", MaxUnavailable: pct(fmt.Sprintf("%d%%", int(poolUnavail)%101))},
		}}
		if closed {
			l.Calendar = Calendar{Windows: []Window{mustWindow(t, "0 12 * * *", time.Hour, "UTC")}}
		}
		p, err := MakePlan(s, l, t0)
		if err != nil {
			t.Fatal(err)
		}
		nodes := map[string]PlanNode{}
		for _, n := range s.Nodes {
			nodes[n.Name] = n
		}
		for _, pp := range p.Pools {
			started, newly := 0, 0
			for _, o := range p.Schedule {
				n := nodes[o.NodeName]
				if !slices.Contains(n.Pools, pp.Name) {
					continue
				}
				started++
				if n.available() {
					newly++
				}
			}
			if pp.MaxParallel >= 0 && started > 0 && pp.InProgress+started > pp.MaxParallel {
				t.Fatalf("pool %s: %d in progress + %d started > %d", pp.Name, pp.InProgress, started, pp.MaxParallel)
			}
			if pp.MaxUnavailable >= 0 && newly > 0 && pp.Unavailable+newly > pp.MaxUnavailable {
				t.Fatalf("pool %s: %d unavailable + %d newly > %d", pp.Name, pp.Unavailable, newly, pp.MaxUnavailable)
			}
		}
		for _, o := range p.Schedule {
			if closed && (!o.Urgent || nodes[o.NodeName].available()) {
				t.Fatalf("%s scheduled while the window is closed", o.Key())
			}
		}
		shuffled := s
		shuffled.Objects = slices.Clone(s.Objects)
		slices.Reverse(shuffled.Objects)
		p2, err := MakePlan(shuffled, l, t0)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(p, p2, cmp.AllowUnexported(Window{}), cmp.Comparer(func(a, b *time.Location) bool { return a.String() == b.String() })); diff != "" {
			t.Fatalf("plan depends on input order:\n%s", diff)
		}
	})
}
