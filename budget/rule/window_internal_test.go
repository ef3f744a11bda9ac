package rule

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestWindowKeepsTodaysPeriod: today's period budget (day or month, UTC)
// is a Window, with exactly the boundaries Period.start and Period.next
// compute, so moving tenants onto windows changes no one's resets.
func TestWindowKeepsTodaysPeriod(t *testing.T) {
	t.Parallel()
	if _, ok := PeriodNone.Window(); ok {
		t.Fatal("PeriodNone has a window")
	}
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 25))
	from, to := time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range []Period{PeriodDay, PeriodMonth} {
		w, ok := p.Window()
		if !ok || w != (Window{Unit: WindowUnit(p), Location: time.UTC, WeekStart: time.Monday}) {
			t.Fatalf("%s: window %+v %v", p, w, ok)
		}
		if err := w.Validate(); err != nil {
			t.Fatal(err)
		}
		var instants []time.Time
		for range 20_000 {
			instants = append(instants, from.Add(time.Duration(r.Int64N(int64(to.Sub(from))))))
		}
		// Every boundary of 2024-2028, and a nanosecond either side.
		for b := p.start(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)); b.Year() < 2029; b = p.next(b) {
			instants = append(instants, b, b.Add(-time.Nanosecond), b.Add(time.Nanosecond))
		}
		for _, at := range instants {
			for _, tt := range []time.Time{at, at.In(paris)} {
				start := p.start(tt)
				if got := w.Start(tt); !got.Equal(start) {
					t.Fatalf("%s at %s: start %s, today's code %s", p, tt, got, start)
				}
				if got, want := w.Next(tt), p.next(start); !got.Equal(want) {
					t.Fatalf("%s at %s: next %s, today's code %s", p, tt, got, want)
				}
			}
		}
	}
}
