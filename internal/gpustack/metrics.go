package gpustack

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/scrapesource"
)

// The GPU stack's state, read from the cached ClusterPolicy status at
// scrape time (no writes, no polling). Ignored policies are left out.
var (
	componentDesiredDesc = prometheus.NewDesc("gpufleet_gpustack_component_nodes_desired",
		"GPU nodes that should run an enabled component of the active ClusterPolicy.",
		[]string{"policy", "component"}, nil)
	componentReadyDesc = prometheus.NewDesc("gpufleet_gpustack_component_nodes_ready",
		"GPU nodes where an enabled component of the active ClusterPolicy runs Ready.",
		[]string{"policy", "component"}, nil)
	readyDesc = prometheus.NewDesc("gpufleet_gpustack_ready",
		"1 when every enabled component is Ready on every GPU node (ClusterPolicy state ready), else 0.",
		[]string{"policy"}, nil)
	degradedDesc = prometheus.NewDesc("gpufleet_gpustack_degraded",
		"1 when a component pod has not been Ready for longer than the degraded threshold on some node (condition Degraded), else 0.",
		[]string{"policy"}, nil)
)

// policyCollector reads the ClusterPolicies from its source once this
// replica leads (elected closed), so that replicas never report twice.
type policyCollector struct{ scrapesource.Source }

var policies = &policyCollector{}

func init() { metrics.Registry.MustRegister(policies) }

// ServeMetrics makes the registered collector read ClusterPolicies from
// reader once elected is closed (nil: at once).
func ServeMetrics(reader client.Reader, elected <-chan struct{}) {
	policies.Serve(reader, elected)
}

func (c *policyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- componentDesiredDesc
	ch <- componentReadyDesc
	ch <- readyDesc
	ch <- degradedDesc
}

func (c *policyCollector) Collect(ch chan<- prometheus.Metric) {
	reader := c.Reader()
	if reader == nil {
		return
	}
	var list nvidiav1.ClusterPolicyList
	if err := reader.List(context.Background(), &list, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(readyDesc, err)
		return
	}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Status.State == nvidiav1.StateIgnored || p.Status.State == "" {
			continue // not the active policy, or not reconciled yet
		}
		ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, boolValue(p.Status.State == nvidiav1.StateReady), p.Name)
		ch <- prometheus.MustNewConstMetric(degradedDesc, prometheus.GaugeValue,
			boolValue(meta.IsStatusConditionTrue(p.Status.Conditions, nvidiav1.ConditionDegraded)), p.Name)
		for _, cs := range p.Status.Components {
			if !cs.Enabled {
				continue
			}
			ch <- prometheus.MustNewConstMetric(componentDesiredDesc, prometheus.GaugeValue, float64(cs.NodesDesired), p.Name, cs.Name)
			ch <- prometheus.MustNewConstMetric(componentReadyDesc, prometheus.GaugeValue, float64(cs.NodesReady), p.Name, cs.Name)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
