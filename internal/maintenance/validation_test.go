package maintenance_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// applyYAML creates an object from YAML as an untyped client would.
func applyYAML(t *testing.T, doc string) error {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatalf("bad test YAML: %v", err)
	}
	return k8s.Create(t.Context(), u)
}

func TestSchemaRejectsBadObjects(t *testing.T) {
	devtest.NeedCluster(t)
	nm := func(spec string) string {
		return "apiVersion: maintenance.nvidia.com/v1alpha1\nkind: NodeMaintenance\nmetadata:\n  generateName: bad-\n  namespace: default\nspec:\n" + spec
	}
	cfg := func(spec string) string {
		return "apiVersion: maintenance.nvidia.com/v1alpha1\nkind: MaintenanceOperatorConfig\nmetadata:\n  generateName: bad-\n  namespace: default\nspec:\n" + spec
	}
	tests := map[string]struct {
		doc string
		// wantMsg must appear in the API server's error.
		wantMsg string
	}{
		"missing requestorID":      {nm("  nodeName: gpu-000\n"), "requestorID: Required value"},
		"missing nodeName":         {nm("  requestorID: a.b\n"), "nodeName: Required value"},
		"requestorID too short":    {nm("  requestorID: a\n  nodeName: gpu-000\n"), "spec.requestorID: Invalid value"},
		"requestorID too long":     {nm("  requestorID: " + strings.Repeat("a", 64) + "\n  nodeName: gpu-000\n"), "may not be more than 63"},
		"requestorID bad chars":    {nm("  requestorID: bad_requestor!\n  nodeName: gpu-000\n"), "spec.requestorID: Invalid value"},
		"requestorID ends in dash": {nm("  requestorID: abc-\n  nodeName: gpu-000\n"), "spec.requestorID: Invalid value"},
		"empty nodeName":           {nm("  requestorID: a.b\n  nodeName: \"\"\n"), "spec.nodeName: Invalid value"},
		"negative drain timeout":   {nm("  requestorID: a.b\n  nodeName: gpu-000\n  drainSpec:\n    timeoutSeconds: -1\n"), "timeoutSeconds: Invalid value: -1"},
		"negative wait timeout":    {nm("  requestorID: a.b\n  nodeName: gpu-000\n  waitForPodCompletion:\n    timeoutSeconds: -5\n"), "timeoutSeconds: Invalid value: -5"},
		"bad drain podSelector":    {nm("  requestorID: a.b\n  nodeName: gpu-000\n  drainSpec:\n    podSelector: \"app==\\\"x\\\"\"\n"), "must be a label selector"},
		"bad wait podSelector":     {nm("  requestorID: a.b\n  nodeName: gpu-000\n  waitForPodCompletion:\n    podSelector: \"app in (a\"\n"), "must be a label selector"},
		"empty eviction regex":     {nm("  requestorID: a.b\n  nodeName: gpu-000\n  drainSpec:\n    podEvictionFilters:\n    - byResourceNameRegex: \"\"\n"), "byResourceNameRegex"},
		"eviction filter without regex": {nm("  requestorID: a.b\n  nodeName: gpu-000\n  drainSpec:\n    podEvictionFilters:\n    - {}\n"),
			"a pod eviction filter needs byResourceNameRegex"},
		"cordon not a bool":                 {nm("  requestorID: a.b\n  nodeName: gpu-000\n  cordon: sometimes\n"), "spec.cordon: Invalid value"},
		"maxParallelOperations abc":         {cfg("  maxParallelOperations: abc\n"), "maxParallelOperations must be a non-negative integer or a percentage"},
		"maxParallelOperations 150%":        {cfg("  maxParallelOperations: 150%\n"), "maxParallelOperations must be a non-negative integer or a percentage"},
		"maxParallelOperations -1":          {cfg("  maxParallelOperations: -1\n"), "maxParallelOperations must be a non-negative integer or a percentage"},
		"maxUnavailable -2":                 {cfg("  maxUnavailable: -2\n"), "maxUnavailable must be a non-negative integer or a percentage"},
		"maxUnavailable 10.5%":              {cfg("  maxUnavailable: 10.5%\n"), "maxUnavailable must be a non-negative integer or a percentage"},
		"maxUnavailable percent only":       {cfg("  maxUnavailable: \"%\"\n"), "maxUnavailable must be a non-negative integer or a percentage"},
		"logLevel unknown":                  {cfg("  logLevel: verbose\n"), "Unsupported value: \"verbose\""},
		"negative maintenance timeout":      {cfg("  maxNodeMaintenanceTimeSeconds: -1\n"), "maxNodeMaintenanceTimeSeconds: Invalid value: -1"},
		"window with six cron fields":       {cfg("  maintenanceWindows:\n  - {name: w, schedule: \"0 0 1 * * 1\", duration: 4h}\n"), "schedule must be five cron fields"},
		"window schedule with a time zone":  {cfg("  maintenanceWindows:\n  - {name: w, schedule: \"CRON_TZ=UTC 0 1 * * *\", duration: 4h}\n"), "set the time zone in timeZone"},
		"window with zero duration":         {cfg("  maintenanceWindows:\n  - {name: w, schedule: \"0 1 * * *\", duration: 0s}\n"), "duration must be positive"},
		"window with negative duration":     {cfg("  maintenanceWindows:\n  - {name: w, schedule: \"0 1 * * *\", duration: -1h}\n"), "spec.maintenanceWindows[0].duration: Invalid value"},
		"window longer than a week":         {cfg("  maintenanceWindows:\n  - {name: w, schedule: \"0 1 * * *\", duration: 200h}\n"), "duration must be at most 168h"},
		"window with a bad duration":        {cfg("  maintenanceWindows:\n  - {name: w, schedule: \"0 1 * * *\", duration: soon}\n"), "spec.maintenanceWindows[0].duration: Invalid value"},
		"window without duration":           {cfg("  maintenanceWindows:\n  - {name: w, schedule: \"0 1 * * *\"}\n"), "duration: Required value"},
		"window time zone with spaces":      {cfg("  maintenanceWindows:\n  - {name: w, schedule: \"0 1 * * *\", duration: 1h, timeZone: \"Europe / Berlin\"}\n"), "timeZone: Invalid value"},
		"two windows with one name":         {cfg("  maintenanceWindows:\n  - {name: w, schedule: \"0 1 * * *\", duration: 1h}\n  - {name: w, schedule: \"0 2 * * *\", duration: 1h}\n"), "Duplicate value"},
		"exclusion ending before it starts": {cfg("  maintenanceExclusions:\n  - {name: x, start: \"2026-12-20T00:00:00Z\", end: \"2026-12-19T00:00:00Z\"}\n"), "an exclusion must end after it starts"},
		"exclusion with a bad time":         {cfg("  maintenanceExclusions:\n  - {name: x, start: \"next week\", end: \"2026-12-19T00:00:00Z\"}\n"), "spec.maintenanceExclusions[0].start"},
		"pool without limits":               {cfg("  pools:\n  - {name: p, nodeSelector: {}}\n"), "a pool needs maxParallelOperations or maxUnavailable"},
		"pool limit 150%":                   {cfg("  pools:\n  - {name: p, nodeSelector: {}, maxUnavailable: 150%}\n"), "maxUnavailable must be a non-negative integer or a percentage"},
		"pool without selector":             {cfg("  pools:\n  - {name: p, maxParallelOperations: 1}\n"), "nodeSelector: Required value"},
		"unknown urgency scope":             {cfg("  urgentMaintenance: Everything\n"), "Unsupported value: \"Everything\""},
		"domains without nodeLabel":         {cfg("  domains: {maxDisruptedDomains: 2}\n"), "nodeLabel: Required value"},
		"domains with a bad nodeLabel":      {cfg("  domains: {nodeLabel: \"nvidia.com/gpu clique\"}\n"), "nodeLabel must be a label key"},
		"maxDisruptedDomains 150%":          {cfg("  domains: {nodeLabel: nvidia.com/gpu.clique, maxDisruptedDomains: 150%}\n"), "maxDisruptedDomains must be a non-negative integer or a percentage"},
		"maxDisruptedDomains -1":            {cfg("  domains: {nodeLabel: nvidia.com/gpu.clique, maxDisruptedDomains: -1}\n"), "maxDisruptedDomains must be a non-negative integer or a percentage"},
		"collectSeconds -1":                 {cfg("  domains: {nodeLabel: nvidia.com/gpu.clique, collectSeconds: -1}\n"), "should be greater than or equal to 0"},
		"collectSeconds 3601":               {cfg("  domains: {nodeLabel: nvidia.com/gpu.clique, collectSeconds: 3601}\n"), "should be less than or equal to 3600"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := applyYAML(t, tc.doc)
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.doc)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not say %q", err, tc.wantMsg)
			}
		})
	}
}

func TestSchemaAcceptsGoodValues(t *testing.T) {
	devtest.NeedCluster(t)
	for _, v := range []string{"0", "5", "0%", "7%", "100%"} {
		doc := "apiVersion: maintenance.nvidia.com/v1alpha1\nkind: MaintenanceOperatorConfig\nmetadata:\n  generateName: good-\n  namespace: default\nspec:\n  maxParallelOperations: " + quoteIfPercent(v) + "\n  maxUnavailable: " + quoteIfPercent(v) + "\n"
		if err := applyYAML(t, doc); err != nil {
			t.Errorf("value %s rejected: %v", v, err)
		}
	}
	for _, d := range []string{"{nodeLabel: nvidia.com/gpu.clique}", "{nodeLabel: rack, maxDisruptedDomains: 0, coSchedule: false}",
		"{nodeLabel: example.com/nvlink-domain, maxDisruptedDomains: \"25%\"}",
		"{nodeLabel: rack, collectSeconds: 0, waitForComputeDomains: true, upgradeByDomain: true}"} {
		doc := "apiVersion: maintenance.nvidia.com/v1alpha1\nkind: MaintenanceOperatorConfig\nmetadata:\n  generateName: good-\n  namespace: default\nspec:\n  domains: " + d + "\n"
		if err := applyYAML(t, doc); err != nil {
			t.Errorf("domains %s rejected: %v", d, err)
		}
	}
	for _, sel := range []string{"app=training", "app==x,tier!=web", "gpu in (a100, h100)", "!canary", "example.com/team notin (a,b),env", ""} {
		doc := "apiVersion: maintenance.nvidia.com/v1alpha1\nkind: NodeMaintenance\nmetadata:\n  generateName: good-\n  namespace: default\nspec:\n  requestorID: a.b\n  nodeName: no-such-node\n  drainSpec:\n    podSelector: \"" + sel + "\"\n"
		if err := applyYAML(t, doc); err != nil {
			t.Errorf("selector %q rejected: %v", sel, err)
		}
	}
	full := `apiVersion: maintenance.nvidia.com/v1alpha1
kind: MaintenanceOperatorConfig
metadata:
  generateName: good-
  namespace: default
spec:
  maxParallelOperations: 10%
  maintenanceWindows:
  - {name: weekday-nights, schedule: "0 1 * * 1-5", duration: 4h, timeZone: Europe/Berlin}
  - {name: sundays, schedule: "@weekly", duration: 90m}
  maintenanceExclusions:
  - {name: eoq-freeze, start: "2026-12-20T00:00:00+01:00", end: "2027-01-04T00:00:00+01:00"}
  pools:
  - {name: h200, nodeSelector: {matchLabels: {gpufleet.dev/pool: h200}}, maxParallelOperations: 1, maxUnavailable: 25%}
  urgentMaintenance: AllNodes
`
	if err := applyYAML(t, full); err != nil {
		t.Errorf("a config with windows, exclusions and pools rejected: %v", err)
	}
	var cfgs maintenancev1.MaintenanceOperatorConfigList
	if err := k8s.List(t.Context(), &cfgs, client.InNamespace("default")); err != nil {
		t.Fatalf("listing configs (typed decoding of durations and times): %v", err)
	}
	t.Cleanup(func() { cleanupNMs(t) })
}

func quoteIfPercent(v string) string {
	if strings.HasSuffix(v, "%") {
		return "\"" + v + "\""
	}
	return v
}

func TestImmutableFields(t *testing.T) {
	devtest.NeedCluster(t)
	nm := newNM("immutable", "no-such-node", "first.requestor")
	create(t, nm)
	t.Cleanup(func() { cleanupNMs(t) })
	nm.Spec.NodeName = "gpu-000"
	if err := k8s.Update(t.Context(), nm); err == nil || !strings.Contains(err.Error(), "nodeName is immutable") {
		t.Errorf("nodeName change: %v, want 'nodeName is immutable'", err)
	}
	nm = getNM(t, "immutable")
	nm.Spec.RequestorID = "second.requestor"
	if err := k8s.Update(t.Context(), nm); err == nil || !strings.Contains(err.Error(), "requestorID is immutable") {
		t.Errorf("requestorID change: %v, want 'requestorID is immutable'", err)
	}
}

func TestZeroValuesRoundTrip(t *testing.T) {
	devtest.NeedCluster(t)
	f, zero := false, int32(0)
	nm := newNM("zero", "no-such-node", "a.b")
	nm.Spec.Cordon = &f
	nm.Spec.DrainSpec = &maintenancev1.DrainSpec{TimeoutSeconds: &zero}
	nm.Spec.WaitForPodCompletion = &maintenancev1.WaitForPodCompletionSpec{TimeoutSeconds: &zero}
	create(t, nm)
	t.Cleanup(func() { cleanupNMs(t) })
	got := getNM(t, "zero")
	if got.Spec.Cordon == nil || *got.Spec.Cordon {
		t.Errorf("cordon = %v after round trip, want false", got.Spec.Cordon)
	}
	if got.Spec.DrainSpec.TimeoutSeconds == nil || *got.Spec.DrainSpec.TimeoutSeconds != 0 {
		t.Errorf("drainSpec.timeoutSeconds = %v, want 0", got.Spec.DrainSpec.TimeoutSeconds)
	}
	// Defaults apply when the fields are omitted.
	d := newNM("defaults", "no-such-node", "a.b")
	d.Spec.DrainSpec = &maintenancev1.DrainSpec{}
	create(t, d)
	got = getNM(t, "defaults")
	if got.Spec.Cordon == nil || !*got.Spec.Cordon || got.Spec.DrainSpec.TimeoutSeconds == nil || *got.Spec.DrainSpec.TimeoutSeconds != 300 {
		t.Errorf("defaults: cordon=%v timeoutSeconds=%v, want true and 300", got.Spec.Cordon, got.Spec.DrainSpec.TimeoutSeconds)
	}
}
