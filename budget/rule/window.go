package rule

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// WindowUnit is the length of a calendar window.
type WindowUnit string

// The window units.
const (
	WindowHour  WindowUnit = "hour"
	WindowDay   WindowUnit = "day"
	WindowWeek  WindowUnit = "week"
	WindowMonth WindowUnit = "month"
)

// WindowUnits are the units a Window may have, shortest first.
var WindowUnits = []WindowUnit{WindowHour, WindowDay, WindowWeek, WindowMonth}

// Window is a calendar-aligned budget window in a tenant's time zone: what
// finance and product teams mean by "per day" or "per month" (issue 25). It
// is a value (no clock, no I/O): the caller passes the decision's now, so
// every replica and every test computes the same boundaries.
//
// A window resets when the zone's wall clock reaches the reset time:
//   - hour: at minute ResetAt of every hour, on the zone's wall clock, so
//     Asia/Kolkata (UTC+05:30) hours start at :30 past a UTC hour;
//   - day: at ResetAt every day;
//   - week: at ResetAt on every WeekStart;
//   - month: at ResetAt on the 1st of every month (the reset day of a month
//     is always the 1st: every month has one, so months of 28 to 31 days
//     need no rule of their own).
//
// Daylight saving time follows from one rule: a boundary is the first
// instant at which the wall clock reaches the reset time. So a day is 23
// or 25 hours long across a change; a reset time that does not exist on the
// spring-forward day (02:30 in America/New_York) resets at the first
// instant after the gap (03:00 EDT), because that is when the clock passes
// it; and a reset time that happens twice on the fall-back day resets once,
// at its first occurrence, because the second time the clock has already
// been there. (An hour window that holds a repeated hour is two hours long
// for the same reason.) A zone that skips a whole day merges the windows it
// skips into nothing: boundaries never repeat, and Start and Next never
// return an empty window.
//
// Window{Unit: WindowDay or WindowMonth, Location: time.UTC} is exactly
// today's period budget (Period.Window).
type Window struct {
	Unit WindowUnit
	// Location is the tenant's IANA time zone; nil means UTC.
	Location *time.Location
	// ResetAt is the reset time of day, an offset from midnight (9*time.Hour
	// for 09:00), in whole minutes; for an hour window, the minute within
	// the hour.
	ResetAt time.Duration
	// WeekStart is the day a week window resets on (week windows only).
	// Its zero value is Sunday, as time.Weekday's is; ParseWindow defaults
	// to Monday.
	WeekStart time.Weekday
}

// Window returns the calendar window of today's period budget: day or
// month, in UTC, resetting at midnight. ok is false for PeriodNone.
func (p Period) Window() (w Window, ok bool) {
	switch p {
	case PeriodDay:
		return Window{Unit: WindowDay, Location: time.UTC, WeekStart: time.Monday}, true
	case PeriodMonth:
		return Window{Unit: WindowMonth, Location: time.UTC, WeekStart: time.Monday}, true
	}
	return Window{}, false
}

// The fields a window's *LimitError names.
const (
	windowFieldUnit      = "window.unit"
	windowFieldZone      = "window.time_zone"
	windowFieldResetAt   = "window.reset_at"
	windowFieldWeekStart = "window.week_start"
)

// Validate returns a *LimitError (ErrInvalidLimits) naming the first
// invalid field: the unit, a reset time that is not whole minutes inside
// the day (inside the hour for an hour window), or a week start that is not
// a weekday. A nil Location is valid (UTC).
func (w Window) Validate() error {
	span := 24 * time.Hour
	switch w.Unit {
	case WindowHour:
		span = time.Hour
	case WindowDay, WindowWeek, WindowMonth:
	default:
		return &LimitError{windowFieldUnit, `must be "hour", "day", "week" or "month"`}
	}
	switch {
	case w.ResetAt < 0 || w.ResetAt >= span || w.ResetAt%time.Minute != 0:
		if w.Unit == WindowHour {
			return &LimitError{windowFieldResetAt, `an hour window resets at a whole minute within the hour ("00:00" to "00:59")`}
		}
		return &LimitError{windowFieldResetAt, `must be a whole-minute time of day, "00:00" to "23:59"`}
	case w.WeekStart < time.Sunday || w.WeekStart > time.Saturday:
		return &LimitError{windowFieldWeekStart, "must be a day of the week"}
	}
	return nil
}

// ParseWindow reads a window as the API and the CLI spell it: unit ("hour",
// "day", "week", "month"), an IANA zone name ("Europe/Paris"; "" is UTC),
// a reset time "HH:MM" ("" is 00:00; an hour window's is "00:MM"), and a
// week's first day ("monday"; "" is Monday, the ISO week). Each is trimmed
// and case-insensitive but the zone name, which IANA spells with capitals.
// It returns a *LimitError naming the field. "Local" is refused: it is the
// host's zone, and replicas on different hosts would disagree.
//
// The zone must be in the IANA database built into tokengate (zone.go),
// not merely on this host, so that every replica accepts it.
func ParseWindow(unit, zone, resetAt, weekStart string) (Window, error) {
	return parseWindow(unit, zone, resetAt, weekStart, parseZone)
}

// parseWindow is ParseWindow with the zone read by zoneOf (StoredZone for
// stored rows).
func parseWindow(unit, zone, resetAt, weekStart string, zoneOf func(string) (*time.Location, error)) (Window, error) {
	w := Window{Unit: WindowUnit(strings.ToLower(strings.TrimSpace(unit))), WeekStart: time.Monday}
	loc, err := zoneOf(strings.TrimSpace(zone))
	if err != nil {
		return Window{}, err
	}
	w.Location = loc
	if w.ResetAt, err = parseResetAt(strings.TrimSpace(resetAt)); err != nil {
		return Window{}, err
	}
	if s := strings.ToLower(strings.TrimSpace(weekStart)); s != "" {
		d, ok := weekdays[s]
		if !ok {
			return Window{}, &LimitError{windowFieldWeekStart, fmt.Sprintf("unknown day %q: want monday to sunday", weekStart)}
		}
		w.WeekStart = d
	}
	if err := w.Validate(); err != nil {
		return Window{}, err
	}
	return w, nil
}

var weekdays = map[string]time.Weekday{
	"sunday": time.Sunday, "monday": time.Monday, "tuesday": time.Tuesday, "wednesday": time.Wednesday,
	"thursday": time.Thursday, "friday": time.Friday, "saturday": time.Saturday,
}

// parseResetAt reads "HH:MM" (one or two hour digits, two minute digits).
func parseResetAt(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	bad := &LimitError{windowFieldResetAt, fmt.Sprintf("%q: want a time of day \"HH:MM\", \"00:00\" to \"23:59\"", s)}
	hh, mm, ok := strings.Cut(s, ":")
	if !ok || len(hh) < 1 || len(hh) > 2 || len(mm) != 2 {
		return 0, bad
	}
	h, errH := strconv.Atoi(hh)
	m, errM := strconv.Atoi(mm)
	if errH != nil || errM != nil || h < 0 || h > 23 || m < 0 || m > 59 || strings.ContainsAny(s, "+-") {
		return 0, bad
	}
	return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute, nil
}

// String spells the window for people and logs: "day at 09:00
// Europe/Paris", "week from monday 00:00 UTC", "hour at :30 Asia/Kolkata".
func (w Window) String() string {
	at := fmt.Sprintf("%02d:%02d", int(w.ResetAt/time.Hour), int(w.ResetAt%time.Hour/time.Minute))
	switch w.Unit {
	case WindowHour:
		return fmt.Sprintf("hour at :%02d %s", int(w.ResetAt/time.Minute), w.loc())
	case WindowWeek:
		return fmt.Sprintf("week from %s %s %s", strings.ToLower(w.WeekStart.String()), at, w.loc())
	}
	return fmt.Sprintf("%s at %s %s", w.Unit, at, w.loc())
}

func (w Window) loc() *time.Location {
	if w.Location == nil {
		return time.UTC
	}
	return w.Location
}

// Start returns the start of the window holding t: its last reset at or
// before t, in the window's zone. The window must be valid (Validate).
func (w Window) Start(t time.Time) time.Time {
	start, _ := w.Bounds(t)
	return start
}

// Next returns the next reset after t (strictly), in the window's zone:
// the end of the window holding t. The window must be valid.
func (w Window) Next(t time.Time) time.Time {
	_, next := w.Bounds(t)
	return next
}

// RetryAfter is the exact time from now to the window's next reset, which
// is when a refusal by this window can first succeed: never zero, since
// Next is strictly after now. Faces round it up (RetryAfterSeconds).
func (w Window) RetryAfter(now time.Time) time.Duration { return w.Next(now).Sub(now) }

// Bounds returns the window holding t, [Start(t), Next(t)), in one walk:
// what a decision that both advances a window and answers its Retry-After
// needs. The window must be valid.
//
// Boundaries are firstReach of the reset wall times in order, which never
// decreases. The walk starts from the last reset wall time at or before
// t's wall clock (reached at or before t, since t's clock shows it) and
// steps forward while the next boundary is not after t: more than once
// only when t's clock went back (a fall-back hour) or a gap swallowed
// resets, so it is one or two steps.
func (w Window) Bounds(t time.Time) (start, next time.Time) {
	loc := w.loc()
	wall := w.floorWall(naive(t.In(loc)))
	start = firstReach(wall, loc)
	for {
		wall = w.nextWall(wall)
		next = firstReach(wall, loc)
		if next.After(t) {
			return start, next
		}
		start = next
	}
}

// naive is t's wall clock read as a UTC time, so calendar arithmetic on
// it (AddDate, Truncate) knows no zone and no DST.
func naive(t time.Time) time.Time {
	y, mo, d := t.Date()
	h, mi, s := t.Clock()
	return time.Date(y, mo, d, h, mi, s, t.Nanosecond(), time.UTC)
}

// floorWall returns the last reset wall time at or before the wall time n.
func (w Window) floorWall(n time.Time) time.Time {
	y, mo, d := n.Date()
	var r time.Time
	switch w.Unit {
	case WindowHour:
		r = n.Truncate(time.Hour).Add(w.ResetAt)
	case WindowDay:
		r = time.Date(y, mo, d, 0, 0, 0, 0, time.UTC).Add(w.ResetAt)
	case WindowWeek:
		back := (int(n.Weekday()) - int(w.WeekStart) + 7) % 7
		r = time.Date(y, mo, d-back, 0, 0, 0, 0, time.UTC).Add(w.ResetAt)
	case WindowMonth:
		r = time.Date(y, mo, 1, 0, 0, 0, 0, time.UTC).Add(w.ResetAt)
	default:
		panic("budget: Window with unit " + strconv.Quote(string(w.Unit)) + ": call Validate first")
	}
	if r.After(n) {
		r = w.prevWall(r)
	}
	return r
}

// nextWall and prevWall step a reset wall time by one unit. Wall times are
// naive (UTC), so a day is always 24 hours here; the zone enters only in
// firstReach. A month reset wall time is always on the 1st, so AddDate
// never normalises it into another month.
func (w Window) nextWall(r time.Time) time.Time { return w.stepWall(r, 1) }

func (w Window) prevWall(r time.Time) time.Time { return w.stepWall(r, -1) }

func (w Window) stepWall(r time.Time, n int) time.Time {
	switch w.Unit {
	case WindowHour:
		return r.Add(time.Duration(n) * time.Hour)
	case WindowDay:
		return r.AddDate(0, 0, n)
	case WindowWeek:
		return r.AddDate(0, 0, 7*n)
	}
	return r.AddDate(0, n, 0)
}

// reachLookback is how long before a wall time (read as UTC) firstReach
// starts looking: more than any zone's offset from UTC (at most +14h today,
// and under 16h in any zone's history), so the search starts before the
// clock can show the wall time.
const reachLookback = 48 * time.Hour

// firstReach returns the first instant at which loc's wall clock reaches
// the wall time r (naive): r itself on an ordinary day; the end of the gap
// when r falls in a spring-forward gap (the first instant whose clock is
// past r); the first occurrence when r happens twice. It walks the zone's
// offset periods from reachLookback before r: within one period the clock
// is instant+offset, so the earliest instant there showing r or later is
// max(period start, r-offset), if that is before the period ends.
func firstReach(r time.Time, loc *time.Location) time.Time {
	u := r.Add(-reachLookback)
	for {
		lu := u.In(loc)
		_, off := lu.Zone()
		_, end := lu.ZoneBounds()
		c := r.Add(-time.Duration(off) * time.Second)
		if c.Before(u) {
			c = u
		}
		if end.IsZero() || c.Before(end) {
			return c.In(loc)
		}
		u = end
	}
}
