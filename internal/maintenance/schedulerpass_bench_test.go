package maintenance

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// cachedLists serves the node and NodeMaintenance lists from fixed
// slices, as the informer cache does with UnsafeDisableDeepCopy (no copy,
// no conversion): what a pass costs is then the scheduler's own work.
type cachedLists struct {
	client.Client
	nodes *corev1.NodeList
	nms   *maintenancev1.NodeMaintenanceList
	// statusWrites counts the status writes of the pass (answered without
	// doing anything; a pass sends them in parallel).
	statusWrites atomic.Int64
}

func (c *cachedLists) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	switch l := list.(type) {
	case *corev1.NodeList:
		*l = *c.nodes
	case *maintenancev1.NodeMaintenanceList:
		*l = *c.nms
	default:
		return c.Client.List(ctx, list, opts...)
	}
	return nil
}

func (c *cachedLists) Status() client.SubResourceWriter { return nopStatus{c} }

type nopStatus struct{ c *cachedLists }

func (s nopStatus) Create(context.Context, client.Object, client.Object, ...client.SubResourceCreateOption) error {
	return nil
}
func (s nopStatus) Update(context.Context, client.Object, ...client.SubResourceUpdateOption) error {
	s.c.statusWrites.Add(1)
	return nil
}
func (s nopStatus) Patch(context.Context, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
	s.c.statusWrites.Add(1)
	return nil
}
func (s nopStatus) Apply(context.Context, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
	return nil
}

// scaleScheduler builds the scheduler of the 10,000-node rollout of
// `make bench-scale`: nodes in pools, 1,000 NodeMaintenance objects of
// three requestors, inProgress of them under way (limit 50 in all and 4
// per pool, a window open all day), the rest Pending with their wait
// reasons already written (the steady state of a rollout).
func scaleScheduler(tb testing.TB, nNodes, pools, objects, inProgress int) (*Scheduler, *cachedLists) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = maintenancev1.AddToScheme(scheme)
	nodes := &corev1.NodeList{}
	for i := range nNodes {
		nodes.Items = append(nodes.Items, corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-%05d", i), ResourceVersion: "1", Labels: map[string]string{
				"gpufleet.dev/pool": fmt.Sprintf("pool-%02d", i%pools), "nvidia.com/gpu.present": "true", "kubernetes.io/hostname": fmt.Sprintf("gpu-%05d", i)}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
		})
	}
	nms := &maintenancev1.NodeMaintenanceList{}
	step := max(nNodes/objects, 1)
	for i := range objects {
		nm := maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("nm-%05d", i), ResourceVersion: "1",
				CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(i) * time.Millisecond))},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: fmt.Sprintf("requestor-%d.example.com", i%3), NodeName: nodes.Items[(i*step)%nNodes].Name},
		}
		if i < inProgress {
			nm.Finalizers = []string{maintenancev1.Finalizer}
			setPhase(&nm, maintenancev1.PhaseDraining, "draining", t0)
			nodes.Items[(i*step)%nNodes].Spec.Unschedulable = true
		} else {
			setPhase(&nm, maintenancev1.PhasePending, "waiting to be scheduled", t0)
		}
		nms.Items = append(nms.Items, nm)
	}
	mpo, mu, pm := intstr.FromInt32(50), intstr.FromInt32(51), intstr.FromInt32(4)
	cfg := &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: maintenancev1.DefaultConfigName},
		Spec: maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: &mpo, MaxUnavailable: &mu,
			MaintenanceWindows: []maintenancev1.MaintenanceWindow{{Name: "daily", Schedule: "0 0 * * *", Duration: metav1.Duration{Duration: 24 * time.Hour}}}},
	}
	for p := range pools {
		name := fmt.Sprintf("pool-%02d", p)
		cfg.Spec.Pools = append(cfg.Spec.Pools, maintenancev1.MaintenancePool{Name: name, MaxParallelOperations: ptr.To(pm),
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"gpufleet.dev/pool": name}}})
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(cfg).Build()
	c := &cachedLists{Client: api, nodes: nodes, nms: nms}
	clk := clocktesting.NewFakeClock(t0.Add(time.Hour))
	s := &Scheduler{Client: c, Namespace: "ops", Clock: clk, Recorder: events.NewFakeRecorder(1000),
		Reasons: &WaitReasons{Client: c, Clock: clk}}
	// Write the wait reasons the first pass finds into the cached objects:
	// the passes measured then find every reason already written.
	if _, err := s.Reconcile(context.Background(), reconcile.Request{}); err != nil {
		tb.Fatal(err)
	}
	s.Reasons.mu.Lock()
	for i := range nms.Items {
		nm := &nms.Items[i]
		if r, ok := s.Reasons.want[client.ObjectKeyFromObject(nm)]; ok {
			setCondition(nm, maintenancev1.ConditionTypeReady, metav1.ConditionFalse, string(maintenancev1.PhasePending), r, t0)
		}
	}
	s.Reasons.mu.Unlock()
	s.scheduled = scheduledRecord{}
	c.statusWrites.Store(0)
	return s, c
}

// BenchmarkSchedulerPass is one scheduling pass at 1,000, 3,000 and 10,000
// nodes with a NodeMaintenance on every tenth (16 pools): every slot taken
// (the pass a heartbeat-free change brings), and with one slot free (the
// pass of a rollout: one object scheduled). The writes are answered at
// once, so the figure is the operator's own CPU for a pass: its growth
// with the fleet is the pass's.
func BenchmarkSchedulerPass(b *testing.B) {
	for _, size := range []struct{ nodes, objects, inProgress int }{
		{1000, 100, 50}, {1000, 100, 49}, {3000, 300, 50}, {3000, 300, 49}, {10000, 1000, 50}, {10000, 1000, 49},
	} {
		nodes, objects, inProgress := size.nodes, size.objects, size.inProgress
		b.Run(fmt.Sprintf("nodes=%d/objects=%d/inProgress=%d", nodes, objects, inProgress), func(b *testing.B) {
			s, c := scaleScheduler(b, nodes, 16, objects, inProgress)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				s.scheduled = scheduledRecord{}
				if _, err := s.Reconcile(ctx, reconcile.Request{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(c.statusWrites.Load())/float64(b.N), "writes/pass")
		})
	}
}

// TestSchedulerMatchesPoolsOfChangedNodesOnly: a pass matches against the
// pools' selectors only the nodes that changed since the last pass (every
// node again when the pools change), and a changed node's new pools apply.
func TestSchedulerMatchesPoolsOfChangedNodesOnly(t *testing.T) {
	s, c := scaleScheduler(t, 100, 4, 20, 5)
	ctx := context.Background()
	pass := func() {
		t.Helper()
		s.scheduled = scheduledRecord{}
		if _, err := s.Reconcile(ctx, reconcile.Request{}); err != nil {
			t.Fatal(err)
		}
	}
	if s.pools.computed != 100 {
		t.Fatalf("first pass matched %d nodes, want 100", s.pools.computed)
	}
	pass()
	if s.pools.computed != 100 {
		t.Errorf("a pass with no node changed matched %d nodes again", s.pools.computed-100)
	}
	n := &c.nodes.Items[7]
	n.ResourceVersion, n.Labels["gpufleet.dev/pool"] = "2", "pool-00"
	pass()
	if s.pools.computed != 101 {
		t.Errorf("one node changed: %d nodes matched again, want 1", s.pools.computed-100)
	}
	if got := s.pools.nodes[n.Name].pools; len(got) != 1 || got[0] != "pool-00" {
		t.Errorf("the changed node's pools: %v, want [pool-00]", got)
	}
	c.nodes.Items = c.nodes.Items[:99] // a node deleted
	pass()
	if len(s.pools.nodes) != 99 {
		t.Errorf("%d nodes remembered after one of 100 was deleted, want 99", len(s.pools.nodes))
	}
	var cfg maintenancev1.MaintenanceOperatorConfig
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ops", Name: maintenancev1.DefaultConfigName}, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Spec.Pools = cfg.Spec.Pools[:2]
	if err := c.Update(ctx, &cfg); err != nil {
		t.Fatal(err)
	}
	pass()
	if s.pools.computed != 101+99 {
		t.Errorf("the pools changed: %d nodes matched again, want 99", s.pools.computed-101)
	}
}
