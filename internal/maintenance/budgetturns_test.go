package maintenance

import (
	"context"
	"testing"
	"time"
)

// A drain waiting for a budget's turn behind an eviction that never ends
// goes ahead after the bound; the turn still passes on in order afterwards.
func TestBudgetTurnWaitIsBounded(t *testing.T) {
	var b budgetTurns
	ctx := context.Background()
	start := time.Unix(0, 0)
	holder := b.take(ctx, "ns/pdb", start, "n0", time.Hour) // never released until the end
	// Without the bound this call never returns (the test times out).
	out := b.take(ctx, "ns/pdb", start.Add(time.Second), "n1", 50*time.Millisecond)
	out() // out of turn: passes nothing on

	// The queue is intact: a later drain waits for the holder, then goes.
	got := make(chan struct{})
	go func() {
		done := b.take(ctx, "ns/pdb", start.Add(2*time.Second), "n2", time.Hour)
		close(got)
		done()
	}()
	select {
	case <-got:
		t.Fatal("a drain took the turn while the holder still has it")
	case <-time.After(50 * time.Millisecond):
	}
	holder()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the turn was not passed on after the holder finished")
	}
}

// A cancelled reconcile stops waiting at once.
func TestBudgetTurnWaitEndsWithTheContext(t *testing.T) {
	var b budgetTurns
	holder := b.take(context.Background(), "ns/pdb", time.Unix(0, 0), "n0", time.Hour)
	defer holder()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Bounded: a wait that ignored the context would hang here; the test
	// fails after 30 s instead of at the suite's timeout.
	returned := make(chan func(), 1)
	go func() { returned <- b.take(ctx, "ns/pdb", time.Unix(1, 0), "n1", time.Hour) }()
	select {
	case done := <-returned:
		done()
	case <-time.After(30 * time.Second):
		t.Fatal("take waited for the holder's turn although its context had ended")
	}
}
