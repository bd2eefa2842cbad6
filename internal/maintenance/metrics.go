package maintenance

import (
	"context"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/scrapesource"
)

var (
	schedulingDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufleet_maintenance_scheduling_decisions_total",
		Help: "NodeMaintenance objects scheduled by the scheduler.",
	}, []string{"result"})
	planDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "gpufleet_maintenance_plan_duration_seconds",
		Help:    "Time to compute one scheduling plan.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 4, 8),
	})
	schedulingLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "gpufleet_maintenance_scheduling_latency_seconds",
		Help: "For each scheduling pass that scheduled objects: the time from the first change the scheduler was told of " +
			"(a release, a creation, a node cordoned or uncordoned, a config change) to the pass's writes returning. " +
			"What the API server adds (the change's watch event reaching the operator, the Scheduled object's reaching a client) is not in it.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10},
	})
	plannedAheadOfCache = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpufleet_maintenance_scheduler_planned_ahead_of_cache_total",
		Help: "Objects a scheduling pass planned with as the scheduler wrote them to Scheduled, because its cache did not show that write yet " +
			"(each counted once per pass).",
	})
	drainDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "gpufleet_maintenance_drain_duration_seconds",
		Help:    "Time from the start of a drain to its end.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 12),
	})
	domainsGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpufleet_maintenance_domains",
		Help: "NVLink domains (spec.domains) by state after the last scheduling pass: total, and disrupted (a node of it in maintenance).",
	}, []string{"state"})
	domainInterruptions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpufleet_maintenance_domain_interruptions_total",
		Help: "Times a domain went into maintenance while none of its nodes was (co-scheduling keeps this at one per domain and rollout).",
	})
	watchedNodes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpufleet_maintenance_watched_nodes",
		Help: "Nodes whose pods the operator watches (nodes being cordoned, waited on or drained).",
	})
	statusConflicts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufleet_maintenance_status_conflicts_total",
		Help: "NodeMaintenance writes refused with a conflict (the object changed since it was read; re-read and retried), by writer (scheduler, wait-reasons, lifecycle).",
	}, []string{"writer"})
	evictions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufleet_maintenance_evictions_total",
		Help: "Pod evictions requested by drains, by result (evicted, refused, error).",
	}, []string{"result"})
	evictionDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "gpufleet_maintenance_eviction_duration_seconds",
		Help: "Time of one eviction request, by whether a PodDisruptionBudget covers the pod (budget: true, false). " +
			"The API server retries a budget update that conflicted with another after 500 ms (±10%): " +
			"requests above 0.45 s took at least one such retry, above 0.95 s two.",
		Buckets: []float64{0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.45, 0.95, 1.45, 2.5, 5, 10},
	}, []string{"budget"})
	evictionTurns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufleet_maintenance_eviction_turns_total",
		Help: "Budget turns passed on by evictions, by how: counted (the disruption controller counted the granted eviction), " +
			"bound (granted, not counted within 300 ms of the response), refused (refused or failed), " +
			"stopped (not asked for: its drain was withdrawn or ended).",
	}, []string{"passed"})
	evictionTurnWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "gpufleet_maintenance_eviction_turn_wait_seconds",
		Help:    "Time an eviction waited for its PodDisruptionBudget's turn (evictions under one budget go one at a time).",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
	})
)

func init() {
	metrics.Registry.MustRegister(objects, schedulingDecisions, planDuration, schedulingLatency, plannedAheadOfCache, drainDuration, evictions, watchedNodes, statusConflicts,
		evictionDuration, evictionTurnWait, evictionTurns, domainsGauge, domainInterruptions)
	// Every writer and result from the start, at 0: a dashboard or alert
	// on a rare event sees a series before the first one.
	for _, w := range []string{"scheduler", "wait-reasons", "lifecycle"} {
		statusConflicts.WithLabelValues(w)
	}
	for _, r := range []string{"evicted", "refused", "error"} {
		evictions.WithLabelValues(r)
	}
	for _, how := range []string{"counted", "bound", "refused", "stopped"} {
		evictionTurns.WithLabelValues(how)
	}
}

// Series read from the cached NodeMaintenance objects at scrape time (no
// writes, no polling), for dashboards and alerts.
var (
	objectsByPhaseDesc = prometheus.NewDesc("gpufleet_maintenance_objects",
		"NodeMaintenance objects by phase.", []string{"phase"}, nil)
	pendingByReasonDesc = prometheus.NewDesc("gpufleet_maintenance_pending_objects",
		"Pending NodeMaintenance objects by why they wait (max_parallel, max_unavailable: the cluster's or a pool's limit; window: outside a maintenance window or in an exclusion; node_busy, node_missing, other; none: no reason written yet).",
		[]string{"reason"}, nil)
	drainStartDesc = prometheus.NewDesc("gpufleet_maintenance_drain_start_time_seconds",
		"When the drain of a NodeMaintenance in phase Draining began (Unix time).",
		[]string{"namespace", "name", "node"}, nil)
	drainBlockedDesc = prometheus.NewDesc("gpufleet_maintenance_drain_blocked",
		"1 for a NodeMaintenance whose drain does not finish: refused by the drain rules (condition DrainBlocked, reason DrainFailed) or past its timeout with pods still on the node (reason DrainBlocked).",
		[]string{"namespace", "name", "node"}, nil)
)

// objects is the registered collector of those series; ServeObjectMetrics
// gives it its source.
var objects = &objectCollector{}

type objectCollector struct{ scrapesource.Source }

// ServeObjectMetrics makes the registered collector read NodeMaintenance
// objects from reader once elected is closed (nil: at once).
func ServeObjectMetrics(reader client.Reader, elected <-chan struct{}) {
	objects.Serve(reader, elected)
}

func (c *objectCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- objectsByPhaseDesc
	ch <- pendingByReasonDesc
	ch <- drainStartDesc
	ch <- drainBlockedDesc
}

func (c *objectCollector) Collect(ch chan<- prometheus.Metric) {
	reader := c.Reader()
	if reader == nil {
		return
	}
	var list maintenancev1.NodeMaintenanceList
	if err := reader.List(context.Background(), &list, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(pendingByReasonDesc, err)
		return
	}
	pending := map[string]int{}
	byPhase := make(map[maintenancev1.Phase]int, len(allPhases))
	for i := range list.Items {
		nm := &list.Items[i]
		phase := nm.Phase()
		byPhase[phase]++
		if phase == maintenancev1.PhasePending && nm.DeletionTimestamp == nil {
			pending[waitReasonClass(nm)]++
		}
		labels := []string{nm.Namespace, nm.Name, nm.Spec.NodeName}
		if phase == maintenancev1.PhaseDraining && nm.Status.Drain != nil && nm.Status.Drain.StartTime != nil {
			ch <- prometheus.MustNewConstMetric(drainStartDesc, prometheus.GaugeValue, float64(nm.Status.Drain.StartTime.Unix()), labels...)
		}
		if held, _ := nm.DrainHeld(); held {
			ch <- prometheus.MustNewConstMetric(drainBlockedDesc, prometheus.GaugeValue, 1, labels...)
		}
	}
	for reason, n := range pending {
		ch <- prometheus.MustNewConstMetric(pendingByReasonDesc, prometheus.GaugeValue, float64(n), reason)
	}
	// Every phase, at 0 too.
	for _, p := range allPhases {
		ch <- prometheus.MustNewConstMetric(objectsByPhaseDesc, prometheus.GaugeValue, float64(byPhase[p]), string(p))
	}
}

// waitReasonClass names the kind of a Pending object's wait reason (the
// Ready condition's message, as the planner words it) with a small fixed
// set, fit for a label.
func waitReasonClass(nm *maintenancev1.NodeMaintenance) string {
	var msg string
	for _, c := range nm.Status.Conditions {
		if c.Type == maintenancev1.ConditionTypeReady {
			msg = c.Message
		}
	}
	if pool, rest, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(pool, "pool ") {
		msg = rest // a pool's limit: "pool a: maxParallelOperations reached: ..."
	}
	switch {
	case msg == "":
		return "none"
	case strings.HasPrefix(msg, "outside maintenance window"), strings.HasPrefix(msg, "in maintenance exclusion"):
		return "window"
	case strings.HasPrefix(msg, "maxParallelOperations"):
		return "max_parallel"
	case strings.HasPrefix(msg, "maxUnavailable"):
		return "max_unavailable"
	case strings.HasPrefix(msg, "another request for node"), strings.HasPrefix(msg, "node ") && strings.Contains(msg, " is in maintenance for "):
		return "node_busy"
	case strings.HasPrefix(msg, "node ") && strings.HasSuffix(msg, " does not exist"):
		return "node_missing"
	default:
		return "other"
	}
}

// recordDomains sets the domain gauges after a scheduling pass.
func recordDomains(total, disrupted int) {
	domainsGauge.WithLabelValues("total").Set(float64(total))
	domainsGauge.WithLabelValues("disrupted").Set(float64(disrupted))
}
