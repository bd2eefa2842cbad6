//go:build browser

// The fleet view in a real browser: headless Chromium (Debian's chromium
// package; hack/ensure-chromium.sh installs it) drives the page that the
// real `gpufleet ui` binary serves against the local cluster. Run with
// make test-browser; figures with 1,000 nodes:
//
//	go test -tags browser -run TestFleetViewInBrowser -v ./internal/fleet/ui/ -args -nodes=1000
package ui

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/fleet"
	"github.com/gpufleet/gpufleet/internal/operator"
)

var (
	nodeCount  = flag.Int("nodes", 24, "simulated GPU nodes")
	poolCount  = flag.Int("pools", 3, "pools they are spread over")
	screenshot = flag.String("screenshot", "", "where to save the screenshot (default: results/fleet-view.png in the source tree)")
	chromium   = flag.String("chromium", "/usr/bin/chromium", "the Chromium binary")
)

var env *devcluster.Env

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	scheme, err := operator.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	opts := devcluster.Options{}
	if *nodeCount > 100 {
		// As the chaos scale scenarios: longer node leases, or their
		// renewals alone take the 2 cores and nodes flap to NotReady.
		opts = devcluster.LargeCluster
	}
	began := time.Now()
	env, err = devcluster.NewEnv(context.Background(), opts, devcluster.GPUNodes(*nodeCount, *poolCount), operator.DefaultNamespace, scheme)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the local cluster:", err)
		os.Exit(1)
	}
	fmt.Printf("local cluster with %d nodes up in %s\n", *nodeCount, time.Since(began).Round(time.Second))
	code := m.Run()
	env.Stop()
	os.Exit(code)
}

// TestFleetViewInBrowser: the page shows every node; a node put into
// maintenance through the operator changes colour within a second without
// a reload; a click shows its story, with an event message that carries
// HTML shown as text. Reports first render time, change latency and the
// view's RSS.
func TestFleetViewInBrowser(t *testing.T) {
	devtest.NeedCluster(t)
	if _, err := os.Stat(*chromium); err != nil {
		t.Fatalf("%v: install Chromium with hack/ensure-chromium.sh (as root: apt-get install -y chromium)", err)
	}
	ctx := t.Context()
	kube := env.Kube
	devtest.StartOperator(t, env.OperatorConfig, operator.Options{Namespace: operator.DefaultNamespace, Capabilities: []string{"maintenance"}})
	decorate(t, kube)

	bin := buildBinary(t)
	// gpufleet status on the same cluster: its figure for this many nodes.
	for range 3 { // the first run also pays for discovery's cold cache
		began := time.Now()
		out, err := exec.Command(bin, "status", "--kubeconfig", env.Kubeconfig).CombinedOutput()
		if err != nil {
			t.Fatalf("gpufleet status: %v\n%s", err, out)
		}
		took := time.Since(began)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		t.Logf("gpufleet status: %s; %s", took.Round(time.Millisecond), lines[len(lines)-1])
		fmt.Printf("FLEETSTATUS nodes=%d wall_ms=%d\n", *nodeCount, took.Milliseconds())
	}
	// What each List costs (the same requests as gpufleet status).
	direct, err := client.New(env.Config, client.Options{Scheme: fleet.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.Load(ctx, timedReader{direct, t}, fleet.LoadOptions{}); err != nil {
		t.Fatal(err)
	}
	url, pid, _ := devtest.StartFleetView(t, bin, env.Kubeconfig, 2*time.Minute)
	t.Logf("fleet view of %d nodes at %s (pid %d)", *nodeCount, url, pid)

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(*chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 900))
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(alloc)
	defer cancelBrowser()
	do := func(what string, timeout time.Duration, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(browser, timeout)
		defer cancel()
		if err := chromedp.Do(c, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// Start the browser first (without a timeout: it would stop the
	// browser), so that the first render counts the page, not Chromium's start.
	if err := chromedp.Do(browser, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	poll := func(expr string) chromedp.Action[chromedp.Void] {
		return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(5*time.Millisecond), chromedp.WithPollingTimeout(0))
	}

	began := time.Now()
	do("the first render", time.Minute, chromedp.Navigate(url), poll(fmt.Sprintf(`document.querySelectorAll(".tile").length === %d`, *nodeCount)))
	firstRender := time.Since(began)
	t.Logf("first render of %d nodes: %s", *nodeCount, firstRender.Round(time.Millisecond))
	do("marking the page", 10*time.Second, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Evaluate[bool](`window.__sameDocument = true`)(ctx, tg)
		return err
	}))

	// A node into maintenance; the operator cordons it and reports Ready.
	node := "gpu-001"
	tile := fmt.Sprintf(`document.querySelector('.tile[data-node=%q]')`, node)
	class := evaluate[string](browser, t, tile+".className")
	if !strings.Contains(class, "state-ready") {
		t.Fatalf("tile of %s is %q before the maintenance, want state-ready", node, class)
	}
	nm := &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "browser-test-" + node},
		Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "browser-test.example.com", NodeName: node, DrainSpec: &maintenancev1.DrainSpec{}},
	}
	// When did the API server first show the node held (cordoned)? A
	// watch, as the view's own informer sees it.
	held := make(chan time.Time, 1)
	w, err := env.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	go func() {
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok && n.Spec.Unschedulable {
				held <- time.Now()
				return
			}
		}
	}()
	if err := kube.Create(ctx, nm); err != nil {
		t.Fatal(err)
	}
	do("the tile changing colour", 30*time.Second, poll(tile+`.className.includes("state-in-maintenance") || `+tile+`.className.includes("state-draining")`))
	seen := time.Now()
	var cordonedAt time.Time
	select {
	case cordonedAt = <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the node never showed cordoned in the API server")
	}
	latency := seen.Sub(cordonedAt)
	t.Logf("maintenance visible %s after a watch showed %s cordoned by the operator (%s after the NodeMaintenance was created)",
		latency.Round(time.Millisecond), node, seen.Sub(nm.CreationTimestamp.Time).Round(time.Millisecond))
	if latency > time.Second {
		t.Errorf("the tile changed %s after the cordon, want under 1s", latency)
	}

	// A change the test makes itself: its latency counts from the request.
	other := "gpu-002"
	otherTile := fmt.Sprintf(`document.querySelector('.tile[data-node=%q]')`, other)
	cordon := time.Now()
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, other, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	do("the cordoned tile", 30*time.Second, poll(otherTile+`.className.includes("state-cordoned")`))
	cordonLatency := time.Since(cordon)
	t.Logf("cordon of %s visible %s after the request was sent", other, cordonLatency.Round(time.Millisecond))
	if cordonLatency > time.Second {
		t.Errorf("the cordoned tile changed %s after the request, want under 1s", cordonLatency)
	}
	if !evaluate[bool](browser, t, `window.__sameDocument === true`) {
		t.Error("the page reloaded; the change must arrive without a reload")
	}

	// A click shows the story; an event whose message is HTML shows as text.
	hostile := `<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>`
	if err := kube.Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: "default", Name: node + ".hostile"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, APIVersion: "v1"},
		Reason:         "Hostile", Message: hostile, Type: corev1.EventTypeWarning,
		FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
		Source: corev1.EventSource{Component: "browser-test"},
	}); err != nil {
		t.Fatal(err)
	}
	// The story follows the node: it is read again when the maintenance
	// moves on, so wait for its end too (its one pod may take a while to
	// go on a slow machine; the page shows Draining until then).
	do("the story", 60*time.Second,
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`.tile[data-node=%q]`, node))),
		poll(`(() => { const s = document.getElementById("story-entries").textContent; return s.includes("Hostile") && s.includes("phase Ready"); })()`))
	story := evaluate[string](browser, t, `document.getElementById("story").textContent`)
	for _, want := range []string{"requested by browser-test.example.com", "phase Ready", hostile} {
		if !strings.Contains(story, want) {
			t.Errorf("the story lacks %q:\n%s", want, story)
		}
	}
	if evaluate[bool](browser, t, `window.__pwned === 1 || document.querySelector("#story img, #story-entries script") !== null`) {
		t.Error("an event message was rendered as HTML")
	}

	shot, cancelShot := context.WithTimeout(browser, 30*time.Second)
	defer cancelShot()
	png, err := chromedp.Run(shot, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("the screenshot: %v", err)
	}
	path := *screenshot
	if path == "" {
		root, err := devcluster.SourceRoot()
		if err != nil {
			t.Fatal(err)
		}
		path = filepath.Join(root, "results", "fleet-view.png")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	rss, anon, hwm := memory(t, pid)
	t.Logf("screenshot %s; the view process: RSS %d MB (%d MB anonymous, the rest the binary's pages), peak %d MB", path, rss>>20, anon>>20, hwm>>20)
	fmt.Printf("FLEETVIEW nodes=%d first_render_ms=%d maintenance_visible_ms=%d cordon_visible_ms=%d rss_mb=%d anon_mb=%d peak_rss_mb=%d\n",
		*nodeCount, firstRender.Milliseconds(), latency.Milliseconds(), cordonLatency.Milliseconds(), rss>>20, anon>>20, hwm>>20)
}

// timedReader logs how long each List takes.
type timedReader struct {
	client.Reader
	t *testing.T
}

func (r timedReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	began := time.Now()
	err := r.Reader.List(ctx, list, opts...)
	r.t.Logf("LIST %T: %s (%v)", list, time.Since(began).Round(time.Millisecond), err)
	return err
}

// evaluate runs a JavaScript expression in the page and returns its value.
func evaluate[T any](browser context.Context, t *testing.T, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(browser, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// decorate puts a few nodes in other states, for the screenshot: one being
// repaired, one whose recovery failed, one with a faulty GPU.
func decorate(t *testing.T, kube client.Client) {
	t.Helper()
	ctx := t.Context()
	for i, phase := range []repairv1.Phase{repairv1.PhaseRepairing, repairv1.PhaseRecoveryFailed} {
		node := fmt.Sprintf("gpu-%03d", 4+i)
		r := &repairv1.NodeRepair{
			ObjectMeta: metav1.ObjectMeta{Name: node + "-kubelet-down"},
			Spec: repairv1.NodeRepairSpec{NodeName: node, Policy: "default", Actions: []repairv1.Action{repairv1.ActionRestartKubelet, repairv1.ActionReboot},
				Fault: repairv1.Fault{Rule: "kubelet-down", ConditionType: "Ready", Status: "Unknown", Since: metav1.Now()}},
		}
		if err := kube.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		r.Status.Phase = phase
		if err := kube.Status().Update(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
}

// buildBinary builds gpufleet (without the race detector: the figures
// are the real binary's).
func buildBinary(t *testing.T) string {
	t.Helper()
	root, err := devcluster.SourceRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "gpufleet")
	build := exec.Command("go", "build", "-o", bin, "./cmd/gpufleet")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// memory reads a process's resident set size, its anonymous part (the Go
// heap and stacks; the rest is the binary's pages) and its peak, in bytes.
func memory(t *testing.T, pid int) (rss, anon, peak int64) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "RssAnon:":
			anon = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	return rss, anon, peak
}
