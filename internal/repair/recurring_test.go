package repair

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// past is a finished repair of node for rule, created ago before t0.
func past(name, node, rule string, ago time.Duration, phase repairv1.Phase, mut ...func(*repairv1.NodeRepair)) repairv1.NodeRepair {
	r := repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(-ago))},
		Spec:   repairv1.NodeRepairSpec{NodeName: node, Policy: "p", Fault: repairv1.Fault{Rule: rule}},
		Status: repairv1.NodeRepairStatus{Phase: phase}}
	for _, m := range mut {
		m(&r)
	}
	return r
}

// TestDetectRecurringFaults: a node condition fault that comes back for
// the count-th time within repairAfter's window is reported, not repaired
// (a recommendation, no action); dry-run and ignore records, reboots other
// controllers asked for, other rules, other nodes and repairs older than
// the window do not count.
func TestDetectRecurringFaults(t *testing.T) {
	twice := []repairv1.NodeRepair{past("a-1", "a", "ntp", time.Hour, repairv1.PhaseSucceeded), past("a-2", "a", "ntp", 2*time.Hour, repairv1.PhaseSucceeded)}
	for name, tc := range map[string]struct {
		repairs []repairv1.NodeRepair
		limit   *repairv1.RepeatLimit
		report  bool
	}{
		"first time: repaired":           {},
		"third time within 24 h: report": {repairs: twice, report: true},
		"third time, but the first ones are older than the window": {repairs: []repairv1.NodeRepair{
			past("a-1", "a", "ntp", 25*time.Hour, repairv1.PhaseSucceeded), past("a-2", "a", "ntp", 26*time.Hour, repairv1.PhaseSucceeded)}},
		"records and requested reboots do not count": {repairs: []repairv1.NodeRepair{
			past("a-1", "a", "ntp", time.Hour, repairv1.PhaseIgnored, func(r *repairv1.NodeRepair) { r.Spec.DryRun = true }),
			past("a-2", "a", "ntp", time.Hour, repairv1.PhaseIgnored, func(r *repairv1.NodeRepair) { r.Spec.IgnoreReason = "held" }),
			past("a-3", "a", "ntp", time.Hour, repairv1.PhaseSucceeded, func(r *repairv1.NodeRepair) { r.Spec.Requestor, r.Spec.Policy = "x", "" })}},
		"other rules and nodes do not count": {repairs: []repairv1.NodeRepair{
			past("a-1", "a", "reboot", time.Hour, repairv1.PhaseSucceeded), past("b-1", "b", "ntp", time.Hour, repairv1.PhaseSucceeded)}},
		"a count of 5":                      {repairs: twice, limit: &repairv1.RepeatLimit{Count: 5, WindowSeconds: 86400}},
		"a window of 90 minutes counts one": {repairs: twice, limit: &repairv1.RepeatLimit{Count: 2, WindowSeconds: 5400}, report: true},
	} {
		t.Run(name, func(t *testing.T) {
			policy := testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.RepairAfter = tc.limit })
			d := Detect(DetectInput{Policy: policy, Nodes: []corev1.Node{faultyNode("a", "pool", t0.Add(-time.Minute))}, Repairs: tc.repairs, Now: t0})
			if len(d.Create) != 1 {
				t.Fatalf("created %v, want one NodeRepair", created(d))
			}
			r := d.Create[0]
			if got := r.Spec.Recommendation != ""; got != tc.report {
				t.Fatalf("recommendation %q, want a report: %t", r.Spec.Recommendation, tc.report)
			}
			if tc.report && (len(r.Spec.Actions) != 0 || !strings.Contains(r.Spec.Recommendation, "came back")) {
				t.Errorf("a report with actions %v, recommendation %q", r.Spec.Actions, r.Spec.Recommendation)
			}
			if !tc.report && len(r.Spec.Actions) == 0 {
				t.Errorf("a repair without actions")
			}
		})
	}
}

// TestPrune: per node the newest historyLimit finished repairs are kept;
// never one in progress, a failed one whose fault has not cleared, one
// repairAfter still counts, or another policy's.
func TestPrune(t *testing.T) {
	resolved := func(r *repairv1.NodeRepair) { r.Labels = map[string]string{labelResolved: "true"} }
	var old []repairv1.NodeRepair
	for i := range 5 {
		old = append(old, past(fmt.Sprintf("a-old-%d", i), "a", "ntp", time.Duration(30+i)*time.Hour, repairv1.PhaseSucceeded))
	}
	for name, tc := range map[string]struct {
		repairs []repairv1.NodeRepair
		limit   int32
		want    []string
	}{
		"under the limit":        {repairs: old, limit: 10},
		"past it: the oldest go": {repairs: old, limit: 3, want: []string{"a-old-3", "a-old-4"}},
		"never one in progress, an unresolved failure, one the window counts, another policy's": {limit: 1, repairs: append([]repairv1.NodeRepair{
			past("a-active", "a", "ntp", 40*time.Hour, repairv1.PhaseRepairing),
			past("a-new", "a", "ntp", 40*time.Hour, ""),
			past("a-failed", "a", "ntp", 40*time.Hour, repairv1.PhaseRecoveryFailed),
			past("a-failed-resolved", "a", "ntp", 40*time.Hour, repairv1.PhaseRecoveryFailed, resolved),
			past("a-recent", "a", "ntp", time.Hour, repairv1.PhaseSucceeded),
			past("a-other-policy", "a", "ntp", 40*time.Hour, repairv1.PhaseSucceeded, func(r *repairv1.NodeRepair) { r.Spec.Policy = "q" }),
		}, old...), want: []string{"a-failed-resolved", "a-old-1", "a-old-2", "a-old-3", "a-old-4"}},
		"per node": {limit: 1, repairs: []repairv1.NodeRepair{
			past("a-1", "a", "ntp", 30*time.Hour, repairv1.PhaseSucceeded), past("b-1", "b", "ntp", 30*time.Hour, repairv1.PhaseSucceeded),
			past("b-2", "b", "ntp", 31*time.Hour, repairv1.PhaseIgnored)}, want: []string{"b-2"}},
	} {
		t.Run(name, func(t *testing.T) {
			policy := testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.HistoryLimit = ptr.To(tc.limit) })
			var got []string
			for _, r := range prune(policy, tc.repairs, t0) {
				got = append(got, r.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("pruned (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRebootEnds: the pods a reboot would end are those still running or
// about to, but for DaemonSet pods and static pods' mirrors.
func TestRebootEnds(t *testing.T) {
	pod := func(name string, phase corev1.PodPhase, mut ...func(*corev1.Pod)) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Status: corev1.PodStatus{Phase: phase}}
		for _, m := range mut {
			m(&p)
		}
		return p
	}
	ds := func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "d", Controller: ptr.To(true)}}
	}
	mirror := func(p *corev1.Pod) { p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"} }
	terminating := func(p *corev1.Pod) { p.DeletionTimestamp = ptr.To(metav1.NewTime(t0)) }
	got := rebootEnds([]corev1.Pod{
		pod("running", corev1.PodRunning), pod("pending", corev1.PodPending), pod("terminating", corev1.PodRunning, terminating),
		pod("done", corev1.PodSucceeded), pod("failed", corev1.PodFailed), pod("agent", corev1.PodRunning, ds), pod("static", corev1.PodRunning, mirror),
	})
	if diff := cmp.Diff([]string{"ns/pending", "ns/running", "ns/terminating"}, got); diff != "" {
		t.Errorf("pods the reboot ends (-want +got):\n%s", diff)
	}
}
