package liveowner

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func lease(ns, name, holder string, renewed time.Time, seconds int32) coordinationv1.Lease {
	l := coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if holder != "" {
		l.Spec.HolderIdentity = ptr.To(holder)
	}
	if !renewed.IsZero() {
		l.Spec.RenewTime = &metav1.MicroTime{Time: renewed}
	}
	if seconds > 0 {
		l.Spec.LeaseDurationSeconds = ptr.To(seconds)
	}
	return l
}

func TestHeld(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	cases := map[string]struct {
		leases    []coordinationv1.Lease
		wantHeld  bool
		wantNS    string
		wantUntil time.Time
	}{
		"none": {},
		"renewed 5s ago, 15s lease": {
			leases:   []coordinationv1.Lease{lease("gpu-operator", GPUOperator.Lease, "gpu-operator-7d9-abc_1", now.Add(-5*time.Second), 15)},
			wantHeld: true, wantNS: "gpu-operator", wantUntil: now.Add(10 * time.Second),
		},
		"expired": {
			leases: []coordinationv1.Lease{lease("gpu-operator", GPUOperator.Lease, "x", now.Add(-16*time.Second), 15)},
		},
		"expires exactly now": {
			leases: []coordinationv1.Lease{lease("gpu-operator", GPUOperator.Lease, "x", now.Add(-15*time.Second), 15)},
		},
		"released (no holder)": {
			leases: []coordinationv1.Lease{lease("gpu-operator", GPUOperator.Lease, "", now, 15)},
		},
		"no duration: controller-runtime's 15s": {
			leases:   []coordinationv1.Lease{lease("ns", GPUOperator.Lease, "x", now.Add(-10*time.Second), 0)},
			wantHeld: true, wantNS: "ns", wantUntil: now.Add(5 * time.Second),
		},
		"another operator's lease": {
			leases: []coordinationv1.Lease{lease("ns", MaintenanceOperator.Lease, "x", now, 15)},
		},
		"never renewed nor acquired": {
			leases: []coordinationv1.Lease{lease("ns", GPUOperator.Lease, "x", time.Time{}, 15)},
		},
		"two namespaces: the later expiry": {
			leases: []coordinationv1.Lease{
				lease("a", GPUOperator.Lease, "x", now.Add(-10*time.Second), 15),
				lease("b", GPUOperator.Lease, "y", now.Add(-1*time.Second), 15),
			},
			wantHeld: true, wantNS: "b", wantUntil: now.Add(14 * time.Second),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h, ok := Held(tc.leases, GPUOperator, now)
			if ok != tc.wantHeld || h.Namespace != tc.wantNS || !h.Until.Equal(tc.wantUntil) {
				t.Fatalf("Held = %+v, %v; want held %v in %q until %s", h, ok, tc.wantHeld, tc.wantNS, tc.wantUntil)
			}
			if ok && !strings.Contains(h.Message(), GPUOperator.Lease) {
				t.Errorf("message does not name the lease: %s", h.Message())
			}
		})
	}
}

func TestHeldAcquiredOnly(t *testing.T) {
	now := time.Now()
	l := lease("ns", MaintenanceOperator.Lease, "x", time.Time{}, 15)
	l.Spec.AcquireTime = &metav1.MicroTime{Time: now.Add(-time.Second)}
	if _, ok := Held([]coordinationv1.Lease{l}, MaintenanceOperator, now); !ok {
		t.Fatal("a lease acquired a second ago is held")
	}
}

func TestHoldingNames(t *testing.T) {
	h := Holding{Operator: GPUOperator, Namespace: "gpu-operator", Holder: "pod-a", Until: time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)}
	renewed := h
	renewed.Until = h.Until.Add(time.Minute)
	other := h
	other.Holder = "pod-b"
	if !h.Names(renewed.Message()) || h.Names(other.Message()) || h.Names("") {
		t.Errorf("Names: renewed %t, other holder %t", h.Names(renewed.Message()), h.Names(other.Message()))
	}
}
