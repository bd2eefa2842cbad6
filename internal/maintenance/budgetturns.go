package maintenance

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// budgetTurns lets evictions under one PodDisruptionBudget go one at a
// time, the oldest drain first: drains then finish one after the other and
// free their slots early, instead of all together at the end.
//
// Nobody blocks on a turn: ask takes a free turn at once or puts the
// asker in line, and the asker's wake is called when the turn comes to it
// (the evictor re-queues the eviction). The zero value is ready to use; a
// budget's line is dropped once nobody holds or waits for its turn.
type budgetTurns struct {
	mu     sync.Mutex
	queues map[string]*budgetQueue
}

type budgetQueue struct {
	holder  *turn // nil: the turn is free
	waiting []*turn
}

// turn is one eviction's ask for its budget's turn.
type turn struct {
	budget     string
	drainStart time.Time
	node       string
	wake       func()
	// held: it has the turn; done: it passed the turn on or left the line.
	held, done bool
}

// ask asks for budget's turn for a drain that started at drainStart on
// node. A free turn is taken at once (held reports true); otherwise the
// ask waits in line, the oldest drain first, and wake is called (once,
// with no lock held) when it is handed the turn.
func (b *budgetTurns) ask(budget string, drainStart time.Time, node string, wake func()) *turn {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.queues == nil {
		b.queues = map[string]*budgetQueue{}
	}
	q := b.queues[budget]
	if q == nil {
		q = &budgetQueue{}
		b.queues[budget] = q
	}
	t := &turn{budget: budget, drainStart: drainStart, node: node, wake: wake}
	if q.holder == nil {
		q.holder, t.held = t, true
		return t
	}
	at, _ := slices.BinarySearchFunc(q.waiting, t, func(a, b *turn) int {
		if c := a.drainStart.Compare(b.drainStart); c != 0 {
			return c
		}
		return strings.Compare(a.node, b.node)
	})
	q.waiting = slices.Insert(q.waiting, at, t)
	return t
}

// held reports whether t has its budget's turn.
func (b *budgetTurns) held(t *turn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return t.held
}

// leave takes t out of line unless it holds the turn (it may have been
// handed it meanwhile), and reports whether it holds it.
func (b *budgetTurns) leave(t *turn) (held bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t.held {
		return true
	}
	b.drop(t)
	return false
}

// pass ends t: a turn held passes on to the next in line (whose wake is
// called), an ask still in line leaves it. Only the first call counts.
func (b *budgetTurns) pass(t *turn) {
	b.mu.Lock()
	if !t.held {
		b.drop(t)
		b.mu.Unlock()
		return
	}
	t.held, t.done = false, true
	q := b.queues[t.budget]
	q.holder = nil
	var next *turn
	if len(q.waiting) > 0 {
		next = q.waiting[0]
		q.waiting = slices.Delete(q.waiting, 0, 1)
		q.holder, next.held = next, true
	} else {
		delete(b.queues, t.budget)
	}
	b.mu.Unlock()
	if next != nil && next.wake != nil {
		next.wake()
	}
}

// drop takes t, which does not hold the turn, out of line (b.mu held).
func (b *budgetTurns) drop(t *turn) {
	if t.done {
		return
	}
	t.done = true
	q := b.queues[t.budget]
	if i := slices.Index(q.waiting, t); i >= 0 {
		q.waiting = slices.Delete(q.waiting, i, i+1)
	}
}
