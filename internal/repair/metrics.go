package repair

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Outcomes of a detected fault (gpufleet_repair_faults_total).
const (
	outcomeRepair  = "repair"
	outcomeDryRun  = "dry_run"
	outcomeIgnored = "ignored"
)

var (
	faultsDetected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufleet_repair_faults_total",
		Help: "Faults past their threshold, by rule and what was done (repair, dry_run, ignored).",
	}, []string{"rule", "outcome"})
	repairsFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufleet_repair_repairs_total",
		Help: "Finished repairs by rule and result (Succeeded, RecoveryFailed, Ignored).",
	}, []string{"rule", "result"})
	actionsRequested = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufleet_repair_actions_total",
		Help: "Repair actions handed to the node agent, by action.",
	}, []string{"action"})
	gpusIsolated = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpufleet_repair_isolated_gpus",
		Help: "GPUs kept from new pods by a DeviceTaintRule of gpufleet.",
	})
	gpusOutOfService = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpufleet_repair_gpus_out_of_service",
		Help: "GPUs whose node agent reports a fault that takes them out of service, by class (ResetGPU, Reboot, Replace).",
	}, []string{"class"})
	gpuFaults = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpufleet_repair_gpu_fault_occurrences",
		Help: "GPU faults seen by the node agents (sum of the GPUFault records' counts), by XID code (0: a health counter) and class.",
	}, []string{"code", "class"})
	repairDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gpufleet_repair_duration_seconds",
		Help:    "Time from a repair's start to its end, by result.",
		Buckets: []float64{10, 30, 60, 120, 300, 600, 1200, 1800, 3600},
	}, []string{"result"})
)

func init() {
	metrics.Registry.MustRegister(faultsDetected, repairsFinished, actionsRequested, repairDuration, gpusIsolated, gpusOutOfService, gpuFaults)
}
