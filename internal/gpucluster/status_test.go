package gpucluster_test

import (
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpucluster"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

var t0 = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

func policy(name string, at time.Time) nvidiav1.ClusterPolicy {
	return nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(at)}}
}

func TestBlockingPolicy(t *testing.T) {
	gc := &nvidiav1alpha1.GPUCluster{ObjectMeta: metav1.ObjectMeta{Name: "gpu-cluster", CreationTimestamp: metav1.NewTime(t0)}}
	for _, tc := range []struct {
		name     string
		policies []nvidiav1.ClusterPolicy
		want     string
	}{
		{name: "none"},
		{name: "an older ClusterPolicy holds the GPUCluster", policies: []nvidiav1.ClusterPolicy{policy("cluster-policy", t0.Add(-time.Hour))}, want: "cluster-policy"},
		{name: "created the same second: the ClusterPolicy wins", policies: []nvidiav1.ClusterPolicy{policy("cluster-policy", t0)}, want: "cluster-policy"},
		{name: "a newer ClusterPolicy does not (it is held itself)", policies: []nvidiav1.ClusterPolicy{policy("late", t0.Add(time.Second))}},
		{name: "the oldest of several", policies: []nvidiav1.ClusterPolicy{policy("b", t0.Add(-time.Minute)), policy("a", t0.Add(-time.Hour)), policy("c", t0.Add(time.Hour))}, want: "a"},
		{name: "same time: by name", policies: []nvidiav1.ClusterPolicy{policy("b", t0.Add(-time.Minute)), policy("a", t0.Add(-time.Minute))}, want: "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := gpucluster.BlockingPolicy(gc, tc.policies)
			if (got == nil && tc.want != "") || (got != nil && got.Name != tc.want) {
				t.Errorf("got %v, want %q", got, tc.want)
			}
		})
	}
}

func ds(name string, desired, ready, updated int32) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 2}, Status: appsv1.DaemonSetStatus{
		ObservedGeneration: 2, DesiredNumberScheduled: desired, NumberReady: ready, UpdatedNumberScheduled: updated}}
}

func TestStatus(t *testing.T) {
	gc := &nvidiav1alpha1.GPUCluster{ObjectMeta: metav1.ObjectMeta{Name: "gpu-cluster", Generation: 3}}
	want := []string{gpucluster.KubeletPlugin, gpucluster.Controller}
	ready := gpucluster.Observed{Namespace: "ns", Want: want,
		DaemonSets:  map[string]*appsv1.DaemonSet{gpucluster.KubeletPlugin: ds(gpucluster.KubeletPlugin, 4, 4, 4)},
		Deployments: map[string]*appsv1.Deployment{gpucluster.Controller: {Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1)}, Status: appsv1.DeploymentStatus{AvailableReplicas: 1, UpdatedReplicas: 1}}}}
	for _, tc := range []struct {
		name         string
		obs          func(gpucluster.Observed) gpucluster.Observed
		state        nvidiav1alpha1.GPUClusterState
		readyReason  string
		degraded     metav1.ConditionStatus
		msgSubstring string
	}{
		{name: "every workload ready", obs: func(o gpucluster.Observed) gpucluster.Observed { return o },
			state: nvidiav1alpha1.GPUClusterReady, readyReason: gpucluster.ReasonReconciled, degraded: metav1.ConditionFalse},
		{name: "a node not ready yet", obs: func(o gpucluster.Observed) gpucluster.Observed {
			o.DaemonSets = map[string]*appsv1.DaemonSet{gpucluster.KubeletPlugin: ds(gpucluster.KubeletPlugin, 4, 3, 4)}
			return o
		}, state: nvidiav1alpha1.GPUClusterNotReady, readyReason: gpucluster.ReasonOperandNotReady, degraded: metav1.ConditionFalse, msgSubstring: "nvidia-dra-driver-kubelet-plugin 3/4 ready"},
		{name: "pods ready but not updated", obs: func(o gpucluster.Observed) gpucluster.Observed {
			o.DaemonSets = map[string]*appsv1.DaemonSet{gpucluster.KubeletPlugin: ds(gpucluster.KubeletPlugin, 4, 4, 1)}
			return o
		}, state: nvidiav1alpha1.GPUClusterNotReady, readyReason: gpucluster.ReasonOperandNotReady, msgSubstring: "1/4", degraded: metav1.ConditionFalse},
		{name: "not created yet", obs: func(o gpucluster.Observed) gpucluster.Observed { o.Deployments = nil; return o },
			state: nvidiav1alpha1.GPUClusterNotReady, readyReason: gpucluster.ReasonOperandNotReady, msgSubstring: "not created yet", degraded: metav1.ConditionFalse},
		{name: "held by a ClusterPolicy", obs: func(o gpucluster.Observed) gpucluster.Observed {
			p := policy("cluster-policy", t0)
			o.Blocking = &p
			return o
		}, state: nvidiav1alpha1.GPUClusterNotReady, readyReason: gpucluster.ReasonClusterPolicyPresent, degraded: metav1.ConditionTrue, msgSubstring: "ClusterPolicy cluster-policy"},
		{name: "a refused write", obs: func(o gpucluster.Observed) gpucluster.Observed {
			o.Refused = []string{"ClusterRoleBinding x: roleRef is immutable"}
			return o
		}, state: nvidiav1alpha1.GPUClusterNotReady, readyReason: gpucluster.ReasonObjectRefused, degraded: metav1.ConditionTrue, msgSubstring: "roleRef is immutable"},
		{name: "admin access not allowed", obs: func(o gpucluster.Observed) gpucluster.Observed { o.AdminAccessMissing = true; return o },
			state: nvidiav1alpha1.GPUClusterNotReady, readyReason: gpucluster.ReasonAdminAccessNotAllowed, degraded: metav1.ConditionTrue, msgSubstring: "kubectl label namespace ns resource.kubernetes.io/admin-access=true"},
		{name: "invalid spec", obs: func(o gpucluster.Observed) gpucluster.Observed { o.InvalidSpec = "draDriver: invalid image"; return o },
			state: nvidiav1alpha1.GPUClusterNotReady, readyReason: gpucluster.ReasonInvalidSpec, degraded: metav1.ConditionTrue, msgSubstring: "invalid image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := gpucluster.Status(gc, tc.obs(ready), t0)
			r, d := meta.FindStatusCondition(st.Conditions, gpucluster.ConditionReady), meta.FindStatusCondition(st.Conditions, gpucluster.ConditionDegraded)
			if st.State != tc.state || r == nil || r.Reason != tc.readyReason || d == nil || d.Status != tc.degraded {
				t.Fatalf("state %s, Ready %+v, Degraded %+v", st.State, r, d)
			}
			if !strings.Contains(r.Message+d.Message, tc.msgSubstring) {
				t.Errorf("messages %q / %q lack %q", r.Message, d.Message, tc.msgSubstring)
			}
			if st.Namespace != "ns" || st.ObservedGeneration != 3 {
				t.Errorf("namespace %q generation %d", st.Namespace, st.ObservedGeneration)
			}
			// Computed again from its own result: the same (nothing to write).
			again := *gc.DeepCopy()
			again.Status = st
			if st2 := gpucluster.Status(&again, tc.obs(ready), t0.Add(time.Minute)); !equalStatus(st, st2) {
				t.Errorf("not stable: %+v then %+v", st, st2)
			}
		})
	}
}

func equalStatus(a, b nvidiav1alpha1.GPUClusterStatus) bool {
	return a.State == b.State && len(a.Conditions) == len(b.Conditions) && func() bool {
		for i := range a.Conditions {
			if a.Conditions[i] != b.Conditions[i] {
				return false
			}
		}
		return true
	}()
}

func TestNodeLabels(t *testing.T) {
	gc := &nvidiav1alpha1.GPUCluster{}
	node := func(labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}}
	}
	gpu := map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true"}
	got := gpucluster.NodeLabels(node(gpu), gc)
	for _, k := range []string{gpucluster.DeployDRADriver, gpucluster.DeployDCGMExporter, "nvidia.com/gpu.present"} {
		if v := got[k]; v == nil || *v != "true" {
			t.Errorf("GPU node: %s not set: %v", k, got)
		}
	}
	if _, ok := got[gpucluster.DeployDCGM]; ok {
		t.Errorf("dcgm off: its label set")
	}
	optOut := map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", gpucluster.DeployDRADriver: "false"}
	if _, ok := gpucluster.NodeLabels(node(optOut), gc)[gpucluster.DeployDRADriver]; ok {
		t.Errorf("an administrator's opt-out was overwritten")
	}
	cpu := map[string]string{gpucluster.DeployDRADriver: "true", gpucluster.DeployDCGMExporter: "false"}
	got = gpucluster.NodeLabels(node(cpu), gc)
	if v, ok := got[gpucluster.DeployDRADriver]; !ok || v != nil {
		t.Errorf("CPU node: the deploy label is not removed: %v", got)
	}
	if _, ok := got[gpucluster.DeployDCGMExporter]; ok {
		t.Errorf("CPU node: an administrator's false was touched")
	}
	full := map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.present": "true",
		gpucluster.DeployDRADriver: "true", gpucluster.DeployDCGMExporter: "true"}
	if got := gpucluster.NodeLabels(node(full), gc); len(got) != 0 {
		t.Errorf("a labelled node needs nothing: %v", got)
	}
}

func TestOtherNamespace(t *testing.T) {
	for _, tc := range []struct {
		name, status, cleared, want string
	}{
		{name: "never deployed"},
		{name: "deployed by gpufleet here", status: "ns"},
		{name: "the GPU Operator's stack in its namespace", status: "gpu-operator", want: "gpu-operator"},
		{name: "confirmed gone", status: "gpu-operator", cleared: "gpu-operator"},
		{name: "confirmed gone from another namespace only", status: "gpu-operator", cleared: "old", want: "gpu-operator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gc := &nvidiav1alpha1.GPUCluster{Status: nvidiav1alpha1.GPUClusterStatus{Namespace: tc.status}}
			if tc.cleared != "" {
				gc.Annotations = map[string]string{gpustack.AnnotationOtherNamespaceCleared: tc.cleared}
			}
			if got := gpucluster.OtherNamespace(gc, "ns"); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// A stack in another namespace: nothing deployed, the status keeps that
// namespace (so the next pass still sees it), Ready False says why and how
// to go on; once the lease is free, a previous PreviousOperatorRunning
// condition is gone.
func TestStatusStackInAnotherNamespace(t *testing.T) {
	gc := &nvidiav1alpha1.GPUCluster{ObjectMeta: metav1.ObjectMeta{Name: "gpu-cluster", Generation: 1},
		Status: nvidiav1alpha1.GPUClusterStatus{Namespace: "gpu-operator", State: nvidiav1alpha1.GPUClusterReady,
			Conditions: []metav1.Condition{{Type: gpustack.ConditionPreviousOperator, Status: metav1.ConditionTrue, Reason: gpustack.ReasonPreviousOperatorRunning}}}}
	st := gpucluster.Status(gc, gpucluster.Observed{Namespace: "ns", OtherNamespace: "gpu-operator"}, t0)
	r := meta.FindStatusCondition(st.Conditions, gpucluster.ConditionReady)
	if st.Namespace != "gpu-operator" || st.State != nvidiav1alpha1.GPUClusterNotReady || r == nil || r.Reason != gpucluster.ReasonStackInAnotherNamespace ||
		!strings.Contains(r.Message, gpustack.AnnotationOtherNamespaceCleared+"=gpu-operator") {
		t.Fatalf("status %+v", st)
	}
	if meta.FindStatusCondition(st.Conditions, gpustack.ConditionPreviousOperator) != nil {
		t.Errorf("PreviousOperatorRunning kept after the lease was free: %+v", st.Conditions)
	}
}
