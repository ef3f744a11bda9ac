package rule_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

func utc(y int, mo time.Month, d, h, mi int) time.Time {
	return time.Date(y, mo, d, h, mi, 0, 0, time.UTC)
}

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return loc
}

// TestWindowBoundaries pins Start, Next and RetryAfter on fixed instants:
// 23-, 25-, 23.5- and 24.5-hour days, skipped and repeated reset times,
// hour windows in half- and quarter-hour zones, week starts and month ends.
func TestWindowBoundaries(t *testing.T) {
	t.Parallel()
	ny, london, berlin := zone(t, "America/New_York"), zone(t, "Europe/London"), zone(t, "Europe/Berlin")
	lordHowe, kolkata, kathmandu := zone(t, "Australia/Lord_Howe"), zone(t, "Asia/Kolkata"), zone(t, "Asia/Kathmandu")
	paris, tokyo := zone(t, "Europe/Paris"), zone(t, "Asia/Tokyo")
	hm := func(h, m int) time.Duration { return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute }
	tests := []struct {
		name        string
		w           rule.Window
		t           time.Time
		start, next time.Time
	}{
		// America/New_York: EST -5, EDT -4; spring forward 2026-03-08 02:00 EST, fall back 2026-11-01 02:00 EDT.
		{"NY day, the 23-hour day", rule.Window{Unit: rule.WindowDay, Location: ny}, utc(2026, 3, 8, 12, 0), utc(2026, 3, 8, 5, 0), utc(2026, 3, 9, 4, 0)},
		{"NY day, the 25-hour day", rule.Window{Unit: rule.WindowDay, Location: ny}, utc(2026, 11, 1, 12, 0), utc(2026, 11, 1, 4, 0), utc(2026, 11, 2, 5, 0)},
		{"NY 02:30 does not exist: resets at 03:00 EDT", rule.Window{Unit: rule.WindowDay, Location: ny, ResetAt: hm(2, 30)}, utc(2026, 3, 8, 12, 0), utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30)},
		{"NY 02:30, the window before the gap ends at the gap", rule.Window{Unit: rule.WindowDay, Location: ny, ResetAt: hm(2, 30)}, utc(2026, 3, 8, 6, 59), utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7, 0)},
		{"NY 01:30 twice: resets once, at 01:30 EDT", rule.Window{Unit: rule.WindowDay, Location: ny, ResetAt: hm(1, 30)}, utc(2026, 11, 1, 6, 45), utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)},
		{"NY 01:30, a minute before its first occurrence", rule.Window{Unit: rule.WindowDay, Location: ny, ResetAt: hm(1, 30)}, utc(2026, 11, 1, 5, 29), utc(2026, 10, 31, 5, 30), utc(2026, 11, 1, 5, 30)},
		{"NY hour: the repeated hour is one 2-hour window", rule.Window{Unit: rule.WindowHour, Location: ny}, utc(2026, 11, 1, 6, 30), utc(2026, 11, 1, 5, 0), utc(2026, 11, 1, 7, 0)},
		{"NY hour at :30, 02:30 skipped: ends at 03:00 EDT", rule.Window{Unit: rule.WindowHour, Location: ny, ResetAt: hm(0, 30)}, utc(2026, 3, 8, 6, 45), utc(2026, 3, 8, 6, 30), utc(2026, 3, 8, 7, 0)},
		{"NY hour at :30, the half hour after the gap", rule.Window{Unit: rule.WindowHour, Location: ny, ResetAt: hm(0, 30)}, utc(2026, 3, 8, 7, 0), utc(2026, 3, 8, 7, 0), utc(2026, 3, 8, 7, 30)},
		// Europe/London: GMT, BST +1; 2026-03-29 01:00 GMT -> 02:00, 2026-10-25 02:00 BST -> 01:00.
		{"London day, the 23-hour day", rule.Window{Unit: rule.WindowDay, Location: london}, utc(2026, 3, 29, 12, 0), utc(2026, 3, 29, 0, 0), utc(2026, 3, 29, 23, 0)},
		{"London day, the 25-hour day", rule.Window{Unit: rule.WindowDay, Location: london}, utc(2026, 10, 25, 12, 0), utc(2026, 10, 24, 23, 0), utc(2026, 10, 26, 0, 0)},
		{"London 01:30 does not exist: resets at 02:00 BST", rule.Window{Unit: rule.WindowDay, Location: london, ResetAt: hm(1, 30)}, utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)},
		// Europe/Berlin: CET +1, CEST +2; 2026-03-29 02:00 CET -> 03:00, 2026-10-25 03:00 CEST -> 02:00.
		{"Berlin 02:30, the window before the gap", rule.Window{Unit: rule.WindowDay, Location: berlin, ResetAt: hm(2, 30)}, utc(2026, 3, 29, 0, 59), utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0)},
		{"Berlin 02:30 twice: resets once, at 02:30 CEST", rule.Window{Unit: rule.WindowDay, Location: berlin, ResetAt: hm(2, 30)}, utc(2026, 10, 25, 1, 45), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)},
		// Australia/Lord_Howe: +10:30, DST +11 (a 30-minute shift); 2026-04-05 02:00 -> 01:30, 2026-10-04 02:00 -> 02:30.
		{"Lord Howe day, the 23.5-hour day", rule.Window{Unit: rule.WindowDay, Location: lordHowe}, utc(2026, 10, 4, 0, 0), utc(2026, 10, 3, 13, 30), utc(2026, 10, 4, 13, 0)},
		{"Lord Howe hour, 02:00 skipped: resets at 02:30", rule.Window{Unit: rule.WindowHour, Location: lordHowe}, utc(2026, 10, 3, 15, 45), utc(2026, 10, 3, 15, 30), utc(2026, 10, 3, 16, 0)},
		{"Lord Howe day, the 24.5-hour day", rule.Window{Unit: rule.WindowDay, Location: lordHowe}, utc(2026, 4, 5, 0, 0), utc(2026, 4, 4, 13, 0), utc(2026, 4, 5, 13, 30)},
		{"Lord Howe 01:45 twice: resets once, the first", rule.Window{Unit: rule.WindowDay, Location: lordHowe, ResetAt: hm(1, 45)}, utc(2026, 4, 4, 15, 20), utc(2026, 4, 4, 14, 45), utc(2026, 4, 5, 15, 15)},
		// Hours on a half- and a quarter-hour zone's wall clock.
		{"Kolkata hour starts at :30 UTC", rule.Window{Unit: rule.WindowHour, Location: kolkata}, utc(2026, 6, 1, 10, 29), utc(2026, 6, 1, 9, 30), utc(2026, 6, 1, 10, 30)},
		{"Kathmandu hour starts at :15 UTC", rule.Window{Unit: rule.WindowHour, Location: kathmandu}, utc(2026, 6, 1, 10, 0), utc(2026, 6, 1, 9, 15), utc(2026, 6, 1, 10, 15)},
		{"Kathmandu hour at :20", rule.Window{Unit: rule.WindowHour, Location: kathmandu, ResetAt: hm(0, 20)}, utc(2026, 6, 1, 10, 0), utc(2026, 6, 1, 9, 35), utc(2026, 6, 1, 10, 35)},
		// Weeks.
		{"Paris week from Monday 09:00", rule.Window{Unit: rule.WindowWeek, Location: paris, ResetAt: hm(9, 0), WeekStart: time.Monday}, utc(2026, 3, 4, 12, 0), utc(2026, 3, 2, 8, 0), utc(2026, 3, 9, 8, 0)},
		{"Paris week across spring forward is 167 hours", rule.Window{Unit: rule.WindowWeek, Location: paris, WeekStart: time.Monday}, utc(2026, 3, 26, 0, 0), utc(2026, 3, 22, 23, 0), utc(2026, 3, 29, 22, 0)},
		{"UTC week from Sunday 06:00, Sunday before the reset", rule.Window{Unit: rule.WindowWeek, Location: time.UTC, ResetAt: hm(6, 0), WeekStart: time.Sunday}, utc(2026, 3, 8, 5, 0), utc(2026, 3, 1, 6, 0), utc(2026, 3, 8, 6, 0)},
		{"NY week from Saturday, on the boundary", rule.Window{Unit: rule.WindowWeek, Location: ny, WeekStart: time.Saturday}, utc(2026, 3, 7, 5, 0), utc(2026, 3, 7, 5, 0), utc(2026, 3, 14, 4, 0)},
		// Months.
		{"NY February 2026, 28 days", rule.Window{Unit: rule.WindowMonth, Location: ny}, utc(2026, 2, 15, 0, 0), utc(2026, 2, 1, 5, 0), utc(2026, 3, 1, 5, 0)},
		{"NY February 2028, 29 days", rule.Window{Unit: rule.WindowMonth, Location: ny}, utc(2028, 2, 29, 12, 0), utc(2028, 2, 1, 5, 0), utc(2028, 3, 1, 5, 0)},
		{"NY March 2026 loses an hour", rule.Window{Unit: rule.WindowMonth, Location: ny}, utc(2026, 3, 20, 0, 0), utc(2026, 3, 1, 5, 0), utc(2026, 4, 1, 4, 0)},
		{"Tokyo month at 09:00, the 1st before the reset", rule.Window{Unit: rule.WindowMonth, Location: tokyo, ResetAt: hm(9, 0)}, utc(2026, 1, 31, 23, 59), utc(2026, 1, 1, 0, 0), utc(2026, 2, 1, 0, 0)},
		{"Berlin January, 31 days, its last minute", rule.Window{Unit: rule.WindowMonth, Location: berlin}, utc(2026, 1, 31, 22, 59), utc(2025, 12, 31, 23, 0), utc(2026, 1, 31, 23, 0)},
		{"UTC month over the year end", rule.Window{Unit: rule.WindowMonth, Location: time.UTC}, utc(2026, 12, 31, 23, 59), utc(2026, 12, 1, 0, 0), utc(2027, 1, 1, 0, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := tt.w.Validate(); err != nil {
				t.Fatalf("validate: %v", err)
			}
			start, next := tt.w.Start(tt.t), tt.w.Next(tt.t)
			if !start.Equal(tt.start) || !next.Equal(tt.next) {
				t.Fatalf("%s at %s: [%s, %s); want [%s, %s)", tt.w, tt.t, start.UTC(), next.UTC(), tt.start, tt.next)
			}
			if start.Location() != tt.w.Location || next.Location() != tt.w.Location {
				t.Fatalf("boundaries in %s and %s, want the window's zone %s", start.Location(), next.Location(), tt.w.Location)
			}
			if got, want := tt.w.RetryAfter(tt.t), tt.next.Sub(tt.t); got != want {
				t.Fatalf("retry after %s, want %s", got, want)
			}
			// The same instant read in another zone is the same instant.
			if s := tt.w.Start(tt.t.In(tokyo)); !s.Equal(tt.start) {
				t.Fatalf("start of %s read in Tokyo: %s", tt.t, s)
			}
		})
	}
}

// TestWindowRetryAfterExact: the wait is Next - now to the nanosecond,
// whatever the sub-second part of now, and never zero on a boundary.
func TestWindowRetryAfterExact(t *testing.T) {
	t.Parallel()
	w := rule.Window{Unit: rule.WindowDay, Location: zone(t, "America/New_York"), ResetAt: 9 * time.Hour}
	now := time.Date(2026, 3, 8, 12, 59, 59, 999_999_999, time.UTC) // 08:59:59.999999999 EDT
	if got := w.RetryAfter(now); got != time.Nanosecond {
		t.Fatalf("retry after %s, want 1ns", got)
	}
	if got := w.RetryAfter(now.Add(time.Nanosecond)); got != 24*time.Hour {
		t.Fatalf("on the boundary: retry after %s, want 24h", got)
	}
	// The 23-hour day: from Saturday's reset, 09:00 EST, to Sunday's, 09:00 EDT.
	if got := w.RetryAfter(utc(2026, 3, 7, 14, 0)); got != 23*time.Hour {
		t.Fatalf("across spring forward: retry after %s, want 23h", got)
	}
}

func TestParseWindow(t *testing.T) {
	t.Parallel()
	w, err := rule.ParseWindow(" Day ", "Europe/Paris", "09:00", "Monday")
	if err != nil {
		t.Fatal(err)
	}
	if w.Unit != rule.WindowDay || w.Location.String() != "Europe/Paris" || w.ResetAt != 9*time.Hour || w.WeekStart != time.Monday {
		t.Fatalf("parsed %+v", w)
	}
	if got := w.String(); got != "day at 09:00 Europe/Paris" {
		t.Fatalf("string %q", got)
	}
	w, err = rule.ParseWindow("week", "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if w.Location != time.UTC || w.ResetAt != 0 || w.WeekStart != time.Monday || w.String() != "week from monday 00:00 UTC" {
		t.Fatalf("defaults: %+v %s", w, w)
	}
	w, err = rule.ParseWindow("hour", "Asia/Kolkata", "00:30", "")
	if err != nil || w.ResetAt != 30*time.Minute || w.String() != "hour at :30 Asia/Kolkata" {
		t.Fatalf("hour: %+v %v", w, err)
	}
	w, err = rule.ParseWindow("week", "America/New_York", "7:05", "sunday")
	if err != nil || w.ResetAt != 7*time.Hour+5*time.Minute || w.WeekStart != time.Sunday {
		t.Fatalf("week: %+v %v", w, err)
	}

	bad := []struct {
		name                     string
		unit, zone, reset, start string
		field                    string
	}{
		{"unknown unit", "fortnight", "", "", "", "window.unit"},
		{"empty unit", "", "", "", "", "window.unit"},
		{"unknown zone", "day", "Mars/Olympus_Mons", "", "", "window.time_zone"},
		{"host zone", "day", "Local", "", "", "window.time_zone"},
		{"path in zone", "day", "../../etc/passwd", "", "", "window.time_zone"},
		{"NUL in zone", "day", "Europe/Paris\x00", "", "", "window.time_zone"},
		{"hour 24", "day", "", "24:00", "", "window.reset_at"},
		{"minute 60", "day", "", "09:60", "", "window.reset_at"},
		{"no minutes", "day", "", "9", "", "window.reset_at"},
		{"seconds", "day", "", "09:00:00", "", "window.reset_at"},
		{"negative", "day", "", "-1:00", "", "window.reset_at"},
		{"an hour window past its hour", "hour", "", "01:30", "", "window.reset_at"},
		{"unknown weekday", "week", "", "", "someday", "window.week_start"},
	}
	for _, tt := range bad {
		_, err := rule.ParseWindow(tt.unit, tt.zone, tt.reset, tt.start)
		var le *rule.LimitError
		if !errors.As(err, &le) || le.Field != tt.field || !errors.Is(err, rule.ErrInvalidLimits) {
			t.Errorf("%s: error %v, want a LimitError on %s", tt.name, err, tt.field)
		}
	}
}

func TestWindowValidate(t *testing.T) {
	t.Parallel()
	if err := (rule.Window{Unit: rule.WindowMonth}).Validate(); err != nil {
		t.Fatalf("nil location (UTC): %v", err)
	}
	bad := []struct {
		w     rule.Window
		field string
	}{
		{rule.Window{}, "window.unit"},
		{rule.Window{Unit: "year"}, "window.unit"},
		{rule.Window{Unit: rule.WindowDay, ResetAt: 24 * time.Hour}, "window.reset_at"},
		{rule.Window{Unit: rule.WindowDay, ResetAt: -time.Minute}, "window.reset_at"},
		{rule.Window{Unit: rule.WindowDay, ResetAt: 30 * time.Second}, "window.reset_at"},
		{rule.Window{Unit: rule.WindowHour, ResetAt: time.Hour}, "window.reset_at"},
		{rule.Window{Unit: rule.WindowWeek, WeekStart: 7}, "window.week_start"},
		{rule.Window{Unit: rule.WindowWeek, WeekStart: -1}, "window.week_start"},
	}
	for _, tt := range bad {
		err := tt.w.Validate()
		var le *rule.LimitError
		if !errors.As(err, &le) || le.Field != tt.field || !errors.Is(err, rule.ErrInvalidLimits) {
			t.Errorf("%+v: error %v, want a LimitError on %s", tt.w, err, tt.field)
		}
	}
}

// wallOf is the wall clock of t in loc, read as a UTC time.
func wallOf(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
}

// isResetWall reports whether the wall time n is one of w's reset times,
// read off its fields (independently of the code under test).
func isResetWall(n time.Time, w rule.Window) bool {
	if n.Second() != 0 || n.Nanosecond() != 0 {
		return false
	}
	at := w.ResetAt
	if w.Unit == rule.WindowHour {
		return time.Duration(n.Minute())*time.Minute == at
	}
	if time.Duration(n.Hour())*time.Hour+time.Duration(n.Minute())*time.Minute != at {
		return false
	}
	switch w.Unit {
	case rule.WindowWeek:
		return n.Weekday() == w.WeekStart
	case rule.WindowMonth:
		return n.Day() == 1
	}
	return true
}

// isBoundary: b is a reset, by the definition alone. Either the clock
// shows a reset time at b, arriving there from below (not a repeat); or b
// is a zone transition whose gap holds a reset time.
func isBoundary(b time.Time, w rule.Window) bool {
	loc := w.Location
	at, before := wallOf(b, loc), wallOf(b.Add(-time.Nanosecond), loc)
	if isResetWall(at, w) && before.Before(at) {
		return true
	}
	if start, _ := b.In(loc).ZoneBounds(); !start.Equal(b) {
		return false
	}
	for m := before.Truncate(time.Minute).Add(time.Minute); m.Before(at); m = m.Add(time.Minute) {
		if isResetWall(m, w) {
			return true
		}
	}
	return false
}

var propertyZones = []string{
	"UTC", "America/New_York", "Europe/London", "Europe/Berlin", "Australia/Lord_Howe",
	"Asia/Kolkata", "Asia/Kathmandu", "Pacific/Chatham", "America/Sao_Paulo", "America/St_Johns",
}

func randomWindow(r *rand.Rand, loc *time.Location) rule.Window {
	w := rule.Window{Unit: rule.WindowUnits[r.IntN(len(rule.WindowUnits))], Location: loc, WeekStart: time.Weekday(r.IntN(7))}
	switch {
	case w.Unit == rule.WindowHour:
		w.ResetAt = time.Duration(r.IntN(60)) * time.Minute
	case r.IntN(3) == 0: // the DST hours, where resets are skipped or repeated
		w.ResetAt = time.Duration(60+r.IntN(120)) * time.Minute
	default:
		w.ResetAt = time.Duration(r.IntN(24*60)) * time.Minute
	}
	return w
}

// TestWindowProperties checks random instants in 2024-2028 in zones with
// DST, 30- and 45-minute offsets: Start(t) <= t < Next(t); boundaries are
// fixed points; windows are contiguous (the window before ends where this
// one starts, this one ends where the next starts); every boundary is a
// reset by definition; and a window's length is its unit's, give or take
// a DST shift.
func TestWindowProperties(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(25, 2026))
	from, to := utc(2024, 1, 1, 0, 0), utc(2029, 1, 1, 0, 0)
	lengths := map[rule.WindowUnit][2]time.Duration{
		rule.WindowHour:  {30 * time.Minute, 2 * time.Hour},
		rule.WindowDay:   {23 * time.Hour, 25 * time.Hour},
		rule.WindowWeek:  {7*24*time.Hour - time.Hour, 7*24*time.Hour + time.Hour},
		rule.WindowMonth: {28*24*time.Hour - time.Hour, 31*24*time.Hour + time.Hour},
	}
	for _, name := range propertyZones {
		loc := zone(t, name)
		for range 3000 {
			w := randomWindow(r, loc)
			tt := from.Add(time.Duration(r.Int64N(int64(to.Sub(from)))))
			s, n := w.Start(tt), w.Next(tt)
			if s.After(tt) || !n.After(tt) {
				t.Fatalf("%s at %s: [%s, %s) does not hold it", w, tt, s, n)
			}
			if !w.Start(n).Equal(n) || !w.Start(s).Equal(s) {
				t.Fatalf("%s at %s: boundaries %s, %s are not their own starts", w, tt, s, n)
			}
			if !w.Next(s).Equal(n) || !w.Start(n.Add(-time.Nanosecond)).Equal(s) || !w.Next(s.Add(-time.Nanosecond)).Equal(s) {
				t.Fatalf("%s at %s: [%s, %s) is not contiguous with its neighbours", w, tt, s, n)
			}
			if !isBoundary(s, w) || !isBoundary(n, w) {
				t.Fatalf("%s at %s: [%s, %s): a boundary is not a reset", w, tt, s, n)
			}
			if l := n.Sub(s); l < lengths[w.Unit][0] || l > lengths[w.Unit][1] {
				t.Fatalf("%s at %s: [%s, %s) lasts %s", w, tt, s, n, l)
			}
			if bs, bn := w.Bounds(tt); !bs.Equal(s) || !bn.Equal(n) {
				t.Fatalf("%s at %s: Bounds [%s, %s), Start and Next [%s, %s)", w, tt, bs, bn, s, n)
			}
			if w.RetryAfter(tt) != n.Sub(tt) {
				t.Fatalf("%s at %s: retry after %s, want %s", w, tt, w.RetryAfter(tt), n.Sub(tt))
			}
		}
	}
}

// TestWindowMatchesMinuteScan derives the boundaries around every DST
// change of 2024-2028 by brute force, straight from the definition: walk
// the clock minute by minute, and a reset happens at the first minute
// whose wall clock reaches a reset time never reached before. Next and
// Start must agree with it at every minute.
func TestWindowMatchesMinuteScan(t *testing.T) {
	t.Parallel()
	configs := []struct {
		unit  rule.WindowUnit
		reset time.Duration
		week  time.Weekday
	}{
		{rule.WindowHour, 0, 0},
		{rule.WindowHour, 15 * time.Minute, 0},
		{rule.WindowHour, 30 * time.Minute, 0},
		{rule.WindowDay, 0, 0},
		{rule.WindowDay, 90 * time.Minute, 0},
		{rule.WindowDay, 135 * time.Minute, 0},
		{rule.WindowDay, 150 * time.Minute, 0},
		{rule.WindowWeek, 150 * time.Minute, time.Sunday},
	}
	for _, name := range []string{"America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Pacific/Chatham"} {
		loc := zone(t, name)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var changes []time.Time
			for u := utc(2024, 1, 1, 0, 0); u.Before(utc(2029, 1, 1, 0, 0)); {
				_, end := u.In(loc).ZoneBounds()
				if end.IsZero() {
					break
				}
				changes = append(changes, end)
				u = end
			}
			if len(changes) < 8 {
				t.Fatalf("%d DST changes in 2024-2028", len(changes))
			}
			for _, c := range configs {
				w := rule.Window{Unit: c.unit, Location: loc, ResetAt: c.reset, WeekStart: c.week}
				for _, change := range changes {
					scanAround(t, w, change.Add(-36*time.Hour), change.Add(36*time.Hour))
				}
			}
		})
	}
}

// TestWindowSkippedDay: Samoa skipped 2011-12-30 (from 23:59:59 on the
// 29th at -10 to 00:00 on the 31st at +14). The resets the gap swallows
// merge into one at its end, and no window is empty.
func TestWindowSkippedDay(t *testing.T) {
	t.Parallel()
	apia := zone(t, "Pacific/Apia")
	gap := utc(2011, 12, 30, 10, 0)
	day := rule.Window{Unit: rule.WindowDay, Location: apia}
	if s, n := day.Start(utc(2011, 12, 29, 12, 0)), day.Next(utc(2011, 12, 29, 12, 0)); !s.Equal(utc(2011, 12, 29, 10, 0)) || !n.Equal(gap) {
		t.Fatalf("the 29th: [%s, %s)", s, n)
	}
	if s, n := day.Start(gap), day.Next(gap); !s.Equal(gap) || !n.Equal(utc(2011, 12, 31, 10, 0)) {
		t.Fatalf("the 31st: [%s, %s)", s, n)
	}
	for _, c := range []rule.Window{day, {Unit: rule.WindowHour, Location: apia}, {Unit: rule.WindowDay, Location: apia, ResetAt: 12 * time.Hour}} {
		scanAround(t, c, gap.Add(-36*time.Hour), gap.Add(36*time.Hour))
	}
}

func scanAround(t *testing.T, w rule.Window, from, to time.Time) {
	t.Helper()
	maxWall := wallOf(from.Add(-time.Minute), w.Location)
	start := w.Start(from.Add(-time.Minute))
	for u := from; !u.After(to); u = u.Add(time.Minute) {
		wall := wallOf(u, w.Location)
		reset := false
		for m := maxWall.Add(time.Minute); !m.After(wall); m = m.Add(time.Minute) {
			if isResetWall(m, w) {
				reset = true
				break
			}
		}
		if wall.After(maxWall) {
			maxWall = wall
		}
		if reset {
			if next := w.Next(u.Add(-time.Nanosecond)); !next.Equal(u) {
				t.Fatalf("%s: the scan resets at %s, Next says %s", w, u.In(w.Location), next.In(w.Location))
			}
			start = u
		}
		if got := w.Start(u); !got.Equal(start) {
			t.Fatalf("%s at %s: start %s, the scan says %s", w, u.In(w.Location), got.In(w.Location), start.In(w.Location))
		}
	}
}

// BenchmarkWindowBounds is what a decision would pay per window: one
// Bounds (a few zone lookups).
func BenchmarkWindowBounds(b *testing.B) {
	loc, err := time.LoadLocation("America/New_York")
	if err != nil {
		b.Fatal(err)
	}
	now := utc(2026, 11, 1, 6, 30)
	for _, w := range []rule.Window{{Unit: rule.WindowHour, Location: loc}, {Unit: rule.WindowDay, Location: loc, ResetAt: 9 * time.Hour}, {Unit: rule.WindowMonth, Location: time.UTC}} {
		b.Run(string(w.Unit), func(b *testing.B) {
			for b.Loop() {
				_, _ = w.Bounds(now)
			}
		})
	}
}
