// Package monitoring tests what gpufleet ships for Prometheus and Grafana
// (charts/gpufleet/dashboards, charts/gpufleet/rules): the dashboards'
// structure, the rules under promtool, and that every metric they query
// is exported by the operator in an integration run.
package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

const (
	dashboardDir = "../../charts/gpufleet/dashboards"
	rulesFile    = "../../charts/gpufleet/rules/gpufleet.rules.yaml"
	rulesTest    = "../../charts/gpufleet/rules/gpufleet.rules_test.yaml"
)

// query is one PromQL expression of a dashboard or rule, and where it is.
type query struct {
	where, expr string
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasource     `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// dashboards reads every dashboard file, by file name.
func dashboards(t *testing.T) map[string]dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s: %v", dashboardDir, err)
	}
	out := map[string]dashboard{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		dec := json.NewDecoder(strings.NewReader(string(b)))
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = d
	}
	return out
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// labelValuesQuery matches a Grafana template query label_values(metric, label).
var labelValuesQuery = regexp.MustCompile(`^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)

// dashboardQueries lists the PromQL of every panel target and template
// variable (label_values' metric).
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	var out []query
	for file, d := range dashboards(t) {
		for _, p := range allPanels(d.Panels) {
			for _, tg := range p.Targets {
				out = append(out, query{where: fmt.Sprintf("%s panel %q %s", file, p.Title, tg.RefID), expr: tg.Expr})
			}
		}
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			var q struct{ Query string }
			if err := json.Unmarshal(v.Query, &q); err != nil {
				var s string
				if err := json.Unmarshal(v.Query, &s); err != nil {
					t.Fatalf("%s variable %s: query %s", file, v.Name, v.Query)
				}
				q.Query = s
			}
			m := labelValuesQuery.FindStringSubmatch(q.Query)
			if m == nil {
				t.Fatalf("%s variable %s: query %q is not label_values(metric, label)", file, v.Name, q.Query)
			}
			out = append(out, query{where: fmt.Sprintf("%s variable %s", file, v.Name), expr: m[1]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].where < out[j].where })
	return out
}

// ruleFile is the part of a Prometheus rule file the tests read.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(b, &rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return rf
}

func ruleQueries(t *testing.T) []query {
	t.Helper()
	var out []query
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			out = append(out, query{where: fmt.Sprintf("rule %s", r.Alert+r.Record), expr: r.Expr})
		}
	}
	return out
}

// Parts of PromQL that never name a metric.
var (
	stringLiteral = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	labelMatchers = regexp.MustCompile(`\{[^{}]*\}`)
	rangeSelector = regexp.MustCompile(`\[[^\[\]]*\]`)
	grouping      = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	identifier    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	keywords      = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true, "atan2": true}
)

// metricNames returns the metric names an expression selects: the
// identifiers that remain once strings, label matchers, ranges, grouping
// clauses, numbers, durations, Grafana variables, keywords and function
// names are taken out.
func metricNames(expr string) []string {
	s := stringLiteral.ReplaceAllString(expr, `""`)
	s = labelMatchers.ReplaceAllString(s, " ")
	s = rangeSelector.ReplaceAllString(s, " ")
	s = grouping.ReplaceAllString(s, " ")
	var out []string
	for _, loc := range identifier.FindAllStringIndex(s, -1) {
		if loc[0] > 0 {
			prev := s[loc[0]-1]
			// part of a number (1e3, 5m, 0x1f) or of a Grafana variable ($x, ${x})
			if prev == '$' || prev == '{' || prev == '.' || prev >= '0' && prev <= '9' {
				continue
			}
		}
		name := s[loc[0]:loc[1]]
		if keywords[strings.ToLower(name)] {
			continue
		}
		if rest := strings.TrimLeft(s[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

func TestMetricNames(t *testing.T) {
	tests := map[string]struct {
		expr string
		want []string
	}{
		"a selector":   {expr: `gpufleet_maintenance_objects`, want: []string{"gpufleet_maintenance_objects"}},
		"aggregation":  {expr: `sum by (phase) (gpufleet_maintenance_objects{phase="Draining"})`, want: []string{"gpufleet_maintenance_objects"}},
		"range, rate":  {expr: `rate(gpufleet_api_requests_total{verb=~"GET|LIST"}[$__rate_interval]) * 3600`, want: []string{"gpufleet_api_requests_total"}},
		"histogram":    {expr: `histogram_quantile(0.9, sum by (le, result) (rate(gpufleet_repair_duration_seconds_bucket[5m])))`, want: []string{"gpufleet_repair_duration_seconds_bucket"}},
		"binary, bool": {expr: `time() - max without (instance) (a_seconds offset 5m) > bool 3600 and on (node) b == 1 unless c`, want: []string{"a_seconds", "b", "c"}},
		"strings with braces and names": {
			expr: `label_replace(x{a="}sum(y)"}, "dst", "$1", "src", "(.*)")`, want: []string{"x"},
		},
		"grafana variables and numbers": {expr: `avg(DCGM_FI_DEV_GPU_UTIL{namespace=~"$namespace"}) / 1e2 + 0x1f + ${k}`, want: []string{"DCGM_FI_DEV_GPU_UTIL"}},
		"group_left":                    {expr: `a * on (node) group_left (pool) b`, want: []string{"a", "b"}},
		"vector(0)":                     {expr: `sum(a{node=""}) or vector(0)`, want: []string{"a"}},
		"a colon name":                  {expr: `job:rate5m:sum`, want: []string{"job:rate5m:sum"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, metricNames(tc.expr)); diff != "" {
				t.Errorf("metricNames(%q) (-want +got):\n%s", tc.expr, diff)
			}
		})
	}
}

// queriedMetrics maps every metric name the dashboards and rules query to
// where.
func queriedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, q := range append(dashboardQueries(t), ruleQueries(t)...) {
		names := metricNames(q.expr)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", q.where, q.expr)
		}
		for _, n := range names {
			out[n] = append(out[n], q.where)
		}
	}
	return out
}

// dcgmExporterMetrics are the fields of dcgm-exporter's
// etc/default-counters.csv (NVIDIA/dcgm-exporter), the ones it exports by
// default and those listed there commented out (ECC, retired pages,
// NVLink errors): a dashboard or rule may query only these of DCGM's.
var dcgmExporterMetrics = []string{
	"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
	"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
	"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
	"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
	"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
	"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
	"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING",
	"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
	"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
	"DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
	"DCGM_FI_DEV_ROW_REMAP_FAILURE",
}

// TestQueriedMetricsAreKnown: every metric is gpufleet's (checked against
// an operator run by TestEveryQueriedMetricIsExported) or one of
// dcgm-exporter's documented fields; nothing else (no panel on a metric no
// one exports).
func TestQueriedMetricsAreKnown(t *testing.T) {
	for name, where := range queriedMetrics(t) {
		switch {
		case strings.HasPrefix(name, "gpufleet_"):
		case strings.HasPrefix(name, "DCGM_FI_"):
			if !slices.Contains(dcgmExporterMetrics, name) {
				t.Errorf("%s (%s) is not a field of dcgm-exporter's default-counters.csv", name, strings.Join(where, "; "))
			}
		default:
			t.Errorf("%s (%s) is neither gpufleet's nor dcgm-exporter's", name, strings.Join(where, "; "))
		}
	}
}
