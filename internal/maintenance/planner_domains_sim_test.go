package maintenance

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A simulated rollout with the pure planner: at every step the requests
// due arrive, maintenance that has run its duration completes (the object
// is gone), the planner plans, and the objects it schedules are in
// maintenance from then on.
//
// An interruption of a domain is one maintenance episode of it: a plan
// that starts a node of the domain while none of its nodes is in
// maintenance. A node "had to start alone" when its request starts an
// episode that is not the domain's first and could not have joined the
// domain's previous episode: it arrived after the last plan in which the
// domain was disrupted, or in that plan it waited for a limit (a slot, the
// unavailability or a pool budget, the window, another request of its
// node). Co-scheduling keeps every episode after a domain's first owed to
// such a node.

type simRequest struct {
	PlanObject
	Arrive, Duration int
}

type simResult struct {
	// Steps until every request completed (the cap when some never did).
	Steps int
	Done  bool
	// DomainSteps sums, over the steps, the domains disrupted after the
	// step's plan (a job spanning a domain is down while it is);
	// MaxDisrupted is the most domains disrupted at once.
	DomainSteps, MaxDisrupted int
	// Interruptions counts the episodes of each domain.
	Interruptions map[string]int
	// Unowed lists the episodes that no node had to start alone.
	Unowed []string
}

func (r simResult) totalInterruptions() int {
	n := 0
	for _, v := range r.Interruptions {
		n += v
	}
	return n
}

// simulate runs the rollout; check sees every plan.
func simulate(tb testing.TB, nodes []PlanNode, reqs []simRequest, l Limits, maxSteps int, check func(step int, s Snapshot, p Plan)) simResult {
	tb.Helper()
	domainOf := map[string]string{}
	for _, n := range nodes {
		domainOf[n.Name] = n.Domain
	}
	started := make([]int, len(reqs)) // step it started, -1: not yet
	for i := range started {
		started[i] = -1
	}
	res := simResult{Interruptions: map[string]int{}}
	lastDisrupted := map[string]int{}             // domain -> last step whose plan left it disrupted
	lastReasons := map[string]map[string]string{} // domain -> wait reasons of its requests then
	for step := 0; step < maxSteps; step++ {
		s := Snapshot{Nodes: nodes}
		remaining := 0
		for i, r := range reqs {
			switch {
			case started[i] >= 0 && step >= started[i]+r.Duration: // completed
			case started[i] >= 0:
				o := r.PlanObject
				o.InProgress = true
				s.Objects = append(s.Objects, o)
				remaining++
			case r.Arrive <= step:
				s.Objects = append(s.Objects, r.PlanObject)
				remaining++
			default:
				remaining++
			}
		}
		if remaining == 0 {
			res.Steps, res.Done = step, true
			return res
		}
		before := map[string]bool{}
		for _, o := range s.Objects {
			if d := domainOf[o.NodeName]; o.InProgress && d != "" {
				before[d] = true
			}
		}
		p, err := MakePlan(s, l, simNow(step))
		if err != nil {
			tb.Fatalf("step %d: %v", step, err)
		}
		if check != nil {
			check(step, s, p)
		}
		startedNow := map[string][]string{} // domain -> keys
		for _, o := range p.Schedule {
			i := slices.IndexFunc(reqs, func(r simRequest) bool { return r.Key() == o.Key() })
			started[i] = step
			if d := domainOf[o.NodeName]; d != "" {
				startedNow[d] = append(startedNow[d], o.Key())
			}
		}
		for d, keys := range startedNow {
			if before[d] {
				continue
			}
			if res.Interruptions[d] > 0 && !slices.ContainsFunc(keys, func(k string) bool {
				i := slices.IndexFunc(reqs, func(r simRequest) bool { return r.Key() == k })
				return reqs[i].Arrive > lastDisrupted[d] || waitedForALimit(lastReasons[d][k])
			}) {
				res.Unowed = append(res.Unowed, fmt.Sprintf("step %d: domain %s restarted with %v", step, d, keys))
			}
			res.Interruptions[d]++
		}
		for d := range before {
			startedNow[d] = append(startedNow[d], "")
		}
		res.DomainSteps += len(startedNow)
		res.MaxDisrupted = max(res.MaxDisrupted, len(startedNow))
		for d := range startedNow { // disrupted after this plan
			lastDisrupted[d] = step
			lastReasons[d] = map[string]string{}
			for _, o := range s.Objects {
				if domainOf[o.NodeName] == d && !o.InProgress {
					lastReasons[d][o.Key()] = p.Waiting[o.Key()]
				}
			}
		}
	}
	res.Steps = maxSteps
	return res
}

// simNow is the time of a simulation step: one second each.
func simNow(step int) time.Time { return t0.Add(time.Duration(step) * time.Second) }

// waitedForALimit: a wait reason that a limit, not the ranking, gave.
func waitedForALimit(reason string) bool {
	for _, s := range []string{"maxParallelOperations", "maxUnavailable", "pool ", "maintenance window", "exclusion",
		"another request for node", "is in maintenance for"} {
		if strings.Contains(reason, s) {
			return true
		}
	}
	return false
}

// FuzzMakePlanDomains simulates rollouts with domains, pools, urgent
// requests and late arrivals, and checks every plan: no cluster, pool or
// domain limit exceeded; a disrupted domain's request never waits for a
// slot or budget that a later-ranked request of an undisrupted domain took;
// a request of a disrupted domain that waits for a limit says it will join
// its domain; the plan does not depend on input order; and over the
// rollout, every interruption of a domain after its first is owed to a
// node that had to start alone.
func FuzzMakePlanDomains(f *testing.F) {
	f.Add(uint8(3), uint8(4), uint8(4), int8(-1), int8(-1), int8(-1), uint64(1), false)
	f.Add(uint8(5), uint8(6), uint8(7), int8(6), int8(2), int8(1), uint64(42), false)
	f.Add(uint8(8), uint8(18), uint8(18), int8(-1), int8(3), int8(-1), uint64(7), false)
	f.Add(uint8(4), uint8(3), uint8(2), int8(4), int8(0), int8(2), uint64(99), true)
	f.Fuzz(func(t *testing.T, nDomains, perDomain, maxPar uint8, maxUnavail, maxDom, poolPar int8, seed uint64, nodeByNode bool) {
		next := func(n int) int {
			seed = seed*6364136223846793005 + 1442695040888963407
			return int((seed >> 33) % uint64(max(n, 1)))
		}
		var nodes []PlanNode
		for d := range int(nDomains%6) + 1 {
			busy := next(3) == 0 // a ComputeDomain's workload runs on some of its nodes
			for i := range int(perDomain%10) + 1 {
				n := PlanNode{Name: fmt.Sprintf("d%d-n%02d", d, i), Ready: next(10) != 0, Domain: fmt.Sprintf("d%d", d)}
				if busy && i%2 == 0 {
					n.ComputeDomain = fmt.Sprintf("ml/job-%d", d)
				}
				nodes = append(nodes, n)
			}
		}
		for i := range next(4) {
			nodes = append(nodes, PlanNode{Name: fmt.Sprintf("plain-%d", i), Ready: true})
		}
		l := Limits{MaxParallelOperations: num(int(maxPar % 20)), Domains: &DomainLimits{CoSchedule: !nodeByNode,
			Collect: time.Duration(next(3)) * time.Second}}
		if maxUnavail >= 0 {
			l.MaxUnavailable = num(int(maxUnavail % 20))
		}
		if maxDom >= 0 {
			l.Domains.MaxDisrupted = num(int(maxDom % 5))
		}
		if poolPar >= 0 {
			for i := range nodes {
				if i%3 == 0 {
					nodes[i].Pools = []string{"p"}
				}
			}
			l.Pools = []PoolLimits{{Name: "p", MaxParallelOperations: num(int(poolPar % 4))}}
		}
		var reqs []simRequest
		for i, n := range nodes {
			if next(4) == 0 {
				continue
			}
			o := PlanObject{Namespace: "ns", Name: fmt.Sprintf("o%03d", i), NodeName: n.Name,
				RequestorID: fmt.Sprintf("r%d", next(3)), Created: t0.Add(time.Duration(next(50)) * time.Second), Urgent: next(8) == 0}
			reqs = append(reqs, simRequest{PlanObject: o, Arrive: next(3) * next(6), Duration: 1 + next(4)})
		}
		if len(nodes) > 0 && next(2) == 0 { // a second request for one node
			o := PlanObject{Namespace: "ns", Name: "extra", NodeName: nodes[0].Name, RequestorID: "r9", Created: t0}
			reqs = append(reqs, simRequest{PlanObject: o, Arrive: next(4), Duration: 2})
		}
		check := func(step int, s Snapshot, p Plan) {
			checkDomainPlan(t, step, s, l, p)
		}
		res := simulate(t, nodes, reqs, l, 80, check)
		if !nodeByNode && len(res.Unowed) > 0 {
			t.Fatalf("interruptions owed to no node that had to start alone:\n%s", strings.Join(res.Unowed, "\n"))
		}
	})
}

// checkDomainPlan checks one plan of the simulation.
func checkDomainPlan(t *testing.T, step int, s Snapshot, l Limits, p Plan) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("step %d: "+format, append([]any{step}, args...)...)
	}
	nodes := map[string]PlanNode{}
	for _, n := range s.Nodes {
		nodes[n.Name] = n
	}
	busy := map[string]bool{}
	before := map[string]bool{}
	for _, o := range s.Objects {
		if o.InProgress {
			busy[o.NodeName] = true
			if d := nodes[o.NodeName].Domain; d != "" {
				before[d] = true
			}
		}
	}
	// Cluster limits.
	if len(p.Schedule) > p.AvailableSlots {
		fail("scheduled %d > availableSlots %d", len(p.Schedule), p.AvailableSlots)
	}
	newly, after := 0, map[string]bool{}
	scheduledOn := map[string]bool{}
	poolStarted := map[string]int{}
	for _, o := range p.Schedule {
		n := nodes[o.NodeName]
		if o.InProgress || busy[o.NodeName] || scheduledOn[o.NodeName] {
			fail("%s scheduled on a busy node", o.Key())
		}
		scheduledOn[o.NodeName] = true
		if n.available() {
			newly++
		}
		if n.Domain != "" && !before[n.Domain] {
			after[n.Domain] = true
		}
		for _, pool := range n.Pools {
			poolStarted[pool]++
		}
	}
	if p.CanBecomeUnavailable >= 0 && newly > p.CanBecomeUnavailable {
		fail("%d nodes made unavailable > budget %d", newly, p.CanBecomeUnavailable)
	}
	for _, pp := range p.Pools {
		if pp.MaxParallel >= 0 && poolStarted[pp.Name] > 0 && pp.InProgress+poolStarted[pp.Name] > pp.MaxParallel {
			fail("pool %s: %d + %d > %d", pp.Name, pp.InProgress, poolStarted[pp.Name], pp.MaxParallel)
		}
	}
	// The domain budget.
	if p.MaxDisruptedDomains >= 0 && len(after) > 0 && len(before)+len(after) > p.MaxDisruptedDomains {
		fail("%d domains disrupted + %d started > maxDisruptedDomains %d", len(before), len(after), p.MaxDisruptedDomains)
	}
	if l.Domains.CoSchedule {
		// Priority: a later-ranked request of an undisrupted domain (or of
		// no domain) took no slot or budget a disrupted domain's request
		// waits for.
		// Urgent requests go first and may disrupt a domain too.
		disrupted := maps.Clone(before)
		for _, o := range p.Schedule {
			if n := nodes[o.NodeName]; o.Urgent && n.Domain != "" {
				disrupted[n.Domain] = true
			}
		}
		tookSlot, tookBudget := false, false
		for _, o := range p.Schedule {
			if n := nodes[o.NodeName]; !o.Urgent && !disrupted[n.Domain] {
				tookSlot = true
				tookBudget = tookBudget || n.available()
			}
		}
		for _, o := range s.Objects {
			n, ok := nodes[o.NodeName]
			if o.InProgress || !ok || !before[n.Domain] {
				continue
			}
			why := p.Waiting[o.Key()]
			if tookSlot && strings.Contains(why, "(maxParallelOperations reached") ||
				tookBudget && n.available() && strings.Contains(why, "(maxUnavailable budget exhausted") {
				fail("%s of disrupted domain %s waits (%s) while an undisrupted domain's request started", o.Key(), n.Domain, why)
			}
		}
		// Busy domains (a ComputeDomain's workload runs there) start
		// last: none started while a request of an idle domain, or of no
		// domain, waited for a cluster slot.
		startedBusy := ""
		for _, o := range p.Schedule {
			if n := nodes[o.NodeName]; !o.Urgent && !disrupted[n.Domain] && busyDomain(s, n.Domain) {
				startedBusy = o.Key()
			}
		}
		for _, o := range s.Objects {
			n, ok := nodes[o.NodeName]
			why := p.Waiting[o.Key()]
			if startedBusy != "" && ok && !o.InProgress && !o.Urgent && !busyDomain(s, n.Domain) && !disrupted[n.Domain] &&
				strings.HasPrefix(why, "maxParallelOperations reached") {
				fail("%s of busy domain started while %s of an idle domain waits (%s)", startedBusy, o.Key(), why)
			}
		}
		// A disrupted domain's request that waits for a limit says so.
		for _, o := range s.Objects {
			n, ok := nodes[o.NodeName]
			why, waits := p.Waiting[o.Key()]
			if o.InProgress || !ok || n.Domain == "" || !waits || !before[n.Domain] && !after[n.Domain] {
				continue
			}
			if strings.HasPrefix(why, "another request for node") || strings.HasPrefix(why, "node ") {
				continue
			}
			if !strings.HasPrefix(why, "domain "+n.Domain+": waiting to co-schedule with ") {
				fail("%s of disrupted domain %s waits without naming its domain: %q", o.Key(), n.Domain, why)
			}
		}
	}
	// Every waiting request of a busy domain names what runs there.
	for _, o := range s.Objects {
		n, ok := nodes[o.NodeName]
		if why, waits := p.Waiting[o.Key()]; ok && waits && busyDomain(s, n.Domain) &&
			!strings.HasPrefix(why, "node ") && !strings.Contains(why, "; domain "+n.Domain+" runs ComputeDomain ml/job-") {
			fail("%s of busy domain %s waits without naming its ComputeDomain: %q", o.Key(), n.Domain, why)
		}
	}
	// Not a function of input order.
	shuffled := Snapshot{Nodes: slices.Clone(s.Nodes), Objects: slices.Clone(s.Objects)}
	slices.Reverse(shuffled.Objects)
	sort.Slice(shuffled.Nodes, func(i, j int) bool { return shuffled.Nodes[i].Name > shuffled.Nodes[j].Name })
	p2, err := MakePlan(shuffled, l, simNow(step))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(p, p2, cmp.AllowUnexported(Window{})); diff != "" {
		fail("plan depends on input order:\n%s", diff)
	}
}

// busyDomain: a node of domain runs a ComputeDomain's workload.
func busyDomain(s Snapshot, domain string) bool {
	if domain == "" {
		return false
	}
	for _, n := range s.Nodes {
		if n.Domain == domain && n.ComputeDomain != "" {
			return true
		}
	}
	return false
}

// rackRollout is the scenario of BenchmarkDomainRollout: domains × perDomain
// ready nodes and a request for every node, all pending from the start,
// created round-robin across the domains (so that node-by-node ranking by
// age walks across every domain); each maintenance takes duration(i) steps.
func rackRollout(domains, perDomain int, duration func(i int) int) ([]PlanNode, []simRequest) {
	var nodes []PlanNode
	var reqs []simRequest
	for d := range domains {
		for k := range perDomain {
			name := fmt.Sprintf("gpu-%02d%02d", d, k)
			nodes = append(nodes, PlanNode{Name: name, Ready: true, Domain: fmt.Sprintf("rack-%d", d)})
			i := k*domains + d
			reqs = append(reqs, simRequest{PlanObject: PlanObject{Namespace: "default", Name: "nm-" + name, NodeName: name,
				RequestorID: "upgrade", Created: t0.Add(time.Duration(i) * time.Second)}, Duration: duration(i)})
		}
	}
	return nodes, reqs
}

// TestDomainRolloutInterruptsEachDomainOnce: 8 domains of 18 nodes, a
// request for every node, 18 nodes at a time: co-scheduled, each domain is
// interrupted once, in no more steps than node by node.
func TestDomainRolloutInterruptsEachDomainOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		duration func(i int) int
	}{
		{"equal durations", func(int) int { return 3 }},
		{"unequal durations", func(i int) int { return 2 + i*7%3 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes, reqs := rackRollout(8, 18, tc.duration)
			l := Limits{MaxParallelOperations: num(18)}
			byNode := simulate(t, nodes, reqs, l, 1000, nil)
			l.Domains = coSchedule()
			byDomain := simulate(t, nodes, reqs, l, 1000, nil)
			if !byNode.Done || !byDomain.Done {
				t.Fatalf("rollout did not finish: %+v %+v", byNode, byDomain)
			}
			if got := byDomain.totalInterruptions(); got != 8 {
				t.Errorf("interruptions with domains = %d, want 8 (%v)", got, byDomain.Interruptions)
			}
			if byDomain.Steps > byNode.Steps {
				t.Errorf("steps with domains = %d > %d node by node", byDomain.Steps, byNode.Steps)
			}
			t.Logf("node by node: %d interruptions, %d steps; co-scheduled: %d interruptions, %d steps",
				byNode.totalInterruptions(), byNode.Steps, byDomain.totalInterruptions(), byDomain.Steps)
		})
	}
}

// TestDomainRolloutCollectsArrivingRequests: a requestor creates the
// rollout's requests one after another, a request for each domain in turn
// (8 a second, over 18 seconds); each maintenance lasts 100 s. Started as
// they come, every domain is disrupted within the first second and each
// domain's job is down for most of the rollout; with collectSeconds, the
// domains go one after another, in about the same time.
func TestDomainRolloutCollectsArrivingRequests(t *testing.T) {
	nodes, reqs := rackRollout(8, 18, func(int) int { return 100 })
	for i := range reqs {
		k := int(reqs[i].Created.Sub(t0) / time.Second) // rackRollout's round-robin order
		reqs[i].Arrive = k / 8
		reqs[i].Created = simNow(reqs[i].Arrive).Add(time.Duration(k%8) * 100 * time.Millisecond)
	}
	l := Limits{MaxParallelOperations: num(18)}
	byNode := simulate(t, nodes, reqs, l, 5000, nil)
	l.Domains = coSchedule()
	asTheyCome := simulate(t, nodes, reqs, l, 5000, nil)
	l.Domains = &DomainLimits{CoSchedule: true, Collect: 20 * time.Second}
	collected := simulate(t, nodes, reqs, l, 5000, nil)
	for name, r := range map[string]simResult{"node by node": byNode, "as they come": asTheyCome, "collected": collected} {
		if !r.Done {
			t.Fatalf("%s: the rollout did not finish: %+v", name, r)
		}
		t.Logf("%-13s %4d steps, %d domains disrupted at most, %4d domain-steps down, %d interruptions",
			name, r.Steps, r.MaxDisrupted, r.DomainSteps, r.totalInterruptions())
	}
	if asTheyCome.MaxDisrupted != 8 {
		t.Errorf("as they come: %d domains disrupted at most, want all 8 (the case collecting is for)", asTheyCome.MaxDisrupted)
	}
	if collected.MaxDisrupted > 2 || collected.totalInterruptions() != 8 {
		t.Errorf("collected: %d domains disrupted at most, %d interruptions; want at most 2 (one finishing, one starting) and 8",
			collected.MaxDisrupted, collected.totalInterruptions())
	}
	if collected.DomainSteps*2 > asTheyCome.DomainSteps {
		t.Errorf("collected: %d domain-steps down, not half of %d as they come", collected.DomainSteps, asTheyCome.DomainSteps)
	}
	if collected.Steps > byNode.Steps+20 {
		t.Errorf("collected: %d steps, more than node by node's %d plus the 20 s collected", collected.Steps, byNode.Steps)
	}
}

// BenchmarkDomainRollout simulates the rollout of 8 NVL72-style domains of
// 18 nodes (a request for every node, maxParallelOperations 18) with the
// pure planner, without and with spec.domains, and reports the domain
// interruptions and the steps the rollout takes (each maintenance lasts 3
// steps; "mixed" lasts 2 to 4).
func BenchmarkDomainRollout(b *testing.B) {
	durations := map[string]func(int) int{
		"equal": func(int) int { return 3 },
		"mixed": func(i int) int { return 2 + i*7%3 },
	}
	for _, dur := range []string{"equal", "mixed"} {
		for _, mpo := range []int{18, 9} {
			for _, domains := range []bool{false, true} {
				b.Run(fmt.Sprintf("durations=%s/maxParallel=%d/domains=%t", dur, mpo, domains), func(b *testing.B) {
					nodes, reqs := rackRollout(8, 18, durations[dur])
					l := Limits{MaxParallelOperations: num(mpo)}
					if domains {
						l.Domains = coSchedule()
					}
					var res simResult
					for range b.N {
						res = simulate(b, nodes, reqs, l, 1000, nil)
					}
					if !res.Done {
						b.Fatal("rollout did not finish")
					}
					b.ReportMetric(float64(res.totalInterruptions()), "interruptions")
					b.ReportMetric(float64(res.Steps), "steps")
				})
			}
		}
	}
}
