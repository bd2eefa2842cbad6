package maintenance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

func cdNode(name string, labels map[string]string) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func TestComputeDomainWait(t *testing.T) {
	const rackLabel = "example.com/rack"
	nodes := []corev1.Node{
		cdNode("a0", map[string]string{rackLabel: "r1", LabelComputeDomain: "uid-1"}),
		cdNode("a1", map[string]string{rackLabel: "r1", LabelComputeDomain: "uid-1"}),
		cdNode("a2", map[string]string{rackLabel: "r1"}),
		cdNode("a3", map[string]string{rackLabel: "r1", LabelComputeDomain: "uid-2"}),
		cdNode("b0", map[string]string{rackLabel: "r2", LabelComputeDomain: "uid-3"}),
		cdNode("x0", map[string]string{LabelComputeDomain: "uid-4"}), // in no domain
	}
	names := map[string]string{"uid-1": "ml/train", "uid-3": "ml/other"}
	name := func(uid string) string {
		if n, ok := names[uid]; ok {
			return n
		}
		return uid
	}
	tests := map[string]struct {
		domain string
		want   string
	}{
		"two ComputeDomains in the domain, one not named": {domain: "r1",
			want: "domain r1: waiting for its ComputeDomain workload to finish: ComputeDomain ml/train on a0, a1; ComputeDomain uid-2 on a3"},
		"another domain's workload is not waited for": {domain: "r2",
			want: "domain r2: waiting for its ComputeDomain workload to finish: ComputeDomain ml/other on b0"},
		"a domain without a workload": {domain: "r3", want: ""},
	}
	for n, tt := range tests {
		t.Run(n, func(t *testing.T) {
			if got := computeDomainWait(tt.domain, computeDomainNodes(nodes, rackLabel, tt.domain), name); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
	many := []corev1.Node{}
	for i := range 5 {
		many = append(many, cdNode(fmt.Sprintf("n%d", i), map[string]string{rackLabel: "r", LabelComputeDomain: "u"}))
	}
	if got, want := computeDomainWait("r", computeDomainNodes(many, rackLabel, "r"), name),
		"domain r: waiting for its ComputeDomain workload to finish: ComputeDomain u on n0, n1, n2 and 2 more"; got != want {
		t.Errorf("many nodes:\n got %q\nwant %q", got, want)
	}
}

// cdReader answers ComputeDomain metadata lists, counting them.
type cdReader struct {
	client.Reader
	items []metav1.PartialObjectMetadata
	err   error
	lists int
}

func (r *cdReader) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	r.lists++
	if r.err != nil {
		return r.err
	}
	l, ok := list.(*metav1.PartialObjectMetadataList)
	if !ok || l.GroupVersionKind() != maintenancev1.ComputeDomainListGVK {
		return fmt.Errorf("unexpected list %T %v", list, list.GetObjectKind().GroupVersionKind())
	}
	l.Items = r.items
	return nil
}

func TestComputeDomainNames(t *testing.T) {
	cd := func(ns, name, uid string) metav1.PartialObjectMetadata {
		return metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
	}
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	r := &cdReader{items: []metav1.PartialObjectMetadata{cd("ml", "train", "uid-1")}}
	c := &ComputeDomainNames{Reader: r, Clock: clk}
	ctx := t.Context()
	if got := c.Name(ctx, "uid-1"); got != "ml/train" {
		t.Errorf("uid-1 = %q", got)
	}
	if got := c.Name(ctx, "uid-1"); got != "ml/train" || r.lists != 1 {
		t.Errorf("a known UID is listed again: %q, %d lists", got, r.lists)
	}
	// An unknown UID is looked up at most once per computeDomainRelist.
	r.items = append(r.items, cd("ml", "late", "uid-2"))
	clk.Step(time.Second)
	if got := c.Name(ctx, "uid-2"); got != "uid-2" || r.lists != 1 {
		t.Errorf("within the relist bound: %q after %d lists, want the UID and no list", got, r.lists)
	}
	clk.Step(computeDomainRelist)
	if got := c.Name(ctx, "uid-2"); got != "ml/late" || r.lists != 2 {
		t.Errorf("after the relist bound: %q after %d lists", got, r.lists)
	}
	// The CRD is not installed (or the list is refused): the UID, no error.
	gone := &cdReader{err: &meta.NoKindMatchError{GroupKind: maintenancev1.ComputeDomainListGVK.GroupKind()}}
	c = &ComputeDomainNames{Reader: gone, Clock: clk}
	if got := c.Name(ctx, "uid-9"); got != "uid-9" {
		t.Errorf("without the CRD: %q", got)
	}
	refused := &cdReader{err: errors.New("forbidden")}
	c = &ComputeDomainNames{Reader: refused, Clock: clk}
	if got := c.Name(ctx, "uid-9"); got != "uid-9" {
		t.Errorf("refused: %q", got)
	}
	var none *ComputeDomainNames
	if got := none.Name(ctx, "uid-9"); got != "uid-9" {
		t.Errorf("nil: %q", got)
	}
}

// TestDirectWaitForComputeDomains: with waitForComputeDomains, a node's
// maintenance waits (within the timeout) while a ComputeDomain's workload
// runs on a node of its domain, says which, and goes on when the driver's
// label is gone; another domain's workload, or the setting off, holds
// nothing.
func TestDirectWaitForComputeDomains(t *testing.T) {
	d := newDirectEnv(t)
	const rackLabel = "test.gpufleet.dev/cd-rack"
	nodeA, nodeB, nodeC := "gpu-005", "gpu-006", "gpu-007"
	for _, n := range []string{nodeA, nodeB, nodeC} {
		d.useNode(t, n)
	}
	label := func(node string, kv map[string]*string) {
		t.Helper()
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": kv}})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.c.Patch(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Error(err)
		}
	}
	label(nodeA, map[string]*string{rackLabel: ptr.To("r1")})
	label(nodeB, map[string]*string{rackLabel: ptr.To("r1"), LabelComputeDomain: ptr.To("uid-train")})
	label(nodeC, map[string]*string{rackLabel: ptr.To("r2"), LabelComputeDomain: ptr.To("uid-other")})
	t.Cleanup(func() {
		for _, n := range []string{nodeA, nodeB, nodeC} {
			label(n, map[string]*string{rackLabel: nil, LabelComputeDomain: nil})
		}
	})
	cfg := &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: directNS, Name: maintenancev1.DefaultConfigName},
		Spec: maintenancev1.MaintenanceOperatorConfigSpec{Domains: &maintenancev1.MaintenanceDomains{
			NodeLabel: rackLabel, WaitForComputeDomains: true}},
	}
	if err := d.c.Create(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.c.Delete(context.Background(), cfg) })
	// The ComputeDomain's name, as the API would answer (the local
	// cluster has no ComputeDomain CRD; TestComputeDomainNames covers the
	// lookup).
	d.r.ComputeDomains = &ComputeDomainNames{Clock: d.clock, Reader: &cdReader{items: []metav1.PartialObjectMetadata{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train", UID: "uid-train"}}}}}

	const timeout = 60 * time.Second
	key := d.admit(t, "cd-wait", nodeA, func(nm *maintenancev1.NodeMaintenance) {
		nm.Spec.WaitForPodCompletion = &maintenancev1.WaitForPodCompletionSpec{PodSelector: "app=none", TimeoutSeconds: ptr.To(int32(timeout / time.Second))}
	})
	d.reconcile(t, key) // Cordon
	d.waitPodsSynced(t, nodeA)
	d.reconcile(t, key) // enter WaitForPodCompletion
	d.reconcile(t, key) // wait: no pod, but the domain's ComputeDomain
	nm := d.get(t, key)
	wantPhase(t, nm, maintenancev1.PhaseWaitForPodCompletion)
	want := "domain r1: waiting for its ComputeDomain workload to finish: ComputeDomain ml/train on " + nodeB
	if c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady); c == nil || c.Message != want {
		t.Fatalf("Ready condition %+v, want the message %q", c, want)
	}
	if len(nm.Status.WaitForCompletion) != 0 {
		t.Errorf("waitForCompletion lists pods only: %v", nm.Status.WaitForCompletion)
	}
	rv := nm.ResourceVersion
	d.reconcile(t, key) // nothing changed: nothing written
	if got := d.get(t, key).ResourceVersion; got != rv {
		t.Errorf("an unchanged wait wrote the object (%s -> %s)", rv, got)
	}

	// The workload ends: the driver removes its label; the drain follows.
	label(nodeB, map[string]*string{LabelComputeDomain: nil})
	d.reconcile(t, key)
	wantPhase(t, d.get(t, key), maintenancev1.PhaseDraining)
	d.removeNM(t, key)

	// The timeout bounds the wait, with a Warning that names the workload.
	label(nodeB, map[string]*string{LabelComputeDomain: ptr.To("uid-train")})
	d.events()
	key2 := d.admit(t, "cd-timeout", nodeA, func(nm *maintenancev1.NodeMaintenance) {
		nm.Spec.WaitForPodCompletion = &maintenancev1.WaitForPodCompletionSpec{PodSelector: "app=none", TimeoutSeconds: ptr.To(int32(timeout / time.Second))}
	})
	d.reconcile(t, key2) // Cordon
	d.waitPodsSynced(t, nodeA)
	d.reconcile(t, key2) // enter WaitForPodCompletion
	d.reconcile(t, key2)
	got := d.get(t, key2)
	wantPhase(t, got, maintenancev1.PhaseWaitForPodCompletion)
	d.events()
	d.clock.SetTime(got.Status.WaitForCompletionStartTime.Add(timeout))
	d.reconcile(t, key2)
	wantPhase(t, d.get(t, key2), maintenancev1.PhaseDraining)
	evs := d.events()
	if len(evs) == 0 || !strings.HasPrefix(evs[0], "Warning PodCompletionTimeout") || !strings.Contains(evs[0], "ComputeDomain ml/train on "+nodeB) {
		t.Errorf("events at the timeout: %v", evs)
	}

	// The setting off: the same workload holds nothing.
	cfg.Spec.Domains.WaitForComputeDomains = false
	if err := d.c.Update(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	d.events()
	key3 := d.admit(t, "cd-off", nodeC, func(nm *maintenancev1.NodeMaintenance) {
		nm.Spec.WaitForPodCompletion = &maintenancev1.WaitForPodCompletionSpec{PodSelector: "app=none"}
	})
	d.reconcile(t, key3)
	d.waitPodsSynced(t, nodeC)
	d.reconcile(t, key3)
	d.reconcile(t, key3)
	if diff := cmp.Diff(string(maintenancev1.PhaseDraining), string(d.get(t, key3).Phase())); diff != "" {
		t.Errorf("without waitForComputeDomains (-want +got):\n%s", diff)
	}
}

// TestSnapshotComputeDomains: the scheduler's snapshot names a node's
// ComputeDomain only with spec.domains and only for a node in a domain.
func TestSnapshotComputeDomains(t *testing.T) {
	const rackLabel = "example.com/rack"
	nodes := &corev1.NodeList{Items: []corev1.Node{
		cdNode("a0", map[string]string{rackLabel: "r1", LabelComputeDomain: "uid-1"}),
		cdNode("a1", map[string]string{rackLabel: "r1"}),
		cdNode("x0", map[string]string{LabelComputeDomain: "uid-2"}),
	}}
	name := func(uid string) string { return "ml/" + uid }
	withDomains, err := CompileConfig(&maintenancev1.MaintenanceOperatorConfigSpec{Domains: &maintenancev1.MaintenanceDomains{NodeLabel: rackLabel}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, n := range snapshot(nodes, &maintenancev1.NodeMaintenanceList{}, &withDomains, name, nil).Nodes {
		got[n.Name] = n.Domain + "|" + n.ComputeDomain
	}
	if diff := cmp.Diff(map[string]string{"a0": "r1|ml/uid-1", "a1": "r1|", "x0": "|"}, got); diff != "" {
		t.Errorf("with domains (-want +got):\n%s", diff)
	}
	for _, n := range snapshot(nodes, &maintenancev1.NodeMaintenanceList{}, &Config{}, name, nil).Nodes {
		if n.Domain != "" || n.ComputeDomain != "" {
			t.Errorf("without domains: %+v", n)
		}
	}
}
