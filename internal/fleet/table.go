package fleet

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/printers"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// DeepCopyObject makes Fleet a runtime.Object for cli-runtime's JSON and
// YAML printers.
func (f *Fleet) DeepCopyObject() runtime.Object { return deepCopy(f, &Fleet{}) }

// DeepCopyObject makes Story a runtime.Object for cli-runtime's JSON and
// YAML printers.
func (st *Story) DeepCopyObject() runtime.Object { return deepCopy(st, &Story{}) }

func deepCopy[T runtime.Object](in, out T) T {
	data, err := json.Marshal(in)
	if err == nil {
		err = json.Unmarshal(data, out)
	}
	if err != nil {
		panic(fmt.Sprintf("copying %T: %v", in, err)) // plain data: cannot fail
	}
	return out
}

// Sort orders.
const (
	SortByName  = "name"
	SortByPool  = "pool"
	SortByState = "state"
)

// SortOrders lists the accepted --sort-by values.
var SortOrders = []string{SortByName, SortByPool, SortByState}

// Filter selects and orders the rows.
type Filter struct {
	// Pools keeps the nodes of these pools (empty: all).
	Pools []string
	// Problems keeps the nodes that are not ready for work or have a problem.
	Problems bool
	// SortBy is one of SortOrders (default name).
	SortBy string
}

// Apply filters and sorts f's rows in place and recomputes the summary
// over what is left. With domains, the rows stay grouped by domain (SortBy
// orders them within each), and the domains of the rows left are kept.
func (flt Filter) Apply(f *Fleet) error {
	if flt.SortBy != "" && !slices.Contains(SortOrders, flt.SortBy) {
		return fmt.Errorf("--sort-by %q: must be one of %s", flt.SortBy, strings.Join(SortOrders, ", "))
	}
	rows := f.Rows[:0]
	for _, r := range f.Rows {
		if len(flt.Pools) > 0 && !slices.Contains(flt.Pools, r.Pool) {
			continue
		}
		if flt.Problems && r.State == StateReady && len(r.Problems) == 0 {
			continue
		}
		rows = append(rows, r)
	}
	f.Rows = rows
	urgency := map[State]int{}
	for i, s := range States {
		urgency[s] = i
	}
	switch flt.SortBy {
	case SortByPool:
		sort.SliceStable(f.Rows, func(i, j int) bool { return f.Rows[i].Pool < f.Rows[j].Pool })
	case SortByState:
		sort.SliceStable(f.Rows, func(i, j int) bool { return urgency[f.Rows[i].State] < urgency[f.Rows[j].State] })
	}
	if f.DomainLabel != "" {
		// Grouped by domain, in the order asked within each; the domains
		// of the rows left stay summarised in full.
		groupByDomain(f.Rows)
		f.Domains = keepDomains(f.Domains, f.Rows)
	}
	f.Summary = Summarize(f.Rows)
	return nil
}

// SummaryLine is the one-line summary under the table.
func SummaryLine(s Summary) string {
	line := fmt.Sprintf("%d nodes: %d ready for work, %d in maintenance", s.Nodes, s.ReadyForWork, s.InMaintenance)
	if s.Draining > 0 {
		line += fmt.Sprintf(" (%d draining)", s.Draining)
	}
	line += fmt.Sprintf(", %d repairing", s.Repairing)
	if s.RecoveryFailed > 0 {
		line += fmt.Sprintf(" (%d recovery failed)", s.RecoveryFailed)
	}
	line += fmt.Sprintf(", %d degraded", s.Degraded)
	var parts []string
	if s.NotReady > 0 {
		parts = append(parts, fmt.Sprintf("%d not ready", s.NotReady))
	}
	if s.DegradedStack > 0 {
		parts = append(parts, fmt.Sprintf("%d degraded stack", s.DegradedStack))
	}
	if len(parts) > 0 {
		line += " (" + strings.Join(parts, ", ") + ")"
	}
	if s.Cordoned > 0 {
		line += fmt.Sprintf(", %d cordoned", s.Cordoned)
	}
	return line + fmt.Sprintf("; GPUs %d, %d in use, %d faulty", s.GPUs, s.GPUsInUse, s.GPUsFaulty)
}

// Output formats of WriteTo.
const (
	OutputTable = ""
	OutputWide  = "wide"
	OutputJSON  = "json"
	OutputYAML  = "yaml"
)

// CheckOutput refuses an unknown output format.
func CheckOutput(output string) error {
	switch output {
	case OutputTable, OutputWide, OutputJSON, OutputYAML:
		return nil
	}
	return fmt.Errorf("-o %q: must be wide, json or yaml", output)
}

// Write prints f as a table (wide adds columns) or as JSON or YAML, with
// the notes (kinds that could not be read) on notes.
func Write(out, notes io.Writer, f *Fleet, output string, now time.Time) error {
	if err := CheckOutput(output); err != nil {
		return err
	}
	switch output {
	case OutputJSON:
		return (&printers.JSONPrinter{}).PrintObj(f, out)
	case OutputYAML:
		return (&printers.YAMLPrinter{}).PrintObj(f, out)
	}
	if err := WriteTable(out, f, output == OutputWide, now); err != nil {
		return err
	}
	for _, n := range f.Notes {
		if _, err := fmt.Fprintln(notes, "note:", n); err != nil {
			return err
		}
	}
	return nil
}

// WriteTable prints the rows and the summary line; with domains, a DOMAIN
// column and, before the summary line, a row per domain.
func WriteTable(out io.Writer, f *Fleet, wide bool, now time.Time) error {
	tw := printers.GetNewTabWriter(out)
	w := &errWriter{w: tw}
	domains := f.DomainLabel != ""
	header := []string{"NODE", "POOL", "STATE", "GPUS", "STACK", "MAINTENANCE", "REPAIR"}
	if domains {
		header = slices.Insert(header, 2, "DOMAIN")
	}
	if wide {
		header = append(header, "CAP", "ALLOC", "IN USE", "FAULTY", "AGE", "PROBLEMS")
	}
	w.printf("%s\n", strings.Join(header, "\t"))
	for i := range f.Rows {
		r := &f.Rows[i]
		cols := []string{r.Node, dash(r.Pool), string(r.State), gpuCell(r.GPUs), StackCell(r.Stack, wide),
			oneLine(MaintenanceCell(r.Maintenance)), oneLine(RepairCell(r.Repair, now))}
		if domains {
			cols = slices.Insert(cols, 2, dash(oneLine(r.Domain)))
		}
		if wide {
			cols = append(cols, strconv.FormatInt(r.GPUs.Capacity, 10), strconv.FormatInt(r.GPUs.Allocatable, 10),
				count(r.GPUs.InUse), count(r.GPUs.Faulty), age(r.Created, now), dash(oneLine(strings.Join(r.Problems, "; "))))
		}
		w.printf("%s\n", strings.Join(cols, "\t"))
	}
	if w.err != nil {
		return w.err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if domains {
		if _, err := fmt.Fprintln(out); err != nil {
			return err
		}
		if err := WriteDomainTable(out, f.Domains); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(out, SummaryLine(f.Summary))
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func count(v *int64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatInt(*v, 10)
}

// gpuCell is "in use/allocatable", with the faulty ones: "3/8 1✗".
func gpuCell(g GPUs) string {
	if g.Capacity == 0 && g.Allocatable == 0 {
		return "-"
	}
	s := count(g.InUse) + "/" + strconv.FormatInt(g.Allocatable, 10)
	if g.Capacity != g.Allocatable {
		s += " (cap " + strconv.FormatInt(g.Capacity, 10) + ")"
	}
	if g.Faulty != nil && *g.Faulty > 0 {
		s += " " + strconv.FormatInt(*g.Faulty, 10) + " faulty"
	}
	return s
}

var componentMarks = map[ComponentStatus]string{
	ComponentReady: "✓", ComponentPending: "…", ComponentStuck: "✗", ComponentFailed: "✗", ComponentOff: "off", ComponentAbsent: "-",
}

// tableComponents are the stack components the narrow table shows.
var tableComponents = []string{"driver", "toolkit", "plugin", "validator"}

// StackCell renders the GPU stack: "driver ✓ toolkit ✓ plugin …".
func StackCell(stack []Component, all bool) string {
	if len(stack) == 0 {
		return "-"
	}
	var parts []string
	for _, c := range stack {
		if !all && !slices.Contains(tableComponents, c.Name) {
			continue
		}
		parts = append(parts, c.Name+" "+componentMarks[c.Status])
	}
	return strings.Join(parts, " ")
}

// MaintenanceCell renders the maintenance: "requestor Phase" or
// "requestor Pending: why it waits".
func MaintenanceCell(m *Maintenance) string {
	if m == nil {
		return "-"
	}
	s := m.Requestor + " " + string(m.Phase)
	switch {
	case m.Phase == maintenancev1.PhasePending && m.Waiting != "":
		s += ": " + m.Waiting
	case m.DrainProgress != nil:
		s += fmt.Sprintf(" %d%%", *m.DrainProgress)
	}
	if m.DrainBlocked {
		s += " (drain blocked)"
	}
	if m.Deleting {
		s += " (releasing)"
	}
	if m.Others > 0 {
		s += fmt.Sprintf(" +%d", m.Others)
	}
	return s
}

// RepairCell renders the open repair: "Repairing gpu-xid for 5m".
func RepairCell(r *Repair, now time.Time) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%s %s for %s", r.Phase, dash(r.Fault), age(r.Since, now))
}
