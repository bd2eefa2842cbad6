package testobj

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/allocation"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/fleet"
	"github.com/gpufleet/gpufleet/internal/repair"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestNodeMaintenance(t *testing.T) {
	bare := func(mut func(*maintenancev1.NodeMaintenance)) *maintenancev1.NodeMaintenance {
		m := &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "m"},
			Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "test.example", NodeName: "n"},
		}
		if mut != nil {
			mut(m)
		}
		return m
	}
	ready := func(status metav1.ConditionStatus, p maintenancev1.Phase) metav1.Condition {
		return metav1.Condition{Type: maintenancev1.ConditionTypeReady, Status: status, Reason: string(p)}
	}
	blocked := metav1.Condition{Type: maintenancev1.ConditionTypeDrainBlocked, Status: metav1.ConditionTrue, Reason: "Blocked"}
	tests := map[string]struct {
		opts      []NMOption
		want      *maintenancev1.NodeMaintenance
		wantPhase maintenancev1.Phase
		wantReady bool
	}{
		"a new object: default namespace and requestor, no status, no finalizer": {
			want: bare(nil), wantPhase: maintenancev1.PhasePending,
		},
		"requestor": {
			opts: []NMOption{Requestor("a.example")},
			want: bare(func(m *maintenancev1.NodeMaintenance) { m.Spec.RequestorID = "a.example" }), wantPhase: maintenancev1.PhasePending,
		},
		"a phase before Ready: the Ready condition False, the phase its reason": {
			opts: []NMOption{Phase(maintenancev1.PhaseDraining)},
			want: bare(func(m *maintenancev1.NodeMaintenance) {
				m.Status.Conditions = []metav1.Condition{ready("False", maintenancev1.PhaseDraining)}
			}),
			wantPhase: maintenancev1.PhaseDraining,
		},
		"phase Ready: the Ready condition True": {
			opts: []NMOption{Phase(maintenancev1.PhaseReady)},
			want: bare(func(m *maintenancev1.NodeMaintenance) {
				m.Status.Conditions = []metav1.Condition{ready("True", maintenancev1.PhaseReady)}
			}),
			wantPhase: maintenancev1.PhaseReady, wantReady: true,
		},
		"a later phase replaces the Ready condition and keeps the others": {
			opts: []NMOption{Phase(maintenancev1.PhaseReady), func(m *maintenancev1.NodeMaintenance) {
				m.Status.Conditions = append(m.Status.Conditions, blocked)
			}, Phase(maintenancev1.PhaseRequestorFailed)},
			want: bare(func(m *maintenancev1.NodeMaintenance) {
				m.Status.Conditions = []metav1.Condition{ready("False", maintenancev1.PhaseRequestorFailed), blocked}
			}),
			wantPhase: maintenancev1.PhaseRequestorFailed,
		},
		"finalizer, creation and deletion time": {
			opts: []NMOption{Finalizer(), Created(t0), Deleting(t0.Add(time.Hour))},
			want: bare(func(m *maintenancev1.NodeMaintenance) {
				m.Finalizers = []string{maintenancev1.Finalizer}
				m.CreationTimestamp, m.DeletionTimestamp = metav1.NewTime(t0), ptr.To(metav1.NewTime(t0.Add(time.Hour)))
			}),
			wantPhase: maintenancev1.PhasePending,
		},
		"no finalizer after one": {
			opts: []NMOption{Finalizer(), NoFinalizer()}, want: bare(nil), wantPhase: maintenancev1.PhasePending,
		},
		"drain, no cordon, unschedulable before": {
			opts: []NMOption{Drain(maintenancev1.DrainSpec{Force: true}), NoCordon(), UnschedulableBefore(true)},
			want: bare(func(m *maintenancev1.NodeMaintenance) {
				m.Spec.DrainSpec, m.Spec.Cordon = &maintenancev1.DrainSpec{Force: true}, ptr.To(false)
				m.Status.NodeUnschedulableBefore = ptr.To(true)
			}),
			wantPhase: maintenancev1.PhasePending,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := NodeMaintenance("m", "n", tc.opts...)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if got.Phase() != tc.wantPhase || got.IsReady() != tc.wantReady {
				t.Errorf("phase %s, ready %t; want %s, %t", got.Phase(), got.IsReady(), tc.wantPhase, tc.wantReady)
			}
		})
	}
}

func TestNode(t *testing.T) {
	gpus := func(n int64) corev1.ResourceList {
		return corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(n, resource.DecimalSI)}
	}
	readyAt := func(status corev1.ConditionStatus, reason string, at time.Time) corev1.NodeCondition {
		return corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason, LastTransitionTime: metav1.NewTime(at)}
	}
	problem := corev1.NodeCondition{Type: "GPUProblem", Status: corev1.ConditionTrue, Reason: "ResetGPU"}
	tests := map[string]struct {
		opts []NodeOption
		want *corev1.Node
	}{
		"bare": {want: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}},
		"pool and labels, the later over the earlier": {
			opts: []NodeOption{Pool("a"), Labels(map[string]string{"x": "1", "y": "1"}), Labels(map[string]string{"y": "2"})},
			want: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"gpufleet.dev/pool": "a", "x": "1", "y": "2"}}},
		},
		"an empty pool is a label too": {
			opts: []NodeOption{Pool("")},
			want: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"gpufleet.dev/pool": ""}}},
		},
		"GPUs, capacity alone": {
			opts: []NodeOption{GPUCapacity(8)},
			want: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{Capacity: gpus(8)}},
		},
		"GPUs, capacity and allocatable": {
			opts: []NodeOption{GPUs(8, 7)},
			want: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{Capacity: gpus(8), Allocatable: gpus(7)}},
		},
		"created, cordoned, the kubelet's runtime and boot ID": {
			opts: []NodeOption{NodeCreated(t0), Unschedulable(), RuntimeVersion("containerd://1.7"), BootID("boot-1")},
			want: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", CreationTimestamp: metav1.NewTime(t0)}, Spec: corev1.NodeSpec{Unschedulable: true},
				Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{ContainerRuntimeVersion: "containerd://1.7", BootID: "boot-1"}}},
		},
		"Ready": {
			opts: []NodeOption{Ready(t0)},
			want: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{readyAt("True", "KubeletReady", t0)}}},
		},
		"NotReady in place of Ready; other conditions kept": {
			opts: []NodeOption{Ready(t0), Condition(problem), NotReady(t0.Add(time.Hour))},
			want: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
				readyAt("False", "KubeletNotReady", t0.Add(time.Hour)), problem}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Node("n", tc.opts...)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestNamesAreThoseThePackagesRead: the pool label and the GPU resource
// that the builders write are those the code under test reads.
func TestNamesAreThoseThePackagesRead(t *testing.T) {
	for name, label := range map[string]string{"devcluster.LabelPool": devcluster.LabelPool, "repair.DefaultPoolLabel": repair.DefaultPoolLabel,
		"allocation.DefaultPoolLabel": allocation.DefaultPoolLabel, "fleet.DefaultPoolLabel": fleet.DefaultPoolLabel} {
		if label != poolLabel {
			t.Errorf("%s is %q, Pool sets %q", name, label, poolLabel)
		}
	}
	for name, r := range map[string]corev1.ResourceName{"devcluster.ResourceGPU": devcluster.ResourceGPU, "agent.ResourceGPU": agent.ResourceGPU,
		"allocation.ResourceGPU": allocation.ResourceGPU, "fleet.ResourceGPU": fleet.ResourceGPU} {
		if r != resourceGPU {
			t.Errorf("%s is %q, GPUs sets %q", name, r, resourceGPU)
		}
	}
}
