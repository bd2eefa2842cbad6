package repair

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func nodeWith(conds ...corev1.NodeCondition) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{Conditions: conds}}
}

func cond(typ, status, reason, msg string) corev1.NodeCondition {
	return corev1.NodeCondition{Type: corev1.NodeConditionType(typ), Status: corev1.ConditionStatus(status), Reason: reason, Message: msg,
		LastTransitionTime: metav1.NewTime(t0.Add(-time.Hour))}
}

func TestEvaluateDefaultRules(t *testing.T) {
	tests := map[string]struct {
		node      *corev1.Node
		wantRule  string
		threshold time.Duration
	}{
		"kubelet hung (Ready Unknown)": {nodeWith(cond("Ready", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")), "kubelet-hung", 180 * time.Second},
		"kubelet PLEG":                 {nodeWith(cond("Ready", "False", "KubeletNotReady", "PLEG is not healthy: pleg was last seen active 3m0s ago")), "kubelet-pleg", 180 * time.Second},
		"kubelet sandbox error":        {nodeWith(cond("Ready", "False", "KubeletNotReady", "failed to create pod sandbox: rpc error")), "kubelet-sandbox", 180 * time.Second},
		"container runtime offline":    {nodeWith(cond("Ready", "True", "", ""), cond("ContainerRuntimeUnhealthy", "True", "ContainerdUnhealthy", "")), "container-runtime-offline", 90 * time.Second},
		"NTP problem":                  {nodeWith(cond("NTPProblem", "True", "NTPIsDown", "")), "ntp-problem", 10 * time.Second},
		"systemd offline":              {nodeWith(cond("SystemdOffline", "True", "", "")), "systemd-offline", 90 * time.Second},
		"read-only filesystem":         {nodeWith(cond("ReadonlyFilesystem", "True", "FilesystemIsReadOnly", "")), "readonly-filesystem", 90 * time.Second},
		// ACK's node-problem-detector spelling of the same faults.
		"ACK: kubelet hung":          {nodeWith(cond("Ready", "True", "KubeletReady", ""), cond("KubeletNotReady", "True", "KubeletHung", "kubelet is hung")), "kubelet-hung-npd", 180 * time.Second},
		"ACK: kubelet PLEG":          {nodeWith(cond("KubeletNotReady", "True", "PLEG", "")), "kubelet-pleg-npd", 180 * time.Second},
		"ACK: kubelet sandbox error": {nodeWith(cond("KubeletNotReady", "True", "SandboxError", "")), "kubelet-sandbox-npd", 180 * time.Second},
		"ACK: runtime offline":       {nodeWith(cond("RuntimeOffline", "True", "ContainerdIsDown", "")), "container-runtime-offline-npd", 90 * time.Second},
		// Upstream node-problem-detector's health checker.
		"NPD: kubelet unhealthy": {nodeWith(cond("KubeletUnhealthy", "True", "KubeletUnhealthy", "kubelet:kubelet was found unhealthy")), "kubelet-unhealthy", 180 * time.Second},
		// Letter case does not matter in reasons and messages.
		"reason in another case":                {nodeWith(cond("KubeletNotReady", "True", "sandboxerror", "")), "kubelet-sandbox-npd", 180 * time.Second},
		"message in another case":               {nodeWith(cond("Ready", "False", "KubeletNotReady", "Failed to create PodSandbox for pod x")), "kubelet-sandbox", 180 * time.Second},
		"PLEG message in capitals":              {nodeWith(cond("Ready", "False", "KubeletNotReady", "PLEG IS NOT HEALTHY")), "kubelet-pleg", 180 * time.Second},
		"ACK condition cleared":                 {nodeWith(cond("KubeletNotReady", "False", "KubeletIsReady", "")), "", 0},
		"healthy":                               {nodeWith(cond("Ready", "True", "KubeletReady", ""), cond("ReadonlyFilesystem", "False", "", "")), "", 0},
		"not ready for another reason: no rule": {nodeWith(cond("Ready", "False", "KubeletNotReady", "container runtime network not ready")), "", 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			first := Evaluate(tc.node, DefaultRules(), nil, t0)
			if tc.wantRule == "" {
				if len(first.Matches) != 0 {
					t.Fatalf("matched %v on a node without a known fault", first.Matches[0].Rule.Name)
				}
				return
			}
			if first.Fault != nil {
				t.Fatalf("fault %s counted at once: the threshold must come first", first.Fault.Rule.Name)
			}
			if first.NextCheck != tc.threshold {
				t.Errorf("next check in %s, want %s", first.NextCheck, tc.threshold)
			}
			// Just before the threshold: nothing. At it: the fault.
			before := Evaluate(tc.node, DefaultRules(), first.Tracked, t0.Add(tc.threshold-time.Second))
			if before.Fault != nil || before.NextCheck != time.Second {
				t.Errorf("1s before the threshold: fault=%v next=%s", before.Fault, before.NextCheck)
			}
			at := Evaluate(tc.node, DefaultRules(), first.Tracked, t0.Add(tc.threshold))
			if at.Fault == nil || at.Fault.Rule.Name != tc.wantRule {
				t.Fatalf("at the threshold: fault %+v, want %s", at.Fault, tc.wantRule)
			}
			if !at.Fault.Since.Equal(t0) {
				t.Errorf("since = %s, want when gpufleet first saw it (%s), not the condition's timestamp", at.Fault.Since, t0)
			}
		})
	}
}

func TestEvaluateClockIsGpufleets(t *testing.T) {
	rules := DefaultRules()
	n := nodeWith(cond("ReadonlyFilesystem", "True", "FilesystemIsReadOnly", ""))
	ev := Evaluate(n, rules, nil, t0)
	// The detector restarts: new reason and a fresh lastTransitionTime.
	n2 := nodeWith(corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: "True", Reason: "RemountedRO", LastTransitionTime: metav1.NewTime(t0.Add(80 * time.Second))})
	ev = Evaluate(n2, rules, ev.Tracked, t0.Add(90*time.Second))
	if ev.Fault == nil {
		t.Fatalf("a reason change or detector restart reset the clock")
	}
	// A condition that claims an old lastTransitionTime does not fake an
	// early fault: the clock starts when gpufleet sees it.
	old := nodeWith(corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: "True", LastTransitionTime: metav1.NewTime(t0.Add(-24 * time.Hour))})
	if ev := Evaluate(old, rules, nil, t0); ev.Fault != nil {
		t.Errorf("fault counted from the condition's own timestamp")
	}
	// The fault clears: its tracking is dropped, and coming back restarts it.
	ev = Evaluate(nodeWith(), rules, ev.Tracked, t0.Add(100*time.Second))
	if len(ev.Tracked) != 0 {
		t.Errorf("tracking kept after the fault cleared: %v", ev.Tracked)
	}
}

func TestAdmit(t *testing.T) {
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	tests := map[string]struct {
		cands []Candidate
		pools map[string]PoolState
		spec  repairv1.NodeRepairPolicySpec
		want  []Decision
	}{
		"one repair per pool, one pool at a time": {
			cands: []Candidate{{Node: "b1", Pool: "b"}, {Node: "a2", Pool: "a"}, {Node: "a1", Pool: "a"}},
			pools: map[string]PoolState{"a": {Size: 10, Unhealthy: 2}, "b": {Size: 10, Unhealthy: 1}},
			want: []Decision{{Node: "a1", Start: true}, {Node: "a2", Reason: "pool a already has a repair in progress"},
				{Node: "b1", Reason: "1 pool(s) already repairing (maxParallelPools 1)"}},
		},
		"two pools allowed": {
			cands: []Candidate{{Node: "a1", Pool: "a"}, {Node: "b1", Pool: "b"}},
			pools: map[string]PoolState{"a": {Size: 4, Unhealthy: 1}, "b": {Size: 4, Unhealthy: 1}},
			spec:  repairv1.NodeRepairPolicySpec{MaxParallelPools: ptr.To[int32](2)},
			want:  []Decision{{Node: "a1", Start: true}, {Node: "b1", Start: true}},
		},
		"a pool already repairing blocks other pools": {
			cands: []Candidate{{Node: "b1", Pool: "b"}},
			pools: map[string]PoolState{"a": {Size: 4, Repairing: true}, "b": {Size: 4, Unhealthy: 1}},
			want:  []Decision{{Node: "b1", Reason: "1 pool(s) already repairing (maxParallelPools 1)"}},
		},
		"suspended pool: others still repaired": {
			cands: []Candidate{{Node: "a1", Pool: "a"}, {Node: "b1", Pool: "b"}},
			pools: map[string]PoolState{"a": {Size: 4, Unhealthy: 1, Suspended: "repair of a0 failed"}, "b": {Size: 4, Unhealthy: 1}},
			want:  []Decision{{Node: "a1", Reason: "pool a is suspended: repair of a0 failed"}, {Node: "b1", Start: true}},
		},
		"storm protection": {
			cands: []Candidate{{Node: "a1", Pool: "a"}},
			pools: map[string]PoolState{"a": {Size: 10, Unhealthy: 4}},
			spec:  repairv1.NodeRepairPolicySpec{MaxUnhealthy: pct("30%")},
			want:  []Decision{{Node: "a1", Reason: "storm protection: 4 of 10 nodes in pool a are unhealthy (maxUnhealthy 30%)"}},
		},
		"paused": {
			cands: []Candidate{{Node: "a1", Pool: "a"}},
			pools: map[string]PoolState{"a": {Size: 4, Unhealthy: 1}},
			spec:  repairv1.NodeRepairPolicySpec{Paused: true},
			want:  []Decision{{Node: "a1", Reason: "repairs are paused by the policy"}},
		},
		"deleting and maintained nodes are ignored; recovery-failed wait": {
			cands: []Candidate{{Node: "a1", Pool: "a", Deleting: true}, {Node: "a2", Pool: "a", OtherMaintenance: "firmware.example.com"}, {Node: "a3", Pool: "a", RecoveryFailed: true}},
			pools: map[string]PoolState{"a": {Size: 4, Unhealthy: 3}},
			want: []Decision{{Node: "a1", Ignore: true, Reason: "node is being deleted"},
				{Node: "a2", Ignore: true, Reason: "node is in planned maintenance by firmware.example.com"},
				{Node: "a3", Reason: "an earlier repair of this fault failed; waiting for the fault to clear"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Admit(tc.cands, tc.pools, &tc.spec)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decisions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlannedActionsAndDrainTimeout(t *testing.T) {
	r := DefaultRules()[0] // kubelet-pleg
	if got := PlannedActions(r, false); len(got) != 2 || got[1] != repairv1.ActionRestartKubelet {
		t.Errorf("without reboots: %v", got)
	}
	if got := PlannedActions(r, true); got[len(got)-1] != repairv1.ActionReboot {
		t.Errorf("with reboots: %v", got)
	}
	pod := func(g int64) corev1.Pod { return corev1.Pod{Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &g}} }
	for _, tc := range []struct {
		pods []corev1.Pod
		want time.Duration
	}{
		{nil, 10 * time.Minute},
		{[]corev1.Pod{pod(30), pod(900)}, 15 * time.Minute},
		{[]corev1.Pod{pod(7200)}, 30 * time.Minute},
	} {
		if got := DrainTimeout(nil, tc.pods); got != tc.want {
			t.Errorf("DrainTimeout = %s, want %s", got, tc.want)
		}
	}
	if got := DrainTimeout(&repairv1.DrainSpec{TimeoutSeconds: ptr.To[int32](60)}, nil); got != time.Minute {
		t.Errorf("explicit timeout: %s", got)
	}
}
