package maintenance

import (
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // the image has no zoneinfo: time zones come with the binary

	"github.com/robfig/cron/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// cronParser reads the five standard fields and the @descriptors.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// maxWindowDuration bounds the search for the activation that opened a
// window (the schema allows no more).
const maxWindowDuration = 168 * time.Hour

// dstSlack covers the largest wall-clock jump of a time-zone change.
const dstSlack = 3 * time.Hour

// Window is a compiled recurring maintenance window.
type Window struct {
	Name     string
	schedule cron.Schedule
	duration time.Duration
	loc      *time.Location
}

// Exclusion is an absolute period without new maintenance: [Start, End).
type Exclusion struct {
	Name       string
	Start, End time.Time
}

// Calendar says when new maintenance may start: inside one of its windows
// (always, when it has none) and outside all of its exclusions. The zero
// Calendar is always open.
type Calendar struct {
	Windows    []Window
	Exclusions []Exclusion
}

// CompileCalendar reads the windows and exclusions of a config. Every
// problem is reported (joined), naming the field.
func CompileCalendar(windows []maintenancev1.MaintenanceWindow, exclusions []maintenancev1.MaintenanceExclusion) (Calendar, error) {
	var c Calendar
	var errs []error
	for i, w := range windows {
		field := fmt.Sprintf("maintenanceWindows[%d] (%s)", i, w.Name)
		win, err := compileWindow(w)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
			continue
		}
		c.Windows = append(c.Windows, win)
	}
	for i, e := range exclusions {
		if !e.End.After(e.Start.Time) {
			errs = append(errs, fmt.Errorf("maintenanceExclusions[%d] (%s): ends (%s) before it starts (%s)",
				i, e.Name, e.End.UTC().Format(time.RFC3339), e.Start.UTC().Format(time.RFC3339)))
			continue
		}
		c.Exclusions = append(c.Exclusions, Exclusion{Name: e.Name, Start: e.Start.Time, End: e.End.Time})
	}
	return c, errors.Join(errs...)
}

func compileWindow(w maintenancev1.MaintenanceWindow) (Window, error) {
	if strings.Contains(w.Schedule, "TZ=") {
		return Window{}, fmt.Errorf("schedule %q: set the time zone in timeZone, not in the schedule", w.Schedule)
	}
	sched, err := cronParser.Parse(w.Schedule)
	if err != nil {
		return Window{}, fmt.Errorf("schedule %q: %w", w.Schedule, err)
	}
	if d := w.Duration.Duration; d <= 0 || d > maxWindowDuration {
		return Window{}, fmt.Errorf("duration %s: must be more than 0 and at most %s", d, maxWindowDuration)
	}
	loc := time.UTC
	if w.TimeZone != "" {
		if loc, err = time.LoadLocation(w.TimeZone); err != nil {
			return Window{}, fmt.Errorf("timeZone %q: unknown time zone", w.TimeZone)
		}
	}
	return Window{Name: w.Name, schedule: sched, duration: w.Duration.Duration, loc: loc}, nil
}

// NewWindow compiles one window (for tests and callers outside a config).
func NewWindow(name, schedule string, duration time.Duration, timeZone string) (Window, error) {
	return compileWindow(maintenancev1.MaintenanceWindow{Name: name, Schedule: schedule,
		Duration: metav1.Duration{Duration: duration}, TimeZone: timeZone})
}

// CalendarState is what a Calendar says about one moment.
type CalendarState struct {
	// Open: new maintenance may start.
	Open bool
	// Reason says why it is closed ("" when open).
	Reason string
	// NextChange is the next moment the state may change (zero: never);
	// the scheduler wakes then.
	NextChange time.Time
}

// searchLimit bounds the search for the next opening (a schedule such as
// "0 0 30 2 *" never fires).
const searchLimit = 1000

// At evaluates the calendar at now.
func (c Calendar) At(now time.Time) CalendarState {
	if len(c.Windows) == 0 && len(c.Exclusions) == 0 {
		return CalendarState{Open: true}
	}
	open, closes := c.windowOpen(now)
	excl, inExcl := c.exclusionAt(now)
	if open && !inExcl {
		next := closes
		if s, ok := c.nextExclusionStart(now); ok && (next.IsZero() || s.Before(next)) {
			next = s
		}
		return CalendarState{Open: true, NextChange: next}
	}
	opens, w, ok := c.nextOpen(now)
	var why string
	if inExcl {
		why = fmt.Sprintf("in maintenance exclusion %q until %s", excl.Name, excl.End.Format(time.RFC3339))
	} else {
		why = "outside maintenance window"
	}
	if !ok {
		return CalendarState{Reason: why + "; no window opens in the foreseeable future"}
	}
	return CalendarState{Reason: fmt.Sprintf("%s; next opens %s", why, opens.In(w.loc).Format(time.RFC3339)), NextChange: opens}
}

// windowOpen reports whether a window (or none configured) is open at t,
// and when the open windows' current periods end (zero without windows).
func (c Calendar) windowOpen(t time.Time) (bool, time.Time) {
	if len(c.Windows) == 0 {
		return true, time.Time{}
	}
	var open bool
	var closes time.Time
	for _, w := range c.Windows {
		if start, ok := w.lastStart(t); ok && t.Before(start.Add(w.duration)) {
			open = true
			if end := start.Add(w.duration); closes.IsZero() || end.Before(closes) {
				closes = end
			}
		}
	}
	return open, closes
}

func (c Calendar) exclusionAt(t time.Time) (Exclusion, bool) {
	found, ok := Exclusion{}, false
	for _, e := range c.Exclusions {
		if !t.Before(e.Start) && t.Before(e.End) && (!ok || e.End.After(found.End)) {
			found, ok = e, true
		}
	}
	return found, ok
}

func (c Calendar) nextExclusionStart(t time.Time) (time.Time, bool) {
	var next time.Time
	for _, e := range c.Exclusions {
		if e.Start.After(t) && (next.IsZero() || e.Start.Before(next)) {
			next = e.Start
		}
	}
	return next, !next.IsZero()
}

// nextOpen finds the first moment after t at which a window is open and no
// exclusion applies, and the window that opens then.
func (c Calendar) nextOpen(t time.Time) (time.Time, Window, bool) {
	for range searchLimit {
		if e, in := c.exclusionAt(t); in {
			t = e.End
			if open, _ := c.windowOpen(t); open {
				return t, c.openWindow(t), true
			}
		}
		var best time.Time
		var bestW Window
		for _, w := range c.Windows {
			if s, ok := w.nextStart(t); ok && (best.IsZero() || s.Before(best)) {
				best, bestW = s, w
			}
		}
		if best.IsZero() {
			return time.Time{}, Window{}, false
		}
		if _, in := c.exclusionAt(best); !in {
			return best, bestW, true
		}
		t = best
	}
	return time.Time{}, Window{}, false
}

// openWindow returns a window open at t (the first listed), or, when there
// are no windows, a placeholder in t's location.
func (c Calendar) openWindow(t time.Time) Window {
	for _, w := range c.Windows {
		if s, ok := w.lastStart(t); ok && t.Before(s.Add(w.duration)) {
			return w
		}
	}
	return Window{loc: t.Location()}
}

// Activations are computed on the wall clock of the window's time zone (a
// time.Time in UTC carrying local wall-clock fields), then placed on the
// real time line by start.

// wall returns t's wall-clock fields in loc, as a UTC time.
func wall(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
}

// real places a wall-clock activation in loc on the time line: a time the
// clocks skip (they go forward) becomes the moment they change; a time that
// happens twice (they go back) is its first occurrence.
func (w Window) real(a time.Time) time.Time {
	t := time.Date(a.Year(), a.Month(), a.Day(), a.Hour(), a.Minute(), a.Second(), 0, w.loc)
	if wall(t, w.loc).Equal(a) {
		// Go resolves a repeated wall time to either occurrence; take the
		// first: if the clocks went back at the start of t's zone period,
		// a may also have happened before that.
		start, _ := t.ZoneBounds()
		_, now := t.Zone()
		_, before := start.Add(-time.Nanosecond).Zone()
		if back := time.Duration(before-now) * time.Second; !start.IsZero() && back > 0 {
			if earlier := t.Add(-back); earlier.Before(start) && wall(earlier, w.loc).Equal(a) {
				return earlier
			}
		}
		return t
	}
	// a is skipped: Go placed it on one side of the jump; the moment the
	// clocks jumped over it is the boundary of t's zone period on the
	// other side.
	start, end := t.ZoneBounds()
	if wall(t, w.loc).Before(a) {
		return end
	}
	return start
}

// lastStart is the latest activation at or before t.
func (w Window) lastStart(t time.Time) (time.Time, bool) {
	from := wall(t, w.loc).Add(-w.duration - dstSlack - time.Second)
	var last time.Time
	found := false
	a := w.schedule.Next(from)
	for i := 0; !a.IsZero() && i < maxActivationsSearched; i++ {
		r := w.real(a)
		if r.After(t) {
			break
		}
		last, found = r, true
		a = w.schedule.Next(a)
	}
	return last, found
}

// maxActivationsSearched bounds lastStart: a window firing every minute for
// the longest duration, with the DST slack.
const maxActivationsSearched = int((maxWindowDuration+2*dstSlack)/time.Minute) + 2

// nextStart is the first activation after t.
func (w Window) nextStart(t time.Time) (time.Time, bool) {
	a := w.schedule.Next(wall(t, w.loc).Add(-dstSlack))
	for i := 0; !a.IsZero() && i < maxActivationsSearched; i++ {
		if r := w.real(a); r.After(t) {
			return r, true
		}
		a = w.schedule.Next(a)
	}
	return time.Time{}, false
}
