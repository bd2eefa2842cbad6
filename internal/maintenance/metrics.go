package maintenance

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	objectsByPhase = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpufleet_maintenance_objects",
		Help: "NodeMaintenance objects by phase, as of the last scheduling pass.",
	}, []string{"phase"})
	schedulingDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufleet_maintenance_scheduling_decisions_total",
		Help: "NodeMaintenance objects scheduled by the scheduler.",
	}, []string{"result"})
	planDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "gpufleet_maintenance_plan_duration_seconds",
		Help:    "Time to compute one scheduling plan.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 4, 8),
	})
	drainDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "gpufleet_maintenance_drain_duration_seconds",
		Help:    "Time from the start of a drain to its end.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 12),
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
		Name:    "gpufleet_maintenance_eviction_duration_seconds",
		Help:    "Time of one eviction request, by whether a PodDisruptionBudget covers the pod (budget: true, false).",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
	}, []string{"budget"})
	evictionTurnWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "gpufleet_maintenance_eviction_turn_wait_seconds",
		Help:    "Time an eviction waited for its PodDisruptionBudget's turn (evictions under one budget go one at a time).",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
	})
)

func init() {
	metrics.Registry.MustRegister(objectsByPhase, schedulingDecisions, planDuration, drainDuration, evictions, watchedNodes, statusConflicts,
		evictionDuration, evictionTurnWait)
}
