package devcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
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
// Like NVIDIA's plugin, it never marks a GPU healthy again: only a restart
// of the plugin (its pod, SimGPUPluginStart) or a reboot forgets the XIDs
// it saw. A pod that cannot get enough healthy free GPUs is left without
// (the kubelet would refuse it; kwok runs it).
//
// The same loop is the health monitor of the simulated DRA driver's
// kubelet plugin on the other GPU nodes (simdra.go): it taints a device in
// the node's ResourceSlice for an XID, as NVIDIA's DRA driver does, until
// that plugin restarts. Both plugins run as kwok pods of DaemonSets in
// kube-system (SimGPUPluginDaemonSets), so that deleting a plugin's pod
// restarts it as on a real node. The loop starts with the first GPU node
// (AddNodes) and stops with the cluster.
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
	// slices: the simulated DRA driver's ResourceSlices, by name (a pass
	// reads its node's from here, not from the API server: at 10,000
	// nodes a GET per pass kept the loop minutes behind).
	slices cache.Store
	queue  workqueue.TypedRateLimitingInterface[string]
	// started: when the loop first saw each plugin pod (its start, to
	// the nanosecond; a creation time has whole seconds only).
	started sync.Map // types.UID → time.Time
	// queued: when a node was first queued since its last sync began.
	queued sync.Map // node → time.Time
	mu     sync.Mutex
	// waits: queued → sync began, of the latest passes (at most
	// 2×simPluginWaitsKept: a dev cluster runs for days); dropped counts
	// the older passes no longer kept.
	waits   []time.Duration
	dropped int
	last    map[string]SimPluginSync // node → its last sync
}

// simPluginWaitsKept: how many passes' queue waits are kept at least.
const simPluginWaitsKept = 1 << 17

// SimPluginSync is one pass of the simulated GPU plugins over a node.
type SimPluginSync struct {
	// At: when it began; Waited: how long the node was queued before.
	At     time.Time
	Waited time.Duration
	// PluginStart: the start of the node's plugin it published for (zero:
	// none running); Err: what the pass failed with.
	PluginStart time.Time
	Err         string
}

// SimPluginPasses is how many passes the simulated GPU plugins have made.
// With SimPluginWaitsSince and SimPluginLastSync a benchmark tells the
// simulation's lag from gpufleet's.
func (c *Cluster) SimPluginPasses() int {
	s := c.simPlugins
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped + len(s.waits)
}

// SimPluginWaitsSince returns how long each node waited in the simulated
// GPU plugins' queue before each pass after the first n (those still
// kept), in order.
func (c *Cluster) SimPluginWaitsSince(n int) []time.Duration {
	s := c.simPlugins
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.waits[min(max(n-s.dropped, 0), len(s.waits)):])
}

// SimPluginLastSync is the simulated GPU plugins' last pass over node.
func (c *Cluster) SimPluginLastSync(node string) (SimPluginSync, bool) {
	s := c.simPlugins
	if s == nil {
		return SimPluginSync{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.last[node]
	return r, ok
}

// timedSync is sync, recording the node's wait in the queue and the pass.
func (s *simDevicePlugin) timedSync(ctx context.Context, node string) error {
	began := s.cluster.simNow()
	var waited time.Duration
	if q, ok := s.queued.LoadAndDelete(node); ok {
		waited = began.Sub(q.(time.Time))
	}
	start, err := s.sync(ctx, node)
	rec := SimPluginSync{At: began, Waited: waited, PluginStart: start}
	if err != nil {
		rec.Err = err.Error()
	}
	s.record(node, rec)
	return err
}

// record keeps a pass over node: its queue wait among the latest ones,
// and as the node's last pass.
func (s *simDevicePlugin) record(node string, rec SimPluginSync) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waits) == 2*simPluginWaitsKept {
		s.waits = append(s.waits[:0], s.waits[simPluginWaitsKept:]...)
		s.dropped += simPluginWaitsKept
	}
	s.waits = append(s.waits, rec.Waited)
	s.last[node] = rec
}

// simPluginWorkers: the simulated GPU plugins' passes at once. Each node
// has its own plugin on a real cluster, which taints a device within a
// second of its XID; one loop for 10,000 nodes sends its slice updates one
// after the other (~5 a second on a busy local API server), and a burst of
// 1,000 XIDs then kept a node waiting minutes for its taint. The queue
// never hands one node to two workers.
const simPluginWorkers = 8

// startSimGPUPlugins starts the loop once (the first GPU node calls it),
// after creating the plugins' DaemonSets.
func (c *Cluster) startSimGPUPlugins(ctx context.Context) error {
	var err error
	c.devicePluginOnce.Do(func() {
		for _, ds := range SimGPUPluginDaemonSets() {
			if _, cerr := c.Client.AppsV1().DaemonSets(ds.Namespace).Create(ctx, ds, metav1.CreateOptions{}); cerr != nil && !apierrors.IsAlreadyExists(cerr) {
				err = fmt.Errorf("creating DaemonSet %s/%s: %w", ds.Namespace, ds.Name, cerr)
				return
			}
		}
		simCtx := c.simCtx
		if simCtx == nil {
			simCtx = context.Background() // a Cluster that Start did not make (Connect)
		}
		f := informers.NewSharedInformerFactoryWithOptions(c.Client, 0)
		podInf := f.Core().V1().Pods().Informer()
		nodeInf := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = LabelNFDNvidiaPCI + "=true"
		})).Core().V1().Nodes().Informer()
		if err = podInf.AddIndexers(cache.Indexers{devicePluginPodsByNode: func(obj any) ([]string, error) {
			if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
				return []string{p.Spec.NodeName}, nil
			}
			return nil, nil
		}}); err != nil {
			return
		}
		sliceInf := f.Resource().V1().ResourceSlices().Informer()
		s := &simDevicePlugin{cluster: c, pods: podInf.GetIndexer(), nodes: nodeInf.GetStore(), slices: sliceInf.GetStore(),
			// Retries per node only, no shared bucket: a burst of refused
			// writes must not queue every node behind a 10-per-second limit.
			queue: workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](5*time.Millisecond, 10*time.Second)),
			last:  map[string]SimPluginSync{}}
		c.simPlugins = s
		add := func(node string) {
			s.queued.LoadOrStore(node, s.cluster.simNow())
			s.queue.Add(node)
		}
		enqueue := func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			switch o := obj.(type) {
			case *corev1.Pod:
				if IsSimPluginPod(o) {
					s.started.LoadOrStore(o.UID, s.cluster.simNow())
				}
				if o.Spec.NodeName != "" {
					add(o.Spec.NodeName)
				}
			case *corev1.Node:
				add(o.Name)
			case *resourcev1.ResourceSlice:
				if o.Spec.Driver == DRADriver && o.Spec.NodeName != nil {
					add(*o.Spec.NodeName)
				}
			}
		}
		handler := cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: func(obj any) {
			enqueue(obj)
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				s.started.Delete(p.UID)
			}
		}}
		if _, err = podInf.AddEventHandler(handler); err != nil {
			return
		}
		// A slice published (its node may have been synced before it
		// existed) or changed by someone else.
		if _, err = sliceInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }}); err != nil {
			return
		}
		// Nodes: what the plugins read (the simulated host's annotations,
		// the boot) and what they write (allocatable), not heartbeats.
		if _, err = nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, DeleteFunc: enqueue, UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if !ok1 || !ok2 || !maps.Equal(on.Annotations, nn.Annotations) || on.Status.NodeInfo.BootID != nn.Status.NodeInfo.BootID ||
				!equality.Semantic.DeepEqual(on.Status.Allocatable, nn.Status.Allocatable) || !maps.Equal(on.Labels, nn.Labels) {
				enqueue(n)
			}
		}}); err != nil {
			return
		}
		go podInf.RunWithContext(simCtx)
		go nodeInf.RunWithContext(simCtx)
		go sliceInf.RunWithContext(simCtx)
		runNodeLoop(simCtx, s.queue, []cache.InformerSynced{podInf.HasSynced, nodeInf.HasSynced, sliceInf.HasSynced}, s.timedSync, func(node string, err error) {
			if apierrors.IsConflict(err) {
				return // the cache is behind the loop's own last write: the pass runs again
			}
			s.cluster.logf("simulated GPU plugins of %s: %v", node, err)
		}, simPluginWorkers)
	})
	return err
}

// SimGPUPluginDaemonSets are the simulated GPU plugins' DaemonSets, in
// kube-system: NVIDIA's device plugin on device-plugin nodes (labelled as
// its Helm chart labels it) and the DRA driver's kubelet plugin on the
// other GPU nodes (labelled as the DRA driver's chart does). Their pods
// run nothing (kwok); their creation time is the plugin's start.
func SimGPUPluginDaemonSets() []*appsv1.DaemonSet {
	ds := func(name string, labels map[string]string, affinity []corev1.NodeSelectorRequirement) *appsv1.DaemonSet {
		return &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: name, Labels: labels},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
							NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: affinity}}}}},
						Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
						TerminationGracePeriodSeconds: ptr.To[int64](0),
						Containers:                    []corev1.Container{{Name: "plugin", Image: "registry.k8s.io/pause:3.10"}},
					},
				},
			},
		}
	}
	gpuNode := corev1.NodeSelectorRequirement{Key: LabelNFDNvidiaPCI, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}
	return []*appsv1.DaemonSet{
		ds("sim-nvidia-device-plugin", map[string]string{"app.kubernetes.io/name": "nvidia-device-plugin"}, []corev1.NodeSelectorRequirement{
			gpuNode, {Key: LabelDevicePluginOnly, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}}),
		ds("sim-dra-driver-kubelet-plugin", map[string]string{"dra-driver-nvidia-gpu-component": "kubelet-plugin"}, []corev1.NodeSelectorRequirement{
			gpuNode, {Key: LabelDevicePluginOnly, Operator: corev1.NodeSelectorOpDoesNotExist}}),
	}
}

// simPluginSelectors choose the pods of a node's GPU plugins: the selectors
// gpufleet's repair restarts by default.
var simPluginSelectors = func() []labels.Selector {
	var out []labels.Selector
	for _, ls := range repairv1.DefaultGPUStackPods() {
		s, err := metav1.LabelSelectorAsSelector(&ls)
		if err != nil {
			panic(err) // constant selectors
		}
		out = append(out, s)
	}
	return out
}()

// startedAt is when the loop first saw plugin pod uid.
func (s *simDevicePlugin) startedAt(uid types.UID) (time.Time, bool) {
	t, ok := s.started.Load(uid)
	if !ok {
		return time.Time{}, false
	}
	return t.(time.Time), true
}

// IsSimPluginPod reports whether p is a pod of the simulated GPU plugins:
// one the default gpu.stackPods select.
func IsSimPluginPod(p *corev1.Pod) bool {
	for _, s := range simPluginSelectors {
		if s.Matches(labels.Set(p.Labels)) {
			return true
		}
	}
	return false
}

// SimGPUPluginStart is when the node's GPU plugin last started: the start
// of the newest of its pods (any pod of pods on node that the default
// gpu.stackPods select) — when started knows it, else its creation —,
// zero when none runs (it then remembers the whole boot).
func SimGPUPluginStart(node string, pods []*corev1.Pod, started func(types.UID) (time.Time, bool)) time.Time {
	var start time.Time
	for _, p := range pods {
		if p.Spec.NodeName != node || p.DeletionTimestamp != nil || !IsSimPluginPod(p) {
			continue
		}
		at := p.CreationTimestamp.Time
		if started != nil {
			if t, ok := started(p.UID); ok && t.After(at) {
				at = t
			}
		}
		if at.After(start) {
			start = at
		}
	}
	return start
}

// sync advertises the node's healthy GPUs (allocatable, as the kubelet
// does from the plugin's health reports) and gives the node's waiting pods
// their GPUs. The pods are read from the API server, not the cache: a pass
// must see the previous pass's allocations.
func (s *simDevicePlugin) sync(ctx context.Context, node string) (pluginStart time.Time, _ error) {
	obj, ok, err := s.nodes.GetByKey(node)
	if err != nil || !ok {
		return time.Time{}, err
	}
	objs, err := s.pods.ByIndex(devicePluginPodsByNode, node)
	if err != nil {
		return time.Time{}, err
	}
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		pods = append(pods, o.(*corev1.Pod))
	}
	since := SimGPUPluginStart(node, pods, s.startedAt)
	// Between a plugin's pod going and its successor starting, nothing
	// reports for the node: what it published stays as it was.
	restarting := since.IsZero() && slices.ContainsFunc(pods, func(p *corev1.Pod) bool { return IsSimPluginPod(p) && p.DeletionTimestamp != nil })
	if obj.(*corev1.Node).Labels[LabelDevicePluginOnly] != "true" {
		if restarting {
			return since, nil
		}
		return since, s.cluster.syncSliceTaints(ctx, obj.(*corev1.Node), since, s.slices)
	}
	if healthy, change := SimDevicePluginAllocatable(obj.(*corev1.Node), since); change && !restarting {
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"allocatable": map[string]string{string(ResourceGPU): strconv.Itoa(healthy)}}})
		if err != nil {
			return since, err
		}
		if _, err := s.cluster.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			return since, fmt.Errorf("advertising %d healthy GPUs: %w", healthy, err)
		}
	}
	if !slices.ContainsFunc(pods, func(p *corev1.Pod) bool {
		return p.Annotations[AnnotationGPUs] == "" && podGPUs(p) > 0
	}) {
		return since, nil // nobody waits
	}
	live, err := s.cluster.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return since, err
	}
	for key, gpus := range SimDevicePluginAllocate(obj.(*corev1.Node), live.Items, s.startedAt) {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnotationGPUs: gpus}}})
		if err != nil {
			return since, err
		}
		if _, err := s.cluster.Client.CoreV1().Pods(key.Namespace).Patch(ctx, key.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return since, fmt.Errorf("giving pod %s GPUs %s: %w", key, gpus, err)
		}
	}
	return since, nil
}

// SimDevicePluginAllocate is the simulated device plugin's decision for a
// node and its pods: for each pod that requests nvidia.com/gpu and names
// no GPUs yet, oldest first, the lowest-numbered healthy GPUs (indices,
// AnnotationGPUs's format) that no pod of the node holds.
func SimDevicePluginAllocate(node *corev1.Node, pods []corev1.Pod, started func(types.UID) (time.Time, bool)) map[types.NamespacedName]string {
	h, err := ReadSimGPUHost(node)
	if err != nil {
		return nil
	}
	ptrs := make([]*corev1.Pod, len(pods))
	for i := range pods {
		ptrs[i] = &pods[i]
	}
	taken := simPluginUnhealthy(h, SimGPUPluginStart(node.Name, ptrs, started))
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
// the kubelet reports it from NVIDIA's device plugin started at since: its
// GPUs that pass the plugin's health check (capacity stays the number of
// GPUs), and whether the node's status says otherwise now.
func SimDevicePluginAllocatable(node *corev1.Node, since time.Time) (healthy int, change bool) {
	h, err := ReadSimGPUHost(node)
	if err != nil || h.GPUs == 0 {
		return 0, false
	}
	healthy = h.GPUs - len(simPluginUnhealthy(h, since))
	have, ok := node.Status.Allocatable[ResourceGPU]
	return healthy, !ok || have.Value() != int64(healthy)
}

// SimDevicePluginHealthy is the simulated device plugin's health check of
// GPU i, for a plugin started at since: on the bus, and no XID since the
// plugin started (in this boot) but the ones NVIDIA's plugin skips as
// application errors.
func SimDevicePluginHealthy(h SimGPUHost, i int, since time.Time) bool {
	return !simPluginUnhealthy(h, since)[i]
}

// simXID is an XID of the simulated kernel log with its wall time.
type simXID struct {
	gpu  int
	code int
	seq  int64
	at   time.Time
}

// simXIDs are the XIDs of the host's kernel log (this boot) on its GPUs,
// oldest first, from userspace or not.
func simXIDs(h SimGPUHost) []simXID {
	events, _, err := gpufault.ScanKmsg(strings.NewReader(strings.Join(h.Kmsg, "\n")))
	if err != nil {
		return nil
	}
	byBus := map[string]int{}
	for i := range h.GPUs {
		byBus[SimGPU(h.Node, i).PCIBusID] = i
	}
	var out []simXID
	for _, ev := range events {
		i, ok := byBus[ev.PCIBusID]
		if !ok {
			continue
		}
		at := h.Boot.Time
		if ev.KernelTimeUsec != gpufault.Unknown {
			at = at.Add(time.Duration(ev.KernelTimeUsec) * time.Microsecond)
		}
		out = append(out, simXID{gpu: i, code: ev.Code, seq: ev.Seq, at: at})
	}
	return out
}

// simPluginUnhealthy is the health check of NVIDIA's GPU plugins (the
// device plugin, the DRA driver's kubelet plugin) started at since: the
// GPUs off the bus, and those with an XID since then that the plugins do
// not skip as an application error.
func simPluginUnhealthy(h SimGPUHost, since time.Time) map[int]bool {
	out := map[int]bool{}
	for i, st := range h.State {
		if st.Missing && i < h.GPUs {
			out[i] = true
		}
	}
	for _, x := range simXIDs(h) {
		if !x.at.Before(since) && !slices.Contains(devicePluginSkippedXIDs, x.code) {
			out[x.gpu] = true
		}
	}
	return out
}

// simXIDSinceReset: GPUs with an XID (but the skipped ones) since their
// last reset, in this boot.
func simXIDSinceReset(h SimGPUHost) map[int]bool {
	out := map[int]bool{}
	for _, x := range simXIDs(h) {
		if x.seq > h.State[x.gpu].ResetSeq && !slices.Contains(devicePluginSkippedXIDs, x.code) {
			out[x.gpu] = true
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
