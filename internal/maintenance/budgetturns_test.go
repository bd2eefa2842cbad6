package maintenance

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// take is the blocking form of ask, for tests that hold a budget's turn
// as another drain would: it waits for the turn at most limit (wall time)
// or until ctx ends, and then goes ahead out of turn; done passes the
// turn on (nothing, out of turn).
func (b *budgetTurns) take(ctx context.Context, budget string, drainStart time.Time, node string, limit time.Duration) (done func()) {
	ready := make(chan struct{})
	t := b.ask(budget, drainStart, node, func() { close(ready) })
	done = func() { b.pass(t) }
	if b.held(t) {
		return done
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-ready:
	case <-timer.C:
	case <-ctx.Done():
	}
	b.leave(t) // handed the turn meanwhile: kept, done passes it on
	return done
}

// The turn goes to the oldest drain first (then by node), whatever the
// order of the asks; another budget's turn is separate.
func TestBudgetTurnsGoOldestDrainFirst(t *testing.T) {
	var b budgetTurns
	start := time.Unix(0, 0)
	var woken []string
	ask := func(budget string, after time.Duration, node string) *turn {
		return b.ask(budget, start.Add(after), node, func() { woken = append(woken, node) })
	}
	holder := ask("ns/a", 5*time.Second, "holder") // a late drain, first to ask
	turns := map[string]*turn{}
	for _, w := range []struct {
		after time.Duration
		node  string
	}{{3 * time.Second, "n3"}, {time.Second, "n1"}, {2 * time.Second, "n2-b"}, {2 * time.Second, "n2-a"}} {
		turns[w.node] = ask("ns/a", w.after, w.node)
	}
	other := ask("ns/b", 9*time.Second, "other")
	if !b.held(holder) || !b.held(other) {
		t.Fatal("a free turn was not taken at once")
	}
	for _, tu := range turns {
		if b.held(tu) {
			t.Fatal("a turn was taken while its budget's was held")
		}
	}

	b.pass(holder)
	for _, node := range []string{"n1", "n2-a", "n2-b", "n3"} {
		if !b.held(turns[node]) {
			t.Fatalf("%s does not hold the turn after %v were woken", node, woken)
		}
		b.pass(turns[node])
	}
	if diff := cmp.Diff([]string{"n1", "n2-a", "n2-b", "n3"}, woken); diff != "" {
		t.Errorf("turn order (-want +got):\n%s", diff)
	}
	b.pass(other)
	if len(b.queues) != 0 {
		t.Errorf("lines left once every turn was passed: %v", b.queues)
	}
}

// An ask that leaves the line is skipped; leaving while holding keeps the
// turn; passing twice passes one turn only.
func TestBudgetTurnsLeaveAndPassOnce(t *testing.T) {
	var b budgetTurns
	start := time.Unix(0, 0)
	var woken []string
	wake := func(name string) func() { return func() { woken = append(woken, name) } }
	holder := b.ask("ns/a", start, "holder", wake("holder"))
	gone := b.ask("ns/a", start.Add(time.Second), "gone", wake("gone"))
	next := b.ask("ns/a", start.Add(2*time.Second), "next", wake("next"))
	last := b.ask("ns/a", start.Add(3*time.Second), "last", wake("last"))

	if b.leave(gone) {
		t.Fatal("leave reported a waiting ask as holding the turn")
	}
	if !b.leave(holder) || !b.held(holder) {
		t.Fatal("the holder lost the turn by leaving")
	}
	b.pass(holder)
	b.pass(holder) // a second pass passes nothing
	b.pass(gone)   // left already: nothing
	if !b.held(next) || b.held(last) {
		t.Fatalf("after the holder passed twice: next held %t, last held %t; want only next", b.held(next), b.held(last))
	}
	b.pass(next)
	b.pass(last)
	if diff := cmp.Diff([]string{"next", "last"}, woken); diff != "" {
		t.Errorf("woken (-want +got):\n%s", diff)
	}
}

// The blocking take of the tests goes ahead after its bound, and the line
// stays intact behind the holder.
func TestBudgetTurnTakeIsBounded(t *testing.T) {
	var b budgetTurns
	ctx := context.Background()
	start := time.Unix(0, 0)
	holder := b.take(ctx, "ns/pdb", start, "n0", time.Hour)
	out := b.take(ctx, "ns/pdb", start.Add(time.Second), "n1", 10*time.Millisecond)
	out() // out of turn: passes nothing on
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	b.take(cancelled, "ns/pdb", start.Add(time.Second), "n1", time.Hour)() // returns at once
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
