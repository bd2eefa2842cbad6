package repair

import (
	"context"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/scrapesource"
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
	repairDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gpufleet_repair_duration_seconds",
		Help:    "Time from a repair's start to its end, by result.",
		Buckets: []float64{10, 30, 60, 120, 300, 600, 1200, 1800, 3600},
	}, []string{"result"})
)

func init() {
	metrics.Registry.MustRegister(states, faultsDetected, repairsFinished, actionsRequested, repairDuration, gpusIsolated, gpusOutOfService)
}

// Series read from the cache at scrape time (no writes, no polling): the
// nodes' repair state label, the policies' suspended pools and the GPU
// faults the agents recorded (read at scrape time: a record's counts
// change without any change the isolator reconciles on).
var (
	gpuFaultsDesc = prometheus.NewDesc("gpufleet_repair_gpu_fault_occurrences",
		"GPU faults seen by the node agents (sum of the GPUFault records' counts), by XID code (0: a health counter) and class.",
		[]string{"code", "class"}, nil)
	nodeStateDesc = prometheus.NewDesc("gpufleet_repair_node_state",
		"1 for a node in a repair state (label repair.gpufleet.dev/state: Repairing, RecoveryFailed), with its pool (label gpufleet.dev/pool).",
		[]string{"node", "pool", "state"}, nil)
	suspendedPoolDesc = prometheus.NewDesc("gpufleet_repair_suspended_pool",
		"1 for a pool where a NodeRepairPolicy stopped repairing after a failed repair (status.suspendedPools), with the node whose repair failed.",
		[]string{"policy", "pool", "node"}, nil)
)

// states is the registered collector of those series; ServeStateMetrics
// gives it its source.
var states = &stateCollector{}

type stateCollector struct{ scrapesource.Source }

// ServeStateMetrics makes the registered collector read nodes and
// NodeRepairPolicies from reader once elected is closed (nil: at once), so
// that replicas never report twice.
func ServeStateMetrics(reader client.Reader, elected <-chan struct{}) {
	states.Serve(reader, elected)
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodeStateDesc
	ch <- suspendedPoolDesc
	ch <- gpuFaultsDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	reader := c.Reader()
	if reader == nil {
		return
	}
	ctx := context.Background()
	var nodes corev1.NodeList
	if err := reader.List(ctx, &nodes, client.HasLabels{LabelState}, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(nodeStateDesc, err)
		return
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		ch <- prometheus.MustNewConstMetric(nodeStateDesc, prometheus.GaugeValue, 1, n.Name, n.Labels[DefaultPoolLabel], n.Labels[LabelState])
	}
	var policies repairv1.NodeRepairPolicyList
	if err := reader.List(ctx, &policies, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(suspendedPoolDesc, err)
		return
	}
	for i := range policies.Items {
		p := &policies.Items[i]
		for _, s := range p.Status.SuspendedPools {
			ch <- prometheus.MustNewConstMetric(suspendedPoolDesc, prometheus.GaugeValue, 1, p.Name, s.Pool, s.Node)
		}
	}
	var gpus repairv1.GPUFaultList
	if err := reader.List(ctx, &gpus, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(gpuFaultsDesc, err)
		return
	}
	seen := map[[2]string]int64{}
	for _, g := range gpus.Items {
		for _, f := range g.Status.Faults {
			seen[[2]string{strconv.Itoa(int(f.Code)), string(f.Class)}] += f.Count
		}
	}
	for k, n := range seen {
		ch <- prometheus.MustNewConstMetric(gpuFaultsDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}
