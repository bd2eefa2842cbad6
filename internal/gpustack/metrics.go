package gpustack

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
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

// What the controller does, counted as it does it (only the leader
// reconciles).
var (
	reconcilePasses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufleet_gpustack_reconcile_passes_total",
		Help: "Passes of the ClusterPolicy controller by result: converged (nothing written), wrote, coalesced (a status change held back to be written with the next ones), waiting_for_cache (the cache had not yet shown the controller's last status write), conflict (requeued), error, deferred (not a pass: it came within the pass interval of the last one and is served by the next).",
	}, []string{"result"})
	writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufleet_gpustack_writes_total",
		Help: "API writes of the GPU stack controller by kind of object (ClusterPolicy/status for its status) and verb.",
	}, []string{"kind", "verb"})
	nodesDegraded = &policyGauge{GaugeVec: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpufleet_gpustack_nodes_degraded",
		Help: "GPU nodes where a component of the active ClusterPolicy has not been Ready for longer than the degraded threshold (or cannot be scheduled) while every component it needs there is Ready.",
	}, []string{"policy"})}
)

func init() { metrics.Registry.MustRegister(policies, reconcilePasses, writes, nodesDegraded) }

// policyGauge is a gauge of the active ClusterPolicy: it has one series at
// most, so a policy that is deleted or no longer active leaves none behind.
type policyGauge struct {
	*prometheus.GaugeVec
	mu     sync.Mutex
	policy string // whose series there is ("" none)
}

// set makes v the value of policy's series, and that series the only one.
func (g *policyGauge) set(policy string, v float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.policy != "" && g.policy != policy {
		g.DeleteLabelValues(g.policy)
	}
	g.policy = policy
	g.WithLabelValues(policy).Set(v)
}

// forget removes policy's series (deleted, being deleted, or ignored).
func (g *policyGauge) forget(policy string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.DeleteLabelValues(policy)
	if g.policy == policy {
		g.policy = ""
	}
}

// Pass results (reconcilePasses).
const (
	passConverged = "converged"
	passWrote     = "wrote"
	passCoalesced = "coalesced"
	passWaiting   = "waiting_for_cache"
	passConflict  = "conflict"
	passError     = "error"
	passDeferred  = "deferred" // within PassInterval of the last pass
)

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

// countingWrites wraps c so that each write it sends is counted in
// gpufleet_gpustack_writes_total (requests that fail count too: they
// reached the API server).
func countingWrites(c client.Client) client.Client { return &countingClient{Client: c} }

type countingClient struct{ client.Client }

func (c *countingClient) count(obj client.Object, verb string) {
	kind := "unknown"
	if gvk, err := apiutil.GVKForObject(obj, c.Scheme()); err == nil {
		kind = gvk.Kind
	}
	writes.WithLabelValues(kind, verb).Inc()
	writeCount.Add(1)
}

// writeCount counts every write, for a pass to tell whether it wrote.
var writeCount atomic.Uint64

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.count(obj, "create")
	return c.Client.Create(ctx, obj, opts...)
}

func (c *countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.count(obj, "update")
	return c.Client.Update(ctx, obj, opts...)
}

func (c *countingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.count(obj, "patch")
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *countingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.count(obj, "delete")
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *countingClient) Status() client.SubResourceWriter {
	return &countingStatus{SubResourceWriter: c.Client.Status(), c: c}
}

type countingStatus struct {
	client.SubResourceWriter
	c *countingClient
}

func (s *countingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.c.count(obj, "update status")
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

func (s *countingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	s.c.count(obj, "patch status")
	return s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}
