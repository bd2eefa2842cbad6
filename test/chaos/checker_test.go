package chaos

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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

	mu             sync.Mutex
	nms            map[string]nmState // namespace/name -> state
	nodes          map[string]*corev1.Node
	lastInProgress map[string]time.Time // node -> last time it had an in-progress object
	readySeen      map[string]bool
	suspects       []suspect
	problems       []string
	events         int
	maxInProgress  int
	maxUnavailable int
}

type nmState struct {
	node       string
	inProgress bool
	ready      bool
}

type suspect struct {
	pod, node string
	at        time.Time
}

var nmGVR = schema.GroupVersionResource{Group: "maintenance.nvidia.com", Version: "v1alpha1", Resource: "nodemaintenances"}

func newChecker(c *devcluster.Cluster, k8s client.Client, adminCordoned string) *checker {
	return &checker{cluster: c, k8s: k8s, adminCordoned: adminCordoned,
		nms: map[string]nmState{}, nodes: map[string]*corev1.Node{}, lastInProgress: map[string]time.Time{}, readySeen: map[string]bool{}}
}

func (c *checker) run(ctx context.Context) {
	dyn := dynamic.NewForConfigOrDie(c.cluster.Config)
	dInf := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	nmInf := dInf.ForResource(nmGVR).Informer()
	_, _ = nmInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.onNM(o, false) },
		UpdateFunc: func(_, o any) { c.onNM(o, false) },
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
			if op.DeletionTimestamp == nil && np.DeletionTimestamp != nil && np.Labels["app"] == "train" {
				c.onPodDeleted(np)
			}
		},
	})
	dInf.Start(ctx.Done())
	inf.Start(ctx.Done())
	<-ctx.Done()
}

func (c *checker) onNM(o any, deleted bool) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		if tomb, ok := o.(cache.DeletedFinalStateUnknown); ok {
			u, _ = tomb.Obj.(*unstructured.Unstructured)
		}
		if u == nil {
			return
		}
	}
	key := u.GetNamespace() + "/" + u.GetName()
	c.mu.Lock()
	defer c.mu.Unlock()
	if deleted {
		delete(c.nms, key)
	} else {
		node, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
		st := nmState{node: node}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, raw := range conds {
			m, _ := raw.(map[string]any)
			if m["type"] == "Ready" {
				st.inProgress = m["reason"] != "" && m["reason"] != "Pending"
				st.ready = m["status"] == "True"
			}
		}
		c.nms[key] = st
		if st.ready {
			c.readySeen[key] = true
		}
	}
	c.evaluate()
}

func (c *checker) onNode(n *corev1.Node, deleted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
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
	c.suspects = append(c.suspects, suspect{pod: p.Namespace + "/" + p.Name, node: p.Spec.NodeName, at: time.Now()})
}

// evaluate checks the limits; the caller holds mu.
func (c *checker) evaluate() {
	c.events++
	now := time.Now()
	inProgress := map[string]bool{}
	for _, st := range c.nms {
		if st.inProgress {
			inProgress[st.node] = true
			c.lastInProgress[st.node] = now
		}
	}
	unavailable := map[string]bool{}
	for name := range inProgress {
		if _, ok := c.nodes[name]; ok {
			unavailable[name] = true
		}
	}
	for name, n := range c.nodes {
		if n.Spec.Unschedulable || !devcluster.NodeReady(n) {
			unavailable[name] = true
		}
	}
	c.maxInProgress = max(c.maxInProgress, len(inProgress))
	c.maxUnavailable = max(c.maxUnavailable, len(unavailable))
	if len(inProgress) > maxParallel {
		c.problems = append(c.problems, fmt.Sprintf("%s: %d nodes in maintenance > maxParallelOperations %d", now.Format(time.RFC3339Nano), len(inProgress), maxParallel))
	}
	if len(unavailable) > maxUnavail {
		c.problems = append(c.problems, fmt.Sprintf("%s: %d nodes unavailable > maxUnavailable %d", now.Format(time.RFC3339Nano), len(unavailable), maxUnavail))
	}
}

func (c *checker) readyCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.readySeen)
}

// final checks the end state and resolves pod-deletion suspects: a pod may
// only be evicted from a node that had an in-progress maintenance (seen
// within 2 s of the eviction, for informer ordering).
func (c *checker) final(t *testing.T, ctx context.Context, objects int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.suspects {
		last, ok := c.lastInProgress[s.node]
		if !ok || s.at.Sub(last) > 2*time.Second {
			c.problems = append(c.problems, fmt.Sprintf("pod %s evicted from node %s without an in-progress NodeMaintenance", s.pod, s.node))
		}
	}
	if len(c.readySeen) != objects {
		c.problems = append(c.problems, fmt.Sprintf("%d/%d objects reached Ready", len(c.readySeen), objects))
	}
	nodes, err := c.cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		switch {
		case n.Name == c.adminCordoned && !n.Spec.Unschedulable:
			c.problems = append(c.problems, fmt.Sprintf("node %s was cordoned by an admin and is now schedulable", n.Name))
		case n.Name != c.adminCordoned && n.Spec.Unschedulable:
			c.problems = append(c.problems, fmt.Sprintf("node %s left cordoned", n.Name))
		}
	}
}

func (c *checker) violations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.problems...)
}
