package monitoring

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

var variableRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)

// TestDashboardsStructure checks what Grafana needs to load and lay out a
// dashboard, and what the chart's ConfigMaps rely on.
func TestDashboardsStructure(t *testing.T) {
	uids := map[string]string{}
	panelTypes := []string{"row", "timeseries", "stat", "table", "bargauge", "gauge"}
	for file, d := range dashboards(t) {
		if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
			t.Errorf("%s: uid %q, title %q, schemaVersion %d", file, d.UID, d.Title, d.SchemaVersion)
		}
		if other, ok := uids[d.UID]; ok {
			t.Errorf("%s and %s share uid %s", file, other, d.UID)
		}
		uids[d.UID] = file
		if !strings.HasPrefix(file, "gpufleet-") || len(file) > 63-len("gpufleet-dashboard-")+len(".json") {
			t.Errorf("%s: the chart names its ConfigMap after the file: gpufleet-<short name>.json", file)
		}
		vars := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
		for _, v := range d.Templating.List {
			vars[v.Name] = true
			if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
				t.Errorf("%s variable %s: datasource %+v, want ${datasource}", file, v.Name, v.Datasource)
			}
		}
		if !vars["datasource"] {
			t.Errorf("%s: no datasource variable", file)
		}
		ids := map[int]bool{}
		type cell struct{ x, y int }
		used := map[cell]string{}
		for _, p := range allPanels(d.Panels) {
			where := file + " panel " + p.Title
			if p.ID == 0 || ids[p.ID] {
				t.Errorf("%s: id %d missing or not unique", where, p.ID)
			}
			ids[p.ID] = true
			if !slices.Contains(panelTypes, p.Type) {
				t.Errorf("%s: type %q", where, p.Type)
			}
			g := p.GridPos
			if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("%s: gridPos %+v outside the 24 columns", where, g)
			}
			overlaps := map[string]bool{}
			for x := g.X; x < g.X+g.W; x++ {
				for y := g.Y; y < g.Y+g.H; y++ {
					if other, ok := used[cell{x, y}]; ok {
						overlaps[other] = true
					}
					used[cell{x, y}] = p.Title
				}
			}
			for other := range overlaps {
				t.Errorf("%s overlaps panel %s", where, other)
			}
			if p.Type == "row" {
				continue
			}
			if p.Title == "" || p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
				t.Errorf("%s: title, datasource ${datasource} and targets needed (datasource %+v, %d targets)", where, p.Datasource, len(p.Targets))
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.RefID == "" || refs[tg.RefID] || strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s: target %q: empty or repeated refId, or no expr", where, tg.RefID)
				}
				refs[tg.RefID] = true
				for _, m := range variableRef.FindAllStringSubmatch(tg.Expr, -1) {
					if !vars[m[1]] {
						t.Errorf("%s: %q uses undefined variable $%s", where, tg.Expr, m[1])
					}
				}
			}
		}
	}
	if len(uids) < 2 {
		t.Errorf("dashboards %v: want the operator's and the GPU usage one", uids)
	}
}
