package repair_test

import (
	"context"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/repair"
)

// The tests in this file drive the Isolator's Reconcile directly against
// the real API server, with the simulated DRA driver's ResourceSlices.

// gpuFault creates the GPUFault record of GPU i of node with class (""
// = in service), as the node agent writes it; removed at cleanup.
func gpuFault(t *testing.T, node string, i int, class repairv1.GPUFaultClass) *repairv1.GPUFault {
	t.Helper()
	ref := devcluster.SimGPU(node, i)
	gf := &repairv1.GPUFault{ObjectMeta: metav1.ObjectMeta{Name: agent.GPUFaultName(node, ref.PCIBusID)},
		Spec: repairv1.GPUFaultSpec{NodeName: node, GPU: ref}}
	if err := env.Kube.Create(t.Context(), gf); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), gf) })
	setClass(t, gf, class)
	return gf
}

// setClass writes the record's status as the agent would.
func setClass(t *testing.T, gf *repairv1.GPUFault, class repairv1.GPUFaultClass) {
	t.Helper()
	if err := env.Kube.Get(t.Context(), client.ObjectKeyFromObject(gf), gf); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	gf.Status = repairv1.GPUFaultStatus{Class: class}
	if class != "" {
		gf.Status.Summary = "Xid 48 (Double Bit ECC Error)"
		gf.Status.Faults = []repairv1.GPUFaultEntry{{Code: 48, Class: class, FirstSeen: now, LastSeen: now, Count: 1, Active: true}}
		gf.Status.Occurrences = []metav1.Time{now}
	}
	if err := env.Kube.Status().Update(t.Context(), gf); err != nil {
		t.Fatal(err)
	}
}

func isolate(t *testing.T, iso *repair.Isolator, gf *repairv1.GPUFault) *repairv1.GPUFault {
	t.Helper()
	if _, err := iso.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: gf.Name}}); err != nil {
		t.Fatalf("isolating %s: %v", gf.Name, err)
	}
	got := &repairv1.GPUFault{}
	if err := env.Kube.Get(t.Context(), client.ObjectKeyFromObject(gf), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// taintRule returns the DeviceTaintRule isolating gf, or nil.
func taintRule(t *testing.T, gf *repairv1.GPUFault) *resourcev1.DeviceTaintRule {
	t.Helper()
	r := &resourcev1.DeviceTaintRule{}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Name: "gpufleet-" + gf.Name}, r); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatal(err)
	}
	return r
}

func newIsolator(t *testing.T) (*repair.Isolator, *events.FakeRecorder) {
	t.Helper()
	devtest.NeedCluster(t)
	rec := events.NewFakeRecorder(100)
	return &repair.Isolator{Client: env.Kube, Recorder: rec}, rec
}

func TestIsolatorTaintsOnlyTheFaultyGPUsDevices(t *testing.T) {
	iso, rec := newIsolator(t)
	policy(t, true, ntpRule)
	// Several GPUs at once, on two nodes; a sibling in service.
	three := gpuFault(t, "a-0", 3, repairv1.GPUClassResetGPU)
	five := gpuFault(t, "a-0", 5, repairv1.GPUClassReboot)
	one := gpuFault(t, "b-0", 1, repairv1.GPUClassReplace)
	fine := gpuFault(t, "a-0", 4, "")
	for _, tc := range []struct {
		gf     *repairv1.GPUFault
		pool   string
		device string
		class  string
	}{{three, "a-0", "gpu-3", "ResetGPU"}, {five, "a-0", "gpu-5", "Reboot"}, {one, "b-0", "gpu-1", "Replace"}} {
		got := isolate(t, iso, tc.gf)
		r := taintRule(t, tc.gf)
		if r == nil {
			t.Fatalf("%s: no DeviceTaintRule; isolation note %q", tc.gf.Name, got.Annotations[repair.AnnotationIsolation])
		}
		sel := r.Spec.DeviceSelector
		if ptr.Deref(sel.Driver, "") != devcluster.DRADriver || ptr.Deref(sel.Pool, "") != tc.pool || ptr.Deref(sel.Device, "") != tc.device ||
			r.Spec.Taint.Effect != resourcev1.DeviceTaintEffectNoSchedule || r.Spec.Taint.Key != repair.TaintKey || r.Spec.Taint.Value != tc.class {
			t.Errorf("%s: rule %+v taint %+v", tc.gf.Name, *sel, r.Spec.Taint)
		}
		if len(r.OwnerReferences) != 1 || r.OwnerReferences[0].UID != tc.gf.UID {
			t.Errorf("%s: owner references %+v, want the GPUFault", tc.gf.Name, r.OwnerReferences)
		}
		if note := got.Annotations[repair.AnnotationIsolation]; !strings.Contains(note, "DeviceTaintRule gpufleet-"+tc.gf.Name) {
			t.Errorf("%s: isolation note %q", tc.gf.Name, note)
		}
	}
	isolate(t, iso, fine)
	if r := taintRule(t, fine); r != nil {
		t.Errorf("a GPU in service got a DeviceTaintRule")
	}
	if evs := drain(rec); strings.Count(strings.Join(evs, "\n"), repair.ReasonIsolated) != 3 {
		t.Errorf("events %q, want 3 %s", evs, repair.ReasonIsolated)
	}
	// Converged: a second pass writes nothing and reports nothing.
	before := taintRule(t, three).ResourceVersion
	isolate(t, iso, three)
	if after := taintRule(t, three).ResourceVersion; after != before {
		t.Errorf("a converged pass rewrote the rule (%s -> %s)", before, after)
	}
	if evs := drain(rec); len(evs) != 0 {
		t.Errorf("a converged pass sent events: %q", evs)
	}

	// Back in service: the rule goes, and the note with it.
	setClass(t, three, "")
	got := isolate(t, iso, three)
	if r := taintRule(t, three); r != nil {
		t.Errorf("the rule of a GPU back in service is still there")
	}
	if _, ok := got.Annotations[repair.AnnotationIsolation]; ok {
		t.Errorf("isolation note left on a GPU back in service: %q", got.Annotations[repair.AnnotationIsolation])
	}
	if evs := drain(rec); len(evs) != 1 || !strings.Contains(evs[0], repair.ReasonReturned) {
		t.Errorf("events %q, want one %s", evs, repair.ReasonReturned)
	}

	// The record deleted (a GPU replaced): its rule goes with it.
	if err := env.Kube.Delete(t.Context(), five); err != nil {
		t.Fatal(err)
	}
	isolateGone(t, iso, five.Name)
	if taintRule(t, five) != nil {
		t.Errorf("the DeviceTaintRule of a deleted GPUFault is still there")
	}
}

func isolateGone(t *testing.T, iso *repair.Isolator, name string) {
	t.Helper()
	if _, err := iso.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}); err != nil {
		t.Fatalf("isolating %s: %v", name, err)
	}
}

func TestIsolatorDryRunAndUnselectedNodesAreNotIsolated(t *testing.T) {
	iso, rec := newIsolator(t)
	policy(t, true, ntpRule)
	gf := gpuFault(t, "a-1", 2, repairv1.GPUClassResetGPU)
	isolate(t, iso, gf)
	if taintRule(t, gf) == nil {
		t.Fatal("not isolated under a live policy")
	}
	drain(rec)

	// Dry run: the rule goes; the note says what it would do.
	p := &repairv1.NodeRepairPolicy{}
	if err := env.Kube.Get(t.Context(), types.NamespacedName{Name: "test"}, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.DryRun = true
	if err := env.Kube.Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	got := isolate(t, iso, gf)
	if taintRule(t, gf) != nil {
		t.Errorf("a dry run left the GPU isolated")
	}
	if note := got.Annotations[repair.AnnotationIsolation]; !strings.HasPrefix(note, "dry run (policy test): would taint device gpu.nvidia.com/a-1/gpu-2") {
		t.Errorf("dry-run note %q", note)
	}

	// A policy that does not select the node: nothing, and the note says why.
	p.Spec.DryRun = false
	p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{devcluster.LabelPool: "b"}}
	if err := env.Kube.Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	got = isolate(t, iso, gf)
	if taintRule(t, gf) != nil {
		t.Errorf("a node no policy selects was isolated")
	}
	if note := got.Annotations[repair.AnnotationIsolation]; !strings.Contains(note, "no NodeRepairPolicy selects the node") {
		t.Errorf("note %q", note)
	}
}

func TestIsolatorGPUNotPublishedThroughDRA(t *testing.T) {
	iso, _ := newIsolator(t)
	policy(t, true, ntpRule)
	// A GPU the simulated driver does not publish (no such index, UUID or
	// address on the node): the device plugin's marking is all there is.
	gf := &repairv1.GPUFault{ObjectMeta: metav1.ObjectMeta{Name: "a-2-0000-f0-00-0"},
		Spec: repairv1.GPUFaultSpec{NodeName: "a-2", GPU: repairv1.GPURef{Index: ptr.To[int32](42), UUID: "GPU-not-there", PCIBusID: "0000:f0:00.0"}}}
	if err := env.Kube.Create(t.Context(), gf); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), gf) })
	setClass(t, gf, repairv1.GPUClassResetGPU)
	got := isolate(t, iso, gf)
	if taintRule(t, gf) != nil {
		t.Errorf("a DeviceTaintRule for a device DRA does not publish")
	}
	if note := got.Annotations[repair.AnnotationIsolation]; !strings.HasPrefix(note, "NOT isolated: not published by DRA driver gpu.nvidia.com") {
		t.Errorf("note %q", note)
	}
}

// drain returns the events recorded so far.
func drain(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestIsolatorRestartBetweenItsTwoWrites: an isolator that created the rule
// and stopped before noting it on the record: a fresh one finds the rule,
// writes no second one and notes it.
func TestIsolatorRestartBetweenItsTwoWrites(t *testing.T) {
	iso, rec := newIsolator(t)
	policy(t, true, ntpRule)
	gf := gpuFault(t, "b-2", 7, repairv1.GPUClassResetGPU)
	isolate(t, iso, gf)
	rule := taintRule(t, gf)
	if rule == nil {
		t.Fatal("not isolated")
	}
	drain(rec)
	// Undo the second write, as if the process had stopped before it.
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"repair.gpufleet.dev/isolation":null}}}`))
	if err := env.Kube.Patch(t.Context(), gf, patch); err != nil {
		t.Fatal(err)
	}
	fresh, rec2 := newIsolator(t)
	got := isolate(t, fresh, gf)
	if after := taintRule(t, gf); after == nil || after.UID != rule.UID || after.ResourceVersion != rule.ResourceVersion {
		t.Errorf("the rule was replaced or rewritten: %+v", after)
	}
	if note := got.Annotations[repair.AnnotationIsolation]; !strings.Contains(note, "DeviceTaintRule "+rule.Name) {
		t.Errorf("note %q", note)
	}
	if evs := drain(rec2); len(evs) != 0 {
		t.Errorf("events after the restart: %q", evs)
	}
}

// TestTaintRuleNamesOneDevice: gpufleet's DeviceTaintRule always names the
// driver, the pool and the device; for a device not fully named it writes
// none (an empty or pool-wide selector would taint, with NoExecute evict,
// far more than one GPU).
func TestTaintRuleNamesOneDevice(t *testing.T) {
	gf := &repairv1.GPUFault{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1-0000-18-00-0"}}
	gf.Status.Class = repairv1.GPUClassResetGPU
	for name, tc := range map[string]struct {
		dev repair.Device
		ok  bool
	}{
		"fully named":   {repair.Device{Driver: "gpu.nvidia.com", Pool: "gpu-1", Name: "gpu-3"}, true},
		"no device":     {repair.Device{Driver: "gpu.nvidia.com", Pool: "gpu-1"}, false},
		"no pool":       {repair.Device{Driver: "gpu.nvidia.com", Name: "gpu-3"}, false},
		"no driver":     {repair.Device{Pool: "gpu-1", Name: "gpu-3"}, false},
		"nothing named": {repair.Device{}, false},
	} {
		t.Run(name, func(t *testing.T) {
			rule, err := repair.TaintRule(gf, tc.dev)
			if (err == nil) != tc.ok {
				t.Fatalf("TaintRule: %v, want ok %t", err, tc.ok)
			}
			if err != nil {
				return
			}
			s := rule.Spec.DeviceSelector
			if s == nil || s.Driver == nil || *s.Driver == "" || s.Pool == nil || *s.Pool == "" || s.Device == nil || *s.Device == "" {
				t.Errorf("selector %+v does not name one device", s)
			}
			if rule.Spec.Taint.Effect != resourcev1.DeviceTaintEffectNoSchedule {
				t.Errorf("effect %s, want NoSchedule (pods already running stay until the repair drains them)", rule.Spec.Taint.Effect)
			}
		})
	}
}
