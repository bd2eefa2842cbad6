package liveowner

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestObserverJudgesByObservation: a holder is alive while its lease's
// record changes, whatever its renewTime says against gpufleet's clock: a
// holder whose clock is an hour behind, renewing, is alive; one whose
// renewTime is in gpufleet's future but that stopped renewing (frozen) is
// dead a lease duration after gpufleet last saw it change. A lease seen
// for the first time counts as renewed then; this gpufleet's own fence
// never counts, another gpufleet's does; a released lease is free.
func TestObserverJudgesByObservation(t *testing.T) {
	t0 := time.Date(2026, 12, 8, 1, 0, 0, 0, time.UTC)
	op := MaintenanceOperator
	at := func(holder string, renewed time.Time) coordinationv1.Lease {
		return lease("nvidia", op.Lease, holder, renewed, 15)
	}
	o := &Observer{}
	step := func(now time.Time, l coordinationv1.Lease, want bool) {
		t.Helper()
		if _, held := o.Held([]coordinationv1.Lease{l}, op, now); held != want {
			t.Errorf("at %s, lease renewed %s by %s: held %t, want %t", now.Sub(t0), l.Spec.RenewTime.Sub(t0), holder(&l), held, want)
		}
	}
	// A skewed holder: renewTime an hour in the past, renewed every 2 s.
	for i := range 10 {
		now := t0.Add(time.Duration(2*i) * time.Second)
		step(now, at("skewed", now.Add(-time.Hour)), true)
	}
	// It stops renewing: alive until 15 s after its last change was seen.
	last := at("skewed", t0.Add(18*time.Second).Add(-time.Hour))
	step(t0.Add(32*time.Second), last, true)
	step(t0.Add(33*time.Second), last, false)

	// A frozen holder whose renewTime is in the future of gpufleet's clock.
	o = &Observer{}
	frozen := at("frozen", t0.Add(time.Hour))
	step(t0, frozen, true)                     // first seen: as if renewed now
	step(t0.Add(14*time.Second), frozen, true) // unchanged
	step(t0.Add(15*time.Second), frozen, false)

	// This gpufleet's own fence; another gpufleet's (a second one in the
	// cluster, or this one's previous leader) is a holder like any other.
	o = &Observer{Self: FencePrefix + "gpufleet-operator-7d9-abc"}
	step(t0, at(FencePrefix+"gpufleet-operator-7d9-abc", t0), false)
	step(t0, at(FencePrefix+"gpufleet-operator-5c2-xyz", t0), true)
	released := lease("nvidia", op.Lease, "", t0, 1)
	step(t0, released, false)

	// A nil Observer remembers nothing: a holder counts as held.
	var none *Observer
	if _, held := none.Held([]coordinationv1.Lease{frozen}, op, t0.Add(time.Hour)); !held {
		t.Errorf("a nil Observer took a holder for dead")
	}
}

// TestFenceStep: the fence takes a released lease and one whose holder
// is dead by observation; waits for a live holder, another gpufleet's
// fence included; renews its own every third of the duration.
func TestFenceStep(t *testing.T) {
	t0 := time.Date(2026, 12, 8, 1, 0, 0, 0, time.UTC)
	const me = FencePrefix + "pod-b"
	o := &Observer{}
	live := lease("nvidia", GPUOperator.Lease, "gpu-operator-1", t0, 15)
	if act, next := FenceStep(&live, o, me, t0); act != FenceWait || next <= 14*time.Second || next > 16*time.Second {
		t.Errorf("a live holder: %d after %s, want to wait about 15 s", act, next)
	}
	if act, _ := FenceStep(&live, o, me, t0.Add(15*time.Second)); act != FenceAcquire {
		t.Errorf("a holder silent for a lease duration: %d, want acquire", act)
	}
	released := lease("nvidia", GPUOperator.Lease, "", t0, 15)
	if act, _ := FenceStep(&released, o, me, t0); act != FenceAcquire {
		t.Errorf("a released lease: %d, want acquire", act)
	}
	other := lease("nvidia2", GPUOperator.Lease, FencePrefix+"pod-a", t0, 15)
	if act, _ := FenceStep(&other, o, me, t0); act != FenceWait {
		t.Errorf("another gpufleet's live fence: %d, want to wait", act)
	}
	mine := lease("nvidia", GPUOperator.Lease, me, t0, 15)
	if act, next := FenceStep(&mine, o, me, t0.Add(2*time.Second)); act != FenceNothing || next != 3*time.Second {
		t.Errorf("its own, renewed 2 s ago: %d after %s, want nothing for 3 s", act, next)
	}
	if act, _ := FenceStep(&mine, o, me, t0.Add(5*time.Second)); act != FenceRenew {
		t.Errorf("its own, renewed 5 s ago: %d, want renew", act)
	}
	mine.Spec.RenewTime = &metav1.MicroTime{Time: t0.Add(time.Hour)} // written by a skewed clock
	mine.Spec.LeaseTransitions = ptr.To[int32](3)
	if act, _ := FenceStep(&mine, o, me, t0); act != FenceRenew {
		t.Errorf("its own, renewed in the future: %d, want renew", act)
	}
}
