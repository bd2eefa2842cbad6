package chaos

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/apirequest"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/operator"
)

var (
	scaleNodes          = flag.Int("scale.nodes", 500, "simulated nodes, one NodeMaintenance each (BenchmarkScaleRollout)")
	scalePodsPerNode    = flag.Int("scale.pods-per-node", 4, "workload pods per node, in three Deployments, two behind PDBs")
	scaleMaxParallel    = flag.String("scale.max-parallel", "10%", "MaintenanceOperatorConfig maxParallelOperations")
	scaleMaxUnavailable = flag.String("scale.max-unavailable", "10%", "MaintenanceOperatorConfig maxUnavailable")
	scaleIdle           = flag.Duration("scale.idle", time.Minute, "idle window after the rollout, for requests per minute")
	scaleReport         = flag.String("scale.report", "", "directory for scale-<nodes>.json and .md (default: results/ in the source tree)")
	scaleBaseline       = flag.Bool("scale.baseline", true, "first time a parallel kubectl drain + uncordon of every node on the same cluster (the baseline)")
	scalePDBs           = flag.Bool("scale.pdbs", true, "put two of the three Deployments behind PodDisruptionBudgets (false: no budgets, the engine's own speed)")
	scaleObjects        = flag.Int("scale.objects", 0, "NodeMaintenance objects, on every (nodes/objects)th node (0: one per node)")
	scalePools          = flag.Int("scale.pools", 10, "node pools (label "+devcluster.LabelPool+")")
	scalePoolMax        = flag.String("scale.pool-max-parallel", "", "give each pool its own maxParallelOperations in the MaintenanceOperatorConfig (empty: no pools in the config)")
	scaleWindow         = flag.Bool("scale.window", false, "add a maintenance window that is open the whole run (the window check on every decision)")
	scaleOpenAfter      = flag.Bool("scale.open-after-create", false, "create every NodeMaintenance while maxParallelOperations is 0, then open the limit and start the clock")
)

// scaleRequestors share the NodeMaintenance objects.
var scaleRequestors = []string{"upgrade.example.com", "firmware.example.com", "repair.example.com"}

// scaleReportData is what BenchmarkScaleRollout writes.
type scaleReportData struct {
	Commit     string         `json:"commit"`
	Date       string         `json:"date"`
	Parameters map[string]any `json:"parameters"`
	// Rollout: first object created to last object deleted.
	RolloutSeconds float64 `json:"rolloutSeconds"`
	ObjectsPerMin  float64 `json:"objectsPerMinute"`
	// Latency from a free slot (the later of creation and the last
	// release of a slot or budget) to the object seen scheduled.
	LatencyMs map[string]float64 `json:"schedulingLatencyMs"`
	// Time objects spent in each phase (to the next phase seen).
	PhaseMs map[string]map[string]float64 `json:"phaseDurationsMs"`
	// Limits seen by the independent checker.
	MaxInProgress   int            `json:"maxInProgress"`
	MaxUnavailable  int            `json:"maxHeldOrCordoned"`
	CheckedEvents   int            `json:"checkedEvents"`
	WaitRewrites    int            `json:"waitReasonRewrites"`
	Violations      int            `json:"violations"`
	StartupRequests map[string]int `json:"startupRequests"`
	RolloutRequests map[string]int `json:"rolloutRequests"`
	IdleRequests    map[string]int `json:"idleRequests"`
	IdlePerMinute   float64        `json:"idleRequestsPerMinute"`
	IdleWrites      int            `json:"idleWrites"`
	IdleLists       int            `json:"idleLists"`
	// StatusConflicts: NodeMaintenance writes refused with 409, by writer.
	StatusConflicts map[string]int `json:"statusConflicts"`
	// RequestsPerObject: the operator's rollout requests per NodeMaintenance.
	RequestsPerObject float64 `json:"requestsPerMaintenance"`
	// PodsEvicted: pods the drains had to evict (status.drain.evictionPods
	// when Ready), more than the pods per node at the start because evicted
	// pods are rescheduled onto nodes drained later.
	PodsEvicted int64 `json:"podsEvicted"`
	// EvictionRequests: eviction calls (429 refusals of a budget included).
	EvictionRequests int `json:"evictionRequests"`
	// RequestsPerObjectAtPodsPerNode: the requests of one maintenance of a
	// node holding exactly the pods per node: its requests other than
	// evictions, plus that many pods times the eviction calls per pod.
	RequestsPerObjectAtPodsPerNode float64 `json:"requestsPerMaintenanceAtPodsPerNode"`
	// Baseline: the same drains by kubectl, at the same parallelism, on
	// the same cluster and pods; RatioToBaseline is RolloutSeconds over
	// its time (nil when not run).
	Baseline        *kubectlBaseline `json:"kubectlBaseline,omitempty"`
	RatioToBaseline float64          `json:"ratioToBaseline,omitempty"`
	// PodSpread: fewest and most workload pods on a schedulable node
	// before the baseline and before the rollout.
	PodSpread map[string][2]int `json:"podSpread"`
	// StatusRewrites: status changes that kept the phase, by phase.
	StatusRewrites map[string]int `json:"statusRewritesByPhase"`
	// EvictionMs: mean time of an eviction request (pods with and without
	// a PodDisruptionBudget) and of the wait for the budget's turn.
	EvictionMs map[string]float64 `json:"evictionMs"`
	// Turns: budget turns passed on, by how (counted, bound, refused).
	Turns map[string]int `json:"budgetTurns"`
	// SlowBudgetedEvictions: evictions behind a budget that took longer
	// than 0.45 s, i.e. at least one of the API server's 500 ms retries
	// after a conflict on the budget; of BudgetedEvictions.
	SlowBudgetedEvictions int `json:"slowBudgetedEvictions"`
	BudgetedEvictions     int `json:"budgetedEvictions"`
	// DrainStepMs splits the Draining phase by what the node's pods did.
	DrainStepMs map[string]map[string]float64 `json:"drainStepsMs"`
	CPUSeconds  float64                       `json:"operatorCPUSeconds"`
	// Reconciles and ReconcileMeanMs: every controller's passes during
	// the start-up and rollout and their mean duration (controller-runtime's
	// reconcile metrics), by controller.
	Reconciles      map[string]int     `json:"reconciles"`
	ReconcileMeanMs map[string]float64 `json:"reconcileMeanMs"`
	// OperatorLatencyMs: the operator's own scheduling latency
	// (gpufleet_maintenance_scheduling_latency_seconds: the first change
	// it was told of to the pass's writes returning), estimated from the
	// histogram's buckets; PlannedAhead: objects passes planned with as
	// the scheduler wrote them, ahead of its cache; PlanMeanMs: the plan
	// alone.
	OperatorLatencyMs map[string]float64 `json:"operatorSchedulingLatencyMs"`
	PlannedAhead      int                `json:"plannedAheadOfCache"`
	PlanMeanMs        float64            `json:"planMeanMs"`
	// APIServerMs: the API server's own time for the requests on the
	// scheduling path (apiserver_request_duration_seconds, estimated from
	// its buckets), by "VERB resource/subresource".
	APIServerMs map[string]map[string]float64 `json:"apiServerRequestMs"`
	PeakRSSMB   float64                       `json:"operatorPeakRSSMB"`
	RSSMB       float64                       `json:"operatorRSSMBAtEnd"`
}

// BenchmarkScaleRollout is the default scale scenario of `make bench`: N
// kwok nodes with pods (two Deployments behind PDBs), one NodeMaintenance
// per node from three requestors with drains, the limits of a
// MaintenanceOperatorConfig, the real operator binary as its own process,
// a simulated requestor that deletes each object once Ready, and the
// independent checker of the chaos test watching the limits. It writes a
// JSON and a markdown report with the parameters and figures.
func BenchmarkScaleRollout(b *testing.B) {
	ctx := context.Background()
	nodes, perNode := *scaleNodes, *scalePodsPerNode
	objectCount := *scaleObjects
	if objectCount <= 0 || objectCount > nodes {
		objectCount = nodes
	}
	// The nodes that get a NodeMaintenance: every step-th, from gpu-000.
	step := nodes / objectCount
	targets := make([]string, objectCount)
	for i := range targets {
		targets[i] = fmt.Sprintf("gpu-%03d", i*step)
	}
	mpo, mu := intstr.Parse(*scaleMaxParallel), intstr.Parse(*scaleMaxUnavailable)
	limitParallel, err := intstr.GetScaledValueFromIntOrPercent(&mpo, nodes, true)
	if err != nil {
		b.Fatal(err)
	}
	limitUnavailable, err := intstr.GetScaledValueFromIntOrPercent(&mu, nodes, false)
	if err != nil {
		b.Fatal(err)
	}
	// Built first: the source tree may change while the scenario runs.
	bin := buildOperator(b)
	env, kubeconfig, _, _ := startLargeEnv(b, nodes, *scalePools)
	adminCordoned := "gpu-000"
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, adminCordoned, "application/merge-patch+json",
		[]byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		b.Fatal(err)
	}
	setupBegan := time.Now()
	scaleWorkloads(b, env, nodes*perNode, *scalePDBs)
	b.Logf("%d nodes with %d pods running after %s", nodes, nodes*perNode, time.Since(setupBegan).Round(time.Second))
	spread := map[string][2]int{}
	var baseline *kubectlBaseline
	if *scaleBaseline {
		// As many nodes at a time as the limits let gpufleet drain: the
		// admin's cordon takes one node of the maxUnavailable budget.
		parallel := max(min(limitParallel, limitUnavailable-1), 1)
		lo, hi := podSpread(b, env)
		spread["baseline"] = [2]int{lo, hi}
		bl := runKubectlBaseline(b, env, targets, parallel, adminCordoned)
		baseline = &bl
		b.Logf("baseline: kubectl drain + uncordon of %d nodes, %d at a time: %.1f s, %d requests", objectCount, parallel, bl.Seconds, sum(bl.Requests))
		respreadWorkloads(b, env, nodes*perNode)
	}
	lo, hi := podSpread(b, env)
	spread["gpufleet"] = [2]int{lo, hi}

	addr, err := freeAddr()
	if err != nil {
		b.Fatal(err)
	}
	op := &operatorProcess{bin: bin, kubeconfig: kubeconfig, dir: b.TempDir(), metricsAddr: addr}
	op.startWith(b, strings.Join(operator.CapabilityNames(), ","))
	defer op.kill()
	startup := waitOperatorSettled(b, op)

	mocfg := &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: &mpo, MaxUnavailable: &mu},
	}
	if *scalePoolMax != "" {
		pm := intstr.Parse(*scalePoolMax)
		for _, pool := range poolsOf(devcluster.GPUNodes(nodes, *scalePools)) {
			mocfg.Spec.Pools = append(mocfg.Spec.Pools, maintenancev1.MaintenancePool{Name: pool, MaxParallelOperations: &pm,
				NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{devcluster.LabelPool: pool}}})
		}
	}
	if *scaleWindow {
		mocfg.Spec.MaintenanceWindows = []maintenancev1.MaintenanceWindow{{Name: "daily", Schedule: "0 0 * * *", Duration: metav1.Duration{Duration: 24 * time.Hour}}}
	}
	if *scaleOpenAfter {
		// Closed until every object exists: the clock then measures the
		// engine working through a full queue, not the creation.
		mocfg.Spec.MaxParallelOperations = ptr.To(intstr.FromInt32(0))
	}
	if err := env.Kube.Create(ctx, mocfg); err != nil {
		b.Fatal(err)
	}
	chk := newChecker(env.Cluster, env.Kube, adminCordoned, limitParallel, limitUnavailable)
	ready := make(chan string, objectCount)
	chk.onReady = func(key string) { ready <- key }
	checkCtx, stopChecker := context.WithCancel(ctx)
	defer stopChecker()
	go chk.run(checkCtx)
	// The simulated requestors: delete each object once it is Ready.
	var deleters sync.WaitGroup
	for range 4 {
		deleters.Go(func() {
			for key := range ready {
				namespace, name, _ := strings.Cut(key, "/")
				nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
				if err := env.Kube.Delete(ctx, nm); err != nil && client.IgnoreNotFound(err) != nil {
					b.Errorf("requestor deleting %s: %v", key, err)
				}
			}
		})
	}
	defer func() { close(ready); deleters.Wait() }()

	began := time.Now()
	for i, node := range targets {
		r := scaleRequestors[i%len(scaleRequestors)]
		nm := &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: workloadNamespace, Name: strings.Split(r, ".")[0] + "-" + node},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: r, NodeName: node,
				DrainSpec: &maintenancev1.DrainSpec{TimeoutSeconds: ptr.To[int32](0), DeleteEmptyDir: true}},
		}
		if err := env.Kube.Create(ctx, nm); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("%d NodeMaintenance objectCount created in %s", objectCount, time.Since(began).Round(time.Millisecond))
	if *scaleOpenAfter {
		// Every object seen Pending with its wait reason, then the limit opens.
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
			return chk.pendingWithReason() == objectCount, nil
		})
		if err != nil {
			b.Fatalf("not every NodeMaintenance was seen Pending with a wait reason: %d/%d", chk.pendingWithReason(), objectCount)
		}
		patch := client.MergeFrom(mocfg.DeepCopy())
		mocfg.Spec.MaxParallelOperations = &mpo
		if err := env.Kube.Patch(ctx, mocfg, patch); err != nil {
			b.Fatal(err)
		}
		began = time.Now()
		chk.opened(began)
		b.Logf("maxParallelOperations opened to %s", mpo.String())
	}
	bound := 10*time.Minute + time.Duration(objectCount)*2*time.Second
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, bound, false, func(context.Context) (bool, error) {
		chk.mu.Lock()
		defer chk.mu.Unlock()
		return len(chk.readySeen) == objectCount && len(chk.nms) == 0, nil
	})
	rollout := time.Since(began)
	if err != nil {
		b.Fatalf("rollout not done within %s: %d/%d objectCount Ready once, %d still exist", bound, chk.readyCount(), objectCount, func() int {
			chk.mu.Lock()
			defer chk.mu.Unlock()
			return len(chk.nms)
		}())
	}
	afterRollout := mustRequests(b, addr)
	conflicts := map[string]int{}
	evictionMs := map[string]float64{}
	slowBudgeted, budgeted := 0, 0
	turns := map[string]int{}
	reconciles, reconcileMs := map[string]int{}, map[string]float64{}
	opLatency, plannedAhead, planMs := map[string]float64{}, 0, 0.0
	if fams, err := scrape(addr); err == nil {
		conflicts = countsByLabel(fams, "gpufleet_maintenance_status_conflicts_total", "writer")
		evictionMs = histogramMeansMs(fams, "gpufleet_maintenance_eviction_duration_seconds", "budget")
		if w := histogramMeansMs(fams, "gpufleet_maintenance_eviction_turn_wait_seconds", ""); len(w) > 0 {
			evictionMs["turn wait"] = w[""]
		}
		turns = countsByLabel(fams, "gpufleet_maintenance_eviction_turns_total", "passed")
		reconciles = countsByLabel(fams, "controller_runtime_reconcile_total", "controller")
		reconcileMs = histogramMeansMs(fams, "controller_runtime_reconcile_time_seconds", "controller")
		slowBudgeted, budgeted = slowSamples(fams, "gpufleet_maintenance_eviction_duration_seconds", "budget", "true", 0.45)
		opLatency = histogramQuantilesMs(fams, "gpufleet_maintenance_scheduling_latency_seconds", nil, 0.5, 0.9, 0.99)
		plannedAhead = int(counterValue(fams, "gpufleet_maintenance_scheduler_planned_ahead_of_cache_total"))
		planMs = histogramMeansMs(fams, "gpufleet_maintenance_plan_duration_seconds", "")[""]
	}
	apiServerMs := map[string]map[string]float64{}
	if fams, err := scrapeAPIServer(ctx, env.Client); err == nil {
		for _, r := range [][3]string{{"PATCH", "nodemaintenances", "status"}, {"PATCH", "nodes", ""}} {
			q := histogramQuantilesMs(fams, "apiserver_request_duration_seconds",
				map[string]string{"verb": r[0], "resource": r[1], "subresource": r[2]}, 0.5, 0.99)
			if len(q) > 0 {
				apiServerMs[strings.TrimSuffix(r[0]+" "+r[1]+"/"+r[2], "/")] = q
			}
		}
	} else {
		b.Logf("the API server's metrics: %v", err)
	}
	cpu := cpuSecondsOf(op.pid())
	time.Sleep(*scaleIdle)
	afterIdle := mustRequests(b, addr)
	rss, hwm := memoryOf(op.pid())
	stopChecker()
	chk.final(ctx, b, objectCount)

	idle := diffCounts(afterRollout, afterIdle)
	rep := scaleReportData{
		Commit: gitCommit(), Date: time.Now().UTC().Format(time.RFC3339),
		Parameters: map[string]any{"nodes": nodes, "podsPerNode": perNode, "pods": nodes * perNode,
			"objects": objectCount, "pools": *scalePools, "poolMaxParallel": *scalePoolMax, "window": *scaleWindow, "requestors": scaleRequestors, "maxParallelOperations": mpo.String(), "maxUnavailable": mu.String(),
			"resolvedMaxParallel": limitParallel, "resolvedMaxUnavailable": limitUnavailable,
			"pdbs": pdbParameter(*scalePDBs), "openAfterCreate": *scaleOpenAfter, "adminCordonedNodes": 1,
			"podTerminationSeconds": 1, "idleWindow": scaleIdle.String(), "capabilities": operator.CapabilityNames()},
		RolloutSeconds: rollout.Seconds(), ObjectsPerMin: float64(objectCount) / rollout.Minutes(),
		LatencyMs:         percentiles(chk.latencies()),
		OperatorLatencyMs: opLatency, PlannedAhead: plannedAhead, PlanMeanMs: planMs, APIServerMs: apiServerMs,
		PhaseMs:       map[string]map[string]float64{},
		MaxInProgress: chk.maxInProgress, MaxUnavailable: chk.maxUnavailable, CheckedEvents: chk.events, WaitRewrites: chk.waitRewrites,
		Violations:      len(chk.violations()),
		StartupRequests: startup, RolloutRequests: diffCounts(startup, afterRollout), IdleRequests: idle,
		IdlePerMinute: float64(sum(idle)) / scaleIdle.Minutes(), StatusConflicts: conflicts,
		CPUSeconds: cpu, PeakRSSMB: float64(hwm) / 1024, RSSMB: float64(rss) / 1024,
		Baseline: baseline, PodSpread: spread, DrainStepMs: map[string]map[string]float64{},
		EvictionMs: evictionMs, Turns: turns, Reconciles: reconciles, ReconcileMeanMs: reconcileMs,
		SlowBudgetedEvictions: slowBudgeted, BudgetedEvictions: budgeted, StatusRewrites: chk.rewrites(),
	}
	rep.RequestsPerObject = float64(sum(rep.RolloutRequests)) / float64(objectCount)
	for k, v := range rep.RolloutRequests {
		if strings.HasPrefix(k, "POST pods/eviction") {
			rep.EvictionRequests += v
		}
	}
	chk.mu.Lock()
	for _, n := range chk.evictionPods {
		rep.PodsEvicted += n
	}
	chk.mu.Unlock()
	if rep.PodsEvicted > 0 {
		rep.RequestsPerObjectAtPodsPerNode = float64(sum(rep.RolloutRequests)-rep.EvictionRequests)/float64(objectCount) +
			float64(perNode)*float64(rep.EvictionRequests)/float64(rep.PodsEvicted)
	}
	if baseline != nil {
		rep.RatioToBaseline = rep.RolloutSeconds / baseline.Seconds
	}
	for step, d := range chk.drainSteps() {
		rep.DrainStepMs[step] = percentiles(d)
	}
	for phase, d := range chk.phaseDurations() {
		rep.PhaseMs[phase] = percentiles(d)
	}
	stateWrites := 0 // writes other than events
	for k, v := range idle {
		verb, rest, _ := strings.Cut(k, " ")
		if apirequest.IsWrite(verb) {
			rep.IdleWrites += v
			if !strings.HasPrefix(rest, "events") {
				stateWrites += v
			}
		}
		if verb == "LIST" {
			rep.IdleLists += v
		}
	}
	chk.mu.Lock()
	for _, ex := range chk.rewriteExamples {
		b.Logf("status changed within a phase: %s", ex)
	}
	chk.mu.Unlock()
	md := rep.markdown()
	b.Log("\n" + md)
	writeScaleReport(b, rep, md)
	b.ReportMetric(rollout.Seconds(), "s-rollout")
	b.ReportMetric(rep.LatencyMs["p99"], "ms-p99-sched-latency")
	b.ReportMetric(float64(sum(rep.RolloutRequests)), "requests")
	b.ReportMetric(rep.RequestsPerObject, "requests/maintenance")
	b.ReportMetric(rep.RequestsPerObjectAtPodsPerNode, "requests/maintenance-at-pods-per-node")
	if baseline != nil {
		b.ReportMetric(baseline.Seconds, "s-kubectl-baseline")
		b.ReportMetric(rep.RatioToBaseline, "ratio-to-baseline")
	}
	b.ReportMetric(float64(sum(conflicts)), "conflicts")
	b.ReportMetric(rep.IdlePerMinute, "idle-req/min")
	b.ReportMetric(cpu, "cpu-s")
	b.ReportMetric(rep.PeakRSSMB, "MB-peak-rss")
	for _, v := range chk.violations() {
		b.Error(v)
	}
	// Event writes right after the rollout are client-go's event series
	// (a repeated event is PATCHed, and a series' final count is written
	// once, 6 minutes after its last occurrence); they are reported, not
	// failed.
	if stateWrites > 0 || rep.IdleLists > 0 {
		b.Errorf("idle operator wrote %d times (besides events) and listed %d times in %s: %v", stateWrites, rep.IdleLists, *scaleIdle, idle)
	}
}

func pdbParameter(pdbs bool) string {
	if !pdbs {
		return "none"
	}
	return "train: maxUnavailable 10%; serve: minAvailable 80%; batch: none"
}

// scaleWorkloads runs three Deployments over the nodes: train behind a
// maxUnavailable 10% PDB, serve behind a minAvailable 80% PDB (without
// pdbs, neither), batch unprotected. Pods take a second to terminate.
func scaleWorkloads(b *testing.B, env *devcluster.Env, pods int, pdbs bool) {
	ctx := context.Background()
	names := []string{"train", "serve", "batch"}
	for i, name := range names {
		replicas := int32(pods / len(names))
		if i < pods%len(names) {
			replicas++
		}
		labels := map[string]string{"app": name}
		dep := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: workloadNamespace, Name: name},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To(replicas),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{devcluster.AnnotationTerminateAfter: "1s"}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.example/" + name + ":1"}}},
				},
			},
		}
		if _, err := env.Client.AppsV1().Deployments(workloadNamespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	budgets := map[string]policyv1.PodDisruptionBudgetSpec{
		"train": {MaxUnavailable: ptr.To(intstr.FromString("10%"))},
		"serve": {MinAvailable: ptr.To(intstr.FromString("80%"))},
	}
	if !pdbs {
		clear(budgets)
	}
	for name, spec := range budgets {
		spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
		pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: workloadNamespace, Name: name}, Spec: spec}
		if _, err := env.Client.PolicyV1().PodDisruptionBudgets(workloadNamespace).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 20*time.Minute, true, func(ctx context.Context) (bool, error) {
		readyPods := int32(0)
		for _, name := range names {
			d, err := env.Client.AppsV1().Deployments(workloadNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil //nolint:nilerr // retried
			}
			readyPods += d.Status.ReadyReplicas
		}
		return readyPods == int32(pods), nil
	})
	if err != nil {
		b.Fatalf("%d workload pods never ready: %v", pods, err)
	}
}

// waitOperatorSettled waits until the operator's metrics are served and
// its request count has not moved for 5 s (caches synced, first
// reconciles done); it returns the requests so far.
func waitOperatorSettled(b *testing.B, op *operatorProcess) map[string]int {
	var last map[string]int
	stableSince := time.Now()
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		// Every controller's workers started: its caches synced. Until
		// then no request may be sent for a minute at 10,000 nodes (the
		// informers' initial lists stream on their watches), which is not
		// rest.
		if !op.controllersStarted() {
			return false, nil
		}
		fams, err := scrape(op.metricsAddr)
		if err != nil {
			return false, nil //nolint:nilerr // not serving yet
		}
		now := apiRequests(fams)
		if last == nil || sum(now) != sum(last) {
			last, stableSince = now, time.Now()
			return false, nil
		}
		return time.Since(stableSince) >= 5*time.Second, nil
	})
	if err != nil {
		b.Fatalf("operator never settled: %v", err)
	}
	return last
}

func mustRequests(b *testing.B, addr string) map[string]int {
	fams, err := scrape(addr)
	if err != nil {
		b.Fatal(err)
	}
	return apiRequests(fams)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// percentiles of sorted durations, in milliseconds.
func percentiles(d []time.Duration) map[string]float64 {
	out := map[string]float64{"count": float64(len(d))}
	if len(d) == 0 {
		return out
	}
	at := func(p float64) float64 {
		i := int(p * float64(len(d)-1))
		return float64(d[i].Microseconds()) / 1000
	}
	out["p50"], out["p90"], out["p99"], out["max"] = at(0.5), at(0.9), at(0.99), at(1)
	return out
}

func (r scaleReportData) markdown() string {
	var s strings.Builder
	p := r.Parameters
	fmt.Fprintf(&s, "# gpufleet scale rollout (%s, %s)\n\n", r.Commit, r.Date)
	fmt.Fprintf(&s, "Parameters: %v nodes, %v pods (%v per node; %v), %v NodeMaintenance objects from %d requestors with drains, "+
		"maxParallelOperations %v (= %v), maxUnavailable %v (= %v), 1 node cordoned by an admin, capabilities %v; the operator is the real binary in its own process.\n\n",
		p["nodes"], p["pods"], p["podsPerNode"], "budgets: "+fmt.Sprint(p["pdbs"]), p["objects"], len(scaleRequestors),
		p["maxParallelOperations"], p["resolvedMaxParallel"], p["maxUnavailable"], p["resolvedMaxUnavailable"], p["capabilities"])
	if pm, _ := p["poolMaxParallel"].(string); pm != "" {
		fmt.Fprintf(&s, "The config gives each of the %v pools maxParallelOperations %s.\n\n", p["pools"], pm)
	}
	if p["window"] == true {
		fmt.Fprintf(&s, "A maintenance window (daily, 24 h) is open the whole run.\n\n")
	}
	if p["openAfterCreate"] == true {
		fmt.Fprintf(&s, "Every object was created while maxParallelOperations was 0; the clock starts when it opens.\n\n")
	}
	fmt.Fprintf(&s, "| figure | value |\n|---|---|\n")
	fmt.Fprintf(&s, "| every object Ready once and deleted | %.1f s (%.0f objects/min) |\n", r.RolloutSeconds, r.ObjectsPerMin)
	if bl := r.Baseline; bl != nil {
		fmt.Fprintf(&s, "| baseline: kubectl drain + uncordon of every node, %d at a time, same cluster and pods | %.1f s, %d requests (%.1f per node), %d failed drains run again |\n",
			bl.Parallel, bl.Seconds, sum(bl.Requests), float64(sum(bl.Requests))/float64(bl.Nodes), bl.Retries)
		fmt.Fprintf(&s, "| gpufleet's time / the baseline's | %.2f |\n", r.RatioToBaseline)
	}
	fmt.Fprintf(&s, "| workload pods per schedulable node, fewest–most (before the baseline / before the rollout) | %v / %v |\n", r.PodSpread["baseline"], r.PodSpread["gpufleet"])
	fmt.Fprintf(&s, "| scheduling latency from a free slot (p50 / p90 / p99 / max, %v objects) | %.0f / %.0f / %.0f / %.0f ms |\n",
		r.LatencyMs["count"], r.LatencyMs["p50"], r.LatencyMs["p90"], r.LatencyMs["p99"], r.LatencyMs["max"])
	if l := r.OperatorLatencyMs; len(l) > 0 {
		fmt.Fprintf(&s, "| the operator's own time: first change seen → the writes of the pass that scheduled returned (p50 / p90 / p99 of %v passes, from the histogram's buckets) | %.0f / %.0f / %.0f ms |\n",
			l["count"], l["p50"], l["p90"], l["p99"])
		fmt.Fprintf(&s, "| … a plan alone (mean) / objects planned as the scheduler wrote them, ahead of its cache | %.1f ms / %d |\n", r.PlanMeanMs, r.PlannedAhead)
	}
	for _, k := range slices.Sorted(maps.Keys(r.APIServerMs)) {
		q := r.APIServerMs[k]
		fmt.Fprintf(&s, "| the API server's own time for %s (p50 / p99 of %v, from its histogram) | %.0f / %.0f ms |\n", k, q["count"], q["p50"], q["p99"])
	}
	fmt.Fprintf(&s, "| max in progress (limit %v) / max held or cordoned (limit %v) | %d / %d |\n", p["resolvedMaxParallel"], p["resolvedMaxUnavailable"], r.MaxInProgress, r.MaxUnavailable)
	fmt.Fprintf(&s, "| checker events / violations | %d / %d |\n", r.CheckedEvents, r.Violations)
	fmt.Fprintf(&s, "| changes of a Pending object's wait reason | %d |\n", r.WaitRewrites)
	fmt.Fprintf(&s, "| operator API requests: start-up / rollout / per maintenance | %d / %d / %.1f |\n", sum(r.StartupRequests), sum(r.RolloutRequests), r.RequestsPerObject)
	fmt.Fprintf(&s, "| pods evicted / eviction calls / per maintenance at %v pods per node | %d / %d / %.1f |\n",
		r.Parameters["podsPerNode"], r.PodsEvicted, r.EvictionRequests, r.RequestsPerObjectAtPodsPerNode)
	fmt.Fprintf(&s, "| NodeMaintenance write conflicts (409) by writer | %s |\n", formatCounts(r.StatusConflicts))
	fmt.Fprintf(&s, "| status changes that kept the phase, by phase | %s |\n", formatCounts(r.StatusRewrites))
	fmt.Fprintf(&s, "| mean eviction request: pod behind a budget / not / wait for the budget's turn | %.0f / %.0f / %.0f ms |\n",
		r.EvictionMs["true"], r.EvictionMs["false"], r.EvictionMs["turn wait"])
	fmt.Fprintf(&s, "| evictions behind a budget that took a 500 ms conflict retry in the API server (> 0.45 s) | %d of %d |\n", r.SlowBudgetedEvictions, r.BudgetedEvictions)
	fmt.Fprintf(&s, "| budget turns passed on: when the disruption controller counted the eviction / 300 ms after its response / refused | %d / %d / %d |\n",
		r.Turns["counted"], r.Turns["bound"], r.Turns["refused"])
	fmt.Fprintf(&s, "| operator requests per minute after the rollout (%v window) | %.1f (%d writes, %d lists) |\n", p["idleWindow"], r.IdlePerMinute, r.IdleWrites, r.IdleLists)
	fmt.Fprintf(&s, "| operator CPU during start-up and rollout | %.1f s |\n", r.CPUSeconds)
	fmt.Fprintf(&s, "| scheduling passes (nodemaintenance-scheduler reconciles) / mean pass | %d / %.1f ms |\n",
		r.Reconciles["nodemaintenance-scheduler"], r.ReconcileMeanMs["nodemaintenance-scheduler"])
	fmt.Fprintf(&s, "| lifecycle steps (nodemaintenance reconciles) / mean step | %d / %.1f ms |\n",
		r.Reconciles["nodemaintenance"], r.ReconcileMeanMs["nodemaintenance"])
	fmt.Fprintf(&s, "| operator peak RSS / RSS at the end | %.0f / %.0f MB |\n\n", r.PeakRSSMB, r.RSSMB)
	fmt.Fprintf(&s, "Time in each phase, as the checker saw it (p50 / p90 / max; Ready lasts until the requestor deletes, Deleting is the release):\n\n| phase | objects | p50 | p90 | max |\n|---|---|---|---|---|\n")
	for _, phase := range []string{"Pending", "Scheduled", "Cordon", "WaitForPodCompletion", "Draining", "Ready", "Deleting"} {
		if d, ok := r.PhaseMs[phase]; ok {
			fmt.Fprintf(&s, "| %s | %v | %.0f ms | %.0f ms | %.0f ms |\n", phase, d["count"], d["p50"], d["p90"], d["max"])
		}
		if phase != "Draining" {
			continue
		}
		for _, step := range []string{"to first eviction", "evictions", "pods terminating", "to Ready"} {
			if d, ok := r.DrainStepMs[step]; ok {
				fmt.Fprintf(&s, "| … Draining: %s | %v | %.0f ms | %.0f ms | %.0f ms |\n", step, d["count"], d["p50"], d["p90"], d["max"])
			}
		}
	}
	fmt.Fprintf(&s, "\n")
	fmt.Fprintf(&s, "Rollout requests by verb and resource:\n\n| request | count |\n|---|---|\n")
	keys := make([]string, 0, len(r.RolloutRequests))
	for k := range r.RolloutRequests {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return r.RolloutRequests[keys[i]] > r.RolloutRequests[keys[j]] || r.RolloutRequests[keys[i]] == r.RolloutRequests[keys[j]] && keys[i] < keys[j]
	})
	for _, k := range keys {
		fmt.Fprintf(&s, "| %s | %d |\n", k, r.RolloutRequests[k])
	}
	if bl := r.Baseline; bl != nil {
		fmt.Fprintf(&s, "\nBaseline (kubectl) requests: %s\n", formatCounts(bl.Requests))
	}
	if len(r.IdleRequests) > 0 {
		fmt.Fprintf(&s, "\nIdle requests: %s\n", strings.Join(slices.Sorted(maps.Keys(r.IdleRequests)), ", "))
	}
	return s.String()
}

func writeScaleReport(b *testing.B, r scaleReportData, md string) {
	name := fmt.Sprintf("scale-%d", r.Parameters["nodes"])
	if r.Parameters["pdbs"] == "none" {
		name += "-nopdb"
	}
	base := writeReport(b, reportDir(b, *scaleReport), name, r, md)
	b.Logf("report: %s.json, %s.md", base, base)
}

func gitCommit() string {
	root, err := devcluster.SourceRoot()
	if err != nil {
		return "unknown"
	}
	out, err := runIn(root, "git", "rev-parse", "--short", "HEAD")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
