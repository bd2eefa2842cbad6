// Package pendingevents holds a reconcile's events until the status write
// they report has succeeded: a controller records events while it computes
// the new status, then emits them after the write, or drops them when the
// write failed (the retry computes and records them again). Nothing is
// reported that did not happen.
package pendingevents

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

type event struct {
	regarding, related runtime.Object
	eventType, reason  string
	action, note       string
	args               []any
}

// Recorder buffers events. The zero value is not usable: use New.
type Recorder struct {
	to      events.EventRecorder
	pending []event
}

// New returns a Recorder that emits to rec on Flush.
func New(rec events.EventRecorder) *Recorder { return &Recorder{to: rec} }

// Eventf records an event to emit on Flush; the arguments are those of
// events.EventRecorder.Eventf.
func (r *Recorder) Eventf(regarding, related runtime.Object, eventType, reason, action, note string, args ...any) {
	r.pending = append(r.pending, event{regarding, related, eventType, reason, action, note, args})
}

// Len is the number of events waiting.
func (r *Recorder) Len() int { return len(r.pending) }

// Flush emits the recorded events, in order, and forgets them.
func (r *Recorder) Flush() {
	for _, e := range r.pending {
		r.to.Eventf(e.regarding, e.related, e.eventType, e.reason, e.action, e.note, e.args...)
	}
	r.pending = nil
}

// Drop forgets the recorded events without emitting them.
func (r *Recorder) Drop() { r.pending = nil }
