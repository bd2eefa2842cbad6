// Package allocation exports which pods hold the cluster's GPUs, computed
// from the pods themselves (available without DCGM): nvidia.com/gpu
// requests of non-terminated pods (the device plugin) and the devices of
// NVIDIA's DRA driver allocated to their ResourceClaims, per pod and per
// namespace, with every GPU node's capacity. It writes nothing: a
// Prometheus collector reads a cache at scrape time.
package allocation

import (
	"context"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// ResourceGPU is the device plugin's extended resource.
const ResourceGPU corev1.ResourceName = "nvidia.com/gpu"

// DRADriver publishes NVIDIA GPUs as DRA devices.
const DRADriver = "gpu.nvidia.com"

// DefaultPoolLabel names a node's pool (the pool label of
// NodeRepairPolicy's default).
const DefaultPoolLabel = "gpufleet.dev/pool"

// Sources of a pod's GPUs (label source).
const (
	SourceDevicePlugin = "device-plugin"
	SourceDRA          = "dra"
)

var (
	podGPUsDesc = prometheus.NewDesc("gpufleet_allocation_pod_gpus",
		"GPUs held by a non-terminated pod: its nvidia.com/gpu request (source device-plugin; node empty while unscheduled) "+
			"or the gpu.nvidia.com devices allocated to its ResourceClaims (source dra; a shared claim counts for every pod using it).",
		[]string{"namespace", "pod", "node", "pool", "source"}, nil)
	namespaceGPUsDesc = prometheus.NewDesc("gpufleet_allocation_namespace_gpus",
		"GPUs held by a namespace's non-terminated pods (the sum of gpufleet_allocation_pod_gpus), by source.",
		[]string{"namespace", "source"}, nil)
	nodeCapacityDesc = prometheus.NewDesc("gpufleet_allocation_node_capacity_gpus",
		"A node's nvidia.com/gpu capacity (nodes with a non-zero capacity only).",
		[]string{"node", "pool"}, nil)
	nodeAllocatableDesc = prometheus.NewDesc("gpufleet_allocation_node_allocatable_gpus",
		"A node's nvidia.com/gpu allocatable (what the device plugin offers to pods; less than capacity when GPUs are unhealthy).",
		[]string{"node", "pool"}, nil)
)

// Source is what the collector reads: the pods that hold GPUs and the
// claims allocated GPUs (from the leader's watches), the nodes (the
// manager's cache), and whether they may be read now (listed, on the
// leader, so that two replicas never both report the same GPUs).
type Source struct {
	Nodes  client.Reader
	Pods   func() []PodGPUs
	Claims func() []ClaimGPUs
	Ready  func() bool
	// PoolLabel names a node's pool (default DefaultPoolLabel).
	PoolLabel string
}

// Collector exports the gauges above from its Source at scrape time.
type Collector struct {
	src atomic.Pointer[Source]
}

// collector is the one registered on controller-runtime's registry; the
// latest Setup sets its source.
var collector = &Collector{}

func init() { metrics.Registry.MustRegister(collector) }

// SetSource makes c read src (nil: c exports nothing).
func (c *Collector) SetSource(src *Source) { c.src.Store(src) }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- podGPUsDesc
	ch <- namespaceGPUsDesc
	ch <- nodeCapacityDesc
	ch <- nodeAllocatableDesc
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	src := c.src.Load()
	if src == nil || src.Pods == nil || (src.Ready != nil && !src.Ready()) {
		return
	}
	ctx := context.Background()
	var nodes corev1.NodeList
	if err := src.Nodes.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(nodeCapacityDesc, err)
		return
	}
	var claims []ClaimGPUs
	if src.Claims != nil {
		claims = src.Claims()
	}
	poolLabel := src.PoolLabel
	if poolLabel == "" {
		poolLabel = DefaultPoolLabel
	}
	for _, m := range compute(nodes.Items, src.Pods(), claims, poolLabel) {
		ch <- prometheus.MustNewConstMetric(m.desc, prometheus.GaugeValue, m.value, m.labels...)
	}
}

// sample is one series of the collector.
type sample struct {
	desc   *prometheus.Desc
	labels []string
	value  float64
}

// compute derives the series from nodes, pods and claims (pure).
func compute(nodes []corev1.Node, pods []PodGPUs, claims []ClaimGPUs, poolLabel string) []sample {
	var out []sample
	pools := make(map[string]string, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		pool := n.Labels[poolLabel]
		pools[n.Name] = pool
		if q, ok := n.Status.Capacity[ResourceGPU]; ok && !q.IsZero() {
			out = append(out, sample{nodeCapacityDesc, []string{n.Name, pool}, float64(q.Value())})
			a := n.Status.Allocatable[ResourceGPU]
			out = append(out, sample{nodeAllocatableDesc, []string{n.Name, pool}, float64(a.Value())})
		}
	}
	type podKey struct{ namespace, name string }
	nodeOf := make(map[podKey]string, len(pods))
	perNamespace := map[[2]string]int64{}
	for _, p := range pods {
		nodeOf[podKey{p.Namespace, p.Name}] = p.Node
		if p.GPUs == 0 {
			continue
		}
		out = append(out, sample{podGPUsDesc, []string{p.Namespace, p.Name, p.Node, pools[p.Node], SourceDevicePlugin}, float64(p.GPUs)})
		perNamespace[[2]string{p.Namespace, SourceDevicePlugin}] += p.GPUs
	}
	draPods := map[podKey]int64{}
	for _, c := range claims {
		for _, name := range c.Pods {
			k := podKey{c.Namespace, name}
			if _, ok := nodeOf[k]; !ok {
				continue // terminated, or not seen yet
			}
			draPods[k] += c.GPUs
		}
	}
	for k, n := range draPods {
		node := nodeOf[k]
		out = append(out, sample{podGPUsDesc, []string{k.namespace, k.name, node, pools[node], SourceDRA}, float64(n)})
		perNamespace[[2]string{k.namespace, SourceDRA}] += n
	}
	for k, n := range perNamespace {
		out = append(out, sample{namespaceGPUsDesc, []string{k[0], k[1]}, float64(n)})
	}
	return out
}

// GPURequest is the pod's effective nvidia.com/gpu request as the
// scheduler counts it: its containers and sidecars (restartable init
// containers) together, or an init container with the sidecars started
// before it, whichever is larger.
func GPURequest(p *corev1.Pod) int64 {
	gpus := func(c *corev1.Container) int64 {
		q := c.Resources.Requests[ResourceGPU]
		if q.IsZero() {
			q = c.Resources.Limits[ResourceGPU] // extended resources: the limit is the request
		}
		return q.Value()
	}
	var running, sidecars, initMax int64
	for i := range p.Spec.Containers {
		running += gpus(&p.Spec.Containers[i])
	}
	for i := range p.Spec.InitContainers {
		c := &p.Spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecars += gpus(c)
			initMax = max(initMax, sidecars)
			continue
		}
		initMax = max(initMax, sidecars+gpus(c))
	}
	return max(running+sidecars, initMax)
}

// draGPUs counts the devices of DRADriver allocated to a claim.
func draGPUs(c *resourcev1.ResourceClaim) int64 {
	if c.Status.Allocation == nil {
		return 0
	}
	var n int64
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == DRADriver {
			n++
		}
	}
	return n
}
