// Command metricsdoc writes the metrics reference (make docs:
// docs/reference/metrics.md): every metric that gpufleet's packages
// register on controller-runtime's registry, which the operator serves,
// with its type, labels and help. Run it from the repository root:
//
//	go run ./hack/metricsdoc docs/reference/metrics.md
//
// Names, labels and help come from each collector's Describe, so metrics
// with labels are listed before they have a series. The type comes from
// what the collector is (a CounterVec, a GaugeVec, …) or collects; for a
// collector that makes its series at scrape time (prometheus.NewDesc and
// MustNewConstMetric), from the value type its package's source passes.
package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	// record must come first (it does: hack/ sorts before internal/).
	"github.com/gpufleet/gpufleet/hack/metricsdoc/record"
	// The operator and, through it, every capability's package.
	_ "github.com/gpufleet/gpufleet/internal/operator"
)

const module = "github.com/gpufleet/gpufleet/"

// metric is one row of the reference.
type metric struct {
	name, typ, help, pkg string
	labels               []string // variable labels, in order
	constLabels          string   // k="v",…
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./hack/metricsdoc OUTPUT.md (from the repository root)")
		os.Exit(2)
	}
	ms, err := metrics()
	if err == nil {
		err = os.WriteFile(os.Args[1], []byte(render(ms)), 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "metricsdoc:", err)
		os.Exit(1)
	}
}

// metrics are gpufleet's metrics, sorted by name.
func metrics() ([]metric, error) {
	if _, err := os.Stat("go.mod"); err != nil {
		return nil, errors.New("run from the repository root")
	}
	byName := map[string]*metric{}
	for _, reg := range record.Registrations() {
		if !strings.HasPrefix(reg.Package, module) {
			continue // controller-runtime's and client-go's own
		}
		pkg := strings.TrimPrefix(reg.Package, module)
		types, err := collectedTypes(reg.Collector)
		if err != nil {
			return nil, err
		}
		var constTypes map[string]string // from the package's source, read when needed
		for _, d := range describe(reg.Collector) {
			m, err := parseDesc(d)
			if err != nil {
				return nil, err
			}
			if _, dup := byName[m.name]; dup {
				return nil, fmt.Errorf("%s is registered twice", m.name)
			}
			m.pkg = pkg
			m.typ = types[m.name]
			if m.typ == "" {
				if constTypes == nil {
					if constTypes, err = sourceConstTypes(pkg); err != nil {
						return nil, err
					}
				}
				m.typ = constTypes[m.name]
			}
			if m.typ == "" {
				return nil, fmt.Errorf("%s (%s): type unknown: neither a standard collector nor a NewDesc with one value type in its package's source", m.name, pkg)
			}
			byName[m.name] = &m
		}
	}
	if len(byName) == 0 {
		return nil, errors.New("no gpufleet metrics recorded: was package record initialized first?")
	}
	// Whatever the registry gathers must have been recorded: a gpufleet
	// collector registered before the recorder would be missing here.
	families, err := record.Registry.Gather()
	if err != nil {
		return nil, err
	}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "gpufleet_") && byName[f.GetName()] == nil {
			return nil, fmt.Errorf("%s is gathered but was not recorded: its package registered it before package record's init", f.GetName())
		}
	}
	out := make([]metric, 0, len(byName))
	for _, m := range byName {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// describe is what c's Describe sends.
func describe(c prometheus.Collector) []*prometheus.Desc {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	var out []*prometheus.Desc
	for d := range ch {
		out = append(out, d)
	}
	return out
}

// collectedTypes are the types of c's metrics by name, as far as c shows
// them without series: from what c collects now, and from c (or a field
// it embeds) being a standard metric vector.
func collectedTypes(c prometheus.Collector) (map[string]string, error) {
	types := map[string]string{}
	set := func(name, typ string) error {
		if old, ok := types[name]; ok && old != typ {
			return fmt.Errorf("%s is both a %s and a %s", name, old, typ)
		}
		types[name] = typ
		return nil
	}
	ch := make(chan prometheus.Metric)
	go func() { c.Collect(ch); close(ch) }()
	var errs []error
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) != nil {
			continue // an invalid metric: a collector without its source
		}
		d, err := parseDesc(m.Desc())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if typ := dtoType(&pb); typ != "" {
			errs = append(errs, set(d.name, typ))
		}
	}
	for _, v := range vectors(reflect.ValueOf(c), 2) {
		for _, d := range describe(v.collector) {
			m, err := parseDesc(d)
			if err == nil {
				err = set(m.name, v.typ)
			}
			errs = append(errs, err)
		}
	}
	return types, errors.Join(errs...)
}

func dtoType(m *dto.Metric) string {
	switch {
	case m.Counter != nil:
		return "counter"
	case m.Gauge != nil:
		return "gauge"
	case m.Histogram != nil:
		return "histogram"
	case m.Summary != nil:
		return "summary"
	case m.Untyped != nil:
		return "untyped"
	}
	return ""
}

type vector struct {
	collector prometheus.Collector
	typ       string
}

// vectors are v itself, if a metric vector, or the vectors its struct
// embeds, depth levels down.
func vectors(v reflect.Value, depth int) []vector {
	if !v.IsValid() || !v.CanInterface() {
		return nil
	}
	switch c := v.Interface().(type) {
	case *prometheus.CounterVec:
		return []vector{{c, "counter"}}
	case *prometheus.GaugeVec:
		return []vector{{c, "gauge"}}
	case *prometheus.HistogramVec:
		return []vector{{c, "histogram"}}
	case *prometheus.SummaryVec:
		return []vector{{c, "summary"}}
	}
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if depth == 0 || v.Kind() != reflect.Struct {
		return nil
	}
	var out []vector
	for i := 0; i < v.NumField(); i++ {
		if v.Type().Field(i).Anonymous {
			out = append(out, vectors(v.Field(i), depth-1)...)
		}
	}
	return out
}

// descRE matches prometheus.Desc.String() (client_golang v1.2x).
var descRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), unit: "(?:[^"\\]|\\.)*", constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)

func parseDesc(d *prometheus.Desc) (metric, error) {
	if err := d.Err(); err != nil {
		return metric{}, err
	}
	s := d.String()
	sub := descRE.FindStringSubmatch(s)
	if sub == nil {
		return metric{}, fmt.Errorf("unexpected form of a prometheus.Desc (a new client_golang?): %s", s)
	}
	name, err := strconv.Unquote(sub[1])
	if err != nil {
		return metric{}, err
	}
	help, err := strconv.Unquote(sub[2])
	if err != nil {
		return metric{}, err
	}
	m := metric{name: name, help: help, constLabels: sub[3]}
	if sub[4] != "" {
		for _, l := range strings.Split(sub[4], ",") {
			if strings.HasPrefix(l, "c(") { // a constrained label
				l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")")
			}
			m.labels = append(m.labels, l)
		}
	}
	return m, nil
}

// sourceConstTypes reads the non-test Go files of a package (its directory
// relative to the repository root) for the series it makes at scrape
// time: the name of each prometheus.NewDesc("name", …) assigned to a
// variable, and the value type that MustNewConstMetric(variable,
// prometheus.GaugeValue, …) and the like pass. A desc that no call names
// directly (it is passed through a field) gets the value type of the
// package's calls if they all pass the same.
func sourceConstTypes(dir string) (map[string]string, error) {
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	descVar := map[string]string{} // variable → metric name
	varType := map[string]string{} // variable → type
	pkgTypes := map[string]bool{}
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, name := range n.Names {
					if i < len(n.Values) {
						if metricName, ok := newDescName(n.Values[i]); ok {
							descVar[name.Name] = metricName
						}
					}
				}
			case *ast.AssignStmt:
				for i, lhs := range n.Lhs {
					if id, ok := lhs.(*ast.Ident); ok && i < len(n.Rhs) {
						if metricName, ok := newDescName(n.Rhs[i]); ok {
							descVar[id.Name] = metricName
						}
					}
				}
			case *ast.CallExpr:
				typ := constMetricType(n)
				if typ == "" || len(n.Args) == 0 {
					return true
				}
				pkgTypes[typ] = true
				if id, ok := n.Args[0].(*ast.Ident); ok {
					if old, ok := varType[id.Name]; ok && old != typ {
						varType[id.Name] = "?"
					} else {
						varType[id.Name] = typ
					}
				}
			}
			return true
		})
	}
	out := map[string]string{}
	for v, name := range descVar {
		typ := varType[v]
		if typ == "" && len(pkgTypes) == 1 {
			for t := range pkgTypes {
				typ = t
			}
		}
		if typ != "" && typ != "?" {
			out[name] = typ
		}
	}
	return out, nil
}

// newDescName is the name of prometheus.NewDesc("name", …).
func newDescName(e ast.Expr) (string, bool) {
	call, ok := e.(*ast.CallExpr)
	if !ok || !isPrometheus(call.Fun, "NewDesc") || len(call.Args) == 0 {
		return "", false
	}
	lit, ok := call.Args[0].(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// constMetricType is the type of the series a prometheus.(Must)NewConst…
// call makes, "" if it is no such call.
func constMetricType(call *ast.CallExpr) string {
	for _, fn := range []string{"MustNewConstHistogram", "NewConstHistogram", "MustNewConstHistogramWithCreatedTimestamp", "NewConstHistogramWithCreatedTimestamp"} {
		if isPrometheus(call.Fun, fn) {
			return "histogram"
		}
	}
	for _, fn := range []string{"MustNewConstSummary", "NewConstSummary", "MustNewConstSummaryWithCreatedTimestamp", "NewConstSummaryWithCreatedTimestamp"} {
		if isPrometheus(call.Fun, fn) {
			return "summary"
		}
	}
	for _, fn := range []string{"MustNewConstMetric", "NewConstMetric", "MustNewConstMetricWithCreatedTimestamp", "NewConstMetricWithCreatedTimestamp"} {
		if isPrometheus(call.Fun, fn) && len(call.Args) > 1 {
			switch {
			case isPrometheus(call.Args[1], "CounterValue"):
				return "counter"
			case isPrometheus(call.Args[1], "GaugeValue"):
				return "gauge"
			case isPrometheus(call.Args[1], "UntypedValue"):
				return "untyped"
			}
		}
	}
	return ""
}

// isPrometheus says whether e is prometheus.name.
func isPrometheus(e ast.Expr, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != name {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == "prometheus"
}

// render is the Markdown page.
func render(ms []metric) string {
	var b strings.Builder
	b.WriteString(`# Metrics reference

<!-- Generated by make docs (hack/metricsdoc) from the collectors gpufleet registers: do not edit. -->

Every metric that gpufleet's packages register on controller-runtime's
registry, which ` + "`gpufleet operator`" + ` serves on ` + "`--metrics-bind-address`" + `
(default ` + "`:8080`" + `, path ` + "`/metrics`" + `). A metric with labels is
listed even while it has no series; the scrape-time gauges (those read from
the cache) are exported by the leader only. What they mean for dashboards
and alerts: [operations.md](../operations.md#metrics).

The endpoint also serves controller-runtime's own metrics
(` + "`controller_runtime_*`, `workqueue_*`, `rest_client_*`, `leader_election_*`, `certwatcher_*`" + `)
and Go's runtime and process metrics (` + "`go_*`, `process_*`" + `), not listed here.

| Metric | Type | Labels | Package | Help |
| --- | --- | --- | --- | --- |
`)
	for _, m := range ms {
		labels := make([]string, 0, len(m.labels)+1)
		for _, l := range m.labels {
			labels = append(labels, "`"+l+"`")
		}
		if m.constLabels != "" {
			labels = append(labels, "`"+m.constLabels+"` (constant)")
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", m.name, m.typ, strings.Join(labels, ", "), m.pkg, cell(m.help))
	}
	return b.String()
}

// cell escapes text for a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}
