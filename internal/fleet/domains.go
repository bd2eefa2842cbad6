package fleet

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/printers"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// NVLink domains (docs/maintenance.md, "NVLink domains"): with spec.domains
// in the MaintenanceOperatorConfig, the value of its nodeLabel names a
// node's domain, and the view groups the nodes by it.

// LabelComputeDomain is the node label NVIDIA's DRA driver sets while a
// workload pod of a ComputeDomain is prepared on the node; its value is
// the ComputeDomain's UID.
const LabelComputeDomain = maintenancev1.LabelComputeDomain

// ComputeDomainListGVK: NVIDIA's ComputeDomains, read as metadata only to
// name the UIDs of LabelComputeDomain.
var (
	ComputeDomainListGVK = maintenancev1.ComputeDomainListGVK
	ComputeDomainGVK     = ComputeDomainListGVK.GroupVersion().WithKind("ComputeDomain")
)

// DomainLabel is the config's spec.domains.nodeLabel ("" without a config
// or without spec.domains).
func DomainLabel(c *maintenancev1.MaintenanceOperatorConfig) string {
	if c == nil || c.Spec.Domains == nil {
		return ""
	}
	return c.Spec.Domains.NodeLabel
}

// computeDomainNames maps the UIDs of the ComputeDomains to
// "namespace/name".
func computeDomainNames(cds []*metav1.PartialObjectMetadata) map[string]string {
	names := make(map[string]string, len(cds))
	for _, cd := range cds {
		names[string(cd.UID)] = cd.Namespace + "/" + cd.Name
	}
	return names
}

// noneLast orders names ("" for none: no domain, no pool) with "" last.
func noneLast(a, b string) int {
	switch {
	case a == b:
		return 0
	case a == "":
		return 1
	case b == "":
		return -1
	}
	return strings.Compare(a, b)
}

// groupByDomain orders the rows by domain (nodes in no domain last),
// keeping their order within a domain.
func groupByDomain(rows []Row) {
	slices.SortStableFunc(rows, func(a, b Row) int { return noneLast(a.Domain, b.Domain) })
}

// Domains summarises the rows by domain, sorted by name; the nodes in no
// domain come last, under the name "".
func Domains(rows []Row) []Domain {
	byName := map[string]*Domain{}
	pools := map[string]map[string]bool{}
	cds := map[string]map[ComputeDomainRef]int{}
	for i := range rows {
		r := &rows[i]
		d := byName[r.Domain]
		if d == nil {
			d = &Domain{Name: r.Domain}
			byName[r.Domain] = d
			pools[r.Domain] = map[string]bool{}
			cds[r.Domain] = map[ComputeDomainRef]int{}
		}
		d.Nodes++
		pools[r.Domain][r.Pool] = true
		if r.State == StateReady {
			d.ReadyForWork++
		}
		if m := r.Maintenance; m != nil {
			if m.Phase == maintenancev1.PhasePending {
				d.PendingMaintenance++
			} else {
				d.InMaintenance++
			}
		}
		d.GPUs += r.GPUs.Capacity
		if r.GPUs.InUse != nil {
			d.GPUsInUse += *r.GPUs.InUse
		}
		if r.ComputeDomain != nil {
			cds[r.Domain][*r.ComputeDomain]++
		}
	}
	out := make([]Domain, 0, len(byName))
	for name, d := range byName {
		d.Disrupted = name != "" && d.InMaintenance > 0
		for p := range pools[name] {
			d.Pools = append(d.Pools, p)
		}
		slices.SortFunc(d.Pools, noneLast)
		for ref, n := range cds[name] {
			d.ComputeDomains = append(d.ComputeDomains, ComputeDomainUse{ComputeDomainRef: ref, Nodes: n})
		}
		slices.SortFunc(d.ComputeDomains, func(a, b ComputeDomainUse) int {
			return cmp.Or(cmp.Compare(b.Nodes, a.Nodes), strings.Compare(a.String(), b.String()))
		})
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b Domain) int { return noneLast(a.Name, b.Name) })
	return out
}

// String is the ComputeDomain's name, else its UID.
func (r ComputeDomainRef) String() string {
	if r.Name != "" {
		return r.Name
	}
	return r.UID
}

// keepDomains keeps the domains that have one of rows.
func keepDomains(domains []Domain, rows []Row) []Domain {
	shown := map[string]bool{}
	for i := range rows {
		shown[rows[i].Domain] = true
	}
	return slices.DeleteFunc(domains, func(d Domain) bool { return !shown[d.Name] })
}

// DomainName is the domain's name as the tables show it.
func DomainName(name string) string {
	if name == "" {
		return "(no domain)"
	}
	return name
}

// WorkloadCell says what runs in a domain: "ComputeDomain ml/train on 4
// node(s)", several separated by commas, or "-".
func WorkloadCell(uses []ComputeDomainUse) string {
	if len(uses) == 0 {
		return "-"
	}
	parts := make([]string, len(uses))
	for i, u := range uses {
		parts[i] = fmt.Sprintf("%s on %d node(s)", u.String(), u.Nodes)
	}
	return "ComputeDomain " + strings.Join(parts, ", ")
}

// WriteDomainTable prints a row per domain: its nodes, pools, nodes ready
// for work, in maintenance and waiting for it, whether it is disrupted,
// its GPUs and its ComputeDomain workloads.
func WriteDomainTable(out io.Writer, domains []Domain) error {
	tw := printers.GetNewTabWriter(out)
	w := &errWriter{w: tw}
	w.printf("DOMAIN\tNODES\tPOOLS\tREADY\tIN MAINTENANCE\tPENDING\tDISRUPTED\tGPUS\tWORKLOAD\n")
	for i := range domains {
		d := &domains[i]
		pools := make([]string, len(d.Pools))
		for j, p := range d.Pools {
			pools[j] = cmp.Or(p, "(no pool)")
		}
		disrupted := "no"
		switch {
		case d.Name == "":
			disrupted = "-"
		case d.Disrupted:
			disrupted = "yes"
		}
		gpus := "-"
		if d.GPUs > 0 {
			gpus = strconv.FormatInt(d.GPUsInUse, 10) + "/" + strconv.FormatInt(d.GPUs, 10)
		}
		w.printf("%s\t%d\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", oneLine(DomainName(d.Name)), d.Nodes, oneLine(strings.Join(pools, ",")),
			d.ReadyForWork, d.InMaintenance, d.PendingMaintenance, disrupted, gpus, oneLine(WorkloadCell(d.ComputeDomains)))
	}
	if w.err != nil {
		return w.err
	}
	return tw.Flush()
}
