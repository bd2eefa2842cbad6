package devcluster

import (
	"fmt"
	"maps"
	"net/http"
	"sort"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
)

// RequestCounter counts a client's API requests by "VERB resource", e.g.
// "PUT nodemaintenances/status", "LIST pods", "WATCH nodes"; for tests and
// benchmarks that check what an operator asks of the API server.
type RequestCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

// CountRequests returns a copy of cfg whose requests are counted.
func CountRequests(cfg *rest.Config) (*rest.Config, *RequestCounter) {
	c := &RequestCounter{counts: map[string]int{}}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			c.mu.Lock()
			c.counts[describeRequest(r)]++
			c.mu.Unlock()
			return rt.RoundTrip(r)
		})
	})
	return cfg, c
}

// Snapshot returns the counts so far.
func (c *RequestCounter) Snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

// Since returns the counts added after an earlier Snapshot.
func (c *RequestCounter) Since(before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range c.Snapshot() {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// IsWrite reports whether a counted key is a mutating request.
func IsWrite(key string) bool {
	verb, _, _ := strings.Cut(key, " ")
	switch verb {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// FormatCounts renders counts as sorted lines.
func FormatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-40s %d\n", k, m[k])
	}
	return b.String()
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// describeRequest names a request "VERB resource[/subresource]".
func describeRequest(r *http.Request) string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) > 3 && parts[0] == "apis":
		parts = parts[3:]
	case len(parts) > 2 && parts[0] == "api":
		parts = parts[2:]
	default:
		return r.Method + " " + r.URL.Path
	}
	if len(parts) > 1 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	res := ""
	if len(parts) > 0 {
		res = parts[0]
	}
	if len(parts) > 2 {
		res += "/" + parts[2]
	}
	verb := r.Method
	if r.Method == http.MethodGet {
		switch {
		case r.URL.Query().Get("watch") == "true":
			verb = "WATCH"
		case len(parts) == 1:
			verb = "LIST"
		}
	}
	return verb + " " + res
}
