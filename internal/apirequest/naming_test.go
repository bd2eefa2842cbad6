package apirequest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/rest"
)

// TestDescribeEveryShape names requests of every shape the operator
// sends: core and group paths, cluster-scoped and namespaced, collections
// and single objects, watches, subresources, and paths outside the
// resource API.
func TestDescribeEveryShape(t *testing.T) {
	type named struct{ Verb, Resource string }
	tests := map[string]struct {
		method, url string
		want        named
	}{
		// Core group, cluster-scoped.
		"list nodes":             {"GET", "/api/v1/nodes", named{"LIST", "nodes"}},
		"list nodes by label":    {"GET", "/api/v1/nodes?labelSelector=gpufleet.dev%2Fpool%3Da&limit=500", named{"LIST", "nodes"}},
		"get a node":             {"GET", "/api/v1/nodes/gpu-1", named{"GET", "nodes"}},
		"watch nodes":            {"GET", "/api/v1/nodes?allowWatchBookmarks=true&resourceVersion=7&watch=true", named{"WATCH", "nodes"}},
		"watch=1":                {"GET", "/api/v1/nodes?watch=1", named{"WATCH", "nodes"}},
		"watch=false is a list":  {"GET", "/api/v1/nodes?watch=false", named{"LIST", "nodes"}},
		"cordon a node":          {"PATCH", "/api/v1/nodes/gpu-1", named{"PATCH", "nodes"}},
		"node status":            {"PATCH", "/api/v1/nodes/gpu-1/status", named{"PATCH", "nodes/status"}},
		"get node status":        {"GET", "/api/v1/nodes/gpu-1/status", named{"GET", "nodes/status"}},
		"delete a node":          {"DELETE", "/api/v1/nodes/gpu-1", named{"DELETE", "nodes"}},
		"trailing slash":         {"GET", "/api/v1/nodes/", named{"LIST", "nodes"}},
		"create a namespace":     {"POST", "/api/v1/namespaces", named{"POST", "namespaces"}},
		"a namespace's status":   {"PUT", "/api/v1/namespaces/x/status", named{"PUT", "namespaces/status"}},
		"a namespace's finalize": {"PUT", "/api/v1/namespaces/x/finalize", named{"PUT", "namespaces/finalize"}},
		"get a namespace":        {"GET", "/api/v1/namespaces/gpufleet-system", named{"GET", "namespaces"}},
		"delete a namespace":     {"DELETE", "/api/v1/namespaces/gpufleet-system", named{"DELETE", "namespaces"}},
		"watch namespaces":       {"GET", "/api/v1/namespaces?watch=true", named{"WATCH", "namespaces"}},
		"pods of every ns":       {"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-1", named{"LIST", "pods"}},
		"watch pods of one node": {"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-1&watch=true", named{"WATCH", "pods"}},
		// Core group, namespaced.
		"watch one pod":       {"GET", "/api/v1/namespaces/ml/pods?fieldSelector=metadata.name%3Dp&watch=true", named{"WATCH", "pods"}},
		"create a pod":        {"POST", "/api/v1/namespaces/ml/pods", named{"POST", "pods"}},
		"delete pods":         {"DELETE", "/api/v1/namespaces/ml/pods", named{"DELETE", "pods"}},
		"evict a pod":         {"POST", "/api/v1/namespaces/ml/pods/trainer-0/eviction", named{"POST", "pods/eviction"}},
		"pod log":             {"GET", "/api/v1/namespaces/ml/pods/trainer-0/log", named{"GET", "pods/log"}},
		"pod status":          {"PUT", "/api/v1/namespaces/ml/pods/trainer-0/status", named{"PUT", "pods/status"}},
		"create an event":     {"POST", "/api/v1/namespaces/gpufleet-system/events", named{"POST", "events"}},
		"patch an event":      {"PATCH", "/api/v1/namespaces/gpufleet-system/events/e.1", named{"PATCH", "events"}},
		"a configmap":         {"GET", "/api/v1/namespaces/gpufleet-system/configmaps/driver", named{"GET", "configmaps"}},
		"namespace named pod": {"GET", "/api/v1/namespaces/pods/configmaps", named{"LIST", "configmaps"}},
		// Other groups.
		"list noderepairs":       {"GET", "/apis/repair.gpufleet.dev/v1alpha1/noderepairs", named{"LIST", "noderepairs"}},
		"get a noderepair":       {"GET", "/apis/repair.gpufleet.dev/v1alpha1/noderepairs/r-1", named{"GET", "noderepairs"}},
		"noderepair status":      {"PATCH", "/apis/repair.gpufleet.dev/v1alpha1/noderepairs/r-1/status", named{"PATCH", "noderepairs/status"}},
		"delete all noderepairs": {"DELETE", "/apis/repair.gpufleet.dev/v1alpha1/noderepairs", named{"DELETE", "noderepairs"}},
		"watch policies":         {"GET", "/apis/repair.gpufleet.dev/v1alpha1/noderepairpolicies?watch=true", named{"WATCH", "noderepairpolicies"}},
		"create a maintenance":   {"POST", "/apis/maintenance.nvidia.com/v1alpha1/namespaces/default/nodemaintenances", named{"POST", "nodemaintenances"}},
		"list maintenances":      {"GET", "/apis/maintenance.nvidia.com/v1alpha1/namespaces/default/nodemaintenances", named{"LIST", "nodemaintenances"}},
		"maintenances of all ns": {"GET", "/apis/maintenance.nvidia.com/v1alpha1/nodemaintenances", named{"LIST", "nodemaintenances"}},
		"maintenance status": {"PATCH", "/apis/maintenance.nvidia.com/v1alpha1/namespaces/default/nodemaintenances/m/status",
			named{"PATCH", "nodemaintenances/status"}},
		"cluster policy":      {"GET", "/apis/nvidia.com/v1/clusterpolicies/cluster-policy", named{"GET", "clusterpolicies"}},
		"a daemonset":         {"PUT", "/apis/apps/v1/namespaces/gpu-operator/daemonsets/driver", named{"PUT", "daemonsets"}},
		"daemonsets":          {"GET", "/apis/apps/v1/daemonsets", named{"LIST", "daemonsets"}},
		"renew a lease":       {"PUT", "/apis/coordination.k8s.io/v1/namespaces/gpufleet-system/leases/gpufleet-operator", named{"PUT", "leases"}},
		"access review":       {"POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", named{"POST", "subjectaccessreviews"}},
		"server-side apply":   {"PATCH", "/apis/apps/v1/namespaces/gpu-operator/daemonsets/driver?fieldManager=gpufleet&force=true", named{"PATCH", "daemonsets"}},
		"a PDB":               {"GET", "/apis/policy/v1/namespaces/ml/poddisruptionbudgets", named{"LIST", "poddisruptionbudgets"}},
		"a scale subresource": {"PATCH", "/apis/apps/v1/namespaces/ml/deployments/d/scale", named{"PATCH", "deployments/scale"}},
		// Outside the resource API: named by the path.
		"version":        {"GET", "/version", named{"GET", "/version"}},
		"core discovery": {"GET", "/api", named{"GET", "/api"}},
		"core version":   {"GET", "/api/v1", named{"GET", "/api/v1"}},
		"all groups":     {"GET", "/apis", named{"GET", "/apis"}},
		"one group":      {"GET", "/apis/repair.gpufleet.dev", named{"GET", "/apis/repair.gpufleet.dev"}},
		"group version":  {"GET", "/apis/repair.gpufleet.dev/v1alpha1", named{"GET", "/apis/repair.gpufleet.dev/v1alpha1"}},
		"openapi":        {"GET", "/openapi/v3/apis/apps/v1", named{"GET", "/openapi/v3/apis/apps/v1"}},
		"health":         {"GET", "/readyz", named{"GET", "/readyz"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			verb, res := Describe(httptest.NewRequest(tc.method, tc.url, nil))
			if diff := cmp.Diff(tc.want, named{verb, res}); diff != "" {
				t.Errorf("%s %s (-want +got):\n%s", tc.method, tc.url, diff)
			}
		})
	}
}

func TestIsWrite(t *testing.T) {
	for verb, want := range map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true,
		"GET": false, "LIST": false, "WATCH": false, "HEAD": false, "OPTIONS": false, "": false} {
		if got := IsWrite(verb); got != want {
			t.Errorf("IsWrite(%q) = %t, want %t", verb, got, want)
		}
	}
}

// TestWrapCountsEveryCode: each request is counted once after its
// response, with the response's code; a request that got no response is
// counted with code 0. The response itself is passed through unchanged.
func TestWrapCountsEveryCode(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.URL.Query().Get("code"))
		if err != nil {
			code = http.StatusBadRequest
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "body "+strconv.Itoa(code))
	}))
	defer srv.Close()
	type count struct {
		Verb, Resource string
		Code           int
	}
	var got []count
	base := &rest.Config{Host: srv.URL}
	cfg := Wrap(base, func(verb, resource string, code int) { got = append(got, count{verb, resource, code}) })
	if base.WrapTransport != nil {
		t.Errorf("Wrap changed the config it was given")
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		method, path string
		code         int
		want         count
	}{
		"ok":                 {"GET", "/api/v1/nodes/gpu-1", 200, count{"GET", "nodes", 200}},
		"created":            {"POST", "/api/v1/namespaces/ml/pods/p/eviction", 201, count{"POST", "pods/eviction", 201}},
		"PDB refuses":        {"POST", "/api/v1/namespaces/ml/pods/p/eviction", 429, count{"POST", "pods/eviction", 429}},
		"conflict":           {"PUT", "/apis/maintenance.nvidia.com/v1alpha1/namespaces/d/nodemaintenances/m/status", 409, count{"PUT", "nodemaintenances/status", 409}},
		"not found":          {"DELETE", "/apis/repair.gpufleet.dev/v1alpha1/noderepairs/r", 404, count{"DELETE", "noderepairs", 404}},
		"server error":       {"GET", "/api/v1/pods", 500, count{"LIST", "pods", 500}},
		"unavailable":        {"GET", "/api/v1/nodes?watch=true", 503, count{"WATCH", "nodes", 503}},
		"outside the API":    {"GET", "/version", 200, count{"GET", "/version", 200}},
		"no content (patch)": {"PATCH", "/api/v1/nodes/gpu-1", 204, count{"PATCH", "nodes", 204}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got = nil
			sep := "?"
			if strings.Contains(tc.path, "?") {
				sep = "&"
			}
			req, err := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path+sep+"code="+strconv.Itoa(tc.code), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != tc.code || (tc.code != 204 && string(body) != "body "+strconv.Itoa(tc.code)) {
				t.Errorf("response %d %q, want the server's %d", resp.StatusCode, body, tc.code)
			}
			if diff := cmp.Diff([]count{tc.want}, got); diff != "" {
				t.Errorf("counts (-want +got):\n%s", diff)
			}
		})
	}

	// No response: counted with code 0, and the error is returned.
	got = nil
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	hcDown, err := rest.HTTPClientFor(Wrap(&rest.Config{Host: down.URL}, func(verb, resource string, code int) {
		got = append(got, count{verb, resource, code})
	}))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), "GET", down.URL+"/api/v1/nodes", nil)
	if resp, err := hcDown.Do(req); err == nil {
		_ = resp.Body.Close()
		t.Errorf("a request to a closed server succeeded")
	}
	if diff := cmp.Diff([]count{{"LIST", "nodes", 0}}, got); diff != "" {
		t.Errorf("counts without a response (-want +got):\n%s", diff)
	}
}

// counterValue reads Metric{verb,resource,code}.
func counterValue(t *testing.T, verb, resource, code string) float64 {
	t.Helper()
	var m dto.Metric
	if err := Metric.WithLabelValues(verb, resource, code).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestInstrumentCountsInTheMetric(t *testing.T) {
	codes := map[string]int{"/apis/example.test/v1/widgets/w": 200, "/apis/example.test/v1/widgets/x": 409, "/apis/example.test/v1/widgets": 500}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(codes[r.URL.Path]) }))
	defer srv.Close()
	hc, err := rest.HTTPClientFor(Instrument(&rest.Config{Host: srv.URL}))
	if err != nil {
		t.Fatal(err)
	}
	type key struct{ verb, code string }
	before := map[key]float64{}
	keys := []key{{"GET", "200"}, {"PUT", "409"}, {"LIST", "500"}}
	for _, k := range keys {
		before[k] = counterValue(t, k.verb, "widgets", k.code)
	}
	send := func(method, path string) {
		req, _ := http.NewRequestWithContext(t.Context(), method, srv.URL+path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	send("GET", "/apis/example.test/v1/widgets/w")
	send("GET", "/apis/example.test/v1/widgets/w")
	send("PUT", "/apis/example.test/v1/widgets/x")
	send("GET", "/apis/example.test/v1/widgets")
	want := map[key]float64{{"GET", "200"}: 2, {"PUT", "409"}: 1, {"LIST", "500"}: 1}
	for _, k := range keys {
		if d := counterValue(t, k.verb, "widgets", k.code) - before[k]; d != want[k] {
			t.Errorf("gpufleet_api_requests_total{verb=%q,resource=\"widgets\",code=%q} grew by %v, want %v", k.verb, k.code, d, want[k])
		}
	}
}
