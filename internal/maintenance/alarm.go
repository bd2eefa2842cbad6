package maintenance

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Alarm wakes the scheduler at one moment (the next change of the
// maintenance calendar): one timer on the injected clock, no polling. Set
// replaces the moment; a wake-up that finds nothing to do is harmless.
type Alarm struct {
	clock clock.WithDelayedExecution
	ch    chan event.TypedGenericEvent[struct{}]

	mu    sync.Mutex
	at    time.Time
	timer clock.Timer
}

// NewAlarm uses c's timers (a fake clock's in tests).
func NewAlarm(c clock.WithDelayedExecution) *Alarm {
	return &Alarm{clock: c, ch: make(chan event.TypedGenericEvent[struct{}], 1)}
}

// Set arms the alarm for at (zero: disarm). A nil Alarm ignores it.
func (a *Alarm) Set(at time.Time) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if at.Equal(a.at) {
		return
	}
	if a.timer != nil {
		a.timer.Stop()
		a.timer = nil
	}
	a.at = at
	if at.IsZero() {
		return
	}
	a.timer = a.clock.AfterFunc(at.Sub(a.clock.Now()), func() {
		a.mu.Lock()
		a.at = time.Time{} // fired: the next pass arms it again
		a.mu.Unlock()
		select {
		case a.ch <- event.TypedGenericEvent[struct{}]{}:
		default: // a wake-up is already queued
		}
	})
}

// Source delivers the wake-ups to a controller through h.
func (a *Alarm) Source(h handler.TypedEventHandler[struct{}, reconcile.Request]) source.Source {
	return source.Channel(a.ch, h)
}
