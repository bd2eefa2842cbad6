package monitoring

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// promtool returns bin/promtool (or $GPUFLEET_BIN_DIR/promtool); a missing
// binary fails the test with the command that builds it.
func promtool(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("GPUFLEET_BIN_DIR")
	if dir == "" {
		dir = "../../bin"
	}
	p, err := filepath.Abs(filepath.Join(dir, "promtool"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s missing: build it with `make tools` (or hack/build-tools.sh promtool): %v", p, err)
	}
	return p
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestRulesPassPromtoolCheck(t *testing.T) {
	out := run(t, promtool(t), "check", "rules", rulesFile)
	t.Logf("%s", out)
}

func TestRulesPassTheirUnitTests(t *testing.T) {
	out := run(t, promtool(t), "test", "rules", rulesTest)
	t.Logf("%s", out)
}

// TestEveryAlertIsTestedAndHasARunbook: each alert has a severity, a
// summary and a runbook line, and a promtool test case where it fires.
func TestEveryAlertIsTestedAndHasARunbook(t *testing.T) {
	b, err := os.ReadFile(rulesTest)
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatal(err)
	}
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !fires[r.Alert] {
				t.Errorf("alert %s: no test in %s where it fires", r.Alert, rulesTest)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["runbook"] == "" ||
				strings.Contains(r.Annotations["runbook"], "\n") {
				t.Errorf("alert %s: needs a severity label, a summary and a one-line runbook annotation", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Errorf("no alerts in %s", rulesFile)
	}
}

// grafanaVariable matches $x, ${x} and ${x:format}.
var grafanaVariable = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}?`)

// TestDashboardQueriesParse hands every dashboard query, its Grafana
// variables replaced by values, to promtool as a recording rule: a query
// Prometheus cannot parse fails.
func TestDashboardQueriesParse(t *testing.T) {
	values := map[string]string{"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for i, q := range dashboardQueries(t) {
		expr := grafanaVariable.ReplaceAllStringFunc(q.expr, func(v string) string {
			name := grafanaVariable.FindStringSubmatch(v)[1]
			if val, ok := values[name]; ok {
				return val
			}
			return ".*" // a variable in a label matcher's regular expression
		})
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard_query_%d", i), Expr: expr})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboards", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "dashboards.rules.yaml")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out := run(t, promtool(t), "check", "rules", "--lint=none", f)
	t.Logf("%d dashboard queries: %s", len(rules), out)
}
