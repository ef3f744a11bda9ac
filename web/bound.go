package web

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// A tenant out of money used to read "no period budget" beside "why:
// period_budget" (issue 36): its budget was a calendar window, which the
// period gauge did not show, and the tally of rejections did not say
// which. The gauge of a tenant without the legacy period budget shows the
// window that binds, and why names the window that refused.

// boundWindow is the window whose refusals were the most in the last two
// minutes (by name, on a tie), "" for none.
func boundWindow(byWindow map[string]int64) string {
	names := make([]string, 0, len(byWindow))
	for n := range byWindow {
		names = append(names, n)
	}
	sort.Strings(names)
	best, most := "", int64(0)
	for _, n := range names {
		if byWindow[n] > most {
			best, most = n, byWindow[n]
		}
	}
	return best
}

// windowGauge sets r's period gauge to a window of s, for a tenant without
// the legacy period budget: the window that refused (named), else the one
// nearest its ceiling. It shows what is left below the ceiling.
func (r *tenantRow) windowGauge(s rule.Snapshot, named, currency string) {
	if s.Limits.PeriodBudget > 0 || len(s.Windows) == 0 {
		return
	}
	i := slices.IndexFunc(s.Windows, func(w rule.WindowSnapshot) bool { return w.Name == named })
	if i < 0 {
		i = 0
		for j, w := range s.Windows {
			// used/ceiling above the best's, exactly
			if scaledLess(s.Windows[i].Used, w.Ceiling(), w.Used, s.Windows[i].Ceiling()) {
				i = j
			}
		}
	}
	w := s.Windows[i]
	amount := func(n int64) string {
		if w.Counts == rule.CountMoney {
			return fmtMoney(n, currency)
		}
		return groupDigits(n)
	}
	left := max(0, w.Ceiling()-w.Used)
	g := balanceGauge("period", left, w.Ceiling())
	g.Text = amount(left) + " / " + amount(w.Ceiling())
	r.Period, r.PeriodWindow = g, w.Name
	loc := w.Location
	if loc == nil {
		loc = time.UTC
	}
	r.PeriodHint = "window " + w.Name + ": " + string(w.Counts) + " per " + string(w.Unit) + ", resets " +
		w.End.In(loc).Format("2006-01-02 15:04") + " " + loc.String()
}

// currencyFor is the deployment's currency when some snapshot has a money
// window ("" otherwise: no query).
func (d *Dashboard) currencyFor(ctx context.Context, snaps []rule.Snapshot) (string, error) {
	for _, s := range snaps {
		for _, w := range s.Windows {
			if w.Counts == rule.CountMoney {
				return d.admin.PriceCurrency(ctx)
			}
		}
	}
	return "", nil
}
