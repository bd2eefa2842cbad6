package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpufleet/gpufleet/internal/devcluster"
)

// checker watches the cluster on its own (client-go informers, no operator
// code) and checks the safety invariants on every event.
type checker struct {
	cluster       *devcluster.Cluster
	k8s           client.Client
	adminCordoned string
	// The resolved limits of the MaintenanceOperatorConfig.
	limitParallel, limitUnavailable int
	// onReady is called (outside the lock) the first time an object is seen Ready.
	onReady func(key string)

	mu             sync.Mutex
	nms            map[string]nmState // namespace/name -> state
	nodes          map[string]*corev1.Node
	drains         map[string]map[string]*window // node -> object -> drain window (server times)
	readySeen      map[string]bool
	notReadySeen   int
	transients     int // suspected violations that fresh reads did not confirm
	suspects       []suspect
	problems       []string
	events         int
	maxInProgress  int
	maxUnavailable int
	// waitRewrites counts changes of a Pending object's wait reason.
	waitRewrites int
	// phases: per object, the phases (Ready condition reason, then
	// Deleting and Gone) in the order first seen, with when.
	phases map[string][]phaseSeen

	// Scheduling latency: when each object was first seen, when it was
	// first seen scheduled, and when slots or budget were released (an
	// object gone, a node uncordoned), all as observed by this watch.
	created   map[string]time.Time
	scheduled map[string]time.Time
	releases  []time.Time
	// podTimes: per node, when workload pods were seen evicted
	// (deletionTimestamp set) and gone.
	podTimes map[string][]podSeen
	nodeOf   map[string]string // object -> node, kept after deletion
	// statusRewrites: status changes that kept the phase, by phase.
	statusRewrites  map[string]int
	rewriteExamples []string
	// evictionPods: per object, status.drain.evictionPods when first seen
	// Ready (the pods its drain had to evict).
	evictionPods map[string]int64
}

type podSeen struct {
	gone bool // else evicted
	at   time.Time
}

type phaseSeen struct {
	phase string
	at    time.Time
}

// enterPhase records a phase the first time it follows another; the
// caller holds mu.
func (c *checker) enterPhase(key, phase string, at time.Time) {
	if c.phases == nil {
		c.phases = map[string][]phaseSeen{}
	}
	seen := c.phases[key]
	if len(seen) > 0 && seen[len(seen)-1].phase == phase {
		return
	}
	c.phases[key] = append(seen, phaseSeen{phase, at})
}

// phaseDurations returns, per phase, how long objects stayed in it (until
// the next phase was seen), sorted.
func (c *checker) phaseDurations() map[string][]time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][]time.Duration{}
	for _, seen := range c.phases {
		for i := 0; i+1 < len(seen); i++ {
			out[seen[i].phase] = append(out[seen[i].phase], seen[i+1].at.Sub(seen[i].at))
		}
	}
	for _, d := range out {
		slices.Sort(d)
	}
	return out
}

// countStatusRewrite counts a status change that kept the phase (the
// Ready condition's reason).
func (c *checker) countStatusRewrite(old, o any) {
	ou, ok1 := old.(*unstructured.Unstructured)
	nu, ok2 := o.(*unstructured.Unstructured)
	if !ok1 || !ok2 {
		return
	}
	oldStatus, _, _ := unstructured.NestedMap(ou.Object, "status")
	newStatus, _, _ := unstructured.NestedMap(nu.Object, "status")
	if equality.Semantic.DeepEqual(oldStatus, newStatus) {
		return
	}
	op, np := readyReason(ou), readyReason(nu)
	if op != np || np == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.statusRewrites == nil {
		c.statusRewrites = map[string]int{}
	}
	c.statusRewrites[np]++
	if len(c.rewriteExamples) < 3 {
		c.rewriteExamples = append(c.rewriteExamples, fmt.Sprintf("%s/%s in %s:\n  before %v\n  after  %v", nu.GetNamespace(), nu.GetName(), np, oldStatus, newStatus))
	}
}

func (c *checker) rewrites() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.statusRewrites)
}

func readyReason(u *unstructured.Unstructured) string {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, raw := range conds {
		if m, _ := raw.(map[string]any); m["type"] == "Ready" {
			r, _ := m["reason"].(string)
			return r
		}
	}
	return ""
}

// recordPod notes a pod of node seen evicted or gone; the caller holds mu.
func (c *checker) recordPod(node string, gone bool) {
	if c.podTimes == nil {
		c.podTimes = map[string][]podSeen{}
	}
	c.podTimes[node] = append(c.podTimes[node], podSeen{gone: gone, at: time.Now()})
}

// drainSteps splits each object's Draining phase (from Draining seen to
// Ready seen) by what its node's pods did meanwhile: "to first eviction",
// "evictions" (first to last pod seen evicted), "pods terminating" (last
// eviction to last pod gone) and "to Ready" (last pod gone to Ready seen).
func (c *checker) drainSteps() map[string][]time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][]time.Duration{}
	for key, seen := range c.phases {
		var from, to time.Time
		for i, p := range seen {
			if p.phase == "Draining" && i+1 < len(seen) && seen[i+1].phase == "Ready" {
				from, to = p.at, seen[i+1].at
			}
		}
		if from.IsZero() {
			continue
		}
		node := c.nodeOf[key]
		var firstEvict, lastEvict, lastGone time.Time
		for _, e := range c.podTimes[node] {
			if e.at.Before(from) || e.at.After(to) {
				continue
			}
			switch {
			case e.gone:
				lastGone = e.at
			case firstEvict.IsZero():
				firstEvict, lastEvict = e.at, e.at
			default:
				lastEvict = e.at
			}
		}
		if firstEvict.IsZero() || lastGone.IsZero() {
			continue
		}
		out["to first eviction"] = append(out["to first eviction"], firstEvict.Sub(from))
		out["evictions"] = append(out["evictions"], lastEvict.Sub(firstEvict))
		out["pods terminating"] = append(out["pods terminating"], lastGone.Sub(lastEvict))
		out["to Ready"] = append(out["to Ready"], to.Sub(lastGone))
	}
	for _, d := range out {
		slices.Sort(d)
	}
	return out
}

type nmState struct {
	node       string
	inProgress bool
	ready      bool
	message    string // of the Ready condition
}

// window is when an object's drain ran, from server-side timestamps:
// status.drain.startTime to the Ready condition's transition.
type window struct{ start, end time.Time }

type suspect struct {
	pod, node string
	// evictedAt is the server's time of the eviction: deletionTimestamp
	// minus the grace period.
	evictedAt time.Time
}

var nmGVR = schema.GroupVersionResource{Group: "maintenance.nvidia.com", Version: "v1alpha1", Resource: "nodemaintenances"}

func newChecker(c *devcluster.Cluster, k8s client.Client, adminCordoned string, limitParallel, limitUnavailable int) *checker {
	return &checker{cluster: c, k8s: k8s, adminCordoned: adminCordoned, limitParallel: limitParallel, limitUnavailable: limitUnavailable,
		nms: map[string]nmState{}, nodes: map[string]*corev1.Node{}, drains: map[string]map[string]*window{}, readySeen: map[string]bool{},
		created: map[string]time.Time{}, scheduled: map[string]time.Time{}}
}

func (c *checker) run(ctx context.Context) {
	dyn := dynamic.NewForConfigOrDie(c.cluster.Config)
	dInf := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	nmInf := dInf.ForResource(nmGVR).Informer()
	_, _ = nmInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { c.onNM(o, false) },
		UpdateFunc: func(old, o any) {
			c.countStatusRewrite(old, o)
			c.onNM(o, false)
		},
		DeleteFunc: func(o any) { c.onNM(o, true) },
	})
	inf := informers.NewSharedInformerFactory(c.cluster.Client, 0)
	nodeInf := inf.Core().V1().Nodes().Informer()
	_, _ = nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.onNode(o.(*corev1.Node), false) },
		UpdateFunc: func(_, o any) { c.onNode(o.(*corev1.Node), false) },
		DeleteFunc: func(o any) {
			if n, ok := o.(*corev1.Node); ok {
				c.onNode(n, true)
			}
		},
	})
	podInf := inf.Core().V1().Pods().Informer()
	_, _ = podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, o any) {
			op, np := old.(*corev1.Pod), o.(*corev1.Pod)
			if op.DeletionTimestamp == nil && np.DeletionTimestamp != nil && np.Namespace == workloadNamespace {
				c.onPodDeleted(np)
			}
		},
		DeleteFunc: func(o any) {
			if tomb, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = tomb.Obj
			}
			if p, ok := o.(*corev1.Pod); ok && p.Namespace == workloadNamespace {
				c.mu.Lock()
				defer c.mu.Unlock()
				c.recordPod(p.Spec.NodeName, true)
			}
		},
	})
	dInf.Start(ctx.Done())
	inf.Start(ctx.Done())
	<-ctx.Done()
}

func (c *checker) onNM(o any, deleted bool) {
	if key, first := c.recordNM(o, deleted); first && c.onReady != nil {
		c.onReady(key)
	}
}

// recordNM records an object's state and evaluates the limits; it reports
// whether the object was seen Ready for the first time.
func (c *checker) recordNM(o any, deleted bool) (key string, firstReady bool) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		if tomb, ok := o.(cache.DeletedFinalStateUnknown); ok {
			u, _ = tomb.Obj.(*unstructured.Unstructured)
		}
		if u == nil {
			return "", false
		}
	}
	key = u.GetNamespace() + "/" + u.GetName()
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if deleted {
		delete(c.nms, key)
		c.releases = append(c.releases, now)
		c.enterPhase(key, "Gone", now)
	} else {
		node, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
		st := nmState{node: node}
		if c.nodeOf == nil {
			c.nodeOf = map[string]string{}
		}
		c.nodeOf[key] = node
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, raw := range conds {
			m, _ := raw.(map[string]any)
			if m["type"] == "Ready" {
				st.inProgress = m["reason"] != "" && m["reason"] != "Pending"
				st.ready = m["status"] == "True"
				st.message, _ = m["message"].(string)
				if r, _ := m["reason"].(string); r != "" {
					c.enterPhase(key, r, now)
				}
			}
		}
		if u.GetDeletionTimestamp() != nil {
			c.enterPhase(key, "Deleting", now)
		}
		if old, ok := c.nms[key]; ok && !old.inProgress && !st.inProgress && old.message != "" && old.message != st.message {
			c.waitRewrites++
		}
		c.nms[key] = st
		if _, ok := c.created[key]; !ok {
			c.created[key] = now
		}
		if _, ok := c.scheduled[key]; !ok && st.inProgress {
			c.scheduled[key] = now
		}
		if st.ready && !c.readySeen[key] {
			c.readySeen[key] = true
			firstReady = true
			if n, ok, _ := unstructured.NestedInt64(u.Object, "status", "drain", "evictionPods"); ok {
				if c.evictionPods == nil {
					c.evictionPods = map[string]int64{}
				}
				c.evictionPods[key] = n
			}
		}
		if start, _, _ := unstructured.NestedString(u.Object, "status", "drain", "startTime"); start != "" {
			if c.drains[node] == nil {
				c.drains[node] = map[string]*window{}
			}
			w := c.drains[node][key]
			if w == nil {
				w = &window{}
				c.drains[node][key] = w
			}
			w.start, _ = time.Parse(time.RFC3339, start)
			for _, raw := range conds {
				m, _ := raw.(map[string]any)
				if m["type"] == "Ready" && m["status"] == "True" {
					w.end, _ = time.Parse(time.RFC3339, fmt.Sprint(m["lastTransitionTime"]))
				}
			}
		}
	}
	c.evaluate()
	return key, firstReady
}

func (c *checker) onNode(n *corev1.Node, deleted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.nodes[n.Name]; old != nil && old.Spec.Unschedulable && (deleted || !n.Spec.Unschedulable) {
		c.releases = append(c.releases, time.Now())
	}
	if deleted {
		delete(c.nodes, n.Name)
	} else {
		c.nodes[n.Name] = n
	}
	c.evaluate()
}

func (c *checker) onPodDeleted(p *corev1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events++
	grace := int64(30)
	if p.DeletionGracePeriodSeconds != nil {
		grace = *p.DeletionGracePeriodSeconds
	}
	c.recordPod(p.Spec.NodeName, false)
	c.suspects = append(c.suspects, suspect{pod: p.Namespace + "/" + p.Name, node: p.Spec.NodeName,
		evictedAt: p.DeletionTimestamp.Add(-time.Duration(grace) * time.Second)})
}

// evaluate checks the limits; the caller holds mu.
func (c *checker) evaluate() {
	c.events++
	now := time.Now()
	inProgress := map[string]bool{}
	for _, st := range c.nms {
		if st.inProgress {
			inProgress[st.node] = true
		}
	}
	// Nodes gpufleet holds or that are cordoned (the admin's cordon counts
	// too); nodes NotReady through no action of gpufleet (the API server
	// restart stops lease renewals) are reported, not counted.
	unavailable := map[string]bool{}
	for name := range inProgress {
		if _, ok := c.nodes[name]; ok {
			unavailable[name] = true
		}
	}
	notReady := 0
	for name, n := range c.nodes {
		if n.Spec.Unschedulable {
			unavailable[name] = true
		}
		if !devcluster.NodeReady(n) {
			notReady++
		}
	}
	c.notReadySeen = max(c.notReadySeen, notReady)
	c.maxInProgress = max(c.maxInProgress, len(inProgress))
	c.maxUnavailable = max(c.maxUnavailable, len(unavailable))
	if len(inProgress) > c.limitParallel || len(unavailable) > c.limitUnavailable {
		// Two informers deliver events in no common order (a node's
		// uncordon can arrive after its object's deletion): confirm from
		// fresh reads before calling it a violation.
		seen := fmt.Sprintf("%s: informers show %d in maintenance (limit %d), %d held or cordoned (limit %d)",
			now.Format(time.RFC3339Nano), len(inProgress), c.limitParallel, len(unavailable), c.limitUnavailable)
		go c.confirm(seen)
	}
}

// confirm re-reads the API server shortly after a suspected violation.
func (c *checker) confirm(seen string) {
	time.Sleep(300 * time.Millisecond)
	ctx := context.Background()
	var nms unstructured.UnstructuredList
	nms.SetAPIVersion("maintenance.nvidia.com/v1alpha1")
	nms.SetKind("NodeMaintenanceList")
	if err := c.k8s.List(ctx, &nms); err != nil {
		return
	}
	nodes, err := c.cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	inProgress := map[string]bool{}
	for _, u := range nms.Items {
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, raw := range conds {
			m, _ := raw.(map[string]any)
			if m["type"] == "Ready" && m["reason"] != "" && m["reason"] != "Pending" {
				node, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
				inProgress[node] = true
			}
		}
	}
	unavailable := map[string]bool{}
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable || inProgress[n.Name] {
			unavailable[n.Name] = true
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(inProgress) > c.limitParallel || len(unavailable) > c.limitUnavailable {
		c.problems = append(c.problems, fmt.Sprintf("%s; confirmed 300ms later: %d in maintenance, %d held or cordoned", seen, len(inProgress), len(unavailable)))
	} else {
		c.transients++
	}
}

func (c *checker) readyCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.readySeen)
}

// final checks the end state and resolves pod-deletion suspects: a pod may
// only be evicted while a drain of its node runs (server timestamps, 1 s
// resolution).
func (c *checker) final(ctx context.Context, t testing.TB, objects int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.suspects {
		ok := false
		for _, w := range c.drains[s.node] {
			end := w.end
			if end.IsZero() {
				end = time.Now()
			}
			if !s.evictedAt.Before(w.start.Add(-time.Second)) && !s.evictedAt.After(end.Add(time.Second)) {
				ok = true
			}
		}
		if !ok {
			c.problems = append(c.problems, fmt.Sprintf("pod %s evicted from node %s at %s outside any drain of that node (%v)",
				s.pod, s.node, s.evictedAt.Format(time.RFC3339), c.drainsOf(s.node)))
		}
	}
	// The requestor's objects (in the workload namespace) all reached
	// Ready; upgrades and repairs are checked by their tests.
	ready := 0
	for key := range c.readySeen {
		if strings.HasPrefix(key, workloadNamespace+"/") {
			ready++
		}
	}
	if ready != objects {
		c.problems = append(c.problems, fmt.Sprintf("%d/%d objects reached Ready", ready, objects))
	}
	nodes, err := c.cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A node whose maintenance is still in progress (a benchmark that
	// stops watching before every repair has ended) is cordoned by it.
	held := map[string]bool{}
	for _, st := range c.nms {
		held[st.node] = held[st.node] || st.inProgress
	}
	for _, n := range nodes.Items {
		switch {
		case n.Name == c.adminCordoned && !n.Spec.Unschedulable:
			c.problems = append(c.problems, fmt.Sprintf("node %s was cordoned by an admin and is now schedulable", n.Name))
		case n.Name != c.adminCordoned && n.Spec.Unschedulable && !held[n.Name]:
			c.problems = append(c.problems, fmt.Sprintf("node %s left cordoned", n.Name))
		}
	}
}

func (c *checker) drainsOf(node string) []string {
	var out []string
	for k, w := range c.drains[node] {
		out = append(out, fmt.Sprintf("%s %s..%s", k, w.start.Format(time.TimeOnly), w.end.Format(time.TimeOnly)))
	}
	return out
}

// sawReady reports whether the checker has seen the object Ready; the
// simulated requestor deletes an object only then, so no Ready is missed
// while the checker's watch reconnects.
func (c *checker) sawReady(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readySeen[key]
}

func (c *checker) violations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.problems...)
}

// latencies returns, per scheduled object, the time from the later of its
// creation and the last release of a slot or budget before it was
// scheduled, to its scheduling: how long a free slot stayed unused.
func (c *checker) latencies() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	rel := slices.Clone(c.releases)
	slices.SortFunc(rel, func(a, b time.Time) int { return a.Compare(b) })
	out := make([]time.Duration, 0, len(c.scheduled))
	for key, at := range c.scheduled {
		from := c.created[key]
		// the last release at or before the scheduling
		if i, _ := slices.BinarySearchFunc(rel, at, func(e, t time.Time) int {
			if e.After(t) {
				return 1
			}
			return -1
		}); i > 0 && rel[i-1].After(from) {
			from = rel[i-1]
		}
		out = append(out, at.Sub(from))
	}
	slices.Sort(out)
	return out
}

// pendingWithReason counts the objects seen Pending with a wait reason.
func (c *checker) pendingWithReason() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, st := range c.nms {
		if !st.inProgress && st.message != "" {
			n++
		}
	}
	return n
}

// opened records that the limits opened at t: a release, and the start of
// the Pending phase of every object still waiting (their time before it
// was the closed limit's, not the engine's).
func (c *checker) opened(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.releases = append(c.releases, t)
	for _, seen := range c.phases {
		if n := len(seen); n > 0 && seen[n-1].phase == "Pending" && seen[n-1].at.Before(t) {
			seen[n-1].at = t
		}
	}
}
