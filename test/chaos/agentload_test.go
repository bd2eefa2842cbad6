package chaos

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/devcluster"
)

var (
	agentLoadAgents  = flag.Int("agentload.agents", 200, "node agents, one per node, each with its own agent.Daemon in this process (BenchmarkAgentAPILoad)")
	agentLoadWindow  = flag.Duration("agentload.window", 3*time.Minute, "window at rest for the requests per minute (BenchmarkAgentAPILoad)")
	agentLoadScaleTo = flag.Int("agentload.scale-to", 10000, "fleet size the measured load is scaled to (BenchmarkAgentAPILoad)")
	agentLoadReport  = flag.String("agentload.report", "", "directory for agentload-<agents>.{json,md} (default: results/ in the source tree)")
)

// agentLoadReportData is what BenchmarkAgentAPILoad writes.
type agentLoadReportData struct {
	Commit string `json:"commit"`
	Date   string `json:"date"`
	Agents int    `json:"agents"`
	// StartupRequests: every agent's requests from its start to rest (its
	// lists and watches), by verb and resource.
	StartupRequests map[string]int `json:"startupRequests"`
	StartupSeconds  float64        `json:"startupSeconds"`
	// WatchesPerAgent: the watches one agent keeps open.
	WatchesPerAgent float64 `json:"watchesPerAgent"`
	// RestRequests: all agents' requests in the window at rest.
	RestRequests        map[string]int `json:"restRequests"`
	WindowSeconds       float64        `json:"windowSeconds"`
	RestPerAgentMinute  float64        `json:"restRequestsPerAgentPerMinute"`
	ScaleTo             int            `json:"scaleTo"`
	ScaledWatches       float64        `json:"scaledWatchConnections"`
	ScaledStartup       float64        `json:"scaledStartupRequests"`
	ScaledRestPerMinute float64        `json:"scaledRestRequestsPerMinute"`
	// SteadyRewatchPerMinute: the watch renewals of client-go's reflector
	// (each watch ends after 5 to 10 minutes, 7.5 on average, and is
	// asked again), scaled: watches × scaleTo / 7.5.
	SteadyRewatchPerMinute float64 `json:"scaledRewatchesPerMinute"`
}

// BenchmarkAgentAPILoad estimates what the node agents of a large fleet
// cost the API server: -agentload.agents kwok GPU nodes (with their DRA
// ResourceSlices) and a NodeRepairPolicy, one agent per node, each its own
// agent.Daemon — the node agent's client code, informers and watches, as
// gpufleet-agent runs it on a node — in this process, on the simulated
// GPU source (which reads the node object, as the real one reads the
// kernel log and dcgm-exporter: no API requests). It counts every agent
// request from the start to rest (requests stable for 10 s) and in a
// window at rest, and scales them linearly to -agentload.scale-to nodes:
// every agent watches only its own node's objects, so its requests do not
// grow with the fleet.
func BenchmarkAgentAPILoad(b *testing.B) {
	ctx := context.Background()
	n := *agentLoadAgents
	env, _, _, _ := startLargeEnv(b, n, 16)
	if err := env.Kube.Create(ctx, &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: repairv1.NodeRepairPolicySpec{GPU: repairv1.GPUSpec{DRADriver: devcluster.DRADriver}}}); err != nil {
		b.Fatal(err)
	}
	cfg, counter := devcluster.CountRequests(env.OperatorConfig)
	sim := devcluster.SimExecutor{Cluster: env.Cluster}
	agentCtx, stop := context.WithCancel(ctx)
	var agents sync.WaitGroup
	defer func() { stop(); agents.Wait() }()
	began := time.Now()
	for i := range n {
		d, err := agent.New(cfg, agent.Options{NodeName: fmt.Sprintf("gpu-%03d", i), Namespace: ns, Executor: sim, GPUs: sim})
		if err != nil {
			b.Fatal(err)
		}
		agents.Go(func() {
			if err := d.Start(agentCtx); err != nil && agentCtx.Err() == nil {
				b.Errorf("agent: %v", err)
			}
		})
	}
	// Rest: the counts have not moved for 10 s.
	last, stableSince := counter.Snapshot(), time.Now()
	err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, false, func(context.Context) (bool, error) {
		now := counter.Snapshot()
		if sum(now) != sum(last) {
			last, stableSince = now, time.Now()
			return false, nil
		}
		return time.Since(stableSince) >= 10*time.Second, nil
	})
	if err != nil {
		b.Fatalf("the agents never came to rest: %v", err)
	}
	r := agentLoadReportData{Commit: gitCommit(), Date: time.Now().UTC().Format(time.RFC3339), Agents: n, ScaleTo: *agentLoadScaleTo,
		StartupRequests: last, StartupSeconds: stableSince.Sub(began).Seconds(), WindowSeconds: agentLoadWindow.Seconds()}
	watches := 0
	for k, v := range last {
		if strings.HasPrefix(k, "WATCH ") {
			watches += v
		}
	}
	r.WatchesPerAgent = float64(watches) / float64(n)
	time.Sleep(*agentLoadWindow)
	r.RestRequests = counter.Since(last)
	r.RestPerAgentMinute = float64(sum(r.RestRequests)) / float64(n) / agentLoadWindow.Minutes()
	scale := float64(r.ScaleTo) / float64(n)
	r.ScaledWatches = float64(watches) * scale
	r.ScaledStartup = float64(sum(last)) * scale
	r.ScaledRestPerMinute = r.RestPerAgentMinute * float64(r.ScaleTo)
	r.SteadyRewatchPerMinute = r.ScaledWatches / 7.5
	md := agentLoadMarkdown(r)
	b.Log("\n" + md)
	base := writeReport(b, reportDir(b, *agentLoadReport), fmt.Sprintf("agentload-%d", n), r, md)
	b.Logf("report: %s.{json,md}", base)
	b.ReportMetric(r.WatchesPerAgent, "watches/agent")
	b.ReportMetric(r.RestPerAgentMinute, "req/agent/min-at-rest")
	b.ReportMetric(r.ScaledWatches, "watches-at-scale")
	b.ReportMetric(r.ScaledRestPerMinute, "req/min-at-scale")
}

func agentLoadMarkdown(r agentLoadReportData) string {
	var s strings.Builder
	fmt.Fprintf(&s, "# The node agents' load on the API server (%s, %s)\n\n", r.Commit, r.Date)
	fmt.Fprintf(&s, "%d agents (one per kwok GPU node, each its own agent.Daemon), a NodeRepairPolicy, the simulated GPU source; scaled linearly to %d nodes.\n\n", r.Agents, r.ScaleTo)
	fmt.Fprintf(&s, "| figure | %d agents | per agent | at %d nodes |\n|---|---|---|---|\n", r.Agents, r.ScaleTo)
	scale := float64(r.ScaleTo) / float64(r.Agents)
	fmt.Fprintf(&s, "| requests from start to rest (%.0f s) | %d | %.1f | %.0f |\n", r.StartupSeconds, sum(r.StartupRequests),
		float64(sum(r.StartupRequests))/float64(r.Agents), r.ScaledStartup)
	fmt.Fprintf(&s, "| watch connections | %.0f | %.1f | %.0f |\n", r.WatchesPerAgent*float64(r.Agents), r.WatchesPerAgent, r.ScaledWatches)
	fmt.Fprintf(&s, "| requests per minute at rest (%.0f s window) | %.1f | %.3f | %.0f |\n", r.WindowSeconds,
		float64(sum(r.RestRequests))/(r.WindowSeconds/60), r.RestPerAgentMinute, r.ScaledRestPerMinute)
	fmt.Fprintf(&s, "| watch renewals per minute in steady state (watches / 7.5 min) | %.1f | %.2f | %.0f |\n\n",
		r.WatchesPerAgent*float64(r.Agents)/7.5, r.WatchesPerAgent/7.5, r.SteadyRewatchPerMinute)
	fmt.Fprintf(&s, "Formula: at N nodes, watch connections = N × %.1f; requests per minute at rest = N × %.3f (measured) — in steady state at least N × %.1f / 7.5 watch renewals; a restart of every agent at once costs N × %.1f requests. (Scale factor here %.0f.)\n\n",
		r.WatchesPerAgent, r.RestPerAgentMinute, r.WatchesPerAgent, float64(sum(r.StartupRequests))/float64(r.Agents), scale)
	fmt.Fprintf(&s, "Start-up requests: %s\n\nRequests at rest: %s\n", formatCounts(r.StartupRequests), formatCounts(r.RestRequests))
	return s.String()
}
