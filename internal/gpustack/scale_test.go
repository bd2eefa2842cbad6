package gpustack_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/operator"
)

var (
	scaleNodes        = flag.Int("gpustack.nodes", 20, "GPU nodes of BenchmarkClusterPolicyScale (the test cluster's 7 healthy ones included)")
	scaleReadyTimeout = flag.Duration("gpustack.ready-timeout", 10*time.Minute, "BenchmarkClusterPolicyScale: longest wait for the policy to be ready (the failure names the stack pods by phase)")
	scaleReadyAfter   = flag.Duration("gpustack.ready-after", 0, "BenchmarkClusterPolicyScale: every stack pod becomes Ready this long after its init containers completed (sim.gpufleet.dev/ready-after; 0: the simulation's 0.1-0.3 s)")
	scaleUpgrade      = flag.Bool("gpustack.upgrade", true, "BenchmarkClusterPolicyScale: once converged, roll a driver version change through NodeMaintenance (maxParallelUpgrades 10% of the GPU nodes)")
	scaleUpgradeFor   = flag.Duration("gpustack.upgrade-timeout", 20*time.Minute, "BenchmarkClusterPolicyScale: how long the driver upgrade may take before the benchmark fails")
	scaleReport       = flag.String("gpustack.report", "", "BenchmarkClusterPolicyScale: directory for gpustack-<nodes>.{json,md} (default: results/ in the source tree)")
)

// BenchmarkClusterPolicyScale deploys the GPU Operator 1.6 ClusterPolicy on
// -gpustack.nodes healthy simulated GPU nodes (two OS versions, two
// runtimes; plus the 2 CPU nodes of the test cluster) and reports: the
// time to state ready, the operator's API requests to get there, its
// reconcile passes, the CPU seconds of the test process (the in-process
// operator, and the simulated init containers of devcluster) from the
// policy's creation to ready, and the operator's requests per minute once
// converged and while one node's stack is stuck (target: none).
//
// With -gpustack.upgrade (the default), between the converged and the
// stuck window it changes spec.driver.version with autoUpgrade and
// maxParallelUpgrades 10% of the GPU nodes (at least 1), and reports the
// time until every GPU node runs the new driver Ready, no node carries the
// upgrade label, no upgrade NodeMaintenance is left and the policy is
// ready again; the operator's requests, reconcile passes and CPU seconds
// during it; and the most NodeMaintenance objects in progress at once
// (polled every 200 ms; more than the limit fails the benchmark). The
// operator runs the gpustack and maintenance capabilities, as in a
// cluster: the upgrade's NodeMaintenance objects are scheduled, cordoned
// and drained by the maintenance controllers and released (deleted) by
// the GPU stack controller itself. The cluster's MaintenanceOperatorConfig
// allows twice the upgrade limit, so the limit checked is the upgrade
// policy's own.
//
// It writes gpustack-<nodes>.{json,md} to -gpustack.report (default
// results/ in the source tree), which hack/scalereport gathers.
//
//	GPUFLEET_BIN_DIR=… flock /tmp/gpufleet-cluster.lock go test -run '^$' \
//	  -bench BenchmarkClusterPolicyScale -benchtime 1x ./internal/gpustack/ -args -gpustack.nodes=100
//
// -gpustack.ready-after=8s makes every stack pod take 8 s to start once its
// init containers have completed (and they complete only once the
// components they validate are Ready on the node): how long the chain of a
// node's components takes when pods do not start at once.
func BenchmarkClusterPolicyScale(b *testing.B) {
	if cluster == nil {
		b.Skip("needs the local cluster")
	}
	ctx := context.Background()
	// The test cluster's broken node comes back later as the stuck one.
	_ = cluster.Client.CoreV1().Nodes().Delete(ctx, devcluster.UnhealthyNodePrefix+"gpu-007", metav1.DeleteOptions{})
	const existing = 7 // gpu-000 … gpu-006 of TestMain
	var specs []devcluster.NodeSpec
	for i := range max(*scaleNodes-existing, 0) {
		s := devcluster.NodeSpec{Name: fmt.Sprintf("bench-%03d", i), Pool: "bench", GPUs: 8}
		if i%4 == 0 {
			s.OSVersion, s.Runtime = "20.04", devcluster.RuntimeDocker
		}
		specs = append(specs, s)
	}
	if err := cluster.AddNodes(ctx, specs...); err != nil {
		b.Fatal(err)
	}
	gpuNodes := existing + len(specs)
	cfg, counter := devcluster.CountRequests(operatorCfg)
	stop := devtest.StartOperator(b, cfg, operator.Options{Namespace: ns, Capabilities: []string{"gpustack", "maintenance"},
		GPUStackDegradedAfter: 10 * time.Second})
	defer stop()
	time.Sleep(2 * time.Second) // caches synced

	policy := &nvidiav1.ClusterPolicy{}
	if err := yamlUnmarshal(v16YAML(b), policy); err != nil {
		b.Fatal(err)
	}
	policy.Name = "bench-policy"
	if *scaleReadyAfter > 0 {
		if policy.Spec.Daemonsets.Annotations == nil {
			policy.Spec.Daemonsets.Annotations = map[string]string{}
		}
		policy.Spec.Daemonsets.Annotations["sim.gpufleet.dev/ready-after"] = scaleReadyAfter.String()
	}
	start, passes0, cpu0 := counter.Snapshot(), reconcilePasses(b), processCPU()
	began := time.Now()
	if err := k8s.Create(ctx, policy); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = k8s.Delete(context.Background(), policy) }()
	stopProgress := reportStackProgress(b, began)
	waitPolicy(b, *scaleReadyTimeout, func(p *nvidiav1.ClusterPolicy) bool { return p.Status.State == nvidiav1.StateReady })
	stopProgress()
	elapsed := time.Since(began)
	cpu := processCPU() - cpu0
	passes := reconcilePasses(b) - passes0
	rollout := counter.Since(start)
	// The last status write may still be on its way through the cache;
	// give it a moment before the idle window.
	time.Sleep(3 * time.Second)
	idleStart := counter.Snapshot()
	const idleFor = 30 * time.Second
	time.Sleep(idleFor)
	idle := counter.Since(idleStart)

	var up upgradeFigures
	if *scaleUpgrade {
		up = measureUpgrade(b, counter, gpuNodes)
		time.Sleep(3 * time.Second) // the last writes, as above
	}

	// One node whose stack never comes up: Degraded, then quiet.
	stuck := devcluster.UnhealthyNodePrefix + "bench-stuck"
	if err := cluster.AddNodes(ctx, devcluster.NodeSpec{Name: stuck, Pool: "bench", GPUs: 8}); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), stuck, metav1.DeleteOptions{})
	}()
	waitPolicy(b, 2*time.Minute, func(p *nvidiav1.ClusterPolicy) bool {
		return meta.IsStatusConditionTrue(p.Status.Conditions, nvidiav1.ConditionDegraded)
	})
	time.Sleep(3 * time.Second)
	stuckStart := counter.Snapshot()
	time.Sleep(idleFor)
	stuckIdle := counter.Since(stuckStart)

	total, writes := sum(rollout, false), sum(rollout, true)
	perMin := func(m map[string]int) float64 {
		return float64(sum(m, false)) * float64(time.Minute) / float64(idleFor)
	}
	b.ReportMetric(elapsed.Seconds(), "s/to-ready")
	b.ReportMetric(float64(total), "requests/to-ready")
	b.ReportMetric(float64(writes), "writes/to-ready")
	b.ReportMetric(float64(passes), "passes/to-ready")
	b.ReportMetric(cpu.Seconds(), "cpu-s/to-ready")
	b.ReportMetric(perMin(idle), "requests/min-converged")
	b.ReportMetric(perMin(stuckIdle), "requests/min-stuck")
	b.Logf("GPU Operator 1.6 ClusterPolicy on %d GPU nodes (pods ready %s after start): ready after %s; %d requests (%d writes), %.0f reconcile passes, %.1f CPU s:\n%s",
		gpuNodes, *scaleReadyAfter, elapsed.Round(100*time.Millisecond), total, writes, passes, cpu.Seconds(), devcluster.FormatCounts(rollout))
	b.Logf("requests in %s converged:\n%s", idleFor, devcluster.FormatCounts(idle))
	if *scaleUpgrade {
		b.ReportMetric(up.elapsed.Seconds(), "s/upgrade")
		b.ReportMetric(float64(sum(up.requests, false)), "requests/upgrade")
		b.ReportMetric(float64(sum(up.requests, true)), "writes/upgrade")
		b.ReportMetric(up.passes, "passes/upgrade")
		b.ReportMetric(up.cpu.Seconds(), "cpu-s/upgrade")
		b.ReportMetric(float64(up.maxInProgress), "max-in-progress/upgrade")
		b.ReportMetric(float64(up.limit), "limit/upgrade")
		b.Logf("driver upgrade %s → %s on %d GPU nodes (maxParallelUpgrades %d): done after %s; %d requests (%d writes), %.0f reconcile passes, %.1f CPU s; at most %d NodeMaintenance in progress at once (%d polls):\n%s",
			up.from, up.to, gpuNodes, up.limit, up.elapsed.Round(100*time.Millisecond), sum(up.requests, false), sum(up.requests, true),
			up.passes, up.cpu.Seconds(), up.maxInProgress, up.polls, devcluster.FormatCounts(up.requests))
	}
	b.Logf("requests in %s with %s stuck:\n%s", idleFor, stuck, devcluster.FormatCounts(stuckIdle))
	for _, m := range []map[string]int{idle, stuckIdle} {
		for k := range m {
			if devcluster.IsWrite(k) || strings.HasPrefix(k, "LIST") {
				b.Errorf("idle operator issued %s", k)
			}
		}
	}

	r := gpustackReport{Nodes: gpuNodes, ReadySeconds: elapsed.Seconds(), RequestsToReady: total, WritesToReady: writes,
		PassesToReady: passes, CPUSecondsToReady: cpu.Seconds(), RequestsPerNodeToReady: float64(total) / float64(gpuNodes),
		IdleRequestsPerMinute: perMin(idle), StuckRequestsPerMinute: perMin(stuckIdle), ReadyAfter: scaleReadyAfter.String(),
		IdleRequests: devcluster.FormatCountsLine(idle, "none"), StuckRequests: devcluster.FormatCountsLine(stuckIdle, "none"),
		Commit: gitCommit()}
	if *scaleUpgrade {
		r.UpgradeSeconds, r.UpgradeRequests, r.UpgradeWrites = up.elapsed.Seconds(), sum(up.requests, false), sum(up.requests, true)
		r.UpgradeRequestsPerNode = float64(r.UpgradeRequests) / float64(gpuNodes)
		r.UpgradePasses, r.UpgradeCPUSeconds = up.passes, up.cpu.Seconds()
		r.UpgradeMaxInProgress, r.UpgradeLimit, r.UpgradeRequestsBy = up.maxInProgress, up.limit, up.requests
	}
	writeGPUStackReport(b, r)
}

func waitPolicy(b *testing.B, timeout time.Duration, done func(*nvidiav1.ClusterPolicy) bool) {
	b.Helper()
	p := &nvidiav1.ClusterPolicy{}
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := k8s.Get(ctx, keyOf("bench-policy"), p); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		return done(p), nil
	})
	if err != nil {
		pods, _ := cluster.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		phases := map[string]int{}
		for _, pod := range pods.Items {
			phase := string(pod.Status.Phase)
			if pod.Spec.NodeName == "" {
				phase += "/unscheduled"
			}
			phases[phase]++
		}
		b.Fatalf("bench-policy: condition not reached within %s; stack pods by phase %v; status %+v", timeout, phases, p.Status)
	}
}

func sum(m map[string]int, writesOnly bool) int {
	n := 0
	for k, v := range m {
		if !writesOnly || devcluster.IsWrite(k) {
			n += v
		}
	}
	return n
}

// reconcilePasses is controller-runtime's count of the ClusterPolicy
// controller's reconciles (every result).
func reconcilePasses(tb testing.TB) float64 {
	tb.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != "gpufleet_gpustack_reconcile_passes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelValue(m, "result") != "deferred" { // not a pass
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// processCPU is the user+system CPU time of this process.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// upgradeVersion is the driver version the benchmark's upgrade rolls out.
const upgradeVersion = "470.57.02"

// upgradeFigures are what BenchmarkClusterPolicyScale measures of the
// driver upgrade.
type upgradeFigures struct {
	from, to string
	// limit is maxParallelUpgrades: 10% of the GPU nodes, at least 1.
	limit   int
	elapsed time.Duration
	// requests are the operator's, by verb and resource.
	requests map[string]int
	passes   float64
	cpu      time.Duration
	// maxInProgress is the most upgrade NodeMaintenance objects in
	// progress (past Pending, deleted ones included until they are gone)
	// seen at once in polls every 200 ms.
	maxInProgress, polls int
}

// measureUpgrade changes the converged bench-policy's driver version with
// autoUpgrade and maxParallelUpgrades 10% of gpuNodes, and waits (at most
// -gpustack.upgrade-timeout) until the upgrade is done on every GPU node.
func measureUpgrade(b *testing.B, counter *devcluster.RequestCounter, gpuNodes int) upgradeFigures {
	b.Helper()
	ctx := context.Background()
	f := upgradeFigures{limit: max(gpuNodes/10, 1), to: upgradeVersion}
	// The cluster's limits allow twice as many, so that the limit checked
	// below is the upgrade policy's own (the default, 1, would hold it).
	mcfg := &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: maintenancev1.DefaultConfigName},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: ptr.To(intstr.FromInt32(int32(2 * f.limit)))},
	}
	if err := k8s.Create(ctx, mcfg); err != nil {
		b.Fatalf("creating MaintenanceOperatorConfig %s/%s: %v", ns, mcfg.Name, err)
	}
	defer func() { _ = k8s.Delete(context.Background(), mcfg) }()
	time.Sleep(2 * time.Second) // in the operator's cache

	stopCheck, checked := make(chan struct{}), make(chan struct{})
	var violations []string
	go func() {
		defer close(checked)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopCheck:
				return
			case <-tick.C:
			}
			var nms maintenancev1.NodeMaintenanceList
			if err := k8s.List(ctx, &nms, client.InNamespace(ns)); err != nil {
				continue
			}
			inProgress := 0
			for i := range nms.Items {
				if nm := &nms.Items[i]; nm.Spec.RequestorID == gpustack.UpgradeRequestor && nm.InProgress() {
					inProgress++
				}
			}
			f.polls++
			f.maxInProgress = max(f.maxInProgress, inProgress)
			if inProgress > f.limit && len(violations) < 10 {
				violations = append(violations, fmt.Sprintf("%s: %d upgrade NodeMaintenance objects in progress, limit %d",
					time.Now().Format(time.RFC3339Nano), inProgress, f.limit))
			}
		}
	}()

	start, passes0, cpu0 := counter.Snapshot(), reconcilePasses(b), processCPU()
	began := time.Now()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := &nvidiav1.ClusterPolicy{}
		if err := k8s.Get(ctx, keyOf("bench-policy"), p); err != nil {
			return err
		}
		f.from = p.Spec.Driver.Version
		p.Spec.Driver.Version = upgradeVersion
		p.Spec.Driver.UpgradePolicy = &nvidiav1.DriverUpgradePolicySpec{AutoUpgrade: ptr.To(true), MaxParallelUpgrades: ptr.To(int32(f.limit))}
		return k8s.Update(ctx, p)
	})
	if err != nil {
		close(stopCheck)
		b.Fatalf("changing bench-policy's driver version: %v", err)
	}
	var progress upgradeProgress
	err = wait.PollUntilContextTimeout(ctx, time.Second, *scaleUpgradeFor, true, func(ctx context.Context) (bool, error) {
		p, err := readUpgradeProgress(ctx, upgradeVersion)
		if err != nil {
			return false, nil //nolint:nilerr // a transient error: keep polling
		}
		progress = p
		if p.failed > 0 {
			return false, fmt.Errorf("%d nodes labelled %s=failed", p.failed, nvidiav1.LabelUpgradeState)
		}
		return p.done(gpuNodes), nil
	})
	f.elapsed = time.Since(began)
	f.cpu = processCPU() - cpu0
	f.passes = reconcilePasses(b) - passes0
	f.requests = counter.Since(start)
	close(stopCheck)
	<-checked
	if err != nil {
		b.Fatalf("driver upgrade %s → %s (maxParallelUpgrades %d) not finished after %s (%v): %s; at most %d in progress at once",
			f.from, f.to, f.limit, f.elapsed.Round(time.Second), err, progress, f.maxInProgress)
	}
	for _, v := range violations {
		b.Error(v)
	}
	if f.maxInProgress == 0 {
		b.Errorf("the checker never saw an upgrade NodeMaintenance in progress (%d polls)", f.polls)
	}
	return f
}

// upgradeProgress is where the GPU nodes are in a driver upgrade.
type upgradeProgress struct {
	// gpuNodes: upgraded (one driver pod, of the new version, Ready),
	// starting (a new driver pod not Ready yet, or an old one still
	// terminating), old (an old driver pod), noPod.
	gpuNodes, upgraded, starting, old, noPod int
	// upgrading and failed carry the upgrade-state label; cordoned nodes
	// are unschedulable.
	upgrading, failed, cordoned int
	// maintenance counts the upgrade's NodeMaintenance objects, inProgress
	// those past Pending.
	maintenance, inProgress int
	state                   nvidiav1.State
}

func (p upgradeProgress) done(gpuNodes int) bool {
	return p.gpuNodes == gpuNodes && p.upgraded == gpuNodes && p.upgrading == 0 && p.failed == 0 && p.cordoned == 0 &&
		p.maintenance == 0 && p.state == nvidiav1.StateReady
}

func (p upgradeProgress) String() string {
	return fmt.Sprintf("of %d GPU nodes %d run the new driver Ready, %d are starting it, %d run the old one, %d have no driver pod; "+
		"%d labelled upgrading, %d failed, %d cordoned; %d upgrade NodeMaintenance objects (%d in progress); policy state %q",
		p.gpuNodes, p.upgraded, p.starting, p.old, p.noPod, p.upgrading, p.failed, p.cordoned, p.maintenance, p.inProgress, p.state)
}

// readUpgradeProgress reads the GPU nodes, the driver pods, the upgrade's
// NodeMaintenance objects and bench-policy from the API server.
func readUpgradeProgress(ctx context.Context, version string) (upgradeProgress, error) {
	var p upgradeProgress
	nodes, err := cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return p, err
	}
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: gpustack.LabelComponent + "=" + gpustack.Driver})
	if err != nil {
		return p, err
	}
	var nms maintenancev1.NodeMaintenanceList
	if err := k8s.List(ctx, &nms, client.InNamespace(ns)); err != nil {
		return p, err
	}
	policy := &nvidiav1.ClusterPolicy{}
	if err := k8s.Get(ctx, keyOf("bench-policy"), policy); err != nil {
		return p, err
	}
	type driverPods struct{ newReady, other, old int }
	byNode := map[string]*driverPods{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		d := byNode[pod.Spec.NodeName]
		if d == nil {
			d = &driverPods{}
			byNode[pod.Spec.NodeName] = d
		}
		current := len(pod.Spec.Containers) > 0 && strings.Contains(pod.Spec.Containers[0].Image, ":"+version+"-")
		switch {
		case current && pod.DeletionTimestamp == nil && podutils.IsPodReady(pod):
			d.newReady++
		case !current && pod.DeletionTimestamp == nil:
			d.old++
		default:
			d.other++
		}
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if !nvidiav1.HasNvidiaGPU(n.Labels) {
			continue
		}
		p.gpuNodes++
		switch d := byNode[n.Name]; {
		case d == nil:
			p.noPod++
		case d.old > 0:
			p.old++
		case d.newReady == 1 && d.other == 0:
			p.upgraded++
		default:
			p.starting++
		}
		switch n.Labels[nvidiav1.LabelUpgradeState] {
		case "":
		case "failed":
			p.failed++
		default:
			p.upgrading++
		}
		if n.Spec.Unschedulable {
			p.cordoned++
		}
	}
	for i := range nms.Items {
		if nm := &nms.Items[i]; nm.Spec.RequestorID == gpustack.UpgradeRequestor {
			p.maintenance++
			if nm.InProgress() {
				p.inProgress++
			}
		}
	}
	p.state = policy.Status.State
	return p, nil
}

// gpustackReport is gpustack-<nodes>.json: BenchmarkClusterPolicyScale's
// figures (the upgrade ones absent when -gpustack.upgrade=false). Requests
// are the operator's; CPU seconds the test process's.
type gpustackReport struct {
	Nodes                  int     `json:"nodes"`
	ReadyAfter             string  `json:"readyAfter"`
	ReadySeconds           float64 `json:"readySeconds"`
	RequestsToReady        int     `json:"requestsToReady"`
	WritesToReady          int     `json:"writesToReady"`
	PassesToReady          float64 `json:"passesToReady"`
	CPUSecondsToReady      float64 `json:"cpuSecondsToReady"`
	RequestsPerNodeToReady float64 `json:"requestsPerNodeToReady"`
	IdleRequestsPerMinute  float64 `json:"idleRequestsPerMinute"`
	StuckRequestsPerMinute float64 `json:"stuckRequestsPerMinute"`
	// IdleRequests and StuckRequests: the requests of those windows, by
	// verb and resource.
	IdleRequests           string  `json:"idleRequests"`
	StuckRequests          string  `json:"stuckRequests"`
	UpgradeSeconds         float64 `json:"upgradeSeconds,omitempty"`
	UpgradeRequests        int     `json:"upgradeRequests,omitempty"`
	UpgradeWrites          int     `json:"upgradeWrites,omitempty"`
	UpgradeRequestsPerNode float64 `json:"upgradeRequestsPerNode,omitempty"`
	UpgradePasses          float64 `json:"upgradePasses,omitempty"`
	UpgradeCPUSeconds      float64 `json:"upgradeCpuSeconds,omitempty"`
	UpgradeMaxInProgress   int     `json:"upgradeMaxInProgress,omitempty"`
	UpgradeLimit           int     `json:"upgradeLimit,omitempty"`
	// UpgradeRequestsBy are the upgrade's requests by verb and resource.
	UpgradeRequestsBy map[string]int `json:"upgradeRequestsBy,omitempty"`
	Commit            string         `json:"commit"`
}

// writeGPUStackReport writes gpustack-<nodes>.{json,md} to -gpustack.report.
func writeGPUStackReport(b *testing.B, r gpustackReport) {
	b.Helper()
	dir, err := devcluster.ResultsDir(*scaleReport)
	if err != nil {
		b.Fatal(err)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	base := filepath.Join(dir, fmt.Sprintf("gpustack-%d", r.Nodes))
	if err := os.WriteFile(base+".json", append(data, '\n'), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(base+".md", []byte(gpustackMarkdown(r)), 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("report: %s.json, %s.md", base, base)
}

func gpustackMarkdown(r gpustackReport) string {
	var s strings.Builder
	fmt.Fprintf(&s, "# GPU stack: the GPU Operator 1.6 ClusterPolicy on %d GPU nodes\n\n", r.Nodes)
	s.WriteString("| figure | value |\n|---|---|\n")
	fmt.Fprintf(&s, "| time to ready | %.1f s |\n", r.ReadySeconds)
	fmt.Fprintf(&s, "| operator requests to ready (writes) | %d (%d) |\n", r.RequestsToReady, r.WritesToReady)
	fmt.Fprintf(&s, "| requests per GPU node to ready | %.1f |\n", r.RequestsPerNodeToReady)
	fmt.Fprintf(&s, "| reconcile passes to ready | %.0f |\n", r.PassesToReady)
	fmt.Fprintf(&s, "| CPU seconds to ready (test process) | %.1f |\n", r.CPUSecondsToReady)
	fmt.Fprintf(&s, "| requests/min converged | %.1f (%s) |\n", r.IdleRequestsPerMinute, r.IdleRequests)
	fmt.Fprintf(&s, "| requests/min with one node stuck | %.1f (%s) |\n", r.StuckRequestsPerMinute, r.StuckRequests)
	if r.UpgradeLimit > 0 {
		fmt.Fprintf(&s, "| driver upgrade, maxParallelUpgrades %d | %.1f s |\n", r.UpgradeLimit, r.UpgradeSeconds)
		fmt.Fprintf(&s, "| upgrade: operator requests (writes) | %d (%d) |\n", r.UpgradeRequests, r.UpgradeWrites)
		fmt.Fprintf(&s, "| upgrade: requests per GPU node | %.1f |\n", r.UpgradeRequestsPerNode)
		fmt.Fprintf(&s, "| upgrade: reconcile passes | %.0f |\n", r.UpgradePasses)
		fmt.Fprintf(&s, "| upgrade: CPU seconds (test process) | %.1f |\n", r.UpgradeCPUSeconds)
		fmt.Fprintf(&s, "| upgrade: most NodeMaintenance in progress at once | %d of %d allowed |\n", r.UpgradeMaxInProgress, r.UpgradeLimit)
	}
	cmd := fmt.Sprintf("go test -run '^$' -bench BenchmarkClusterPolicyScale -benchtime 1x ./internal/gpustack/ -args -gpustack.nodes=%d", *scaleNodes)
	if *scaleReadyAfter > 0 {
		cmd += " -gpustack.ready-after=" + scaleReadyAfter.String()
	}
	if !*scaleUpgrade {
		cmd += " -gpustack.upgrade=false"
	}
	fmt.Fprintf(&s, "\nCommit %s: `%s`\n", r.Commit, cmd)
	return s.String()
}

// gitCommit is the source tree's HEAD, short ("unknown" outside git).
func gitCommit() string {
	root, err := devcluster.SourceRoot()
	if err != nil {
		return "unknown"
	}
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// reportStackProgress logs, every 30 s until stopped, where each stack
// component's pods are (stackProgress) and the CPU each part of the local
// cluster and this process used since the last line: the evidence of
// what holds a large cluster back when the policy is slow to get ready.
func reportStackProgress(b *testing.B, began time.Time) (stop func()) {
	b.Helper()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(30 * time.Second)
		defer tick.Stop()
		last, lastSelf, lastAt := cluster.ProcessCPU(), processCPU(), time.Now()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			progress, err := stackProgress(context.Background())
			if err != nil {
				b.Logf("stack progress: %v", err)
				continue
			}
			now, self, at := cluster.ProcessCPU(), processCPU(), time.Now()
			span := at.Sub(lastAt).Seconds()
			var cpu []string
			for _, name := range slices.Sorted(maps.Keys(now)) {
				cpu = append(cpu, fmt.Sprintf("%s %.0f%%", name, 100*(now[name]-last[name]).Seconds()/span))
			}
			cpu = append(cpu, fmt.Sprintf("benchmark (operator, simulation) %.0f%%", 100*(self-lastSelf).Seconds()/span))
			b.Logf("%s after the policy: %s; CPU of one core: %s", time.Since(began).Round(time.Second), progress, strings.Join(cpu, ", "))
			last, lastSelf, lastAt = now, self, at
		}
	}()
	return func() { close(done); <-finished }
}

// stackProgress counts each component's pods by where they are in their
// start: not there (a GPU node labelled for the component without its
// pod), not scheduled, created (kwok has not started it), initialising
// (its validation init containers wait), starting (initialised, not Ready
// yet), not Ready (running) and Ready.
func stackProgress(ctx context.Context) (string, error) {
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	nodes, err := cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	type key struct{ component, node string }
	has := map[key]bool{}
	counts := map[string]map[string]int{}
	count := func(component, state string) {
		if counts[component] == nil {
			counts[component] = map[string]int{}
		}
		counts[component][state]++
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		component := p.Labels["app.kubernetes.io/component"]
		if component == "" || p.DeletionTimestamp != nil {
			continue
		}
		has[key{component, p.Spec.NodeName}] = true
		gated := false
		for _, c := range p.Spec.InitContainers {
			gated = gated || strings.HasSuffix(c.Name, "-validation")
		}
		switch {
		case p.Spec.NodeName == "":
			count(component, "unscheduled")
		case podutils.IsPodReady(p):
			count(component, "ready")
		case p.Status.Phase == "Running":
			count(component, "not-ready")
		case p.Status.PodIP == "":
			count(component, "created")
		case gated && p.Annotations[devcluster.AnnotationInitialized] != "true":
			count(component, "initialising")
		default:
			count(component, "starting")
		}
	}
	for _, n := range nodes.Items {
		for label, v := range n.Labels {
			component, ok := strings.CutPrefix(label, "nvidia.com/gpu.deploy.")
			if ok && v == "true" && !has[key{component, n.Name}] {
				count(component, "absent")
			}
		}
	}
	var parts []string
	for _, component := range slices.Sorted(maps.Keys(counts)) {
		c := counts[component]
		var states []string
		for _, state := range []string{"ready", "not-ready", "starting", "initialising", "created", "unscheduled", "absent"} {
			if c[state] > 0 {
				states = append(states, fmt.Sprintf("%s %d", state, c[state]))
			}
		}
		parts = append(parts, component+": "+strings.Join(states, " "))
	}
	return strings.Join(parts, "; "), nil
}
