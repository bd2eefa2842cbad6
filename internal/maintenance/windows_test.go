package maintenance

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

func mustLoc(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func mustWindow(t testing.TB, schedule string, d time.Duration, tz string) Window {
	t.Helper()
	w, err := NewWindow("w", schedule, d, tz)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestCalendarAt(t *testing.T) {
	berlin := mustLoc(t, "Europe/Berlin")
	ny := mustLoc(t, "America/New_York")
	kolkata := mustLoc(t, "Asia/Kolkata")
	weekdays := mustWindow(t, "0 1 * * 1-5", 4*time.Hour, "Europe/Berlin")
	at := func(loc *time.Location, y int, m time.Month, d, h, mi int) time.Time {
		return time.Date(y, m, d, h, mi, 0, 0, loc)
	}
	freeze := Exclusion{Name: "eoq-freeze", Start: at(berlin, 2026, 12, 3, 0, 0), End: at(berlin, 2026, 12, 8, 0, 0)}

	tests := map[string]struct {
		cal      Calendar
		now      time.Time
		wantOpen bool
		// wantNext is the next change (zero: none).
		wantNext   time.Time
		wantReason string
	}{
		"no windows, no exclusions: always open": {
			cal: Calendar{}, now: at(berlin, 2026, 12, 3, 12, 0), wantOpen: true,
		},
		"inside a weekday window (Thursday 02:00 Berlin)": {
			cal: Calendar{Windows: []Window{weekdays}}, now: at(berlin, 2026, 12, 3, 2, 0),
			wantOpen: true, wantNext: at(berlin, 2026, 12, 3, 5, 0),
		},
		"the window opens at its first minute": {
			cal: Calendar{Windows: []Window{weekdays}}, now: at(berlin, 2026, 12, 3, 1, 0),
			wantOpen: true, wantNext: at(berlin, 2026, 12, 3, 5, 0),
		},
		"a second before it opens": {
			cal: Calendar{Windows: []Window{weekdays}}, now: at(berlin, 2026, 12, 3, 1, 0).Add(-time.Second),
			wantNext: at(berlin, 2026, 12, 3, 1, 0), wantReason: "outside maintenance window; next opens 2026-12-03T01:00:00+01:00",
		},
		"it closes after its duration (end exclusive)": {
			cal: Calendar{Windows: []Window{weekdays}}, now: at(berlin, 2026, 12, 3, 5, 0),
			wantNext: at(berlin, 2026, 12, 4, 1, 0), wantReason: "outside maintenance window; next opens 2026-12-04T01:00:00+01:00",
		},
		"Friday afternoon: next is Monday": {
			cal: Calendar{Windows: []Window{weekdays}}, now: at(berlin, 2026, 12, 4, 15, 0),
			wantNext: at(berlin, 2026, 12, 7, 1, 0), wantReason: "outside maintenance window; next opens 2026-12-07T01:00:00+01:00",
		},
		"a window over midnight is open after midnight": {
			cal: Calendar{Windows: []Window{mustWindow(t, "0 22 * * *", 4*time.Hour, "UTC")}}, now: time.Date(2026, 12, 3, 1, 30, 0, 0, time.UTC),
			wantOpen: true, wantNext: time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC),
		},
		"the message uses the window's time zone": {
			cal: Calendar{Windows: []Window{mustWindow(t, "30 3 * * *", time.Hour, "Asia/Kolkata")}}, now: time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC),
			wantNext: at(kolkata, 2026, 12, 4, 3, 30), wantReason: "outside maintenance window; next opens 2026-12-04T03:30:00+05:30",
		},
		"two windows: the earlier opening wins": {
			cal: Calendar{Windows: []Window{weekdays, mustWindow(t, "0 10 * * 6", 2*time.Hour, "America/New_York")}}, now: at(berlin, 2026, 12, 4, 15, 0),
			wantNext: at(ny, 2026, 12, 5, 10, 0), wantReason: "outside maintenance window; next opens 2026-12-05T10:00:00-05:00",
		},
		// DST in Berlin: 2026-03-29 02:00 CET -> 03:00 CEST; 2026-10-25 03:00 CEST -> 02:00 CET.
		"DST starts: a 02:30 window opens when the clocks jump (03:00 CEST)": {
			cal: Calendar{Windows: []Window{mustWindow(t, "30 2 * * *", 2*time.Hour, "Europe/Berlin")}}, now: at(berlin, 2026, 3, 29, 1, 0),
			wantNext: at(berlin, 2026, 3, 29, 3, 0), wantReason: "outside maintenance window; next opens 2026-03-29T03:00:00+02:00",
		},
		"DST starts: open just after the jump, for its whole duration": {
			cal: Calendar{Windows: []Window{mustWindow(t, "30 2 * * *", 2*time.Hour, "Europe/Berlin")}}, now: at(berlin, 2026, 3, 29, 4, 30),
			wantOpen: true, wantNext: at(berlin, 2026, 3, 29, 5, 0),
		},
		"DST starts: the day after opens at 02:30 again": {
			cal: Calendar{Windows: []Window{mustWindow(t, "30 2 * * *", 2*time.Hour, "Europe/Berlin")}}, now: at(berlin, 2026, 3, 29, 12, 0),
			wantNext: at(berlin, 2026, 3, 30, 2, 30), wantReason: "outside maintenance window; next opens 2026-03-30T02:30:00+02:00",
		},
		"DST ends: a 02:30 window opens once, at the first 02:30 (CEST)": {
			cal: Calendar{Windows: []Window{mustWindow(t, "30 2 * * *", time.Hour, "Europe/Berlin")}}, now: at(berlin, 2026, 10, 25, 1, 0),
			wantNext: time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC), wantReason: "outside maintenance window; next opens 2026-10-25T02:30:00+02:00",
		},
		"DST ends: closed at the second 02:30 (CET) once its hour has passed": {
			cal: Calendar{Windows: []Window{mustWindow(t, "30 2 * * *", time.Hour, "Europe/Berlin")}}, now: time.Date(2026, 10, 25, 1, 30, 0, 0, time.UTC), // 02:30 CET
			wantNext: at(berlin, 2026, 10, 26, 2, 30), wantReason: "outside maintenance window; next opens 2026-10-26T02:30:00+01:00",
		},
		"DST in New York (2026-03-08): a 02:15 window opens at 03:00 EDT": {
			cal: Calendar{Windows: []Window{mustWindow(t, "15 2 * * *", time.Hour, "America/New_York")}}, now: at(ny, 2026, 3, 8, 0, 0),
			wantNext: at(ny, 2026, 3, 8, 3, 0), wantReason: "outside maintenance window; next opens 2026-03-08T03:00:00-04:00",
		},
		"an exclusion closes an open window": {
			cal: Calendar{Windows: []Window{weekdays}, Exclusions: []Exclusion{freeze}}, now: at(berlin, 2026, 12, 3, 2, 0),
			wantNext: at(berlin, 2026, 12, 8, 1, 0), wantReason: `in maintenance exclusion "eoq-freeze" until 2026-12-08T00:00:00+01:00; next opens 2026-12-08T01:00:00+01:00`,
		},
		"an exclusion without windows: open when it ends": {
			cal: Calendar{Exclusions: []Exclusion{freeze}}, now: at(berlin, 2026, 12, 5, 0, 0),
			wantNext: at(berlin, 2026, 12, 8, 0, 0), wantReason: `in maintenance exclusion "eoq-freeze" until 2026-12-08T00:00:00+01:00; next opens 2026-12-08T00:00:00+01:00`,
		},
		"an exclusion ending inside a window: open when it ends": {
			cal: Calendar{Windows: []Window{weekdays}, Exclusions: []Exclusion{{Name: "x", Start: at(berlin, 2026, 12, 3, 0, 0), End: at(berlin, 2026, 12, 3, 2, 0)}}},
			now: at(berlin, 2026, 12, 3, 1, 30), wantNext: at(berlin, 2026, 12, 3, 2, 0),
			wantReason: `in maintenance exclusion "x" until 2026-12-03T02:00:00+01:00; next opens 2026-12-03T02:00:00+01:00`,
		},
		"an exclusion covering the next openings skips them": {
			cal: Calendar{Windows: []Window{weekdays}, Exclusions: []Exclusion{freeze}}, now: at(berlin, 2026, 12, 2, 12, 0),
			wantNext:   at(berlin, 2026, 12, 3, 0, 0), // the state may change when the exclusion starts? no: it is already closed
			wantReason: "outside maintenance window; next opens 2026-12-08T01:00:00+01:00",
		},
		"open, an exclusion ahead: the next change is the earlier of its start and the close": {
			cal: Calendar{Windows: []Window{weekdays}, Exclusions: []Exclusion{{Name: "x", Start: at(berlin, 2026, 12, 3, 3, 0), End: at(berlin, 2026, 12, 4, 0, 0)}}},
			now: at(berlin, 2026, 12, 3, 2, 0), wantOpen: true, wantNext: at(berlin, 2026, 12, 3, 3, 0),
		},
		"a schedule that never fires": {
			cal: Calendar{Windows: []Window{mustWindow(t, "0 0 30 2 *", time.Hour, "UTC")}}, now: at(berlin, 2026, 12, 3, 2, 0),
			wantReason: "outside maintenance window; no window opens in the foreseeable future",
		},
		"every minute for a week: open (the next change is the end of the latest opening's period)": {
			cal: Calendar{Windows: []Window{mustWindow(t, "* * * * *", 168*time.Hour, "UTC")}}, now: at(berlin, 2026, 12, 3, 2, 0),
			wantOpen: true, wantNext: at(berlin, 2026, 12, 3, 2, 0).Add(168 * time.Hour),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := tc.cal.At(tc.now)
			if got.Open != tc.wantOpen || got.Reason != tc.wantReason {
				t.Errorf("At(%s) = open %v %q, want open %v %q", tc.now, got.Open, got.Reason, tc.wantOpen, tc.wantReason)
			}
			if name == "an exclusion covering the next openings skips them" {
				// Closed until the window after the exclusion; waking
				// earlier is harmless, waking later is not.
				if got.NextChange.After(at(berlin, 2026, 12, 8, 1, 0)) {
					t.Errorf("next change %s is after the next opening", got.NextChange)
				}
				return
			}
			if !got.NextChange.Equal(tc.wantNext) {
				t.Errorf("NextChange = %s, want %s", got.NextChange, tc.wantNext)
			}
		})
	}
}

// TestCalendarOpenMatchesReason: whenever the calendar is closed it names
// the next opening, and at that moment it is open (a property over a year
// of hourly samples in several zones, DST days included).
func TestCalendarNextOpeningIsOpen(t *testing.T) {
	cals := []Calendar{
		{Windows: []Window{mustWindow(t, "30 2 * * *", 2*time.Hour, "Europe/Berlin")}},
		{Windows: []Window{mustWindow(t, "0 1 * * 1-5", 4*time.Hour, "America/New_York")}},
		{Windows: []Window{mustWindow(t, "45 23 * * 0", 30*time.Minute, "Australia/Lord_Howe")}},
		{Windows: []Window{mustWindow(t, "@daily", time.Hour, "Asia/Kolkata")}, Exclusions: []Exclusion{{Name: "x",
			Start: time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC), End: time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)}}},
	}
	for i, c := range cals {
		for now := time.Date(2026, 1, 1, 0, 7, 0, 0, time.UTC); now.Year() == 2026; now = now.Add(time.Hour) {
			st := c.At(now)
			if st.NextChange.IsZero() || !st.NextChange.After(now) {
				t.Fatalf("calendar %d at %s: next change %s is not after now", i, now, st.NextChange)
			}
			if !st.Open {
				if got := c.At(st.NextChange); !got.Open {
					t.Fatalf("calendar %d at %s: said %q, but at %s it is closed: %q", i, now, st.Reason, st.NextChange, got.Reason)
				}
				if mid := now.Add(st.NextChange.Sub(now) / 2); c.At(mid).Open {
					t.Fatalf("calendar %d at %s: open at %s, before the opening it named (%s)", i, now, mid, st.NextChange)
				}
			}
		}
	}
}

func TestCompileCalendarErrors(t *testing.T) {
	start := metav1.NewTime(time.Date(2026, 12, 20, 0, 0, 0, 0, time.UTC))
	tests := map[string]struct {
		windows    []maintenancev1.MaintenanceWindow
		exclusions []maintenancev1.MaintenanceExclusion
		wantErr    []string
	}{
		"valid": {
			windows:    []maintenancev1.MaintenanceWindow{{Name: "nightly", Schedule: "0 1 * * 1-5", Duration: metav1.Duration{Duration: 4 * time.Hour}, TimeZone: "Europe/Berlin"}},
			exclusions: []maintenancev1.MaintenanceExclusion{{Name: "x", Start: start, End: metav1.NewTime(start.Add(time.Hour))}},
		},
		"malformed cron, unknown zone, zero duration and a backwards exclusion, all reported": {
			windows: []maintenancev1.MaintenanceWindow{
				{Name: "a", Schedule: "61 * * * *", Duration: metav1.Duration{Duration: time.Hour}},
				{Name: "b", Schedule: "0 1 * * *", Duration: metav1.Duration{Duration: time.Hour}, TimeZone: "Mars/Olympus"},
				{Name: "c", Schedule: "0 1 * * *"},
				{Name: "d", Schedule: "CRON_TZ=UTC 0 1 * * *", Duration: metav1.Duration{Duration: time.Hour}},
			},
			exclusions: []maintenancev1.MaintenanceExclusion{{Name: "e", Start: start, End: start}},
			wantErr: []string{
				`maintenanceWindows[0] (a): schedule "61 * * * *": end of range (61) above maximum (59): 61`,
				`maintenanceWindows[1] (b): timeZone "Mars/Olympus": unknown time zone`,
				`maintenanceWindows[2] (c): duration 0s: must be more than 0 and at most 168h0m0s`,
				`maintenanceWindows[3] (d): schedule "CRON_TZ=UTC 0 1 * * *": set the time zone in timeZone, not in the schedule`,
				`maintenanceExclusions[0] (e): ends (2026-12-20T00:00:00Z) before it starts (2026-12-20T00:00:00Z)`,
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := CompileCalendar(tc.windows, tc.exclusions)
			var got []string
			if err != nil {
				got = strings.Split(err.Error(), "\n")
			}
			if diff := cmp.Diff(tc.wantErr, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzCompileCalendar(f *testing.F) {
	f.Add("0 1 * * 1-5", int64(time.Hour), "Europe/Berlin", int64(0))
	f.Add("@weekly", int64(time.Minute), "", int64(1e9))
	f.Add("*/7 3-5 1,15 */2 SUN", int64(168*time.Hour), "Australia/Lord_Howe", int64(-5e15))
	f.Fuzz(func(t *testing.T, sched string, d int64, tz string, nowOffset int64) {
		cal, err := CompileCalendar([]maintenancev1.MaintenanceWindow{{Name: "f", Schedule: sched,
			Duration: metav1.Duration{Duration: time.Duration(d)}, TimeZone: tz}}, nil)
		if err != nil {
			return
		}
		now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC).Add(time.Duration(nowOffset % int64(20*365*24*time.Hour)))
		st := cal.At(now)
		if st.Open != (st.Reason == "") {
			t.Fatalf("open %v but reason %q", st.Open, st.Reason)
		}
		if !st.NextChange.IsZero() && !st.NextChange.After(now) {
			t.Fatalf("next change %s not after %s", st.NextChange, now)
		}
	})
}
