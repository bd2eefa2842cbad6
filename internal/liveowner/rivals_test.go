package liveowner_test

import (
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpufleet/gpufleet/internal/liveowner"
)

// deployment is a Deployment of namespace/name with labels, one container
// running argv, and ready replicas.
func deployment(namespace, name string, labels map[string]string, ready int32, argv ...string) *appsv1.Deployment {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels}}
	d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "manager", Command: argv[:1], Args: argv[1:]}}
	d.Status.ReadyReplicas = ready
	return d
}

func TestRivalsFindWhatNoLeaseShows(t *testing.T) {
	maintenanceLabels := map[string]string{"app.kubernetes.io/component": "maintenance-operator-controller-manager"}
	now := time.Date(2026, 12, 8, 1, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		op   liveowner.Operator
		deps []*appsv1.Deployment
		want string // part of the reason; "" when nothing is found
	}{
		{name: "nothing runs", op: liveowner.MaintenanceOperator},
		{name: "NVIDIA's chart, with leader election: its lease tells", op: liveowner.MaintenanceOperator,
			deps: []*appsv1.Deployment{deployment("nvidia", "maintenance-operator", maintenanceLabels, 1, "/manager", "--leader-elect")}},
		{name: "without leader election", op: liveowner.MaintenanceOperator,
			deps: []*appsv1.Deployment{deployment("nvidia", "mo-maintenance-operator", maintenanceLabels, 2, "/manager")},
			want: "NVIDIA Maintenance Operator runs as Deployment nvidia/mo-maintenance-operator (2 ready) without leader election"},
		{name: "without leader election, scaled to 0", op: liveowner.MaintenanceOperator,
			deps: []*appsv1.Deployment{deployment("nvidia", "maintenance-operator", maintenanceLabels, 0, "/manager")}},
		{name: "leader election switched off", op: liveowner.GPUOperator,
			deps: []*appsv1.Deployment{deployment("gpu-operator", "gpu-operator", map[string]string{"app": "gpu-operator"}, 1, "gpu-operator", "--leader-elect=false")},
			want: "NVIDIA GPU Operator runs as Deployment gpu-operator/gpu-operator"},
		{name: "the other operator's Deployment is not this one's", op: liveowner.GPUOperator,
			deps: []*appsv1.Deployment{deployment("nvidia", "maintenance-operator", maintenanceLabels, 1, "/manager")}},
		{name: "this gpufleet's own Deployment", op: liveowner.GPUOperator,
			deps: []*appsv1.Deployment{deployment("gpufleet-system", "gpufleet", nil, 1, "/usr/local/bin/gpufleet", "operator")}},
		{name: "a second gpufleet", op: liveowner.MaintenanceOperator,
			deps: []*appsv1.Deployment{deployment("team-b", "fleet", nil, 1, "/usr/local/bin/gpufleet", "operator", "--leader-elect")},
			want: "another gpufleet operator runs as Deployment team-b/fleet (1 ready)"},
		{name: "gpufleet's agent is not an operator", op: liveowner.MaintenanceOperator,
			deps: []*appsv1.Deployment{deployment("team-b", "fleet-agent", nil, 1, "gpufleet", "agent")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			if err := clientgoscheme.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			objs := make([]client.Object, 0, len(tc.deps))
			for _, d := range tc.deps {
				objs = append(objs, d)
			}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&appsv1.Deployment{}).Build()
			obs := &liveowner.Observer{Rivals: &liveowner.Rivals{Namespace: "gpufleet-system", Reader: c}}
			h, found, err := obs.Read(t.Context(), nil, tc.op, now)
			if err != nil {
				t.Fatal(err)
			}
			if found != (tc.want != "") || !strings.Contains(h.Message(), tc.want) {
				t.Fatalf("found %t %q, want %q", found, h.Message(), tc.want)
			}
			if !found {
				return
			}
			if !h.Until.After(now) || !h.Names(h.Message()) || h.Names("") {
				t.Errorf("holding %+v: Until must be ahead, Names its own message only", h)
			}
			if !strings.HasSuffix(h.Message(), "gpufleet does not act beside it") {
				t.Errorf("the message does not say what gpufleet does: %q", h.Message())
			}
		})
	}
}

func TestNoRivalsLookAtNothing(t *testing.T) {
	var obs *liveowner.Observer
	if _, found, err := obs.Read(t.Context(), nil, liveowner.GPUOperator, time.Now()); found || err != nil {
		t.Errorf("a nil Observer found %t, %v", found, err)
	}
	if _, found, err := (&liveowner.Observer{}).Rival(t.Context(), liveowner.GPUOperator, time.Now()); found || err != nil {
		t.Errorf("no Rivals found %t, %v", found, err)
	}
	var r *liveowner.Rivals
	if r.Source(nil) != nil {
		t.Error("nil Rivals give a watch")
	}
}
