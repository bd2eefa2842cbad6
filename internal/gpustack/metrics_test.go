package gpustack

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/pendingevents"
)

func TestPolicyCollector(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := nvidiav1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	active := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cluster-policy"}, Status: nvidiav1.ClusterPolicyStatus{
		State:      nvidiav1.StateNotReady,
		Conditions: []metav1.Condition{{Type: nvidiav1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: "NodesDegraded"}},
		Components: []nvidiav1.ComponentStatus{
			{Name: "driver", Enabled: true, NodesDesired: 4, NodesReady: 3},
			{Name: "dcgm", Enabled: false},
		},
	}}
	ignored := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "second"}, Status: nvidiav1.ClusterPolicyStatus{State: nvidiav1.StateIgnored}}
	fresh := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "fresh"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects([]client.Object{active, ignored, fresh}...).Build()
	want := `
# HELP gpufleet_gpustack_component_nodes_desired GPU nodes that should run an enabled component of the active ClusterPolicy.
# TYPE gpufleet_gpustack_component_nodes_desired gauge
gpufleet_gpustack_component_nodes_desired{component="driver",policy="cluster-policy"} 4
# HELP gpufleet_gpustack_component_nodes_ready GPU nodes where an enabled component of the active ClusterPolicy runs Ready.
# TYPE gpufleet_gpustack_component_nodes_ready gauge
gpufleet_gpustack_component_nodes_ready{component="driver",policy="cluster-policy"} 3
# HELP gpufleet_gpustack_degraded 1 when a component pod has not been Ready for longer than the degraded threshold on some node (condition Degraded), else 0.
# TYPE gpufleet_gpustack_degraded gauge
gpufleet_gpustack_degraded{policy="cluster-policy"} 1
# HELP gpufleet_gpustack_ready 1 when every enabled component is Ready on every GPU node (ClusterPolicy state ready), else 0.
# TYPE gpufleet_gpustack_ready gauge
gpufleet_gpustack_ready{policy="cluster-policy"} 0
`
	col := &policyCollector{}
	col.Serve(c, nil)
	if err := testutil.CollectAndCompare(col, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	notElected := &policyCollector{}
	notElected.Serve(c, make(chan struct{}))
	if n := testutil.CollectAndCount(notElected); n != 0 {
		t.Errorf("%d series before the election", n)
	}
}

func TestCountingWritesCountsByKindAndVerb(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := nvidiav1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	policy := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	c := countingWrites(fake.NewClientBuilder().WithScheme(scheme).WithObjects(policy).WithStatusSubresource(policy).Build())
	before := map[[2]string]float64{}
	keys := [][2]string{{"Node", "create"}, {"Node", "patch"}, {"Node", "delete"}, {"ClusterPolicy", "patch status"}}
	for _, k := range keys {
		before[k] = testutil.ToFloat64(writes.WithLabelValues(k[0], k[1]))
	}
	total := writeCount.Load()
	ctx := t.Context()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	if err := c.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	if err := c.Patch(ctx, node, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`))); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, node); err != nil {
		t.Fatal(err)
	}
	updated := policy.DeepCopy()
	updated.Status.State = nvidiav1.StateReady
	if err := c.Status().Patch(ctx, updated, client.MergeFrom(policy)); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if got := testutil.ToFloat64(writes.WithLabelValues(k[0], k[1])) - before[k]; got != 1 {
			t.Errorf("gpufleet_gpustack_writes_total{kind=%q,verb=%q} grew by %v, want 1", k[0], k[1], got)
		}
	}
	if got := writeCount.Load() - total; got != 4 {
		t.Errorf("%d writes counted, want 4", got)
	}
}

// A node whose driver fails is one degraded node: its later components
// wait for the driver (not Degraded themselves); a node whose toolkit fails
// after its driver came up is another.
func TestComputeStatusReportsTheFirstFailingComponentPerNode(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{Clock: clocktesting.NewFakePassiveClock(now), DegradedAfter: time.Minute}
	old := now.Add(-10 * time.Minute)
	gpu := func(name string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: applied(gpuNode(nil, ""), NodeLabels(gpuNode(nil, ""), &nvidiav1.ClusterPolicySpec{}))}}
	}
	nodes := &corev1.NodeList{Items: []corev1.Node{gpu("a"), gpu("b"), gpu("c"), gpu("d")}}
	all := func(ready bool) map[string]podState {
		m := map[string]podState{}
		for _, c := range []string{Driver, ContainerToolkit, DevicePlugin, Validator, DCGMExporter, GFD} {
			m[c] = podState{ready: ready, since: old}
		}
		return m
	}
	pods := map[string]map[string]podState{"a": all(true), "b": all(false), "c": all(false)}
	pods["c"][Driver] = podState{ready: true, since: old}
	// d's driver became Ready 5 s ago: its toolkit, created long before,
	// has been able to start for 5 s only — starting, not Degraded.
	pods["d"] = all(false)
	pods["d"][Driver] = podState{ready: true, since: old, readyAt: now.Add(-5 * time.Second)}
	policy := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	status := &nvidiav1.ClusterPolicyStatus{}
	r.computeStatus(policy, status, nodes, pods, pendingevents.New(nil))
	deg := meta.FindStatusCondition(status.Conditions, nvidiav1.ConditionDegraded)
	if deg == nil || deg.Message != "not Ready: container-toolkit on c, driver on b" {
		t.Errorf("Degraded = %+v, want the driver on b and the toolkit on c only", deg)
	}
	if got := testutil.ToFloat64(nodesDegraded.WithLabelValues("p")); got != 2 {
		t.Errorf("gpufleet_gpustack_nodes_degraded = %v, want 2", got)
	}
	for _, cs := range status.Components {
		if cs.Name == ContainerToolkit && !strings.Contains(cs.Message, "d (starting)") {
			t.Errorf("container-toolkit message %q, want d starting", cs.Message)
		}
		if cs.Name == GFD && cs.Message != "b (waiting for driver), c (waiting for container-toolkit), d (waiting for container-toolkit)" {
			t.Errorf("gpu-feature-discovery message %q", cs.Message)
		}
	}
}

// Within StatusInterval of the last write, a change of the component
// counts waits for the next; a change of state is written at once, with
// the resourceVersion it was computed from.
func TestWriteStatusCoalescesCountChanges(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := nvidiav1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	policy := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	c := countingWrites(fake.NewClientBuilder().WithScheme(scheme).WithObjects(policy).WithStatusSubresource(policy).Build())
	clock := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	r := &Reconciler{Client: c, Clock: clock, StatusInterval: 2 * time.Second}
	ctx := t.Context()
	get := func() *nvidiav1.ClusterPolicy {
		p := &nvidiav1.ClusterPolicy{}
		if err := c.Get(ctx, client.ObjectKey{Name: "p"}, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write := func(change func(*nvidiav1.ClusterPolicyStatus)) (time.Duration, bool) {
		p := get()
		st := p.Status.DeepCopy()
		change(st)
		before := writeCount.Load()
		held, err := r.writeStatus(ctx, p, st, pendingevents.New(nil))
		if err != nil {
			t.Fatal(err)
		}
		return held, writeCount.Load() != before
	}
	counts := func(n int32) func(*nvidiav1.ClusterPolicyStatus) {
		return func(s *nvidiav1.ClusterPolicyStatus) {
			s.State = nvidiav1.StateNotReady
			s.Components = []nvidiav1.ComponentStatus{{Name: Driver, Enabled: true, NodesDesired: 4, NodesReady: n}}
		}
	}
	if _, wrote := write(counts(1)); !wrote {
		t.Fatal("first status not written")
	}
	clock.SetTime(clock.Now().Add(500 * time.Millisecond))
	if held, wrote := write(counts(2)); wrote || held != 1500*time.Millisecond {
		t.Errorf("count change 0.5 s after a write: wrote %v, held %s; want held 1.5s", wrote, held)
	}
	if held, wrote := write(func(s *nvidiav1.ClusterPolicyStatus) { counts(4)(s); s.State = nvidiav1.StateReady }); !wrote || held != 0 {
		t.Errorf("state change: wrote %v held %s, want written at once", wrote, held)
	}
	clock.SetTime(clock.Now().Add(2 * time.Second))
	if _, wrote := write(counts(3)); !wrote {
		t.Error("count change after the interval not written")
	}
	// Optimistic lock: a status computed from an older version conflicts.
	stale := get()
	stale.ResourceVersion = "1"
	st := stale.Status.DeepCopy()
	st.State = nvidiav1.StateIgnored
	if _, err := r.writeStatus(ctx, stale, st, pendingevents.New(nil)); !apierrors.IsConflict(err) {
		t.Errorf("status computed from resourceVersion 1: %v, want a conflict", err)
	}
}

// gpufleet_gpustack_nodes_degraded has a series for the active ClusterPolicy
// only: a policy that was deleted, or that another one replaced as the
// active policy, leaves no series behind.
func TestNodesDegradedKeepsNoStaleSeries(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := nvidiav1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	r := &Reconciler{Client: c, Live: c, Clock: clocktesting.NewFakePassiveClock(now), DegradedAfter: time.Minute}
	// One GPU node whose driver has not been Ready for 10 minutes.
	nodes := &corev1.NodeList{Items: []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "a",
		Labels: applied(gpuNode(nil, ""), NodeLabels(gpuNode(nil, ""), &nvidiav1.ClusterPolicySpec{}))}}}}
	pods := map[string]map[string]podState{"a": {Driver: {since: now.Add(-10 * time.Minute)}}}
	degradedIn := func(policy string) {
		t.Helper()
		p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: policy}}
		r.computeStatus(p, &nvidiav1.ClusterPolicyStatus{}, nodes, pods, pendingevents.New(nil))
	}
	series := func() string {
		t.Helper()
		ch := make(chan prometheus.Metric, 10)
		nodesDegraded.Collect(ch)
		close(ch)
		var out []string
		for m := range ch {
			var d dto.Metric
			if err := m.Write(&d); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s=%v", d.GetLabel()[0].GetValue(), d.GetGauge().GetValue()))
		}
		sort.Strings(out)
		return strings.Join(out, " ")
	}

	degradedIn("first")
	if got := series(); got != "first=1" {
		t.Fatalf("series %q, want first=1", got)
	}
	// "first" is deleted: its pass finds no policy.
	if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "first"}}); err != nil {
		t.Fatal(err)
	}
	if got := series(); got != "" {
		t.Errorf("after the policy was deleted: series %q, want none", got)
	}
	// "second" is active, then "third" replaces it (the pass that would
	// find "second" ignored has not run yet).
	degradedIn("second")
	degradedIn("third")
	if got := series(); got != "third=1" {
		t.Errorf("after another policy became active: series %q, want third=1 only", got)
	}
}
