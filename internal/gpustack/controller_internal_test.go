package gpustack

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestPassWaitCoalescesPassesOfAPolicy(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	r := &Reconciler{Clock: clk, PassInterval: 200 * time.Millisecond}
	if w := r.passWait("a"); w != 0 {
		t.Fatalf("first pass waits %s", w)
	}
	clk.SetTime(t0.Add(50 * time.Millisecond))
	if w := r.passWait("a"); w != 150*time.Millisecond {
		t.Errorf("50ms after a pass: wait %s, want 150ms", w)
	}
	if w := r.passWait("b"); w != 0 {
		t.Errorf("another policy waits %s", w)
	}
	clk.SetTime(t0.Add(200 * time.Millisecond))
	if w := r.passWait("a"); w != 0 {
		t.Errorf("at the interval: wait %s", w)
	}
	if w := r.passWait("a"); w != 200*time.Millisecond {
		t.Errorf("right after the second pass: wait %s, want 200ms", w)
	}
	off := &Reconciler{Clock: clk}
	for range 3 {
		if w := off.passWait("a"); w != 0 {
			t.Errorf("without an interval: wait %s", w)
		}
	}
}
