package account

import (
	"context"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// Activity is what one tenant did in the last minutes, across every
// replica: admissions (the ledger's reserve entries) and rejections (the
// flushed tallies) per minute, index 0 being the current minute, and the
// rejections of the current and previous minute by the limit that refused.
// WouldRefuse counts, over the whole window, the requests each of the
// tenant's shadow limits would have refused.
type Activity struct {
	Admitted, Rejected []int64
	ByLimit            map[rule.Limit]int64
	// ByWindow are the rejections of the same two minutes by period_budget,
	// by the window that refused.
	ByWindow    map[string]int64
	WouldRefuse map[rule.Limit]int64
}

// Activity returns each active tenant's last `minutes` minutes as of now
// (the database's time of a snapshot, so that every replica buckets alike).
// A tenant with no activity is absent.
func (s *Store) Activity(ctx context.Context, now time.Time, minutes int) (map[string]*Activity, error) {
	window := time.Duration(minutes) * time.Minute
	admitted, err := ledger.KindCounts(ctx, s.reads, ledger.KindReserve, window)
	if err != nil {
		return nil, err
	}
	rejected, err := s.RejectionsSince(ctx, window)
	if err != nil {
		return nil, err
	}
	now = now.Truncate(time.Minute)
	ago := func(minute time.Time) int {
		return max(0, int(now.Sub(minute.Truncate(time.Minute))/time.Minute)) // a tally a moment ahead counts as now
	}
	per := map[string]*Activity{}
	get := func(id string) *Activity {
		a, ok := per[id]
		if !ok {
			a = &Activity{Admitted: make([]int64, minutes), Rejected: make([]int64, minutes), ByLimit: map[rule.Limit]int64{}, ByWindow: map[string]int64{},
				WouldRefuse: map[rule.Limit]int64{}}
			per[id] = a
		}
		return a
	}
	for _, m := range admitted {
		if i := ago(m.Minute); i < minutes {
			get(m.TenantID).Admitted[i] += m.Count
		}
	}
	for _, r := range rejected {
		i := ago(r.Minute)
		if i >= minutes {
			continue
		}
		a := get(r.TenantID)
		if r.Shadow {
			a.WouldRefuse[r.Limit] += r.Count
			continue
		}
		a.Rejected[i] += r.Count
		if i <= 1 {
			a.ByLimit[r.Limit] += r.Count
			if r.Window != "" {
				a.ByWindow[r.Window] += r.Count
			}
		}
	}
	return per, nil
}
