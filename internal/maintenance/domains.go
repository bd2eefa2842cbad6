package maintenance

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// DomainLimits are the settings of spec.domains (docs/maintenance.md,
// "NVLink domains"). Limits.Domains is nil when domains are not
// configured: PlanNode.Domain is then ignored and the plan is exactly the
// one without domains.
type DomainLimits struct {
	// MaxDisrupted bounds how many domains may be disrupted at once (an
	// integer or a percentage of the domains, rounded up); nil: no limit.
	MaxDisrupted *intstr.IntOrString
	// CoSchedule: the pending requests of a disrupted domain take free
	// slots before those of other non-urgent requests, and a domain that
	// starts pulls its other pending requests right after it.
	CoSchedule bool
	// Collect: with CoSchedule, a domain with no node in maintenance
	// starts only once its oldest pending request is this old (0: at once).
	Collect time.Duration
}

// domainMembersShown is how many of a domain's nodes a wait reason names.
const domainMembersShown = 3

// domainUse tracks the domains during one plan: which are disrupted (a
// node in maintenance before the plan, or one started by it) and the
// budget of maxDisruptedDomains.
type domainUse struct {
	coSchedule bool
	// max is maxDisruptedDomains resolved (-1: no limit).
	max int
	// disrupted counts disrupted domains, before and during the plan.
	disrupted int
	// members: the nodes of each disrupted domain in maintenance (before
	// the plan or started by it).
	members map[string][]string
	// busy: the ComputeDomains whose workload runs in each busy domain
	// (sorted, each once).
	busy map[string][]string
	// collect and oldest: a domain not disrupted starts once its oldest
	// pending request (oldest) is collect old, or once every node of it
	// has one (complete).
	collect  time.Duration
	oldest   map[string]time.Time
	complete map[string]bool
}

// newDomainUse resolves the domain limits; nil when domains are not
// configured. It also fills the plan's domain figures.
func newDomainUse(l *DomainLimits, nodes map[string]PlanNode, busy map[string]string, objects []PlanObject, p *Plan) (*domainUse, error) {
	p.MaxDisruptedDomains = -1
	if l == nil {
		return nil, nil
	}
	all := map[string]bool{}
	for _, n := range nodes {
		if n.Domain != "" {
			all[n.Domain] = true
		}
	}
	p.TotalDomains = len(all)
	u := &domainUse{coSchedule: l.CoSchedule, max: -1, members: map[string][]string{}}
	if l.MaxDisrupted != nil {
		var err error
		if u.max, err = scaled(*l.MaxDisrupted, p.TotalDomains, true); err != nil {
			return nil, fmt.Errorf("domains: maxDisruptedDomains: %w", err)
		}
		p.MaxDisruptedDomains = u.max
	}
	for name := range busy {
		if n, ok := nodes[name]; ok && n.Domain != "" {
			u.members[n.Domain] = append(u.members[n.Domain], name)
		}
	}
	u.disrupted = len(u.members)
	p.DisruptedDomains = u.disrupted
	for _, n := range nodes {
		if n.Domain != "" && n.ComputeDomain != "" && !slices.Contains(u.busy[n.Domain], n.ComputeDomain) {
			if u.busy == nil {
				u.busy = map[string][]string{}
			}
			u.busy[n.Domain] = append(u.busy[n.Domain], n.ComputeDomain)
		}
	}
	for _, cds := range u.busy {
		slices.Sort(cds)
	}
	if l.CoSchedule && l.Collect > 0 {
		u.collect, u.oldest, u.complete = l.Collect, map[string]time.Time{}, map[string]bool{}
		requested := map[string]map[string]bool{} // domain -> nodes with a pending request
		for _, o := range objects {
			d := nodes[o.NodeName].Domain
			if o.InProgress || o.Deleting || d == "" {
				continue
			}
			if t, ok := u.oldest[d]; !ok || o.Created.Before(t) {
				u.oldest[d] = o.Created
			}
			if requested[d] == nil {
				requested[d] = map[string]bool{}
			}
			requested[d][o.NodeName] = true
		}
		size := map[string]int{}
		for _, n := range nodes {
			if n.Domain != "" {
				size[n.Domain]++
			}
		}
		for d, r := range requested {
			u.complete[d] = len(r) == size[d]
		}
	}
	return u, nil
}

// collecting says why a non-urgent request of domain d waits at now: the
// domain is not disrupted and its requests are still being collected (some
// node of it has none yet; "" if not); until is when the domain may start.
func (u *domainUse) collecting(d string, now time.Time) (why string, until time.Time) {
	if u == nil || u.collect <= 0 || d == "" || u.isDisrupted(d) || u.complete[d] {
		return "", time.Time{} // nothing to collect: every node of the domain has a request
	}
	until = u.oldest[d].Add(u.collect)
	if !now.Before(until) {
		return "", time.Time{}
	}
	return fmt.Sprintf("domain %s: collecting its requests to start them together (collectSeconds %d, until %s)",
		d, int(u.collect/time.Second), until.UTC().Format(time.RFC3339)), until
}

// isBusy: a ComputeDomain's workload runs on a node of domain.
func (u *domainUse) isBusy(domain string) bool {
	return u != nil && domain != "" && len(u.busy[domain]) > 0
}

// busyNote is appended to the wait reason of a request whose domain is
// busy: what starting it would interrupt ("" when not busy).
func (u *domainUse) busyNote(domain string) string {
	if !u.isBusy(domain) {
		return ""
	}
	cds := u.busy[domain]
	return "; domain " + domain + " runs ComputeDomain " + summarize(cds, domainMembersShown)
}

// domainOf is the domain of node n that the plan considers ("" for none,
// and always "" when domains are not configured).
func (u *domainUse) domainOf(n PlanNode) string {
	if u == nil {
		return ""
	}
	return n.Domain
}

func (u *domainUse) isDisrupted(domain string) bool {
	if u == nil || domain == "" {
		return false
	}
	_, ok := u.members[domain]
	return ok
}

// blocks says why n may not start: its domain is not disrupted yet and
// maxDisruptedDomains is reached ("" if it may).
func (u *domainUse) blocks(n PlanNode) string {
	d := u.domainOf(n)
	if d == "" || u.isDisrupted(d) || u.max < 0 || u.disrupted < u.max {
		return ""
	}
	if u.max == 0 {
		return "domain " + d + ": maxDisruptedDomains is 0: maintenance continues only in domains already disrupted"
	}
	return fmt.Sprintf("domain %s: maxDisruptedDomains reached: %d/%d domains disrupted", d, u.disrupted, u.max)
}

// take records that n starts maintenance.
func (u *domainUse) take(n PlanNode) {
	d := u.domainOf(n)
	if d == "" {
		return
	}
	if !u.isDisrupted(d) {
		u.disrupted++
	}
	u.members[d] = append(u.members[d], n.Name)
}

// coScheduleReason explains why a request of a disrupted domain waits:
// it joins the domain's maintenance as soon as the limit (why) allows.
func (u *domainUse) coScheduleReason(domain, why string) string {
	m := slices.Clone(u.members[domain])
	slices.Sort(m)
	var b strings.Builder
	b.WriteString("domain ")
	b.WriteString(domain)
	b.WriteString(": waiting to co-schedule with ")
	b.WriteString(strings.Join(m[:min(len(m), domainMembersShown)], ", "))
	if len(m) > domainMembersShown {
		// No count: it changes with every node that starts or ends, and
		// each change is a status write on every waiting request.
		b.WriteString(" and others")
	}
	b.WriteString(" (")
	b.WriteString(why)
	b.WriteString(")")
	return b.String()
}

// visitOrder calls visit on each of the n ranked candidates once, in the
// order they are considered: without co-scheduling, the ranking itself.
// With it: urgent candidates first (in rank order); then the candidates of
// domains already disrupted (before the plan or by an urgent candidate);
// then the rest in rank order, those of busy domains (a ComputeDomain's
// workload runs there) after all others, where a candidate that disrupts
// its domain is followed at once by that domain's other candidates. visit
// may disrupt the candidate's domain.
func (u *domainUse) visitOrder(n int, urgent func(i int) bool, domain func(i int) string, visit func(i int)) {
	if u == nil || !u.coSchedule {
		for i := range n {
			visit(i)
		}
		return
	}
	visited := make([]bool, n)
	do := func(i int) {
		if !visited[i] {
			visited[i] = true
			visit(i)
		}
	}
	byDomain := map[string][]int{}
	for i := range n {
		if d := domain(i); d != "" && !urgent(i) {
			byDomain[d] = append(byDomain[d], i)
		}
	}
	for i := range n {
		if urgent(i) {
			do(i)
		}
	}
	for i := range n {
		if u.isDisrupted(domain(i)) {
			do(i)
		}
	}
	for _, busyPass := range []bool{false, true} {
		for i := range n {
			d := domain(i)
			if visited[i] || u.isBusy(d) != busyPass {
				continue
			}
			do(i)
			if u.isDisrupted(d) {
				for _, j := range byDomain[d] {
					do(j)
				}
			}
		}
	}
}
