package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// uiRun is `gpufleet ui` against the cluster: how long until the page's
// data is there, and how long a change takes to reach it.
type uiRun struct {
	// StartSeconds: process start to the view listening (its caches synced).
	StartSeconds float64 `json:"startSeconds"`
	// FirstSnapshotSeconds: process start to the whole first snapshot
	// received on the page's event stream (what the page draws first;
	// the browser's own drawing comes after it).
	FirstSnapshotSeconds float64 `json:"firstSnapshotSeconds"`
	FirstSnapshotBytes   int     `json:"firstSnapshotBytes"`
	// ChangeSeconds: a node cordoned or uncordoned through the API to the
	// update naming it received on the stream, each try.
	ChangeSeconds []float64 `json:"changeSeconds"`
	ChangeBytes   []int     `json:"changeBytes"`
	RSSMB         float64   `json:"rssMB"`
	PeakRSSMB     float64   `json:"peakRssMB"`
	// StartCPUSeconds: the view's CPU up to its first snapshot;
	// ChangesCPUSeconds over ChangesSeconds: its CPU from then to the end
	// of the tries (what the cluster's churn and the tries cost it), and
	// Updates: the updates it sent meanwhile.
	StartCPUSeconds   float64 `json:"startCpuSeconds"`
	ChangesCPUSeconds float64 `json:"changesCpuSeconds"`
	ChangesSeconds    float64 `json:"changesSeconds"`
	Updates           int     `json:"updates"`
}

// measureUI starts `gpufleet ui`, reads its event stream as the page does,
// and cordons then uncordons node (tries changes in all), timing each
// until the update that names the node arrives. Every wait is bounded.
func measureUI(b *testing.B, bin, kubeconfig string, cs kubernetes.Interface, node string, tries int) uiRun {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	began := time.Now()
	url, pid, stop := devtest.StartFleetView(b, bin, kubeconfig, 10*time.Minute)
	defer stop()
	var r uiRun
	r.StartSeconds = time.Since(began).Seconds()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"api/events", nil)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatalf("the view's event stream: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	events := make(chan sseEvent, 16)
	go readEvents(resp.Body, events)
	next := func(what string) sseEvent {
		select {
		case e, ok := <-events:
			if !ok {
				b.Fatalf("the view's event stream ended while waiting for %s", what)
			}
			return e
		case <-ctx.Done():
			b.Fatalf("no %s from the view within 10 minutes", what)
		}
		return sseEvent{}
	}
	first := next("first snapshot")
	r.FirstSnapshotSeconds, r.FirstSnapshotBytes = time.Since(began).Seconds(), len(first.data)
	if first.name != "snapshot" {
		b.Fatalf("the view's first event is %q, want snapshot", first.name)
	}
	r.StartCPUSeconds = devcluster.CPUTimeOf(pid).Seconds()
	watching := time.Now()
	quoted := fmt.Sprintf("%q", node)
	for i := range tries {
		patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, i%2 == 0)
		sent := time.Now()
		if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			b.Fatal(err)
		}
		for {
			e := next("an update naming " + node)
			if e.name == "update" {
				r.Updates++
			}
			if e.name == "update" && strings.Contains(e.data, quoted) {
				r.ChangeSeconds = append(r.ChangeSeconds, time.Since(sent).Seconds())
				r.ChangeBytes = append(r.ChangeBytes, len(e.data))
				break
			}
		}
	}
	r.ChangesSeconds = time.Since(watching).Seconds()
	r.ChangesCPUSeconds = devcluster.CPUTimeOf(pid).Seconds() - r.StartCPUSeconds
	rss, hwm := memoryOf(pid)
	r.RSSMB, r.PeakRSSMB = float64(rss)/1024, float64(hwm)/1024
	return r
}

// String gives the run's figures in a sentence.
func (r uiRun) String() string {
	changes := make([]string, len(r.ChangeSeconds))
	for i, c := range r.ChangeSeconds {
		changes[i] = fmt.Sprintf("%.2f s", c)
	}
	return fmt.Sprintf("listening after %.2f s; the first snapshot on the page's event stream (%d bytes) after %.2f s (%.1f CPU s); "+
		"a node cordoned or uncordoned to the update naming it: %s; then %d updates in %.1f s for %.1f CPU s; RSS %.0f MB (peak %.0f)",
		r.StartSeconds, r.FirstSnapshotBytes, r.FirstSnapshotSeconds, r.StartCPUSeconds, strings.Join(changes, ", "),
		r.Updates, r.ChangesSeconds, r.ChangesCPUSeconds, r.RSSMB, r.PeakRSSMB)
}

type sseEvent struct{ name, data string }

// readEvents parses a text/event-stream into events until it ends.
func readEvents(body interface{ Read([]byte) (int, error) }, out chan<- sseEvent) {
	defer close(out)
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 1<<20), 256<<20) // a snapshot of 10,000 nodes is one line of megabytes
	var e sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			e.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			e.data = strings.TrimPrefix(line, "data: ")
		case line == "":
			if e.name != "" {
				out <- e
			}
			e = sseEvent{}
		}
	}
}
