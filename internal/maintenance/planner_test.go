package maintenance

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Builders.

func nodes(n int) []PlanNode {
	out := make([]PlanNode, n)
	for i := range out {
		out[i] = PlanNode{Name: fmt.Sprintf("node-%d", i), Ready: true}
	}
	return out
}

func withUnavailable(ns []PlanNode, idx ...int) []PlanNode {
	out := slices.Clone(ns)
	for _, i := range idx {
		out[i].Unschedulable = true
	}
	return out
}

func withNotReady(ns []PlanNode, idx ...int) []PlanNode {
	out := slices.Clone(ns)
	for _, i := range idx {
		out[i].Ready = false
	}
	return out
}

func pending(name, node, requestor string, ageSec int) PlanObject {
	return PlanObject{Namespace: "default", Name: name, NodeName: node, RequestorID: requestor, Created: t0.Add(-time.Duration(ageSec) * time.Second)}
}

func inProgress(name, node, requestor string) PlanObject {
	o := pending(name, node, requestor, 1000)
	o.InProgress = true
	return o
}

func ptrIOS(v intstr.IntOrString) *intstr.IntOrString { return &v }
func num(n int) *intstr.IntOrString                   { return ptrIOS(intstr.FromInt32(int32(n))) }
func pct(s string) *intstr.IntOrString                { return ptrIOS(intstr.FromString(s)) }

func scheduledNames(p Plan) []string {
	var out []string
	for _, o := range p.Schedule {
		out = append(out, o.Name)
	}
	return out
}

func TestMakePlan(t *testing.T) {
	tests := map[string]struct {
		nodes   []PlanNode
		objects []PlanObject
		limits  Limits
		// wantScheduled is in rank order.
		wantScheduled []string
		// wantWaiting maps names to reasons (only those listed are checked).
		wantWaiting map[string]string
		wantSlots   int
		wantBudget  int
	}{
		// The worked examples of requirement M4 (docs/requirements.md), in the
		// order of its table.
		"M4 example 1: 3 slots, budget 1, two requests on unavailable nodes and one on an available node": {
			nodes:  withNotReady(withUnavailable(nodes(10), 0), 1),
			limits: Limits{MaxParallelOperations: num(3), MaxUnavailable: num(3)},
			objects: []PlanObject{
				pending("a", "node-0", "r", 30), pending("b", "node-1", "r", 20), pending("c", "node-2", "r", 10),
			},
			wantScheduled: []string{"a", "b", "c"},
			wantSlots:     3, wantBudget: 1,
		},
		"M4 example 2: 3 slots, budget 1, three requests on available nodes": {
			nodes:  withUnavailable(nodes(10), 8, 9),
			limits: Limits{MaxParallelOperations: num(3), MaxUnavailable: num(3)},
			objects: []PlanObject{
				pending("a", "node-0", "r", 30), pending("b", "node-1", "r", 20), pending("c", "node-2", "r", 10),
			},
			wantScheduled: []string{"a"},
			wantWaiting: map[string]string{
				"b": "maxUnavailable budget exhausted: 3/3 nodes unavailable",
				"c": "maxUnavailable budget exhausted: 3/3 nodes unavailable",
			},
			wantSlots: 3, wantBudget: 1,
		},
		"M4 example 3: 10 available nodes, maxParallel 2, maxUnavailable 5, 5 pending": {
			nodes:  nodes(10),
			limits: Limits{MaxParallelOperations: num(2), MaxUnavailable: num(5)},
			objects: []PlanObject{
				pending("a", "node-0", "r", 50), pending("b", "node-1", "r", 40), pending("c", "node-2", "r", 30),
				pending("d", "node-3", "r", 20), pending("e", "node-4", "r", 10),
			},
			wantScheduled: []string{"a", "b"},
			wantWaiting:   map[string]string{"c": "maxParallelOperations reached: 2/2 nodes in maintenance"},
			wantSlots:     2, wantBudget: 5,
		},
		"M4 example 4: 2 of 10 unavailable, maxParallel 5, maxUnavailable 3, 3 pending on available nodes": {
			nodes:  withNotReady(withUnavailable(nodes(10), 8), 9),
			limits: Limits{MaxParallelOperations: num(5), MaxUnavailable: num(3)},
			objects: []PlanObject{
				pending("a", "node-0", "r", 30), pending("b", "node-1", "r", 20), pending("c", "node-2", "r", 10),
			},
			wantScheduled: []string{"a"},
			wantSlots:     5, wantBudget: 1,
		},
		"a skipped candidate does not waste a slot: later request on an unavailable node still scheduled": {
			nodes:  withUnavailable(nodes(5), 4),
			limits: Limits{MaxParallelOperations: num(2), MaxUnavailable: num(2)},
			objects: []PlanObject{
				pending("a", "node-0", "r", 50), pending("b", "node-1", "r", 40), pending("c", "node-2", "r", 30),
				pending("d", "node-4", "r", 10),
			},
			// budget 1: a takes it; b and c skipped; d on an unavailable node uses the second slot.
			wantScheduled: []string{"a", "d"},
			wantWaiting:   map[string]string{"b": "maxUnavailable budget exhausted: 2/2 nodes unavailable"},
			wantSlots:     2, wantBudget: 1,
		},
		"default maxParallelOperations is 1": {
			nodes:         nodes(3),
			objects:       []PlanObject{pending("a", "node-0", "r", 2), pending("b", "node-1", "r", 1)},
			wantScheduled: []string{"a"},
			wantSlots:     1, wantBudget: -1,
		},
		"maxParallelOperations 0 schedules nothing": {
			nodes:         nodes(3),
			limits:        Limits{MaxParallelOperations: num(0)},
			objects:       []PlanObject{pending("a", "node-0", "r", 2)},
			wantScheduled: nil,
			wantWaiting:   map[string]string{"a": "maxParallelOperations is 0: no new maintenance is scheduled"},
			wantSlots:     0, wantBudget: -1,
		},
		"maxUnavailable 0 only lets already-unavailable nodes continue": {
			nodes:  withNotReady(withUnavailable(nodes(4), 1), 2),
			limits: Limits{MaxParallelOperations: num(10), MaxUnavailable: num(0)},
			objects: []PlanObject{
				pending("a", "node-0", "r", 40), pending("b", "node-1", "r", 30), pending("c", "node-2", "r", 20), pending("d", "node-3", "r", 10),
			},
			wantScheduled: []string{"b", "c"},
			wantWaiting: map[string]string{
				"a": "maxUnavailable budget exhausted: 2/0 nodes unavailable",
				"d": "maxUnavailable budget exhausted: 2/0 nodes unavailable",
			},
			wantSlots: 4, wantBudget: 0,
		},
		"unset maxUnavailable: no limit": {
			nodes:         withUnavailable(nodes(3), 0, 1),
			limits:        Limits{MaxParallelOperations: num(3)},
			objects:       []PlanObject{pending("a", "node-0", "r", 3), pending("b", "node-1", "r", 2), pending("c", "node-2", "r", 1)},
			wantScheduled: []string{"a", "b", "c"},
			wantSlots:     3, wantBudget: -1,
		},
		"percent maxParallelOperations rounds up, maxUnavailable rounds down": {
			// 10 nodes: 15% -> 2 slots (1.5 up); 25% -> 2 unavailable (2.5 down).
			nodes:  nodes(10),
			limits: Limits{MaxParallelOperations: pct("15%"), MaxUnavailable: pct("25%")},
			objects: []PlanObject{
				pending("a", "node-0", "r", 4), pending("b", "node-1", "r", 3), pending("c", "node-2", "r", 2),
			},
			wantScheduled: []string{"a", "b"},
			wantSlots:     2, wantBudget: 2,
		},
		"small percentages: 1% of 10 nodes is 1 slot but 0 unavailable": {
			nodes:         nodes(10),
			limits:        Limits{MaxParallelOperations: pct("1%"), MaxUnavailable: pct("1%")},
			objects:       []PlanObject{pending("a", "node-0", "r", 1)},
			wantScheduled: nil,
			wantWaiting:   map[string]string{"a": "maxUnavailable budget exhausted: 0/0 nodes unavailable"},
			wantSlots:     1, wantBudget: 0,
		},
		"100% and 0%": {
			nodes:         nodes(2),
			limits:        Limits{MaxParallelOperations: pct("100%"), MaxUnavailable: pct("0%")},
			objects:       []PlanObject{pending("a", "node-0", "r", 1)},
			wantScheduled: nil,
			wantSlots:     2, wantBudget: 0,
		},
		"in-progress objects consume slots and make their nodes unavailable": {
			nodes:  nodes(10),
			limits: Limits{MaxParallelOperations: num(3), MaxUnavailable: num(3)},
			objects: []PlanObject{
				inProgress("x", "node-5", "r"), inProgress("y", "node-6", "r"),
				pending("a", "node-0", "r", 2), pending("b", "node-1", "r", 1),
			},
			wantScheduled: []string{"a"},
			wantWaiting:   map[string]string{"b": "maxParallelOperations reached: 3/3 nodes in maintenance"},
			wantSlots:     1, wantBudget: 1,
		},
		"a node counts once even if cordoned, NotReady and in maintenance": {
			nodes:  withNotReady(withUnavailable(nodes(5), 0), 0),
			limits: Limits{MaxParallelOperations: num(5), MaxUnavailable: num(2)},
			objects: []PlanObject{
				inProgress("x", "node-0", "r"),
				pending("a", "node-1", "r", 1),
			},
			wantScheduled: []string{"a"},
			wantSlots:     4, wantBudget: 1,
		},
		"two in-progress objects on one node take one slot": {
			nodes:  nodes(5),
			limits: Limits{MaxParallelOperations: num(2)},
			objects: []PlanObject{
				inProgress("x", "node-0", "r1"), inProgress("y", "node-0", "r2"),
				pending("a", "node-1", "r1", 1),
			},
			wantScheduled: []string{"a"},
			wantSlots:     1, wantBudget: -1,
		},
		"pending on a node held by an in-progress object is not a candidate": {
			nodes:         nodes(5),
			limits:        Limits{MaxParallelOperations: num(5)},
			objects:       []PlanObject{inProgress("x", "node-0", "r1"), pending("a", "node-0", "r2", 1)},
			wantScheduled: nil,
			wantWaiting:   map[string]string{"a": "node node-0 is in maintenance for default/x"},
			wantSlots:     4, wantBudget: -1,
		},
		"two pending requests for one node: only the best-ranked is scheduled": {
			nodes:         nodes(5),
			limits:        Limits{MaxParallelOperations: num(5)},
			objects:       []PlanObject{pending("new", "node-0", "r1", 1), pending("old", "node-0", "r2", 100)},
			wantScheduled: []string{"old"},
			wantWaiting:   map[string]string{"new": "another request for node node-0 ranks higher (default/old)"},
			wantSlots:     5, wantBudget: -1,
		},
		"object for a node that does not exist waits and uses no slot": {
			nodes:         nodes(2),
			objects:       []PlanObject{pending("ghost", "node-9", "r", 100), pending("a", "node-0", "r", 1)},
			wantScheduled: []string{"a"},
			wantWaiting:   map[string]string{"ghost": "node node-9 does not exist"},
			wantSlots:     1, wantBudget: -1,
		},
		"rank: requestor with an in-progress object first, even if younger": {
			nodes:  nodes(5),
			limits: Limits{MaxParallelOperations: num(2)},
			objects: []PlanObject{
				inProgress("x", "node-4", "active"),
				pending("old", "node-0", "idle", 100), pending("young", "node-1", "active", 1),
			},
			wantScheduled: []string{"young"},
			wantSlots:     1, wantBudget: -1,
		},
		"rank: requestor with fewer pending objects first": {
			nodes:  nodes(6),
			limits: Limits{MaxParallelOperations: num(1)},
			objects: []PlanObject{
				pending("many-1", "node-0", "many", 100), pending("many-2", "node-1", "many", 100), pending("many-3", "node-2", "many", 100),
				pending("few-1", "node-3", "few", 1),
			},
			wantScheduled: []string{"few-1"},
			wantSlots:     1, wantBudget: -1,
		},
		"rank: pending count includes objects on busy nodes": {
			nodes:  nodes(6),
			limits: Limits{MaxParallelOperations: num(2)},
			objects: []PlanObject{
				inProgress("x", "node-5", "r3"),
				pending("r1-a", "node-0", "r1", 1), pending("r1-b", "node-5", "r1", 1), // r1 has 2 pending
				pending("r2-a", "node-1", "r2", 100), pending("r2-b", "node-2", "r2", 100), pending("r2-c", "node-3", "r2", 100),
			},
			wantScheduled: []string{"r1-a"},
			wantSlots:     1, wantBudget: -1,
		},
		"rank ties: creation time, then node name, requestor, name": {
			nodes:  nodes(6),
			limits: Limits{MaxParallelOperations: num(6)},
			objects: []PlanObject{
				pending("z", "node-3", "a", 5), pending("y", "node-2", "a", 5), pending("x", "node-1", "b", 5),
				pending("w", "node-0", "b", 6),
			},
			wantScheduled: []string{"w", "x", "y", "z"},
			wantSlots:     6, wantBudget: -1,
		},
		"deleting pending objects are not scheduled": {
			nodes:         nodes(2),
			objects:       []PlanObject{{Namespace: "default", Name: "gone", NodeName: "node-0", RequestorID: "r", Deleting: true}, pending("a", "node-1", "r", 1)},
			wantScheduled: []string{"a"},
			wantSlots:     1, wantBudget: -1,
		},
		"in-progress object being deleted still holds its slot": {
			nodes:  nodes(3),
			limits: Limits{MaxParallelOperations: num(1)},
			objects: []PlanObject{
				{Namespace: "default", Name: "x", NodeName: "node-0", RequestorID: "r", InProgress: true, Deleting: true},
				pending("a", "node-1", "r", 1),
			},
			wantScheduled: nil,
			wantSlots:     0, wantBudget: -1,
		},
		"more in progress than allowed (limit lowered): no slots, no negative": {
			nodes:  nodes(5),
			limits: Limits{MaxParallelOperations: num(1), MaxUnavailable: num(1)},
			objects: []PlanObject{
				inProgress("x", "node-0", "r"), inProgress("y", "node-1", "r"), inProgress("z", "node-2", "r"),
				pending("a", "node-3", "r", 1),
			},
			wantScheduled: nil,
			wantWaiting:   map[string]string{"a": "maxParallelOperations reached: 3/1 nodes in maintenance"},
			wantSlots:     0, wantBudget: 0,
		},
		"empty cluster": {
			wantSlots: 0, wantBudget: -1,
		},
		"slots never exceed the node count": {
			nodes:         nodes(2),
			limits:        Limits{MaxParallelOperations: num(50)},
			objects:       []PlanObject{pending("a", "node-0", "r", 1)},
			wantScheduled: []string{"a"},
			wantSlots:     2, wantBudget: -1,
		},
		// Scenarios of the reference implementation's tests (5 nodes).
		"reference: one in progress, one pending, 1 slot": {
			nodes:         nodes(5),
			limits:        Limits{MaxParallelOperations: num(2)},
			objects:       []PlanObject{inProgress("nm-in-prog-0", "node-0", "test.nvidia.com"), pending("test-nm", "node-1", "test.nvidia.com", 1)},
			wantScheduled: []string{"test-nm"},
			wantSlots:     1, wantBudget: -1,
		},
		"reference: two in progress, maxUnavailable 50% of 5 = 2 leaves no budget": {
			nodes:  nodes(5),
			limits: Limits{MaxParallelOperations: num(5), MaxUnavailable: pct("50%")},
			objects: []PlanObject{
				inProgress("nm-0", "node-0", "r"), inProgress("nm-1", "node-1", "r"),
				pending("nm-2", "node-2", "r", 2), pending("nm-3", "node-2", "r", 1),
			},
			wantScheduled: nil,
			wantSlots:     3, wantBudget: 0,
		},
		"reference: budget 1 with one candidate node already unschedulable schedules two": {
			nodes:  withUnavailable(nodes(5), 3),
			limits: Limits{MaxParallelOperations: num(4), MaxUnavailable: num(4)},
			objects: []PlanObject{
				inProgress("p0", "node-0", "test.nvidia.com"), inProgress("p1", "node-1", "test.nvidia.com"),
				pending("test-nm-2", "node-2", "test.nvidia.com", 5), pending("other-nm", "node-2", "other-test.nvidia.com", 5),
				pending("test-nm-3", "node-3", "test.nvidia.com", 5), pending("test-nm-4", "node-4", "test.nvidia.com", 5),
			},
			wantScheduled: []string{"test-nm-2", "test-nm-3"},
			wantSlots:     2, wantBudget: 1,
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
					t.Errorf("waiting[%s] = %q, want %q", n, got, want)
				}
			}
			if p.AvailableSlots != tc.wantSlots || p.CanBecomeUnavailable != tc.wantBudget {
				t.Errorf("availableSlots=%d canBecomeUnavailable=%d, want %d %d", p.AvailableSlots, p.CanBecomeUnavailable, tc.wantSlots, tc.wantBudget)
			}
			// Every pending, non-scheduled object has a reason.
			sched := map[string]bool{}
			for _, o := range p.Schedule {
				sched[o.Key()] = true
			}
			for _, o := range tc.objects {
				if !o.InProgress && !o.Deleting && !sched[o.Key()] && p.Waiting[o.Key()] == "" {
					t.Errorf("pending %s neither scheduled nor given a reason", o.Key())
				}
			}
		})
	}
}

func TestResolveLimitsRejectsBadValues(t *testing.T) {
	tests := map[string]Limits{
		"not a number":       {MaxParallelOperations: pct("abc")},
		"percent above 100":  {MaxUnavailable: pct("150%")},
		"negative int":       {MaxParallelOperations: num(-1)},
		"negative unavail":   {MaxUnavailable: num(-3)},
		"percent no number":  {MaxUnavailable: pct("%")},
		"negative percent":   {MaxParallelOperations: pct("-10%")},
		"fraction percent":   {MaxParallelOperations: pct("1.5%")},
		"percent with space": {MaxParallelOperations: pct("10 %")},
	}
	for name, l := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := MakePlan(Snapshot{Nodes: nodes(10)}, l, t0); err == nil {
				t.Errorf("MakePlan accepted %+v", l)
			}
		})
	}
}

// checkInvariants verifies what must hold for every plan.
func checkInvariants(t *testing.T, s Snapshot, p Plan) {
	t.Helper()
	if len(p.Schedule) > p.AvailableSlots {
		t.Fatalf("scheduled %d > availableSlots %d", len(p.Schedule), p.AvailableSlots)
	}
	nodes := map[string]PlanNode{}
	for _, n := range s.Nodes {
		nodes[n.Name] = n
	}
	busy := map[string]bool{}
	for _, o := range s.Objects {
		if o.InProgress {
			busy[o.NodeName] = true
		}
	}
	perNode := map[string]int{}
	newly := 0
	for _, o := range p.Schedule {
		if o.InProgress || o.Deleting {
			t.Fatalf("scheduled a non-pending object %s", o.Key())
		}
		n, ok := nodes[o.NodeName]
		if !ok {
			t.Fatalf("scheduled %s on missing node %s", o.Key(), o.NodeName)
		}
		if busy[o.NodeName] {
			t.Fatalf("scheduled %s on busy node %s", o.Key(), o.NodeName)
		}
		perNode[o.NodeName]++
		if perNode[o.NodeName] > 1 {
			t.Fatalf("two objects scheduled on node %s", o.NodeName)
		}
		if n.available() {
			newly++
		}
	}
	if p.CanBecomeUnavailable >= 0 && newly > p.CanBecomeUnavailable {
		t.Fatalf("%d nodes made unavailable > budget %d", newly, p.CanBecomeUnavailable)
	}
	// Maximality: a waiting candidate whose node is free must have been
	// blocked by slots or budget, never left out while both had room.
	if len(p.Schedule) < p.AvailableSlots {
		for _, o := range s.Objects {
			if o.InProgress || o.Deleting || busy[o.NodeName] {
				continue
			}
			n, ok := nodes[o.NodeName]
			if !ok || slices.ContainsFunc(p.Schedule, func(x PlanObject) bool { return x.NodeName == o.NodeName }) {
				continue
			}
			if !n.available() || p.CanBecomeUnavailable < 0 || newly < p.CanBecomeUnavailable {
				t.Fatalf("%s on node %s could have been scheduled (slots left %d, budget left %d)",
					o.Key(), o.NodeName, p.AvailableSlots-len(p.Schedule), p.CanBecomeUnavailable-newly)
			}
		}
	}
}

func FuzzMakePlan(f *testing.F) {
	f.Add(uint8(10), uint8(5), uint8(2), int8(3), int8(2), uint64(42), false)
	f.Add(uint8(3), uint8(9), uint8(0), int8(-1), int8(0), uint64(7), true)
	f.Add(uint8(50), uint8(60), uint8(10), int8(5), int8(-1), uint64(99), true)
	f.Fuzz(func(t *testing.T, nNodes, nObjects, nInProgress uint8, maxPar, maxUnavail int8, seed uint64, percent bool) {
		s := randomSnapshot(int(nNodes), int(nObjects), int(nInProgress), seed)
		var l Limits
		if maxPar >= 0 {
			l.MaxParallelOperations = num(int(maxPar))
			if percent {
				l.MaxParallelOperations = pct(fmt.Sprintf("%d%%", int(maxPar)%101))
			}
		}
		if maxUnavail >= 0 {
			l.MaxUnavailable = num(int(maxUnavail))
			if percent {
				l.MaxUnavailable = pct(fmt.Sprintf("%d%%", int(maxUnavail)%101))
			}
		}
		p, err := MakePlan(s, l, t0)
		if err != nil {
			t.Fatal(err)
		}
		checkInvariants(t, s, p)
		// Deterministic: the order of the input does not matter.
		shuffled := s
		shuffled.Objects = slices.Clone(s.Objects)
		slices.Reverse(shuffled.Objects)
		shuffled.Nodes = slices.Clone(s.Nodes)
		sort.Slice(shuffled.Nodes, func(i, j int) bool { return shuffled.Nodes[i].Name > shuffled.Nodes[j].Name })
		p2, err := MakePlan(shuffled, l, t0)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(p, p2); diff != "" {
			t.Fatalf("plan depends on input order:\n%s", diff)
		}
	})
}

// randomSnapshot builds a reproducible snapshot from seed (a small LCG, so
// the fuzzer's inputs fully determine it).
func randomSnapshot(nNodes, nObjects, nInProgress int, seed uint64) Snapshot {
	next := func(n int) int {
		seed = seed*6364136223846793005 + 1442695040888963407
		if n <= 0 {
			return 0
		}
		return int((seed >> 33) % uint64(n))
	}
	var s Snapshot
	for i := range nNodes {
		s.Nodes = append(s.Nodes, PlanNode{Name: fmt.Sprintf("n%03d", i), Ready: next(5) != 0, Unschedulable: next(6) == 0})
	}
	requestors := []string{"r0", "r1", "r2"}
	for i := range nObjects {
		node := fmt.Sprintf("n%03d", next(nNodes+2)) // sometimes a missing node
		o := PlanObject{
			Namespace: "ns", Name: fmt.Sprintf("o%03d", i), NodeName: node,
			RequestorID: requestors[next(len(requestors))],
			Created:     t0.Add(time.Duration(next(20)) * time.Second),
			InProgress:  i < nInProgress,
			Deleting:    next(10) == 0,
		}
		s.Objects = append(s.Objects, o)
	}
	return s
}

func BenchmarkMakePlan(b *testing.B) {
	for _, n := range []int{1000, 3000, 10000, 50000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { benchmarkMakePlan(b, n, false) })
	}
	// A large fleet's shape: 16 pools with their own limits, NVLink
	// domains of 18 nodes (a third of them running a ComputeDomain), a
	// pending request for every node; 1,000 to 10,000 nodes, to show the
	// time per plan grows linearly.
	for _, n := range []int{1000, 3000, 10000} {
		b.Run(fmt.Sprintf("nodes=%d/pools=16/domains=%d", n, (n+17)/18), func(b *testing.B) { benchmarkMakePlan(b, n, true) })
	}
}

func benchmarkMakePlan(b *testing.B, n int, pooled bool) {
	s := Snapshot{}
	for i := range n {
		node := PlanNode{Name: fmt.Sprintf("node-%05d", i), Ready: i%50 != 0, Unschedulable: i%70 == 0}
		if pooled {
			node.Pools = []string{fmt.Sprintf("pool-%02d", i%16)}
			node.Domain = fmt.Sprintf("rack-%03d", i/18)
			if (i/18)%3 == 0 {
				node.ComputeDomain = fmt.Sprintf("ml/job-%03d", i/18)
			}
		}
		s.Nodes = append(s.Nodes, node)
		s.Objects = append(s.Objects, PlanObject{
			Namespace: "default", Name: fmt.Sprintf("nm-%05d", i), NodeName: fmt.Sprintf("node-%05d", i),
			RequestorID: fmt.Sprintf("requestor-%d", i%3), Created: t0.Add(time.Duration(i%1000) * time.Second),
			InProgress: i%100 == 0,
		})
	}
	l := Limits{MaxParallelOperations: pct("5%"), MaxUnavailable: pct("10%")}
	if pooled {
		for p := range 16 {
			l.Pools = append(l.Pools, PoolLimits{Name: fmt.Sprintf("pool-%02d", p), MaxParallelOperations: pct("10%")})
		}
		l.Domains = &DomainLimits{CoSchedule: true, MaxDisrupted: pct("10%")}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := MakePlan(s, l, t0); err != nil {
			b.Fatal(err)
		}
	}
}
