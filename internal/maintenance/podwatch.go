package maintenance

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	typedappsv1 "k8s.io/client-go/kubernetes/typed/apps/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// PodWatch watches the pods of the nodes that NodeMaintenance objects are
// cordoning, waiting on or draining — and of no other node. The operator's
// memory then grows with the number of nodes in maintenance, not with the
// pods of the cluster, and the drain reads the node's pods from the watch
// instead of listing them at every step.
//
// Which nodes are watched follows from the objects' phases (see
// needsPods): the lifecycle controller declares, at every reconcile,
// whether an object needs its node's pods. Nothing here is progress: after
// a restart the first reconcile of each object starts its node's watch
// again.
type PodWatch struct {
	kube kubernetes.Interface
	// changed receives a node's name when one of its pods changed in a way
	// that can end a wait or a drain step, and when its watch has synced.
	changed chan event.TypedGenericEvent[string]

	mu      sync.Mutex
	ctx     context.Context // set by Start; watches begin only then
	nodes   map[string]*nodeWatch
	holders map[types.NamespacedName]string // object → its node
}

type nodeWatch struct {
	informer toolscache.SharedIndexInformer
	cancel   context.CancelFunc // nil until started
	holders  sets.Set[types.NamespacedName]
}

// NewPodWatch returns a PodWatch that lists and watches through kube.
func NewPodWatch(kube kubernetes.Interface) *PodWatch {
	return &PodWatch{
		kube:    kube,
		changed: make(chan event.TypedGenericEvent[string]),
		nodes:   map[string]*nodeWatch{},
		holders: map[types.NamespacedName]string{},
	}
}

// Start runs the watches until ctx ends (a manager.Runnable that runs only
// on the leader, like the controllers that use it).
func (w *PodWatch) Start(ctx context.Context) error {
	w.mu.Lock()
	w.ctx = ctx
	for node, nw := range w.nodes {
		w.run(node, nw)
	}
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	defer w.mu.Unlock()
	for node, nw := range w.nodes {
		if nw.cancel != nil {
			nw.cancel()
		}
		delete(w.nodes, node)
	}
	clear(w.holders)
	watchedNodes.Set(0)
	return nil
}

// NeedLeaderElection: only the leader reconciles, so only it watches.
func (w *PodWatch) NeedLeaderElection() bool { return true }

// Changes delivers node names to the lifecycle controller.
func (w *PodWatch) Changes() <-chan event.TypedGenericEvent[string] { return w.changed }

// Notify announces node on Changes, as a change of its pods would (an
// eviction refused or failed). It returns at once if the watch has not
// started, and when ctx or the watch ends.
func (w *PodWatch) Notify(ctx context.Context, node string) {
	w.mu.Lock()
	wctx := w.ctx
	w.mu.Unlock()
	if wctx == nil {
		return
	}
	select {
	case w.changed <- event.TypedGenericEvent[string]{Object: node}:
	case <-ctx.Done():
	case <-wctx.Done():
	}
}

// Hold makes sure node's pods are watched for the object holder.
func (w *PodWatch) Hold(holder types.NamespacedName, node string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if prev, ok := w.holders[holder]; ok {
		if prev == node {
			return
		}
		w.releaseLocked(holder)
	}
	nw := w.nodes[node]
	if nw == nil {
		nw = &nodeWatch{informer: w.informer(node), holders: sets.New[types.NamespacedName]()}
		w.nodes[node] = nw
		watchedNodes.Set(float64(len(w.nodes)))
		if w.ctx != nil {
			w.run(node, nw)
		}
	}
	nw.holders.Insert(holder)
	w.holders[holder] = node
}

// Release ends holder's interest in its node's pods; the node's watch
// stops when nobody holds it.
func (w *PodWatch) Release(holder types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.releaseLocked(holder)
}

func (w *PodWatch) releaseLocked(holder types.NamespacedName) {
	node, ok := w.holders[holder]
	if !ok {
		return
	}
	delete(w.holders, holder)
	nw := w.nodes[node]
	nw.holders.Delete(holder)
	if nw.holders.Len() > 0 {
		return
	}
	if nw.cancel != nil {
		nw.cancel()
	}
	delete(w.nodes, node)
	watchedNodes.Set(float64(len(w.nodes)))
}

// Pods returns the pods bound to node, and false while the node is not
// watched or its watch has not synced yet (its sync is announced on
// Changes). The pods are shared with the watch: read them, never modify.
func (w *PodWatch) Pods(node string) ([]corev1.Pod, bool) {
	w.mu.Lock()
	nw := w.nodes[node]
	started := nw != nil && nw.cancel != nil
	w.mu.Unlock()
	if !started || !nw.informer.HasSynced() {
		return nil, false
	}
	objs := nw.informer.GetStore().List()
	pods := make([]corev1.Pod, 0, len(objs))
	for _, o := range objs {
		pods = append(pods, *o.(*corev1.Pod))
	}
	return pods, true
}

// informer builds (without starting) the watch of one node's pods.
func (w *PodWatch) informer(node string) toolscache.SharedIndexInformer {
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	pods := w.kube.CoreV1().Pods(metav1.NamespaceAll)
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return pods.Watch(ctx, o)
		},
	}
	// A fake clientset says it cannot stream the initial list.
	inf := toolscache.NewSharedIndexInformer(toolscache.ToListWatcherWithWatchListSemantics(lw, w.kube), &corev1.Pod{}, 0, toolscache.Indexers{})
	// managedFields are never read.
	_ = inf.SetTransform(func(obj any) (any, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			p.ManagedFields = nil
		}
		return obj, nil
	})
	return inf
}

// run starts nw's watch; w.mu is held.
func (w *PodWatch) run(node string, nw *nodeWatch) {
	ctx, cancel := context.WithCancel(w.ctx)
	nw.cancel = cancel
	notify := func() {
		select {
		case w.changed <- event.TypedGenericEvent[string]{Object: node}:
		case <-ctx.Done():
		}
	}
	_, _ = nw.informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(o, n any) {
			if podProgressed(o.(*corev1.Pod), n.(*corev1.Pod)) {
				notify()
			}
		},
		DeleteFunc: func(any) { notify() },
	})
	go nw.informer.RunWithContext(ctx)
	go func() {
		if toolscache.WaitForCacheSync(ctx.Done(), nw.informer.HasSynced) {
			notify()
		}
	}()
}

// podProgressed reports a pod change that can end a wait or a drain step.
func podProgressed(o, n *corev1.Pod) bool {
	return o.Status.Phase != n.Status.Phase || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
}

// podsFrom is a clientset whose pod listing is served from a node's
// watched pods: the drain library lists the node's pods through it at
// every step. Its DaemonSet lookups (one per DaemonSet pod of the node at
// every step, to tell a DaemonSet's pods from orphans) are remembered in
// daemonSets when given, so a drain asks for each DaemonSet once a
// minute instead of at each step; everything else (evictions) goes to
// the API server.
type podsFrom struct {
	kubernetes.Interface
	pods       []corev1.Pod
	daemonSets *daemonSetsSeen
}

func (c podsFrom) CoreV1() typedcorev1.CoreV1Interface {
	return coreV1From{CoreV1Interface: c.Interface.CoreV1(), pods: c.pods}
}

func (c podsFrom) AppsV1() typedappsv1.AppsV1Interface {
	if c.daemonSets == nil {
		return c.Interface.AppsV1()
	}
	return appsV1From{AppsV1Interface: c.Interface.AppsV1(), seen: c.daemonSets}
}

// daemonSetSeenFor is how long a DaemonSet found by a drain is taken to
// exist without asking again. A DaemonSet deleted meanwhile has its pods
// deleted by the garbage collector; until then they are treated as
// DaemonSet pods (left on the node), as kubectl drain would have a moment
// earlier.
const daemonSetSeenFor = time.Minute

// daemonSetsSeen remembers the DaemonSets the drains found, by
// namespace/name, for daemonSetSeenFor (an LRU of at most 4,096).
type daemonSetsSeen struct{ found *utilcache.LRUExpireCache }

func newDaemonSetsSeen(c utilcache.Clock) *daemonSetsSeen {
	return &daemonSetsSeen{found: utilcache.NewLRUExpireCacheWithClock(4096, c)}
}

type appsV1From struct {
	typedappsv1.AppsV1Interface
	seen *daemonSetsSeen
}

func (c appsV1From) DaemonSets(namespace string) typedappsv1.DaemonSetInterface {
	return daemonSetsFrom{DaemonSetInterface: c.AppsV1Interface.DaemonSets(namespace), namespace: namespace, seen: c.seen}
}

type daemonSetsFrom struct {
	typedappsv1.DaemonSetInterface
	namespace string
	seen      *daemonSetsSeen
}

// Get answers from what was found within daemonSetSeenFor (the drain
// library only asks whether the DaemonSet exists), else asks the API
// server and remembers a DaemonSet it finds. Not found is never
// remembered.
func (c daemonSetsFrom) Get(ctx context.Context, name string, opts metav1.GetOptions) (*appsv1.DaemonSet, error) {
	key := c.namespace + "/" + name
	if ds, ok := c.seen.found.Get(key); ok {
		return ds.(*appsv1.DaemonSet).DeepCopy(), nil
	}
	ds, err := c.DaemonSetInterface.Get(ctx, name, opts)
	if err != nil {
		return nil, err
	}
	c.seen.found.Add(key, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: ds.Namespace, Name: ds.Name, UID: ds.UID}}, daemonSetSeenFor)
	return ds, nil
}

type coreV1From struct {
	typedcorev1.CoreV1Interface
	pods []corev1.Pod
}

func (c coreV1From) Pods(namespace string) typedcorev1.PodInterface {
	return podListFrom{PodInterface: c.CoreV1Interface.Pods(namespace), namespace: namespace, pods: c.pods}
}

type podListFrom struct {
	typedcorev1.PodInterface
	namespace string
	pods      []corev1.Pod
}

// List filters the watched pods by namespace, label selector and node;
// a field selector on anything but the node goes to the API server.
func (c podListFrom) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	byLabel, err := labels.Parse(opts.LabelSelector)
	if err != nil {
		return nil, fmt.Errorf("pod selector %q: %w", opts.LabelSelector, err)
	}
	byField, err := fields.ParseSelector(opts.FieldSelector)
	if err != nil {
		return nil, fmt.Errorf("field selector %q: %w", opts.FieldSelector, err)
	}
	for _, r := range byField.Requirements() {
		if r.Field != "spec.nodeName" {
			return c.PodInterface.List(ctx, opts)
		}
	}
	list := &corev1.PodList{}
	for i := range c.pods {
		p := &c.pods[i]
		if (c.namespace == metav1.NamespaceAll || p.Namespace == c.namespace) && byLabel.Matches(labels.Set(p.Labels)) &&
			byField.Matches(fields.Set{"spec.nodeName": p.Spec.NodeName}) {
			list.Items = append(list.Items, *p)
		}
	}
	return list, nil
}
