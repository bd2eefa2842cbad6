package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"

	"github.com/gpufleet/gpufleet/internal/devcluster"
)

// freeAddr returns a free loopback address for the operator's metrics.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return "", err
	}
	return addr, nil
}

// scrape reads the operator's Prometheus metrics.
func scrape(addr string) (map[string]*dto.MetricFamily, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }() // read side: nothing to lose
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// apiRequests returns gpufleet_api_requests_total summed by "VERB
// resource", with the status code appended when it is not 2xx
// ("POST pods/eviction 429").
func apiRequests(fams map[string]*dto.MetricFamily) map[string]int {
	out := map[string]int{}
	f := fams["gpufleet_api_requests_total"]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		var verb, res, code string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "verb":
				verb = l.GetValue()
			case "resource":
				res = l.GetValue()
			case "code":
				code = l.GetValue()
			}
		}
		key := verb + " " + res
		if !strings.HasPrefix(code, "2") {
			key += " " + code
		}
		out[key] += int(m.GetCounter().GetValue())
	}
	return out
}

// gauge returns a single-series gauge (e.g. go_memstats_heap_inuse_bytes).
func gauge(fams map[string]*dto.MetricFamily, name string) float64 {
	if f := fams[name]; f != nil && len(f.GetMetric()) > 0 {
		return f.GetMetric()[0].GetGauge().GetValue()
	}
	return 0
}

// saveHeapProfile writes the operator's heap profile to path.
func saveHeapProfile(addr, path string) error {
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get("http://" + addr + "/debug/pprof/heap?gc=1")
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }() // read side: nothing to lose
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	// A failed Close can lose written data: report it.
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// diffCounts returns after-before per key, without zeros.
func diffCounts(before, after map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// memoryOf reads VmRSS and VmHWM (KiB) of a process.
func memoryOf(pid int) (rss, hwm int) {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "VmRSS:":
			rss = v
		case "VmHWM:":
			hwm = v
		}
	}
	return rss, hwm
}

// cpuSecondsOf reads utime+stime of a process.
func cpuSecondsOf(pid int) float64 { return devcluster.CPUTimeOf(pid).Seconds() }

// countsByLabel sums a counter family's values by the values of labels
// (joined by NUL when there are several; a series without the first label
// is left out).
func countsByLabel(fams map[string]*dto.MetricFamily, family string, labels ...string) map[string]int {
	out := map[string]int{}
	for _, m := range fams[family].GetMetric() {
		values := make([]string, len(labels))
		found := false
		for _, l := range m.GetLabel() {
			if i := slices.Index(labels, l.GetName()); i >= 0 {
				values[i] = l.GetValue()
				found = found || i == 0
			}
		}
		if found {
			out[strings.Join(values, "\x00")] += int(m.GetCounter().GetValue())
		}
	}
	return out
}

// formatCounts is "a 3, b 1" in key order, or "0".
func formatCounts(m map[string]int) string { return devcluster.FormatCountsLine(m, "0") }

// histogramMeansMs returns a histogram's mean in milliseconds by the value
// of label ("" for all).
func histogramMeansMs(fams map[string]*dto.MetricFamily, family, label string) map[string]float64 {
	sums, counts := map[string]float64{}, map[string]uint64{}
	for _, m := range fams[family].GetMetric() {
		key := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				key = l.GetValue()
			}
		}
		sums[key] += m.GetHistogram().GetSampleSum()
		counts[key] += m.GetHistogram().GetSampleCount()
	}
	out := map[string]float64{}
	for k, n := range counts {
		if n > 0 {
			out[k] = sums[k] / float64(n) * 1000
		}
	}
	return out
}

// slowSamples counts, in the histogram series whose label has value, the
// samples above bound (a bucket boundary) and all samples.
func slowSamples(fams map[string]*dto.MetricFamily, family, label, value string, bound float64) (slow, all int) {
	for _, m := range fams[family].GetMetric() {
		match := false
		for _, l := range m.GetLabel() {
			match = match || (l.GetName() == label && l.GetValue() == value)
		}
		if !match {
			continue
		}
		h := m.GetHistogram()
		all += int(h.GetSampleCount())
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == bound {
				slow += int(h.GetSampleCount() - b.GetCumulativeCount())
			}
		}
	}
	return slow, all
}

// histogramQuantilesMs estimates quantiles (in milliseconds) of the
// histogram series whose labels include match, summed, by interpolating
// within buckets as Prometheus's histogram_quantile does; "count" is the
// number of samples. Empty when there is none.
func histogramQuantilesMs(fams map[string]*dto.MetricFamily, family string, match map[string]string, qs ...float64) map[string]float64 {
	cum := map[float64]float64{}
	var total float64
	for _, m := range fams[family].GetMetric() {
		ok := true
		for name, want := range match {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == name && l.GetValue() == want)
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		h := m.GetHistogram()
		total += float64(h.GetSampleCount())
		for _, b := range h.GetBucket() {
			cum[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
	}
	if total == 0 {
		return map[string]float64{}
	}
	bounds := slices.Sorted(maps.Keys(cum))
	if len(bounds) > 1 && math.IsInf(bounds[len(bounds)-1], 1) {
		bounds = bounds[:len(bounds)-1] // above the last finite bound: that bound, as histogram_quantile says
	}
	out := map[string]float64{"count": total}
	for _, q := range qs {
		rank, lower, below := q*total, 0.0, 0.0
		v := bounds[len(bounds)-1] // beyond the last bucket: its bound
		for _, ub := range bounds {
			if cum[ub] >= rank {
				v = lower
				if n := cum[ub] - below; n > 0 {
					v += (ub - lower) * (rank - below) / n
				}
				break
			}
			lower, below = ub, cum[ub]
		}
		out[fmt.Sprintf("p%g", q*100)] = v * 1000
	}
	return out
}

// scrapeAPIServer reads the API server's own metrics.
func scrapeAPIServer(ctx context.Context, c kubernetes.Interface) (map[string]*dto.MetricFamily, error) {
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(bytes.NewReader(raw))
}

// TestHistogramQuantiles: quantiles interpolate within the bucket that
// holds the rank, over the series that match, as histogram_quantile does.
func TestHistogramQuantiles(t *testing.T) {
	text := `# TYPE d histogram
d_bucket{verb="PATCH",le="0.1"} 50
d_bucket{verb="PATCH",le="0.2"} 90
d_bucket{verb="PATCH",le="0.4"} 100
d_bucket{verb="PATCH",le="+Inf"} 100
d_sum{verb="PATCH"} 10
d_count{verb="PATCH"} 100
d_bucket{verb="GET",le="0.1"} 0
d_bucket{verb="GET",le="0.2"} 0
d_bucket{verb="GET",le="0.4"} 100
d_bucket{verb="GET",le="+Inf"} 100
d_sum{verb="GET"} 30
d_count{verb="GET"} 100
d_bucket{verb="POST",le="0.1"} 0
d_bucket{verb="POST",le="0.2"} 0
d_bucket{verb="POST",le="0.4"} 90
d_bucket{verb="POST",le="+Inf"} 100
d_sum{verb="POST"} 80
d_count{verb="POST"} 100
`
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	got := histogramQuantilesMs(fams, "d", map[string]string{"verb": "PATCH"}, 0.5, 0.9, 0.95)
	want := map[string]float64{"count": 100, "p50": 100, "p90": 200, "p95": 300}
	for k, w := range want {
		if g := got[k]; g < w-1e-6 || g > w+1e-6 {
			t.Errorf("%s = %v, want %v (all: %v)", k, g, w, got)
		}
	}
	// All three: rank 150 lies in (0.2, 0.4], which holds 200 samples above 90.
	if all, p50 := histogramQuantilesMs(fams, "d", nil, 0.5), 200+200*60.0/200; all["count"] != 300 || all["p50"] < p50-1e-6 || all["p50"] > p50+1e-6 {
		t.Errorf("every series: %v, want 300 samples, p50 %.1f ms", all, p50)
	}
	if top := histogramQuantilesMs(fams, "d", map[string]string{"verb": "POST"}, 0.99); top["p99"] != 400 {
		t.Errorf("a quantile above the last finite bound: %v, want that bound, 400 ms (JSON has no +Inf)", top)
	}
	if none := histogramQuantilesMs(fams, "d", map[string]string{"verb": "PUT"}, 0.5); len(none) != 0 {
		t.Errorf("no series: %v", none)
	}
}
