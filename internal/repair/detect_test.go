package repair

import (
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

var ntp = repairv1.Rule{Name: "ntp", ConditionType: "NTPProblem", Status: "True", ThresholdSeconds: 10,
	Actions: []repairv1.Action{repairv1.ActionRestartNTP}}

// faultyNode is a node of pool with an NTP fault seen since `since` (zero:
// not yet seen by gpufleet).
func faultyNode(name, pool string, since time.Time) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{DefaultPoolLabel: pool}}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: "NTPProblem", Status: corev1.ConditionTrue}}
	if !since.IsZero() {
		data, _ := json.Marshal(map[string]string{"ntp": since.Format(time.RFC3339)})
		n.Annotations = map[string]string{annotationFaults: string(data)}
	}
	return n
}

func healthyNode(name, pool string) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{DefaultPoolLabel: pool}}}
}

func testPolicy(mut func(*repairv1.NodeRepairPolicySpec)) *repairv1.NodeRepairPolicy {
	p := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 1},
		Spec: repairv1.NodeRepairPolicySpec{Rules: []repairv1.Rule{ntp}, AllowReboot: true}}
	if mut != nil {
		mut(&p.Spec)
	}
	return p
}

// created summarises Detect's creations as node=kind.
func created(d Detection) []string {
	var out []string
	for _, r := range d.Create {
		kind := "repair"
		switch {
		case r.Spec.DryRun:
			kind = "dryrun"
		case r.Spec.IgnoreReason != "":
			kind = "ignore"
		}
		out = append(out, r.Spec.NodeName+"="+kind)
	}
	sort.Strings(out)
	return out
}

func record(node string, since time.Time, mut func(*repairv1.NodeRepair)) repairv1.NodeRepair {
	r := repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: node + "-x"},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Policy: "p", Fault: repairv1.Fault{Rule: "ntp", Since: metav1.NewTime(since)}}}
	if mut != nil {
		mut(&r)
	}
	return r
}

func TestDetect(t *testing.T) {
	since := t0.Add(-time.Minute) // past the 10 s threshold
	held := maintenancev1.NodeMaintenance{Spec: maintenancev1.NodeMaintenanceSpec{NodeName: "a-1", RequestorID: "human.example.com"}}
	held.Status.Conditions = []metav1.Condition{{Type: maintenancev1.ConditionTypeReady, Reason: string(maintenancev1.PhaseDraining)}}
	deleting := faultyNode("a-0", "a", since)
	deleting.DeletionTimestamp = ptr.To(metav1.NewTime(t0))
	tests := map[string]struct {
		policy       *repairv1.NodeRepairPolicy
		nodes        []corev1.Node
		repairs      []repairv1.NodeRepair
		maintenances []maintenancev1.NodeMaintenance
		want         []string
	}{
		"a fault past its threshold starts one repair per pool": {
			policy: testPolicy(nil),
			nodes:  []corev1.Node{faultyNode("a-0", "a", since), faultyNode("a-1", "a", since), faultyNode("b-0", "b", since)},
			want:   []string{"a-0=repair"},
		},
		"a fault before its threshold starts nothing": {
			policy: testPolicy(nil),
			nodes:  []corev1.Node{faultyNode("a-0", "a", t0.Add(-5*time.Second))},
		},
		"a dry run records each fault once": {
			policy: testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.DryRun = true }),
			nodes:  []corev1.Node{faultyNode("a-0", "a", since)},
			want:   []string{"a-0=dryrun"},
		},
		"a dry run does not record the same fault again": {
			policy:  testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.DryRun = true }),
			nodes:   []corev1.Node{faultyNode("a-0", "a", since)},
			repairs: []repairv1.NodeRepair{record("a-0", since, func(r *repairv1.NodeRepair) { r.Spec.DryRun = true; r.Status.Phase = repairv1.PhaseIgnored })},
		},
		"a dry-run record does not hold its pool, nor its phase": {
			policy: testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.DryRun = true }),
			nodes:  []corev1.Node{faultyNode("a-0", "a", since), faultyNode("a-1", "a", since)},
			// a-0's record is just created (no phase yet).
			repairs: []repairv1.NodeRepair{record("a-0", since, func(r *repairv1.NodeRepair) { r.Spec.DryRun = true })},
			want:    []string{"a-1=dryrun"},
		},
		"a fault that came back is recorded again in a dry run": {
			policy:  testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.DryRun = true }),
			nodes:   []corev1.Node{faultyNode("a-0", "a", since)},
			repairs: []repairv1.NodeRepair{record("a-0", since.Add(-time.Hour), func(r *repairv1.NodeRepair) { r.Spec.DryRun = true })},
			want:    []string{"a-0=dryrun"},
		},
		"leaving dry run repairs a fault the dry run recorded": {
			policy:  testPolicy(nil),
			nodes:   []corev1.Node{faultyNode("a-0", "a", since)},
			repairs: []repairv1.NodeRepair{record("a-0", since, func(r *repairv1.NodeRepair) { r.Spec.DryRun = true; r.Status.Phase = repairv1.PhaseIgnored })},
			want:    []string{"a-0=repair"},
		},
		"nodes being deleted or held by another requestor are ignored, all at once": {
			policy:       testPolicy(nil),
			nodes:        []corev1.Node{deleting, faultyNode("a-1", "a", since), faultyNode("a-2", "a", since)},
			maintenances: []maintenancev1.NodeMaintenance{held},
			want:         []string{"a-0=ignore", "a-1=ignore", "a-2=repair"},
		},
		"an ignored fault is recorded once": {
			policy:       testPolicy(nil),
			nodes:        []corev1.Node{faultyNode("a-1", "a", since)},
			maintenances: []maintenancev1.NodeMaintenance{held},
			// Just created: the repairer has not written its phase.
			repairs: []repairv1.NodeRepair{record("a-1", since, func(r *repairv1.NodeRepair) { r.Spec.IgnoreReason = "held" })},
		},
		"an ignore record does not hold the pool": {
			policy:       testPolicy(nil),
			nodes:        []corev1.Node{faultyNode("a-1", "a", since), faultyNode("a-2", "a", since)},
			maintenances: []maintenancev1.NodeMaintenance{held},
			repairs:      []repairv1.NodeRepair{record("a-1", since, func(r *repairv1.NodeRepair) { r.Spec.IgnoreReason = "held" })},
			want:         []string{"a-2=repair"},
		},
		"a node no longer held is repaired after having been ignored": {
			policy:  testPolicy(nil),
			nodes:   []corev1.Node{faultyNode("a-1", "a", since)},
			repairs: []repairv1.NodeRepair{record("a-1", since, func(r *repairv1.NodeRepair) { r.Spec.IgnoreReason = "held"; r.Status.Phase = repairv1.PhaseIgnored })},
			want:    []string{"a-1=repair"},
		},
		"a repair created but not yet started holds its pool": {
			policy:  testPolicy(nil),
			nodes:   []corev1.Node{faultyNode("a-0", "a", since), faultyNode("a-1", "a", since)},
			repairs: []repairv1.NodeRepair{record("a-0", since, nil)},
		},
		"a repairing node is not repaired twice": {
			policy:  testPolicy(nil),
			nodes:   []corev1.Node{faultyNode("a-0", "a", since)},
			repairs: []repairv1.NodeRepair{record("a-0", since, func(r *repairv1.NodeRepair) { r.Status.Phase = repairv1.PhaseRepairing })},
		},
		"a reboot another controller asked for holds its node and pool like a repair": {
			policy: testPolicy(nil),
			nodes:  []corev1.Node{faultyNode("a-0", "a", since), faultyNode("a-1", "a", since)},
			repairs: []repairv1.NodeRepair{record("a-0", since, func(r *repairv1.NodeRepair) {
				r.Spec.Policy, r.Spec.Requestor, r.Status.Phase = "", "driver-upgrade.gpufleet.nvidia.com", repairv1.PhaseRepairing
			})},
		},
		"a failed reboot another controller asked for suspends no pool": {
			policy: testPolicy(nil),
			nodes:  []corev1.Node{healthyNode("x-0", "x"), faultyNode("a-1", "a", since)},
			repairs: []repairv1.NodeRepair{record("b-9", since, func(r *repairv1.NodeRepair) {
				r.Spec.Policy, r.Spec.Requestor, r.Spec.Pool, r.Status.Phase = "", "driver-upgrade.gpufleet.nvidia.com", "a", repairv1.PhaseRecoveryFailed
			})},
			want: []string{"a-1=repair"},
		},
		"a paused policy starts nothing but still ignores": {
			policy:       testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.Paused = true }),
			nodes:        []corev1.Node{faultyNode("a-1", "a", since), faultyNode("b-0", "b", since)},
			maintenances: []maintenancev1.NodeMaintenance{held},
			want:         []string{"a-1=ignore"},
		},
		"a deleted maintenance no longer holds its node": {
			policy: testPolicy(nil),
			nodes:  []corev1.Node{faultyNode("a-1", "a", since)},
			maintenances: func() []maintenancev1.NodeMaintenance {
				m := *held.DeepCopy()
				m.DeletionTimestamp = ptr.To(metav1.NewTime(t0))
				return []maintenancev1.NodeMaintenance{m}
			}(),
			want: []string{"a-1=repair"},
		},
		"gpufleet's own maintenance of a node does not make it ignored": {
			policy: testPolicy(nil),
			nodes:  []corev1.Node{faultyNode("a-1", "a", since)},
			maintenances: func() []maintenancev1.NodeMaintenance {
				m := *held.DeepCopy()
				m.Spec.RequestorID = Requestor
				return []maintenancev1.NodeMaintenance{m}
			}(),
			want: []string{"a-1=repair"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := Detect(DetectInput{Policy: tc.policy, Nodes: tc.nodes, Repairs: tc.repairs, Maintenances: tc.maintenances, Now: t0})
			if diff := cmp.Diff(tc.want, created(d)); diff != "" {
				t.Errorf("created (-want +got):\n%s", diff)
			}
			names := map[string]bool{}
			for _, r := range d.Create {
				if names[r.Name] {
					t.Errorf("two NodeRepairs named %s", r.Name)
				}
				names[r.Name] = true
			}
		})
	}
}

// TestDetectDryRunIsQuietWhileTheFaultPersists replays what the detector
// sees pass after pass: a persistent fault in a dry run is recorded once.
func TestDetectDryRunIsQuietWhileTheFaultPersists(t *testing.T) {
	policy := testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.DryRun = true })
	node := faultyNode("a-0", "a", time.Time{})
	var repairs []repairv1.NodeRepair
	for i := range 60 {
		now := t0.Add(time.Duration(i) * time.Second)
		d := Detect(DetectInput{Policy: policy, Nodes: []corev1.Node{node}, Repairs: repairs, Now: now})
		if tracked, ok := d.Tracked["a-0"]; ok {
			data, _ := json.Marshal(map[string]string{"ntp": tracked["ntp"].Format(time.RFC3339)})
			node.Annotations = map[string]string{annotationFaults: string(data)}
		}
		for _, r := range d.Create {
			repairs = append(repairs, *r)
		}
		policy.Status = d.Status
	}
	if len(repairs) != 1 {
		t.Fatalf("%d records in 60 passes of a persistent fault, want 1", len(repairs))
	}
	if !repairs[0].Spec.DryRun || repairs[0].Spec.Fault.Since.Time != t0 {
		t.Errorf("record %+v, want a dry run of the fault seen at %s", repairs[0].Spec, t0)
	}
}

func TestDetectSuspensionLiftsWhenTheFaultClears(t *testing.T) {
	failed := record("a-0", t0.Add(-time.Hour), func(r *repairv1.NodeRepair) {
		r.Spec.Pool = "a"
		r.Status.Phase = repairv1.PhaseRecoveryFailed
	})
	policy := testPolicy(nil)
	policy.Status.SuspendedPools = []repairv1.SuspendedPool{{Pool: "a", Node: "a-0"}}
	// Still faulty: the pool stays suspended and a-1 waits.
	d := Detect(DetectInput{Policy: policy, Nodes: []corev1.Node{faultyNode("a-0", "a", t0.Add(-time.Hour)), faultyNode("a-1", "a", t0.Add(-time.Hour))},
		Repairs: []repairv1.NodeRepair{failed}, Now: t0})
	if len(d.Create) != 0 || len(d.Status.SuspendedPools) != 1 || len(d.Resolved) != 0 {
		t.Fatalf("while the failed fault persists: create %v, suspended %v, resolved %d", created(d), d.Status.SuspendedPools, len(d.Resolved))
	}
	// a-0 healthy again: resolved, the pool opens, a-1 is repaired.
	d = Detect(DetectInput{Policy: policy, Nodes: []corev1.Node{healthyNode("a-0", "a"), faultyNode("a-1", "a", t0.Add(-time.Hour))},
		Repairs: []repairv1.NodeRepair{failed}, Now: t0})
	if len(d.Resolved) != 1 || len(d.Status.SuspendedPools) != 0 {
		t.Fatalf("after the fault cleared: resolved %d, suspended %v", len(d.Resolved), d.Status.SuspendedPools)
	}
	if diff := cmp.Diff([]string{"a-1=repair"}, created(d)); diff != "" {
		t.Errorf("created (-want +got):\n%s", diff)
	}
}

// FuzzDetect: any mix of nodes, conditions and records yields at most one
// repair to run per pool, never two records with one name, and no panic.
func FuzzDetect(f *testing.F) {
	f.Add(uint8(3), uint8(2), uint16(0b101), true, false)
	f.Add(uint8(7), uint8(3), uint16(0xffff), false, true)
	f.Fuzz(func(t *testing.T, nodes, pools uint8, faultBits uint16, dryRun, withRecords bool) {
		nodes, pools = nodes%12, pools%4+1
		policy := testPolicy(func(s *repairv1.NodeRepairPolicySpec) {
			s.DryRun = dryRun
			s.MaxParallelPools = ptr.To[int32](2)
			s.HistoryLimit = ptr.To[int32](1)
		})
		var ns []corev1.Node
		var repairs []repairv1.NodeRepair
		for i := range int(nodes) {
			name, pool := string(rune('a'+i)), string(rune('p'+i%int(pools)))
			if faultBits&(1<<i) == 0 {
				ns = append(ns, healthyNode(name, pool))
				continue
			}
			ns = append(ns, faultyNode(name, pool, t0.Add(-time.Duration(i)*time.Minute)))
			if withRecords && i%3 == 0 {
				repairs = append(repairs, record(name, t0.Add(-time.Duration(i)*time.Minute), func(r *repairv1.NodeRepair) { r.Spec.DryRun = i%2 == 0 }))
			}
			if withRecords { // a node's history, long finished or not
				phases := []repairv1.Phase{"", repairv1.PhaseRepairing, repairv1.PhaseSucceeded, repairv1.PhaseRecoveryFailed, repairv1.PhaseIgnored}
				for j := range 3 {
					repairs = append(repairs, past(fmt.Sprintf("%s-h%d", name, j), name, "ntp", time.Duration(30+j)*time.Hour, phases[(i+j)%len(phases)]))
				}
			}
		}
		in := DetectInput{Policy: policy, Nodes: ns, Repairs: repairs, Now: t0}
		before := deepCopyInput(in)
		d := Detect(in)
		// The detector reads its input from the cache without copies
		// (client.UnsafeDisableDeepCopy): Detect must change none of it.
		if diff := cmp.Diff(before, in); diff != "" {
			t.Fatalf("Detect changed its input (-before +after):\n%s", diff)
		}
		perPool, names := map[string]int{}, map[string]bool{}
		for _, r := range d.Create {
			if names[r.Name] {
				t.Fatalf("two records named %s", r.Name)
			}
			names[r.Name] = true
			if !r.Recorded() {
				perPool[r.Spec.Pool]++
			}
		}
		for pool, n := range perPool {
			if n > 1 {
				t.Errorf("%d repairs started in pool %s", n, pool)
			}
		}
		if len(perPool) > 2 {
			t.Errorf("%d pools repairing, maxParallelPools 2", len(perPool))
		}
		for _, r := range d.Prune {
			if r.Status.Phase == "" || r.Status.Phase == repairv1.PhaseRepairing ||
				(r.Status.Phase == repairv1.PhaseRecoveryFailed && r.Labels[labelResolved] != "true") {
				t.Errorf("pruned %s in phase %q (resolved %q)", r.Name, r.Status.Phase, r.Labels[labelResolved])
			}
		}
	})
}

// deepCopyInput copies every object of in.
func deepCopyInput(in DetectInput) DetectInput {
	out := in
	out.Policy = in.Policy.DeepCopy()
	out.Nodes = nil
	for i := range in.Nodes {
		out.Nodes = append(out.Nodes, *in.Nodes[i].DeepCopy())
	}
	out.Repairs = nil
	for i := range in.Repairs {
		out.Repairs = append(out.Repairs, *in.Repairs[i].DeepCopy())
	}
	return out
}
