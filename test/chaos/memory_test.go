package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// BenchmarkOperatorMemory measures the operator at rest: -memory.nodes GPU
// nodes (8 GPUs each, in -memory.pools pools, each publishing the
// simulated DRA driver's ResourceSlice) with -memory.pods-per-node running
// pods, every capability on. For each runtime setting it starts the real
// operator binary, waits until every controller's caches are synced (the
// time to rest), lets it idle, and reports its RSS, Go heap in use, bytes
// per node and per pod, the API requests per minute at rest, a heap
// profile (results/heap-<nodes>.pprof) and its top in-use allocation
// sites. Each size is written to results/rest-<nodes>.{json,md} and merged
// into the curve results/scale-rest.{json,md}.
var (
	memoryEnv = flag.String("chaos.memory-env", "",
		"comma-separated runtime settings, one operator run each (empty: the operator's own, GOGC=50; GOGC=100: Go's default)")
	heapProfile       = flag.String("chaos.heap-profile", "", "also copy the first run's heap profile here (BenchmarkOperatorMemory)")
	memoryNodes       = flag.Int("memory.nodes", 1000, "simulated GPU nodes (BenchmarkOperatorMemory)")
	memoryPodsPerNode = flag.Int("memory.pods-per-node", 8, "running pods per node, bound to it (BenchmarkOperatorMemory)")
	memoryPools       = flag.Int("memory.pools", 16, "node pools (BenchmarkOperatorMemory)")
	memorySettle      = flag.Duration("memory.settle", 30*time.Second, "wait after the caches are synced before measuring (BenchmarkOperatorMemory)")
	memoryIdle        = flag.Duration("memory.idle", time.Minute, "window at rest for the API requests per minute (BenchmarkOperatorMemory)")
	memoryWaitRunning = flag.Bool("memory.wait-running", true, "wait until kwok has made every pod Running before starting the operator (false: start once they exist; at 10,000 nodes kwok on 2 cores runs ~35 pods a second)")
	memoryObjects     = flag.Bool("memory.objects", true, "give the controllers work at rest: a MaintenanceOperatorConfig with maxParallelOperations 0, a pending NodeMaintenance on 1% of the nodes and a NodeRepairPolicy with the default rules (BenchmarkOperatorMemory)")
	memoryStatus      = flag.Bool("memory.status", true, "after the operator runs, time `gpufleet status` (three runs) and read its peak memory (BenchmarkOperatorMemory)")
	memoryStatusAlso  = flag.String("memory.status-also", "", "another gpufleet binary whose `gpufleet status` is measured the same way on the same cluster (e.g. an older build, for a before/after)")
	memoryUIAlso      = flag.String("memory.ui-also", "", "another gpufleet binary whose `gpufleet ui` is measured the same way on the same cluster, after this build's (e.g. an older build, for a before/after)")
	memoryUI          = flag.Bool("memory.ui", true, "after the operator runs, start `gpufleet ui`, read its event stream as the page does (time to the first snapshot) and time 4 cordon/uncordon changes to the update naming the node (BenchmarkOperatorMemory)")
	memoryHeartbeats  = flag.Bool("memory.heartbeats", true, "during the window at rest, write one kubelet-style status heartbeat on every node and count the reconciles it causes (BenchmarkOperatorMemory)")
	memoryReport      = flag.String("memory.report", "", "directory for rest-<nodes>.{json,md}, scale-rest.{json,md} and heap-<nodes>.pprof (default: results/ in the source tree)")
)

// restRun is one operator run at rest.
type restRun struct {
	Setting string `json:"setting"`
	// RestSeconds: process start to every controller's workers started
	// (their caches synced).
	RestSeconds  float64 `json:"timeToRestSeconds"`
	RSSMB        float64 `json:"rssMB"`
	PeakRSSMB    float64 `json:"peakRssMB"`
	HeapInuseMB  float64 `json:"heapInuseMB"`
	BytesPerNode float64 `json:"heapBytesPerNode"`
	BytesPerPod  float64 `json:"heapBytesPerPod"`
	RSSPerNode   float64 `json:"rssBytesPerNode"`
	CPUSeconds   float64 `json:"cpuSecondsToEnd"`
	// StartupRequests: the operator's API requests up to rest.
	StartupRequests map[string]int `json:"startupRequests"`
	// RestRequests: its requests in the idle window; RestPerMinute all of
	// them, RestPerMinuteNoLeases without coordination leases.
	RestRequests          map[string]int `json:"restRequests"`
	RestPerMinute         float64        `json:"restRequestsPerMinute"`
	RestPerMinuteNoLeases float64        `json:"restRequestsPerMinuteWithoutLeases"`
	// Heartbeats: node status heartbeats written during the idle window
	// (one per node); RestReconciles: every controller's reconciles in
	// that window, by controller; ReconcilesPerHeartbeat their sum over
	// Heartbeats.
	StartupReconciles      map[string]int `json:"startupReconciles"`
	Heartbeats             int            `json:"nodeHeartbeats"`
	RestReconciles         map[string]int `json:"restReconciles"`
	ReconcilesPerHeartbeat float64        `json:"reconcilesPerHeartbeat"`
	HeapProfile            string         `json:"heapProfile,omitempty"`
	TopInuse               []string       `json:"topInuseSites,omitempty"`
}

// restReport is one fleet size.
type restReport struct {
	Commit     string         `json:"commit"`
	Date       string         `json:"date"`
	Nodes      int            `json:"nodes"`
	Pools      int            `json:"pools"`
	Pods       int            `json:"pods"`
	Objects    map[string]int `json:"clusterObjects"`
	Setup      map[string]any `json:"setup"`
	Runs       []restRun      `json:"runs"`
	LoadAfter  string         `json:"loadAverageAfter"`
	EtcdDBMB   float64        `json:"etcdDbMB"`
	MemAvailMB float64        `json:"machineMemAvailableMB"`
	// Status: `gpufleet status` against the same cluster, each run;
	// StatusAlso: the same with -memory.status-also's binary.
	Status     []statusRun `json:"gpufleetStatus,omitempty"`
	StatusAlso []statusRun `json:"gpufleetStatusOtherBinary,omitempty"`
	// UI: `gpufleet ui` against the same cluster; UIAlso: the same with
	// -memory.ui-also's binary, right after.
	// UIAgain: this build's view once more after the other's (the
	// cluster's churn changes while they run: before, between, after).
	UI      *uiRun `json:"gpufleetUI,omitempty"`
	UIAlso  *uiRun `json:"gpufleetUIOtherBinary,omitempty"`
	UIAgain *uiRun `json:"gpufleetUIAgain,omitempty"`
}

// statusRun is one `gpufleet status` run: its wall time, peak RSS and
// output size.
type statusRun struct {
	Seconds     float64 `json:"seconds"`
	MaxRSSMB    float64 `json:"maxRssMB"`
	OutputBytes int     `json:"outputBytes"`
}

func BenchmarkOperatorMemory(b *testing.B) {
	ctx := context.Background()
	nodes, perNode, pools := *memoryNodes, *memoryPodsPerNode, *memoryPools
	env, kubeconfig, cs, setup := startLargeEnv(b, nodes, pools)
	specs := devcluster.GPUNodes(nodes, pools)

	began := time.Now()
	createPods(ctx, b, cs, specs, perNode)
	created := time.Since(began)
	setup["podCreateSeconds"] = created.Seconds()
	setup["podsCreatedPerSecond"] = float64(nodes*perNode) / created.Seconds()
	if *memoryWaitRunning {
		waitPodsRunning(ctx, b, cs)
		setup["podsRunningSeconds"] = time.Since(began).Seconds()
		b.Logf("%d pods (%d per node) running after %s (created at %.0f/s)", nodes*perNode, perNode, time.Since(began).Round(time.Second), float64(nodes*perNode)/created.Seconds())
	} else {
		setup["podsRunningAtStart"] = podsRunning(ctx, b, cs)
	}

	if *memoryObjects {
		setup["pendingMaintenances"] = createRestObjects(ctx, b, env, specs)
	}

	r := restReport{Commit: gitCommit(), Date: time.Now().UTC().Format(time.RFC3339), Nodes: nodes, Pools: pools, Setup: setup,
		Objects: clusterObjects(ctx, b, env)}
	r.Pods = r.Objects["pods"]
	dir := reportDir(b, *memoryReport)
	addr, err := freeAddr()
	if err != nil {
		b.Fatal(err)
	}
	bin := buildOperator(b)
	capabilities := strings.Join(operator.CapabilityNames(), ",")
	// One operator process per runtime setting, one after the other.
	for i, setting := range strings.Split(*memoryEnv, ",") {
		name := setting
		if name == "" {
			name = "operator defaults (GOGC=50)"
		}
		op := &operatorProcess{bin: bin, kubeconfig: kubeconfig, dir: b.TempDir(), metricsAddr: addr}
		if setting != "" {
			op.env = []string{setting}
		}
		run := restRun{Setting: name}
		start := time.Now()
		op.startWith(b, capabilities)
		if err := waitRest(ctx, op, addr, 20*time.Minute); err != nil {
			op.kill()
			b.Fatal(err)
		}
		run.RestSeconds = time.Since(start).Seconds()
		atRest, err := scrape(addr)
		if err != nil {
			op.kill()
			b.Fatal(err)
		}
		run.StartupRequests = apiRequests(atRest)
		run.StartupReconciles = countsByLabel(atRest, "controller_runtime_reconcile_total", "controller")
		time.Sleep(*memorySettle)
		before, err := scrape(addr)
		if err != nil {
			op.kill()
			b.Fatal(err)
		}
		idleEnds := time.Now().Add(*memoryIdle)
		if *memoryHeartbeats {
			n, err := heartbeatAll(ctx, cs, specs)
			if err != nil {
				op.kill()
				b.Fatal(err)
			}
			run.Heartbeats = n
		}
		time.Sleep(time.Until(idleEnds))
		after, err := scrape(addr)
		if err != nil {
			op.kill()
			b.Fatal(err)
		}
		run.RestRequests = diffCounts(apiRequests(before), apiRequests(after))
		run.RestReconciles = diffCounts(countsByLabel(before, "controller_runtime_reconcile_total", "controller"),
			countsByLabel(after, "controller_runtime_reconcile_total", "controller"))
		if run.Heartbeats > 0 {
			run.ReconcilesPerHeartbeat = float64(sum(run.RestReconciles)) / float64(run.Heartbeats)
		}
		leases := 0
		for k, v := range run.RestRequests {
			if strings.Contains(k, "leases") {
				leases += v
			}
		}
		total := 0
		for _, v := range run.RestRequests {
			total += v
		}
		minutes := memoryIdle.Minutes()
		run.RestPerMinute = float64(total) / minutes
		run.RestPerMinuteNoLeases = float64(total-leases) / minutes
		// The profile's ?gc=1 collects first: the heap gauge after it is
		// what the caches and the controllers keep.
		profile := filepath.Join(dir, fmt.Sprintf("heap-%d.pprof", nodes))
		if setting != "" {
			profile = filepath.Join(dir, fmt.Sprintf("heap-%d-%s.pprof", nodes, strings.ReplaceAll(setting, "=", "")))
		}
		if err := saveHeapProfile(addr, profile); err != nil {
			b.Error(err)
		} else {
			run.HeapProfile = profile
			run.TopInuse = pprofTop(b, bin, profile, 10)
			if i == 0 && *heapProfile != "" {
				if data, err := os.ReadFile(profile); err == nil {
					if err := os.WriteFile(*heapProfile, data, 0o644); err != nil {
						b.Error(err)
					}
				}
			}
		}
		fams, err := scrape(addr)
		if err != nil {
			op.kill()
			b.Fatal(err)
		}
		rss, hwm := memoryOf(op.pid())
		run.CPUSeconds = cpuSecondsOf(op.pid())
		op.kill()
		run.HeapInuseMB = gauge(fams, "go_memstats_heap_inuse_bytes") / (1 << 20)
		run.RSSMB, run.PeakRSSMB = float64(rss)/1024, float64(hwm)/1024
		run.BytesPerNode = run.HeapInuseMB * (1 << 20) / float64(nodes)
		run.RSSPerNode = run.RSSMB * (1 << 20) / float64(nodes)
		if r.Pods > 0 {
			run.BytesPerPod = run.HeapInuseMB * (1 << 20) / float64(r.Pods)
		}
		r.Runs = append(r.Runs, run)
		unit := func(u string) string {
			if setting == "" {
				return u
			}
			return u + "-" + strings.ReplaceAll(setting, "=", "")
		}
		b.ReportMetric(run.RSSMB, unit("MB-rss"))
		b.ReportMetric(run.HeapInuseMB, unit("MB-heap"))
		b.ReportMetric(run.RestPerMinuteNoLeases, unit("req/min-at-rest"))
		b.Logf("%s: %d nodes, %d pods: at rest after %.1f s; RSS %.0f MB (peak %.0f), heap in use %.1f MB = %.0f B/node, %.0f B/pod; %.1f requests/min at rest (%s); %.1f CPU s",
			name, nodes, r.Pods, run.RestSeconds, run.RSSMB, run.PeakRSSMB, run.HeapInuseMB, run.BytesPerNode, run.BytesPerPod,
			run.RestPerMinute, formatCounts(run.RestRequests), run.CPUSeconds)
		b.Logf("top in-use sites:\n%s", strings.Join(run.TopInuse, "\n"))
		if run.Heartbeats > 0 {
			b.ReportMetric(run.ReconcilesPerHeartbeat, unit("reconciles/heartbeat"))
			b.Logf("%d node heartbeats at rest: %d reconciles (%s), %.3f per heartbeat", run.Heartbeats, sum(run.RestReconciles),
				formatCounts(run.RestReconciles), run.ReconcilesPerHeartbeat)
		}
	}
	if *memoryStatus {
		for range 3 {
			r.Status = append(r.Status, measureStatus(b, bin, env.Kubeconfig))
		}
		for _, st := range r.Status {
			b.Logf("gpufleet status: %.2f s, peak RSS %.0f MB, %d bytes of output", st.Seconds, st.MaxRSSMB, st.OutputBytes)
		}
		if other := *memoryStatusAlso; other != "" {
			for range 3 {
				r.StatusAlso = append(r.StatusAlso, measureStatus(b, other, env.Kubeconfig))
			}
			for _, st := range r.StatusAlso {
				b.Logf("%s status: %.2f s, peak RSS %.0f MB, %d bytes of output", other, st.Seconds, st.MaxRSSMB, st.OutputBytes)
			}
		}
	}
	if *memoryUI {
		ui := measureUI(b, bin, env.Kubeconfig, cs, specs[len(specs)/2].Name, 4)
		r.UI = &ui
		b.Logf("gpufleet ui: %s", ui)
		if other := *memoryUIAlso; other != "" {
			ui := measureUI(b, other, env.Kubeconfig, cs, specs[len(specs)/2].Name, 4)
			r.UIAlso = &ui
			b.Logf("%s ui: %s", other, ui)
			again := measureUI(b, bin, env.Kubeconfig, cs, specs[len(specs)/2].Name, 4)
			r.UIAgain = &again
			b.Logf("gpufleet ui again: %s", again)
		}
	}
	r.LoadAfter = loadAverage()
	r.EtcdDBMB = etcdDBMB(env.Dir)
	r.MemAvailMB = memAvailableMB()
	writeRestReport(b, dir, r)
}

// createRestObjects gives every controller something to hold at rest: the
// maintenance limits closed (maxParallelOperations 0), a pending
// NodeMaintenance with a drain on every hundredth node, and a
// NodeRepairPolicy with the default rules over every node. It returns the
// number of NodeMaintenance objects. (A ClusterPolicy is left out: its
// DaemonSets would put a pod per component on every node.)
func createRestObjects(ctx context.Context, b *testing.B, env *devcluster.Env, specs []devcluster.NodeSpec) int {
	if err := env.Kube.Create(ctx, &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: ptr.To(intstr.FromInt32(0))},
	}); err != nil {
		b.Fatal(err)
	}
	if err := env.Kube.Create(ctx, &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: repairv1.NodeRepairPolicySpec{GPU: repairv1.GPUSpec{DRADriver: devcluster.DRADriver}}}); err != nil {
		b.Fatal(err)
	}
	n := 0
	for i := 0; i < len(specs); i += 100 {
		nm := &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: workloadNamespace, Name: "rest-" + specs[i].Name},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: "rest.example.com", NodeName: specs[i].Name,
				DrainSpec: &maintenancev1.DrainSpec{DeleteEmptyDir: true}},
		}
		if err := env.Kube.Create(ctx, nm); err != nil {
			b.Fatal(err)
		}
		n++
	}
	return n
}

// measureStatus runs `gpufleet status` as the cluster's admin and reads its
// wall time and peak RSS: its VmHWM, read every 20 ms until it exits (the
// kernel's maxrss of a child counts the parent's memory before the exec:
// it reported this test process's 2.5 GB at 10,000 nodes).
func measureStatus(b *testing.B, bin, kubeconfig string) statusRun {
	cmd := exec.Command(bin, "status", "--kubeconfig", kubeconfig)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	began := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatalf("gpufleet status: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	hwm := 0
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, h := memoryOf(cmd.Process.Pid); h > hwm {
			hwm = h
		}
		select {
		case err := <-done:
			if err != nil {
				b.Fatalf("gpufleet status: %v\n%s", err, tail(stderr.String(), 2000))
			}
			return statusRun{Seconds: time.Since(began).Seconds(), OutputBytes: out.Len(), MaxRSSMB: float64(hwm) / 1024}
		case <-tick.C:
		}
	}
}

// inParallel calls f(ctx, 0) … f(ctx, n-1), at most workers at once, and
// returns the first error (what was not started then is not).
func inParallel(ctx context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error { return f(ctx, i) })
	}
	return g.Wait()
}

// heartbeatAll writes one status heartbeat on every node, as a kubelet
// does every 5 minutes when nothing changed (the Ready condition's
// lastHeartbeatTime), 32 at a time; it returns how many it wrote.
func heartbeatAll(ctx context.Context, cs kubernetes.Interface, specs []devcluster.NodeSpec) (int, error) {
	var written atomic.Int64
	err := inParallel(ctx, len(specs), 32, func(ctx context.Context, i int) error {
		patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","lastHeartbeatTime":%q}]}}`, time.Now().UTC().Format(time.RFC3339))
		if _, err := cs.CoreV1().Nodes().Patch(ctx, specs[i].Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			return fmt.Errorf("heartbeat of %s: %w", specs[i].Name, err)
		}
		written.Add(1)
		return nil
	})
	return int(written.Load()), err
}

// createNodes creates the nodes and their ResourceSlices, 32 at a time.
func createNodes(ctx context.Context, b *testing.B, cs kubernetes.Interface, specs []devcluster.NodeSpec) {
	err := inParallel(ctx, len(specs), 32, func(ctx context.Context, i int) error {
		node, err := cs.CoreV1().Nodes().Create(ctx, specs[i].Node(), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if s := specs[i].ResourceSlice(node.UID); s != nil {
			if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// waitNodesReady waits until n nodes are Ready (the API server's cache).
func waitNodesReady(ctx context.Context, b *testing.B, cs kubernetes.Interface, n int) {
	ready := 0
	err := wait.PollUntilContextTimeout(ctx, 5*time.Second, 20*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, nil //nolint:nilerr // transient; keep polling
		}
		ready = 0
		for i := range list.Items {
			if devcluster.NodeReady(&list.Items[i]) {
				ready++
			}
		}
		return ready >= n, nil
	})
	if err != nil {
		b.Fatalf("%d of %d nodes Ready: %v", ready, n, err)
	}
}

// createPods creates perNode pods bound to each node, 64 at a time.
func createPods(ctx context.Context, b *testing.B, cs kubernetes.Interface, specs []devcluster.NodeSpec, perNode int) {
	err := inParallel(ctx, len(specs)*perNode, 64, func(ctx context.Context, i int) error {
		node := specs[i/perNode].Name
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("fleet-%s-%d", node, i%perNode),
				Labels:      map[string]string{"app": "fleet", "shard": fmt.Sprint(i % perNode)},
				Annotations: map[string]string{"example.com/owner": "team-a"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
				Name: "main", Image: "registry.example/fleet:1", Args: []string{"--serve", "--port=8080"},
				Env: []corev1.EnvVar{{Name: "MODE", Value: "training"}, {Name: "SHARD", Value: fmt.Sprint(i % perNode)}},
			}}},
		}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// podsRunning counts the Running pods (the API server's watch cache).
func podsRunning(ctx context.Context, b *testing.B, cs kubernetes.Interface) int {
	list, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Running", ResourceVersion: "0"})
	if err != nil {
		b.Fatal(err)
	}
	return len(list.Items)
}

// waitPodsRunning waits until no pod is outside Running (an hour at most:
// kwok starts ~50 pods a second on 2 cores next to the control plane,
// 80,000 take ~30 minutes). It asks the API server's watch cache
// (resourceVersion 0), not etcd: a field-selected list from etcd scans
// every pod.
func waitPodsRunning(ctx context.Context, b *testing.B, cs kubernetes.Interface) {
	err := wait.PollUntilContextTimeout(ctx, 5*time.Second, time.Hour, true, func(ctx context.Context) (bool, error) {
		list, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase!=Running", ResourceVersion: "0"})
		if err != nil {
			return false, nil //nolint:nilerr // transient; keep polling
		}
		return len(list.Items) == 0, nil
	})
	if err != nil {
		b.Fatalf("pods never all Running: %v", err)
	}
}

// waitRest waits until the operator's log says every controller started
// its workers, which controller-runtime does once its caches are synced,
// and the allocation metrics' own pod watch has listed (they export node
// capacities then).
func waitRest(ctx context.Context, op *operatorProcess, addr string, timeout time.Duration) error {
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		op.mu.Lock()
		path := op.logPath
		op.mu.Unlock()
		data, _ := os.ReadFile(path)
		s := string(data)
		controllers, workers := strings.Count(s, "Starting Controller"), strings.Count(s, "Starting workers")
		if controllers == 0 || workers < controllers {
			return false, nil
		}
		fams, err := scrape(addr)
		if err != nil {
			return false, nil //nolint:nilerr // not serving yet
		}
		_, ok := fams["gpufleet_allocation_node_capacity_gpus"]
		return ok, nil
	})
}

// clusterObjects counts the objects of the types the operator's caches hold.
func clusterObjects(ctx context.Context, b *testing.B, env *devcluster.Env) map[string]int {
	out := map[string]int{}
	mc, err := metadata.NewForConfig(env.Config)
	if err != nil {
		b.Logf("counting objects: %v", err)
		return out
	}
	for _, gvr := range []schema.GroupVersionResource{
		{Version: "v1", Resource: "nodes"}, {Version: "v1", Resource: "pods"},
		{Group: "resource.k8s.io", Version: "v1", Resource: "resourceslices"},
		{Group: "apps", Version: "v1", Resource: "daemonsets"},
		{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"},
	} {
		opts := metav1.ListOptions{Limit: 5000}
		for {
			l, err := mc.Resource(gvr).List(ctx, opts)
			if err != nil {
				b.Logf("counting %s: %v", gvr.Resource, err)
				break
			}
			out[gvr.Resource] += len(l.Items)
			if l.Continue == "" {
				break
			}
			opts.Continue = l.Continue
		}
	}
	return out
}

// pprofTop is the first n rows of `go tool pprof -top
// -sample_index=inuse_space` of the profile.
func pprofTop(b *testing.B, bin, profile string, n int) []string {
	out, err := runIn(filepath.Dir(profile), "go", "tool", "pprof", "-top", "-sample_index=inuse_space", bin, profile)
	if err != nil {
		b.Logf("go tool pprof: %v\n%s", err, out)
		return nil
	}
	var rows []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	header := true
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if header {
			if strings.HasPrefix(line, "flat") {
				header = false
				rows = append(rows, line)
			}
			continue
		}
		if len(rows) > n {
			break
		}
		rows = append(rows, line)
	}
	return rows
}

// etcdDBMB is the size of the etcd database file under the cluster's dir.
func etcdDBMB(dir string) float64 {
	var size int64
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "db" {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	return float64(size) / (1 << 20)
}

// memAvailableMB is MemAvailable of /proc/meminfo.
func memAvailableMB() float64 {
	data, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(data), "\n") {
		var kb float64
		if _, err := fmt.Sscanf(line, "MemAvailable: %f kB", &kb); err == nil {
			return kb / 1024
		}
	}
	return 0
}

func reportDir(b *testing.B, dir string) string {
	dir, err := devcluster.ResultsDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	return dir
}

// writeReport writes <dir>/<name>.json (v, indented) and <name>.md, and
// returns their path without the extension. Every benchmark's report.
func writeReport(b *testing.B, dir, name string, v any, md string) string {
	b.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	base := filepath.Join(dir, name)
	if err := os.WriteFile(base+".json", append(data, '\n'), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(base+".md", []byte(md), 0o644); err != nil {
		b.Fatal(err)
	}
	return base
}

// writeRestReport writes rest-<nodes>.{json,md} and merges the size into
// the curve scale-rest.{json,md} (one entry per node count, the latest).
func writeRestReport(b *testing.B, dir string, r restReport) {
	base := writeReport(b, dir, fmt.Sprintf("rest-%d", r.Nodes), r, restMarkdown([]restReport{r}))
	curve := map[int]restReport{}
	if old, err := os.ReadFile(filepath.Join(dir, "scale-rest.json")); err == nil {
		var sizes []restReport
		if json.Unmarshal(old, &sizes) == nil {
			for _, s := range sizes {
				curve[s.Nodes] = s
			}
		}
	}
	curve[r.Nodes] = r
	var sizes []restReport
	for _, n := range slices.Sorted(maps.Keys(curve)) {
		sizes = append(sizes, curve[n])
	}
	writeReport(b, dir, "scale-rest", sizes, restMarkdown(sizes))
	b.Logf("report: %s.{json,md}, %s", base, filepath.Join(dir, "scale-rest.{json,md}"))
}

func restMarkdown(sizes []restReport) string {
	var s strings.Builder
	s.WriteString("# The operator at rest, by fleet size\n\n")
	s.WriteString("| nodes | pods | setting | time to rest | RSS (peak) | Go heap in use | heap B/node | heap B/pod | requests/min at rest (w/o leases) | commit |\n")
	s.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range sizes {
		for _, run := range r.Runs {
			fmt.Fprintf(&s, "| %d | %d | %s | %.1f s | %.0f MB (%.0f) | %.1f MB | %.0f | %.0f | %.1f (%.1f) | %s |\n",
				r.Nodes, r.Pods, run.Setting, run.RestSeconds, run.RSSMB, run.PeakRSSMB, run.HeapInuseMB,
				run.BytesPerNode, run.BytesPerPod, run.RestPerMinute, run.RestPerMinuteNoLeases, r.Commit)
		}
	}
	for _, r := range sizes {
		fmt.Fprintf(&s, "\n## %d nodes\n\nCluster objects: %s. Setup: %s. etcd db %.0f MB; load after %s; machine memory available %.0f MB.\n",
			r.Nodes, formatCounts(r.Objects), formatAny(r.Setup), r.EtcdDBMB, r.LoadAfter, r.MemAvailMB)
		for i, st := range r.Status {
			fmt.Fprintf(&s, "\n`gpufleet status` run %d: %.2f s, peak RSS %.0f MB, %d bytes of output.\n", i+1, st.Seconds, st.MaxRSSMB, st.OutputBytes)
		}
		for i, st := range r.StatusAlso {
			fmt.Fprintf(&s, "\n`gpufleet status` of the other binary, run %d: %.2f s, peak RSS %.0f MB, %d bytes of output.\n", i+1, st.Seconds, st.MaxRSSMB, st.OutputBytes)
		}
		if ui := r.UI; ui != nil {
			fmt.Fprintf(&s, "\n`gpufleet ui`: %s.\n", ui)
		}
		if ui := r.UIAlso; ui != nil {
			fmt.Fprintf(&s, "\n`gpufleet ui` of the other binary, next: %s.\n", ui)
		}
		if ui := r.UIAgain; ui != nil {
			fmt.Fprintf(&s, "\n`gpufleet ui` again, last: %s.\n", ui)
		}
		for _, run := range r.Runs {
			fmt.Fprintf(&s, "\n%s: startup requests %s; at rest %s.\n", run.Setting, formatCounts(run.StartupRequests), formatCounts(run.RestRequests))
			fmt.Fprintf(&s, "\nReconciles up to rest, by controller: %s.\n", formatCounts(run.StartupReconciles))
			if run.Heartbeats > 0 {
				fmt.Fprintf(&s, "\nOne status heartbeat on every node at rest (%d): %d reconciles (%s), %.3f per heartbeat.\n",
					run.Heartbeats, sum(run.RestReconciles), formatCounts(run.RestReconciles), run.ReconcilesPerHeartbeat)
			}
			if len(run.TopInuse) > 0 {
				fmt.Fprintf(&s, "\nTop in-use allocation sites (`go tool pprof -top -sample_index=inuse_space %s`):\n\n```\n%s\n```\n",
					filepath.Base(run.HeapProfile), strings.Join(run.TopInuse, "\n"))
			}
		}
	}
	return s.String()
}

func formatAny(m map[string]any) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		if f, ok := v.(float64); ok {
			v = fmt.Sprintf("%.1f", f)
		}
		parts = append(parts, fmt.Sprintf("%s %v", k, v))
	}
	return strings.Join(parts, ", ")
}
