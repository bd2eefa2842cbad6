package devcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/gpufleet/gpufleet/internal/gpufault"
)

// The simulated NVIDIA device plugin of device-plugin nodes
// (NodeSpec.DevicePluginOnly, labelled LabelDevicePluginOnly). kwok runs
// no device plugin, so nothing says which of a node's GPUs a pod requesting
// nvidia.com/gpu was given; this loop does, as the plugin's allocation
// would: a pod bound to such a node that requests nvidia.com/gpu and does
// not name its GPUs yet (AnnotationGPUs, which a test may also set itself)
// gets the lowest-numbered GPUs of the node that no other pod there holds
// and that the plugin's health check passes, written to AnnotationGPUs
// (which the simulated kubelet's pod-resources API reports). Like NVIDIA's
// plugin, the health check sees XIDs — all but the ones it skips as
// application errors — and a GPU that fell off the bus, not
// dcgm-exporter's counters: a GPU with only an ECC count stays allocatable.
// A GPU is healthy again after a successful reset (or a reboot). A pod that
// cannot get enough healthy free GPUs is left without (the kubelet would
// refuse it; kwok runs it). The loop starts with the first device-plugin
// node (AddNodes) and stops with the cluster.
const LabelDevicePluginOnly = "sim.gpufleet.dev/device-plugin-only"

// devicePluginSkippedXIDs are the XIDs NVIDIA's device plugin does not mark
// a GPU unhealthy for, as application errors (k8s-device-plugin
// internal/rm/health.go; gpufault's catalogue cites the same list).
var devicePluginSkippedXIDs = []int{13, 31, 43, 45, 68, 109}

// devicePluginPodsByNode indexes pods by their node.
const devicePluginPodsByNode = "node"

// simDevicePlugin allocates the GPUs of device-plugin nodes to their pods.
type simDevicePlugin struct {
	cluster *Cluster
	pods    cache.Indexer
	nodes   cache.Store
	queue   workqueue.TypedRateLimitingInterface[string]
}

// startSimDevicePlugin starts the loop once (the first device-plugin node
// calls it).
func (c *Cluster) startSimDevicePlugin() error {
	var err error
	c.devicePluginOnce.Do(func() {
		ctx := c.simCtx
		if ctx == nil {
			ctx = context.Background() // a Cluster that Start did not make (Connect)
		}
		f := informers.NewSharedInformerFactoryWithOptions(c.Client, 0)
		podInf := f.Core().V1().Pods().Informer()
		nodeInf := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = LabelDevicePluginOnly + "=true"
		})).Core().V1().Nodes().Informer()
		if err = podInf.AddIndexers(cache.Indexers{devicePluginPodsByNode: func(obj any) ([]string, error) {
			if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
				return []string{p.Spec.NodeName}, nil
			}
			return nil, nil
		}}); err != nil {
			return
		}
		s := &simDevicePlugin{cluster: c, pods: podInf.GetIndexer(), nodes: nodeInf.GetStore(),
			queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
		enqueue := func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			switch o := obj.(type) {
			case *corev1.Pod:
				if o.Spec.NodeName != "" {
					s.queue.Add(o.Spec.NodeName)
				}
			case *corev1.Node:
				s.queue.Add(o.Name)
			}
		}
		handler := cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue}
		if _, err = podInf.AddEventHandler(handler); err != nil {
			return
		}
		if _, err = nodeInf.AddEventHandler(handler); err != nil {
			return
		}
		go podInf.RunWithContext(ctx)
		go nodeInf.RunWithContext(ctx)
		runNodeLoop(ctx, s.queue, []cache.InformerSynced{podInf.HasSynced, nodeInf.HasSynced}, s.sync, func(node string, err error) {
			s.cluster.logf("simulated device plugin of %s: %v", node, err)
		})
	})
	return err
}

// sync advertises the node's healthy GPUs (allocatable, as the kubelet
// does from the plugin's health reports) and gives the node's waiting pods
// their GPUs. The pods are read from the API server, not the cache: a pass
// must see the previous pass's allocations.
func (s *simDevicePlugin) sync(ctx context.Context, node string) error {
	obj, ok, err := s.nodes.GetByKey(node)
	if err != nil || !ok {
		return err
	}
	if healthy, change := SimDevicePluginAllocatable(obj.(*corev1.Node)); change {
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"allocatable": map[string]string{string(ResourceGPU): strconv.Itoa(healthy)}}})
		if err != nil {
			return err
		}
		if _, err := s.cluster.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			return fmt.Errorf("advertising %d healthy GPUs: %w", healthy, err)
		}
	}
	if objs, err := s.pods.ByIndex(devicePluginPodsByNode, node); err != nil || !slices.ContainsFunc(objs, func(o any) bool {
		p := o.(*corev1.Pod)
		return p.Annotations[AnnotationGPUs] == "" && podGPUs(p) > 0
	}) {
		return err // nobody waits
	}
	pods, err := s.cluster.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return err
	}
	for key, gpus := range SimDevicePluginAllocate(obj.(*corev1.Node), pods.Items) {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnotationGPUs: gpus}}})
		if err != nil {
			return err
		}
		if _, err := s.cluster.Client.CoreV1().Pods(key.Namespace).Patch(ctx, key.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("giving pod %s GPUs %s: %w", key, gpus, err)
		}
	}
	return nil
}

// SimDevicePluginAllocate is the simulated device plugin's decision for a
// node and its pods: for each pod that requests nvidia.com/gpu and names
// no GPUs yet, oldest first, the lowest-numbered healthy GPUs (indices,
// AnnotationGPUs's format) that no pod of the node holds.
func SimDevicePluginAllocate(node *corev1.Node, pods []corev1.Pod) map[types.NamespacedName]string {
	h, err := ReadSimGPUHost(node)
	if err != nil {
		return nil
	}
	taken := simDevicePluginUnhealthy(h)
	var waiting []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName != node.Name || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if v := p.Annotations[AnnotationGPUs]; v != "" {
			for f := range strings.SplitSeq(v, ",") {
				if idx, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
					taken[idx] = true
				}
			}
			continue
		}
		if podGPUs(p) > 0 {
			waiting = append(waiting, p)
		}
	}
	sort.SliceStable(waiting, func(i, j int) bool {
		a, b := waiting[i], waiting[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	out := map[types.NamespacedName]string{}
	for _, p := range waiting {
		var picked []string
		for i := 0; i < h.GPUs && len(picked) < podGPUs(p); i++ {
			if !taken[i] {
				picked = append(picked, strconv.Itoa(i))
			}
		}
		if len(picked) < podGPUs(p) {
			continue // not enough: the kubelet would refuse the pod
		}
		for _, i := range picked {
			idx, _ := strconv.Atoi(i)
			taken[idx] = true
		}
		out[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = strings.Join(picked, ",")
	}
	return out
}

// SimDevicePluginAllocatable is the node's nvidia.com/gpu allocatable as
// the kubelet reports it from NVIDIA's device plugin: its GPUs that pass
// the plugin's health check (capacity stays the number of GPUs), and
// whether the node's status says otherwise now.
func SimDevicePluginAllocatable(node *corev1.Node) (healthy int, change bool) {
	h, err := ReadSimGPUHost(node)
	if err != nil || h.GPUs == 0 {
		return 0, false
	}
	healthy = h.GPUs - len(simDevicePluginUnhealthy(h))
	have, ok := node.Status.Allocatable[ResourceGPU]
	return healthy, !ok || have.Value() != int64(healthy)
}

// SimDevicePluginHealthy is the simulated device plugin's health check of
// GPU i: on the bus, and no XID since its last reset (in this boot) but
// the ones NVIDIA's plugin skips as application errors.
func SimDevicePluginHealthy(h SimGPUHost, i int) bool {
	return !simDevicePluginUnhealthy(h)[i]
}

// simDevicePluginUnhealthy is the plugin's health check of every GPU of
// the host, reading the kernel log once: the GPUs that fail it.
func simDevicePluginUnhealthy(h SimGPUHost) map[int]bool {
	out := map[int]bool{}
	for i, st := range h.State {
		if st.Missing && i < h.GPUs {
			out[i] = true
		}
	}
	events, _, err := gpufault.ScanKmsg(strings.NewReader(strings.Join(h.Kmsg, "\n")))
	if err != nil {
		return out
	}
	for i := range h.GPUs {
		bus, reset := SimGPU(h.Node, i).PCIBusID, h.State[i].ResetSeq
		for _, ev := range events {
			if ev.PCIBusID == bus && ev.Seq > reset && !slices.Contains(devicePluginSkippedXIDs, ev.Code) {
				out[i] = true
			}
		}
	}
	return out
}

// podGPUs is how many nvidia.com/gpu a pod requests (its containers' sum,
// or an init container's, whichever is more).
func podGPUs(p *corev1.Pod) int {
	sum := 0
	for _, c := range p.Spec.Containers {
		q := c.Resources.Limits[ResourceGPU]
		sum += int(q.Value())
	}
	for _, c := range p.Spec.InitContainers {
		q := c.Resources.Limits[ResourceGPU]
		sum = max(sum, int(q.Value()))
	}
	return sum
}
