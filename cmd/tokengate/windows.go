package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/rule"
)

// windowFlagHelp explains --window once for create and update.
const windowFlagHelp = "A calendar window (repeat for several): name=NAME,unit=hour|day|week|month,zone=IANA zone (default UTC)," +
	"reset=HH:MM (default 00:00),week=monday..sunday (weeks),tokens=N or money=DECIMAL (the deployment's currency)," +
	"overage=PERCENT (a soft budget),thresholds=P/P/P (alert percents). Example: name=daily,unit=day,zone=Europe/Paris,reset=09:00,money=25.50,overage=10,thresholds=50/80/100"

// parseWindowSpecs reads --window flags into windows, validated as the API
// validates them: an error names the flag and the field (windows[i].money).
func parseWindowSpecs(specs []string) ([]rule.WindowLimit, error) {
	js := make([]rule.WindowJSON, len(specs))
	for i, spec := range specs {
		j, err := parseWindowSpec(spec)
		if err != nil {
			return nil, fmt.Errorf("--window %q: windows[%d].%w", spec, i, err)
		}
		js[i] = j
	}
	ws, err := rule.ParseWindows(js)
	if err != nil {
		return nil, fmt.Errorf("--window: %w", err)
	}
	return ws, nil
}

// windowSpecKeys maps a --window key to the WindowJSON field it sets, as
// the API names it (errors name that field).
var windowSpecKeys = map[string]string{
	"name": "name", "unit": "unit", "zone": "time_zone", "time_zone": "time_zone", "reset": "reset_at", "reset_at": "reset_at",
	"week": "week_start", "week_start": "week_start", "tokens": "tokens", "money": "money",
	"overage": "overage_percent", "overage_percent": "overage_percent", "thresholds": "thresholds",
}

// parseWindowSpec reads one "key=value,..." spec. Its errors start with
// the field they concern, for parseWindowSpecs to prefix.
func parseWindowSpec(spec string) (rule.WindowJSON, error) {
	var j rule.WindowJSON
	seen := map[string]bool{}
	for _, part := range strings.Split(spec, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(part), "=")
		key, value = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(value)
		field, known := windowSpecKeys[key]
		switch {
		case !ok || !known:
			return j, fmt.Errorf("%s: want key=value with key one of name, unit, zone, reset, week, tokens, money, overage, thresholds", orDash(key))
		case seen[field]:
			return j, fmt.Errorf("%s: given twice", field)
		}
		seen[field] = true
		integer := func() (int64, error) {
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %q is not a whole number", field, value)
			}
			return n, nil
		}
		switch field {
		case "name":
			j.Name = value
		case "unit":
			j.Unit = value
		case "time_zone":
			j.TimeZone = value
		case "reset_at":
			j.ResetAt = value
		case "week_start":
			j.WeekStart = value
		case "money":
			j.Money = &value
		case "tokens":
			n, err := integer()
			if err != nil {
				return j, err
			}
			j.Tokens = &n
		case "overage_percent":
			n, err := integer()
			if err != nil {
				return j, err
			}
			j.OveragePercent = n
		case "thresholds":
			for _, p := range strings.Split(value, "/") {
				n, err := strconv.ParseInt(strings.TrimSpace(p), 10, 64)
				if err != nil {
					return j, fmt.Errorf("thresholds: %q: want percents separated by /, e.g. 50/80/100", value)
				}
				j.Thresholds = append(j.Thresholds, n)
			}
		}
	}
	return j, nil
}

// formatMoney writes micro-units of currency with at least two decimals
// ("25.50 USD", "0.000125 USD"), exactly.
func formatMoney(micro int64, currency string) string {
	sign := ""
	if micro < 0 {
		sign, micro = "-", -micro
	}
	s := rule.FormatRate(micro)
	whole, frac, _ := strings.Cut(s, ".")
	for len(frac) < 2 {
		frac += "0"
	}
	return sign + whole + "." + frac + " " + currency
}

// windowAmount writes an amount a window counts: tokens as an integer,
// money with its currency.
func windowAmount(w rule.WindowLimit, n int64, currency string) string {
	if w.Counts == rule.CountMoney {
		return formatMoney(n, currency)
	}
	return strconv.FormatInt(n, 10)
}

// resetTime writes an instant in a window's zone, as its tenant reads it:
// "2026-12-05 09:00 CET (Europe/Paris)".
func resetTime(w rule.WindowLimit, t time.Time) string {
	loc := w.Location
	if loc == nil {
		loc = time.UTC
	}
	s := t.In(loc).Format("2006-01-02 15:04 MST")
	if name := loc.String(); name != "UTC" {
		s += " (" + name + ")"
	}
	return s
}

// printWindows writes every window of snaps below a tenant table: what it
// counts, used of its limit, its ceiling when soft, the money its span
// cost (from the ledger, for tokens windows too) and its next reset in the
// window's zone. Nothing when no tenant has a window.
func printWindows(ctx context.Context, out io.Writer, svc *admin.Service, snaps []rule.Snapshot) error {
	spend, err := svc.WindowSpend(ctx, snaps...)
	if err != nil || spend.Money == nil {
		return err
	}
	spent, currency := spend.Money, spend.Currency
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tWINDOW\tCOUNTS\tUSED / LIMIT\tCEILING\tSPENT\tRESETS")
	i := 0
	for _, s := range snaps {
		for _, w := range s.Windows {
			ceiling := "-"
			if w.OveragePercent > 0 {
				ceiling = windowAmount(w.WindowLimit, w.Ceiling(), currency) + fmt.Sprintf(" (+%d%%)", w.OveragePercent)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s per %s\t%s / %s\t%s\t%s\t%s\n", s.TenantID, w.Name, w.Counts, w.Unit,
				windowAmount(w.WindowLimit, w.Used, currency), windowAmount(w.WindowLimit, w.Limit, currency), ceiling,
				formatMoney(spent[i], currency), resetTime(w.WindowLimit, w.End))
			i++
		}
	}
	return tw.Flush()
}
