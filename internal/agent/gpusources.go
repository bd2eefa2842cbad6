package agent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpufault"
)

// HostGPUSource is the real host's GPUSource: a follower of the kernel log
// and a scraper of dcgm-exporter, each optional (nil). Started with the
// agent (Start), it sends on Events when something new arrived, and the
// monitor looks again.
type HostGPUSource struct {
	NodeName string
	Kmsg     *KmsgFollower
	DCGM     *DCGMScraper
	// PodResources, if set, tells which pods hold which GPU (device-plugin
	// mode).
	PodResources *KubeletPodResources
	events       chan struct{}
}

// NewHostGPUSource returns the source of node's GPUs: kmsgPath is the
// kernel log ("" reads none), dcgmURL dcgm-exporter's metrics endpoint
// ("" scrapes none), scraped every interval.
func NewHostGPUSource(node, kmsgPath, dcgmURL string, interval time.Duration) *HostGPUSource {
	h := &HostGPUSource{NodeName: node, events: make(chan struct{}, 1)}
	if kmsgPath != "" {
		h.Kmsg = &KmsgFollower{Path: kmsgPath, Clock: clock.RealClock{}, Changed: h.changed}
	}
	if dcgmURL != "" {
		h.DCGM = &DCGMScraper{URL: dcgmURL, Interval: interval, Changed: h.changed}
	}
	return h
}

// Events fires when the source has something new for the node.
func (h *HostGPUSource) Events() <-chan struct{} { return h.events }

func (h *HostGPUSource) changed() {
	select {
	case h.events <- struct{}{}:
	default: // a pass is already due
	}
}

// Start runs the follower and the scraper until ctx ends.
func (h *HostGPUSource) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	if h.Kmsg != nil {
		wg.Go(func() { h.Kmsg.Run(ctx) })
	}
	if h.DCGM != nil {
		wg.Go(func() { h.DCGM.Run(ctx) })
	}
	wg.Wait()
	return nil
}

// ObserveGPUs implements GPUSource: the XIDs the follower keeps and the
// scraper's latest view.
func (h *HostGPUSource) ObserveGPUs(context.Context, *corev1.Node) (GPUObservation, error) {
	var obs GPUObservation
	if h.Kmsg != nil {
		obs.XIDs = h.Kmsg.XIDs()
	}
	if h.DCGM != nil {
		obs.DCGM, obs.KnownGPUs = h.DCGM.Health()
	}
	return obs, nil
}

// GPUPods implements GPUPodsSource with the kubelet's pod-resources API.
func (h *HostGPUSource) GPUPods(ctx context.Context, _ *corev1.Node) ([]DeviceAllocation, error) {
	if h.PodResources == nil {
		return nil, ErrNoPodResources
	}
	return h.PodResources.List(ctx)
}

// maxKeptXIDs bounds the XIDs a KmsgFollower keeps (the most recent ones):
// enough for every GPU's XIDs between two passes of the monitor, which
// counts each only once.
const maxKeptXIDs = 1024

// KmsgFollower follows the kernel log (/dev/kmsg) for the life of the
// agent and keeps the last maxKeptXIDs XID events with their wall time:
// the boot time (/proc/stat btime) plus the record's microseconds since
// boot. Opening /dev/kmsg starts at the oldest record the kernel still
// holds, so after an agent restart the monitor sees XIDs it already
// counted again, and recognises them by their time.
type KmsgFollower struct {
	Path string
	// BootTime returns the wall time the node booted (nil: /proc/stat).
	BootTime func() (time.Time, error)
	// Clock dates records without a timestamp.
	Clock clock.PassiveClock
	// Changed is called after a new XID was kept.
	Changed func()

	mu    sync.Mutex
	xids  []XIDObservation
	stats gpufault.KmsgStats
}

// Run reads the kernel log until ctx ends or it cannot be read (logged:
// the agent goes on without XIDs from the kernel log).
func (k *KmsgFollower) Run(ctx context.Context) {
	log := crlog.FromContext(ctx).WithName("kmsg").WithValues("path", k.Path)
	bootTime := k.BootTime
	if bootTime == nil {
		bootTime = func() (time.Time, error) { return ReadBootTime("/proc/stat") }
	}
	boot, err := bootTime()
	if err != nil {
		log.Error(err, "cannot date kernel log records: XIDs are not read from the kernel log")
		return
	}
	f, err := os.Open(k.Path)
	if err != nil {
		log.Error(err, "cannot open the kernel log: XIDs are not read from it")
		return
	}
	stop := context.AfterFunc(ctx, func() { _ = f.Close() }) // unblocks the read
	defer stop()
	log.Info("following the kernel log for NVIDIA XIDs", "bootTime", boot)
	if err := k.Follow(f, boot); err != nil && ctx.Err() == nil {
		log.Error(err, "reading the kernel log stopped: XIDs are no longer read from it", "stats", k.Stats())
	}
	_ = f.Close()
}

// Follow reads r (kernel log records) until its end or a read error,
// keeping its XIDs dated from boot.
func (k *KmsgFollower) Follow(r io.Reader, boot time.Time) error {
	s := gpufault.NewKmsgScanner(r)
	for {
		ev, ok := s.Next()
		k.mu.Lock()
		k.stats = s.Stats()
		if ok && !ev.FromUserspace {
			at := k.Clock.Now()
			if ev.KernelTimeUsec != gpufault.Unknown {
				at = boot.Add(time.Duration(ev.KernelTimeUsec) * time.Microsecond)
			}
			k.xids = append(k.xids, XIDObservation{Event: ev, Time: at})
			if n := len(k.xids); n > maxKeptXIDs {
				k.xids = append(k.xids[:0:0], k.xids[n-maxKeptXIDs:]...)
			}
		}
		k.mu.Unlock()
		if !ok {
			return s.Err()
		}
		if !ev.FromUserspace && k.Changed != nil {
			k.Changed()
		}
	}
}

// XIDs returns the kept XIDs, oldest first.
func (k *KmsgFollower) XIDs() []XIDObservation {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]XIDObservation(nil), k.xids...)
}

// Stats returns what the follower's scanner counted.
func (k *KmsgFollower) Stats() gpufault.KmsgStats {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.stats
}

// ReadBootTime reads the boot time (btime, seconds since the epoch) from
// a /proc/stat file.
func ReadBootTime(path string) (time.Time, error) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "btime "); ok {
			secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || secs <= 0 {
				return time.Time{}, fmt.Errorf("%s: unreadable btime %q", path, v)
			}
			return time.Unix(secs, 0), nil
		}
	}
	if err := sc.Err(); err != nil {
		return time.Time{}, err
	}
	return time.Time{}, fmt.Errorf("%s: no btime line", path)
}

// maxMetricsBytes bounds what a scrape reads of the exporter's answer.
const maxMetricsBytes = 16 << 20

// maxKnownGPUs bounds the GPUs a DCGMScraper remembers.
const maxKnownGPUs = 64

// DCGMScraper reads dcgm-exporter's metrics every Interval and keeps the
// latest view of the GPUs (and every GPU it has seen since it started, to
// tell which one went missing). An exporter that does not answer is not a
// fault: it is logged once per outage and there is no view until it
// answers again.
type DCGMScraper struct {
	URL      string
	Interval time.Duration
	// Client defaults to one with a timeout of min(Interval, 10s).
	Client *http.Client
	// Changed is called when the view changed.
	Changed func()

	mu     sync.Mutex
	latest map[gpufault.GPUKey]gpufault.GPUHealth
	known  map[string]repairv1.GPURef
	down   bool
}

// Run scrapes now and every Interval until ctx ends.
func (d *DCGMScraper) Run(ctx context.Context) {
	interval := d.Interval
	if interval <= 0 {
		interval = 30 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		d.Scrape(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Scrape reads the exporter once.
func (d *DCGMScraper) Scrape(ctx context.Context) {
	log := crlog.FromContext(ctx).WithName("dcgm").WithValues("url", d.URL)
	health, err := d.fetch(ctx)
	d.mu.Lock()
	changed := false
	switch {
	case err != nil && ctx.Err() != nil:
	case err != nil:
		if !d.down {
			log.Info("dcgm-exporter does not answer: GPU health counters are not read until it does", "error", err.Error())
		}
		d.down, changed = true, d.latest != nil
		d.latest = nil
	default:
		if d.down {
			log.Info("dcgm-exporter answers again")
		}
		d.down = false
		changed = d.latest == nil || !reflect.DeepEqual(d.latest, health)
		d.latest = health
		for k := range health {
			if k.PCIBusID == "" || d.known[k.PCIBusID].PCIBusID != "" || len(d.known) >= maxKnownGPUs {
				continue
			}
			if d.known == nil {
				d.known = map[string]repairv1.GPURef{}
			}
			d.known[k.PCIBusID] = refOf(k)
		}
	}
	d.mu.Unlock()
	if changed && d.Changed != nil {
		d.Changed()
	}
}

func (d *DCGMScraper) fetch(ctx context.Context) (map[gpufault.GPUKey]gpufault.GPUHealth, error) {
	c := d.Client
	if c == nil {
		c = &http.Client{Timeout: min(max(d.Interval, time.Second), 10*time.Second)}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.URL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", d.URL, resp.Status)
	}
	health, _, err := gpufault.ParseDCGMMetrics(io.LimitReader(resp.Body, maxMetricsBytes))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", d.URL, err)
	}
	return health, nil
}

// Health returns the latest view (nil: none) and the GPUs seen so far.
func (d *DCGMScraper) Health() (map[gpufault.GPUKey]gpufault.GPUHealth, []repairv1.GPURef) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var known []repairv1.GPURef
	for _, g := range d.known {
		known = append(known, g)
	}
	return d.latest, known
}
