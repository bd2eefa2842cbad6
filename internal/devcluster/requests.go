package devcluster

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"k8s.io/client-go/rest"

	"github.com/gpufleet/gpufleet/internal/apirequest"
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
	cfg = apirequest.Wrap(cfg, func(verb, resource string, _ int) {
		c.mu.Lock()
		c.counts[verb+" "+resource]++
		c.mu.Unlock()
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
	return apirequest.IsWrite(verb)
}

// FormatCountsLine renders counts on one line, sorted by key ("GET pods
// 1, WATCH nodes 2"); none when there are none.
func FormatCountsLine(m map[string]int, none string) string {
	if len(m) == 0 {
		return none
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
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
