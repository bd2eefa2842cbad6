package agent

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestKmsgFollower: records of /dev/kmsg are dated from the boot time,
// records written by processes are not kept, and only the last
// maxKeptXIDs are kept.
func TestKmsgFollower(t *testing.T) {
	boot := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	changed := 0
	k := &KmsgFollower{Clock: clocktesting.NewFakePassiveClock(gNow), Changed: func() { changed++ }}
	log := "6,1,1000,-;NVRM: GPU at PCI:0000:18:00: " + uuid3 + "\n" +
		"4,2,5000000,-;NVRM: Xid (PCI:0000:18:00): 48, pid=7, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n" +
		"12,3,6000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=echo, GPU has fallen off the bus.\n" +
		"NVRM: Xid (PCI:0000:2a:00): 13, pid=1, name=a, no timestamp\n"
	if err := k.Follow(strings.NewReader(log), boot); err != nil {
		t.Fatal(err)
	}
	got := k.XIDs()
	if len(got) != 2 || changed != 2 {
		t.Fatalf("kept %d XIDs, %d changes; want 2 (the userspace one dropped)", len(got), changed)
	}
	if x := got[0]; x.Event.Code != 48 || x.Event.UUID != uuid3 || !x.Time.Equal(boot.Add(5*time.Second)) {
		t.Errorf("first XID %+v at %v", x.Event, x.Time)
	}
	if x := got[1]; x.Event.Code != 13 || !x.Time.Equal(gNow) {
		t.Errorf("an XID without timestamp: %+v at %v, want the clock's time", x.Event, x.Time)
	}
	var many string
	for i := range maxKeptXIDs + 10 {
		many += fmt.Sprintf("4,%d,%d,-;NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=a, x\n", i+10, (i+10)*1000000)
	}
	if err := k.Follow(strings.NewReader(many), boot); err != nil {
		t.Fatal(err)
	}
	if got := k.XIDs(); len(got) != maxKeptXIDs || got[len(got)-1].Event.Seq != int64(maxKeptXIDs+9+10) {
		t.Errorf("kept %d XIDs (last seq %d), want the last %d", len(got), got[len(got)-1].Event.Seq, maxKeptXIDs)
	}
	if k.Stats().Lines == 0 {
		t.Errorf("stats not kept")
	}
}

func TestReadBootTime(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := ReadBootTime(write("stat", "cpu  1 2 3\nintr 5\nctxt 9\nbtime 1764756000\nprocesses 5\n"))
	if err != nil || !got.Equal(time.Unix(1764756000, 0)) {
		t.Errorf("ReadBootTime: %v, %v", got, err)
	}
	for _, bad := range []string{"cpu 1\n", "btime x\n", "btime -5\n"} {
		if _, err := ReadBootTime(write("bad", bad)); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
	if _, err := ReadBootTime(dir + "/none"); err == nil {
		t.Errorf("a missing file: want an error")
	}
}

// TestDCGMScraper: the exporter's text becomes the view (the real parser),
// the GPUs seen are remembered, an exporter that stops answering is
// logged once per outage and leaves no view, and its return is noticed.
func TestDCGMScraper(t *testing.T) {
	body, err := os.ReadFile(filepath.Join("..", "gpufault", "testdata", "dcgm-h100.prom"))
	if err != nil {
		t.Fatal(err)
	}
	up := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !up {
			http.Error(w, "exporter restarting", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	var logged []string
	ctx := logr.NewContext(t.Context(), funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{}))
	changed := 0
	d := &DCGMScraper{URL: srv.URL, Interval: time.Second, Changed: func() { changed++ }}
	d.Scrape(ctx)
	h, known := d.Health()
	if len(h) != 8 || len(known) != 8 || changed != 1 {
		t.Fatalf("view of %d GPUs, %d known, %d changes; want 8, 8, 1", len(h), len(known), changed)
	}
	d.Scrape(ctx)
	if changed != 1 {
		t.Errorf("the same metrics again counted as a change")
	}
	up = false
	d.Scrape(ctx)
	d.Scrape(ctx)
	if h, known := d.Health(); h != nil || len(known) != 8 || changed != 2 {
		t.Errorf("exporter down: view %v, %d known, %d changes; want none, 8, 2", h, len(known), changed)
	}
	up = true
	d.Scrape(ctx)
	want := []string{"dcgm-exporter does not answer", "dcgm-exporter answers again"}
	var got []string
	for _, l := range logged {
		for _, w := range want {
			if strings.Contains(l, w) {
				got = append(got, w)
			}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log lines (-want +got):\n%s\nall: %q", diff, logged)
	}
	if h, _ := d.Health(); len(h) != 8 || changed != 3 {
		t.Errorf("exporter back: %d GPUs, %d changes", len(h), changed)
	}
}
