// Package apirequest names Kubernetes API requests by verb and resource
// ("LIST pods", "PUT nodemaintenances/status") and counts the requests a
// client makes, as a Prometheus metric of the operator
// (gpufleet_api_requests_total) and for tests that check what the operator
// asks of the API server.
package apirequest

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
)

// Describe names a request: its verb (GET, LIST, WATCH, POST, PUT, PATCH,
// DELETE) and its resource with the subresource if any ("pods",
// "pods/eviction", "nodemaintenances/status"). Paths outside the resource
// API (/version, /openapi) are named by their path.
func Describe(r *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) > 3 && parts[0] == "apis":
		parts = parts[3:]
	case len(parts) > 2 && parts[0] == "api":
		parts = parts[2:]
	default:
		return r.Method, r.URL.Path
	}
	// namespaces/<ns>/<resource>/... but not namespaces/<ns> itself, nor
	// the namespace's own subresources (namespaces/<ns>/status, /finalize).
	if len(parts) > 2 && parts[0] == "namespaces" {
		if len(parts) == 3 && (parts[2] == "status" || parts[2] == "finalize") {
			return r.Method, "namespaces/" + parts[2]
		}
		parts = parts[2:]
	}
	resource = parts[0]
	if len(parts) > 2 {
		resource += "/" + parts[2]
	}
	verb = r.Method
	if r.Method == http.MethodGet {
		switch {
		case r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1":
			verb = "WATCH"
		case len(parts) == 1:
			verb = "LIST"
		}
	}
	return verb, resource
}

// IsWrite reports whether a verb mutates.
func IsWrite(verb string) bool {
	switch verb {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// Wrap returns a copy of cfg whose every request is passed to count (after
// the response, with its status code, or 0 when the request failed).
func Wrap(cfg *rest.Config, count func(verb, resource string, code int)) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			verb, resource := Describe(r)
			resp, err := rt.RoundTrip(r)
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			count(verb, resource, code)
			return resp, err
		})
	})
	return cfg
}

// Metric is gpufleet_api_requests_total{verb,resource,code}: every request
// the operator sent to the API server.
var Metric = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "gpufleet_api_requests_total",
	Help: "Requests the operator sent to the Kubernetes API server, by verb (LIST and WATCH apart from GET), resource[/subresource] and HTTP status code (0: no response).",
}, []string{"verb", "resource", "code"})

// Instrument returns a copy of cfg whose requests are counted in Metric.
func Instrument(cfg *rest.Config) *rest.Config {
	return Wrap(cfg, func(verb, resource string, code int) {
		Metric.WithLabelValues(verb, resource, strconv.Itoa(code)).Inc()
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
