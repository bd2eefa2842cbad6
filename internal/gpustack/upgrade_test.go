package gpustack

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func nm(ready bool, restartedAt string) *maintenancev1.NodeMaintenance {
	m := &maintenancev1.NodeMaintenance{}
	if restartedAt != "" {
		m.Annotations = map[string]string{annotationRestartedAt: restartedAt}
	}
	status := metav1.ConditionFalse
	if ready {
		status = metav1.ConditionTrue
	}
	m.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: status, Reason: "Ready"}}
	return m
}

func TestPlanUpgrades(t *testing.T) {
	old := func(name string) UpgradeNode {
		return UpgradeNode{Name: name, DriverPod: name + "-drv", Ready: true, ValidatorReady: true}
	}
	cur := func(name string) UpgradeNode {
		n := old(name)
		n.Current = true
		return n
	}
	createdAt := func(n UpgradeNode, at time.Time) UpgradeNode {
		n.DriverPodCreated = at
		return n
	}
	withNM := func(n UpgradeNode, m *maintenancev1.NodeMaintenance) UpgradeNode {
		n.Maintenance, n.MaintenanceIsOurs = m, true
		return n
	}
	tests := map[string]struct {
		nodes   []UpgradeNode
		limit   int
		want    []UpgradeAction
		timeout time.Duration
	}{
		"up to the limit, in name order": {
			nodes: []UpgradeNode{old("c"), old("a"), old("b")}, limit: 2,
			want: []UpgradeAction{{ActRequest, "a"}, {ActRequest, "b"}},
		},
		"in-flight upgrades use the limit": {
			nodes: []UpgradeNode{withNM(old("a"), nm(false, "")), old("b")}, limit: 1,
			want: nil,
		},
		"maintenance Ready: restart the old driver pod once": {
			nodes: []UpgradeNode{withNM(old("a"), nm(true, "")), withNM(createdAt(old("b"), t0.Add(-time.Minute)), nm(true, t0.Add(-2*time.Minute).Format(time.RFC3339)))}, limit: 2,
			want: []UpgradeAction{{ActRestartDriver, "a"}},
		},
		"restart recorded but the old pod is still there (stopped between the writes): delete it again": {
			nodes: []UpgradeNode{withNM(createdAt(old("a"), t0.Add(-time.Hour)), nm(true, t0.Add(-time.Minute).Format(time.RFC3339)))}, limit: 1,
			want: []UpgradeAction{{ActRestartDriver, "a"}},
		},
		"restarted, still the old image past the timeout: fail (the wait is bounded)": {
			nodes: []UpgradeNode{withNM(createdAt(old("a"), t0.Add(-10*time.Minute)), nm(true, t0.Add(-11*time.Minute).Format(time.RFC3339)))}, limit: 1,
			timeout: 10 * time.Minute,
			want:    []UpgradeAction{{ActFail, "a"}},
		},
		"restarted, no driver pod yet: wait": {
			nodes: []UpgradeNode{withNM(UpgradeNode{Name: "a"}, nm(true, t0.Add(-time.Minute).Format(time.RFC3339)))}, limit: 1,
			want: nil,
		},
		"new driver and validator Ready: release the node": {
			nodes: []UpgradeNode{withNM(cur("a"), nm(true, t0.Format(time.RFC3339)))}, limit: 1,
			want: []UpgradeAction{{ActFinish, "a"}},
		},
		"new driver not Ready past the timeout: fail, which frees the slot next pass": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-11*time.Minute).Format(time.RFC3339)))
				n.Ready = false
				return n
			}(), old("b")}, limit: 1, timeout: 10 * time.Minute,
			want: []UpgradeAction{{ActFail, "a"}},
		},
		"failed nodes are not retried and do not count": {
			nodes: []UpgradeNode{func() UpgradeNode { n := old("a"); n.Failed = true; return n }(), old("b")}, limit: 1,
			want: []UpgradeAction{{ActRequest, "b"}},
		},
		"a failed node that is now fine is cleared": {
			nodes: []UpgradeNode{func() UpgradeNode { n := cur("a"); n.Failed = true; return n }()}, limit: 1,
			want: []UpgradeAction{{ActClearFailed, "a"}},
		},
		"another requestor's maintenance on the node: wait": {
			nodes: []UpgradeNode{func() UpgradeNode { n := old("a"); n.Maintenance = nm(true, ""); return n }()}, limit: 1,
			want: nil,
		},
		"the new driver cannot load, the old module is in use: ask for a reboot": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Minute).Format(time.RFC3339)))
				n.Ready, n.ModuleInUse = false, "nvidia-driver-ctr: Could not unload NVIDIA driver kernel modules, driver is in use"
				return n
			}()}, limit: 1,
			want: []UpgradeAction{{ActReboot, "a"}},
		},
		"module in use but the restart is not ours (no restart recorded): no reboot": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, ""))
				n.Ready, n.ModuleInUse = false, "x: module nvidia is in use"
				return n
			}()}, limit: 1,
			want: nil,
		},
		"rebooting: no timeout of the upgrade's own, nothing asked twice": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Ready, n.ModuleInUse = false, "x: module nvidia is in use"
				n.Reboot = &UpgradeReboot{Name: "r", Phase: repairv1.PhaseRepairing, Created: t0.Add(-50 * time.Minute)}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: nil,
		},
		"a reboot the repair controller never starts is bounded": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Ready = false
				n.Reboot = &UpgradeReboot{Name: "r", Created: t0.Add(-10 * time.Minute)}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: []UpgradeAction{{ActFail, "a"}},
		},
		"the reboot failed: the upgrade fails and releases the node": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Ready = false
				n.Reboot = &UpgradeReboot{Name: "r", Phase: repairv1.PhaseRecoveryFailed, Created: t0.Add(-30 * time.Minute), Ended: t0}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: []UpgradeAction{{ActFail, "a"}},
		},
		"rebooted, the new driver Ready: release the node": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Reboot = &UpgradeReboot{Name: "r", Phase: repairv1.PhaseSucceeded, Created: t0.Add(-30 * time.Minute), Ended: t0.Add(-time.Minute)}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: []UpgradeAction{{ActFinish, "a"}},
		},
		"rebooted, still not Ready: the timeout counts from the reboot's end, and no second reboot": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Ready, n.ModuleInUse = false, "x: module nvidia is in use"
				n.Reboot = &UpgradeReboot{Name: "r", Phase: repairv1.PhaseSucceeded, Created: t0.Add(-30 * time.Minute), Ended: t0.Add(-9 * time.Minute)}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: nil,
		},
		"rebooted, still not Ready past the timeout: fail": {
			nodes: []UpgradeNode{func() UpgradeNode {
				n := withNM(cur("a"), nm(true, t0.Add(-time.Hour).Format(time.RFC3339)))
				n.Ready = false
				n.Reboot = &UpgradeReboot{Name: "r", Phase: repairv1.PhaseSucceeded, Created: t0.Add(-30 * time.Minute), Ended: t0.Add(-10 * time.Minute)}
				return n
			}()}, limit: 1, timeout: 10 * time.Minute,
			want: []UpgradeAction{{ActFail, "a"}},
		},
		"limit 0 pauses the rollout": {
			nodes: []UpgradeNode{old("a")}, limit: 0, want: nil,
		},
		"nodes without a driver pod are skipped": {
			nodes: []UpgradeNode{{Name: "a"}}, limit: 1, want: nil,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			timeout := tc.timeout
			if timeout == 0 {
				timeout = time.Hour
			}
			got := PlanUpgrades(tc.nodes, tc.limit, timeout, t0)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
		})
	}
}

// Regression (issue 14, item 7): a 1.x policy that disables the validator
// under spec.operator.validator rendered no validator, but driver upgrades
// read spec.validator and waited for a validator that never ran.
func TestUpgradeOfA1xPolicyWithoutValidatorDoesNotWaitForIt(t *testing.T) {
	const image = "nvcr.io/nvidia/driver:550.54.15-ubuntu22.04"
	ready := []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	nodes := &corev1.NodeList{Items: []corev1.Node{*gpuNode(nil, "containerd://1.7")}}
	driverPod := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "drv", Labels: map[string]string{LabelManagedBy: managedBy, LabelComponent: Driver, "app": "nvidia-driver-daemonset-ubuntu22.04"}},
		Spec:       corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Image: image}}},
		Status:     corev1.PodStatus{Conditions: ready},
	}
	desired := map[string]string{"nvidia-driver-daemonset-ubuntu22.04": image}
	ours := map[string]*maintenancev1.NodeMaintenance{"n": nm(true, t0.Format(time.RFC3339))}
	tests := map[string]struct {
		spec       nvidiav1.ClusterPolicySpec
		wantFinish bool
	}{
		"1.x: operator.validator.enabled false": {
			spec: nvidiav1.ClusterPolicySpec{Operator: nvidiav1.OperatorSpec{Validator: &nvidiav1.ComponentSpec{
				Enabled: ptr.To(false), Repository: "nvcr.io/nvidia/k8s", Image: "cuda-sample", Version: "vectoradd-cuda10.2"}}},
			wantFinish: true,
		},
		"validator.enabled false":            {spec: nvidiav1.ClusterPolicySpec{Validator: nvidiav1.ValidatorSpec{ComponentSpec: nvidiav1.ComponentSpec{Enabled: ptr.To(false)}}}, wantFinish: true},
		"validator on and not Ready: waits":  {spec: nvidiav1.ClusterPolicySpec{}, wantFinish: false},
		"1.x validator on, not Ready: waits": {spec: nvidiav1.ClusterPolicySpec{Operator: nvidiav1.OperatorSpec{Validator: &nvidiav1.ComponentSpec{Image: "cuda-sample"}}}, wantFinish: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			byNode, gpuNodes := upgradeNodes(&tc.spec, nodes, desired, []corev1.Pod{driverPod}, ours)
			if gpuNodes != 1 || byNode["n"] == nil {
				t.Fatalf("GPU nodes %d, %v", gpuNodes, byNode)
			}
			acts := PlanUpgrades([]UpgradeNode{*byNode["n"]}, 1, time.Hour, t0)
			finish := len(acts) == 1 && acts[0] == UpgradeAction{ActFinish, "n"}
			if finish != tc.wantFinish {
				t.Errorf("actions %v; want the upgrade finished: %v", acts, tc.wantFinish)
			}
		})
	}
}

func TestUpgradeRequestFollowsTheUpgradePolicy(t *testing.T) {
	gpuPods := []maintenancev1.PodEvictionFilterEntry{{ByResourceNameRegex: ptr.To(`^nvidia\.com/`)}}
	tests := map[string]struct {
		policy    *nvidiav1.DriverUpgradePolicySpec
		wantDrain *maintenancev1.DrainSpec
		wantWait  *maintenancev1.WaitForPodCompletionSpec
	}{
		"no policy: delete the pods using GPUs": {
			wantDrain: &maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](300), PodEvictionFilters: gpuPods},
		},
		"the chart's defaults: podDeletion settings, drain off, nothing to wait for": {
			policy: &nvidiav1.DriverUpgradePolicySpec{
				WaitForCompletion: &nvidiav1.WaitForCompletionSpec{TimeoutSeconds: ptr.To[int32](0)},
				PodDeletion:       &nvidiav1.PodDeletionSpec{TimeoutSeconds: ptr.To[int32](300)},
				Drain:             &nvidiav1.UpgradeDrainSpec{Enable: ptr.To(false), TimeoutSeconds: ptr.To[int32](300)},
			},
			wantDrain: &maintenancev1.DrainSpec{TimeoutSeconds: ptr.To[int32](300), PodEvictionFilters: gpuPods},
		},
		"drain enabled: the node's pods of the selector, drain settings": {
			policy: &nvidiav1.DriverUpgradePolicySpec{
				PodDeletion: &nvidiav1.PodDeletionSpec{Force: true, TimeoutSeconds: ptr.To[int32](60)},
				Drain:       &nvidiav1.UpgradeDrainSpec{Enable: ptr.To(true), Force: true, DeleteEmptyDir: true, PodSelector: "tier=batch", TimeoutSeconds: ptr.To[int32](900)},
			},
			wantDrain: &maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, PodSelector: "tier=batch", TimeoutSeconds: ptr.To[int32](900)},
		},
		"wait for the training jobs first": {
			policy:    &nvidiav1.DriverUpgradePolicySpec{WaitForCompletion: &nvidiav1.WaitForCompletionSpec{PodSelector: "app=training", TimeoutSeconds: ptr.To[int32](600)}},
			wantDrain: &maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](300), PodEvictionFilters: gpuPods},
			wantWait:  &maintenancev1.WaitForPodCompletionSpec{PodSelector: "app=training", TimeoutSeconds: ptr.To[int32](600)},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &nvidiav1.ClusterPolicy{}
			p.Spec.Driver.UpgradePolicy = tc.policy
			req := upgradeRequest(p, p.Spec.Driver.UpgradePolicy, "ns", "n")
			if diff := cmp.Diff(tc.wantDrain, req.Drain); diff != "" {
				t.Errorf("drain (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantWait, req.WaitForPodCompletion); diff != "" {
				t.Errorf("wait for completion (-want +got):\n%s", diff)
			}
			if req.Cordon == nil || !*req.Cordon || req.RequestorID != UpgradeRequestor {
				t.Errorf("request %+v", req)
			}
		})
	}
}

func TestModuleInUse(t *testing.T) {
	term := func(msg string) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: msg}}
	}
	tests := map[string]struct {
		init, main []corev1.ContainerStatus
		want       string
	}{
		"the driver container's last run (the NVIDIA driver's own words)": {
			main: []corev1.ContainerStatus{{Name: "nvidia-driver-ctr", LastTerminationState: term("Unloading NVIDIA driver kernel modules...\nnvidia 56807424 113\nCould not unload NVIDIA driver kernel modules, driver is in use\n")}},
			want: "nvidia-driver-ctr: Could not unload NVIDIA driver kernel modules, driver is in use",
		},
		"the k8s-driver-manager init container, letter case aside": {
			init: []corev1.ContainerStatus{{Name: "k8s-driver-manager", State: term("Failed to unload kernel module nvidia_uvm: resource temporarily unavailable\nmore")}},
			want: "k8s-driver-manager: Failed to unload kernel module nvidia_uvm: resource temporarily unavailable",
		},
		"rmmod's words": {
			main: []corev1.ContainerStatus{{Name: "c", State: term("rmmod: ERROR: Module nvidia_drm is in use")}},
			want: "c: Module nvidia_drm is in use",
		},
		"another failure is not a module in use": {
			main: []corev1.ContainerStatus{{Name: "c", LastTerminationState: term("Could not resolve Linux kernel version")}},
		},
		"another module in use is not the driver's": {
			main: []corev1.ContainerStatus{{Name: "c", LastTerminationState: term("rmmod: ERROR: Module i2c_core is in use")}},
		},
		"no status yet": {},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &corev1.Pod{Status: corev1.PodStatus{InitContainerStatuses: tc.init, ContainerStatuses: tc.main}}
			if got := ModuleInUse(p); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func FuzzModuleInUse(f *testing.F) {
	f.Add("Could not unload NVIDIA driver kernel modules, driver is in use")
	f.Add("rmmod: ERROR: Module nvidia is in use\x00\xff")
	f.Fuzz(func(t *testing.T, msg string) {
		p := &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "c",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Message: msg}}}}}}
		if got := ModuleInUse(p); len(got) > 300 {
			t.Errorf("%d characters reported", len(got))
		}
	})
}
