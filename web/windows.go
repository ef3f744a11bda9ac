package web

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// Calendar windows (issue 25) on the dashboard: every window of every
// tenant shown, its use against its limit as a gauge, the ceiling of a soft
// budget, what its span cost in money (from the ledger, so a window that
// counts tokens shows its money too), and its next reset in the window's
// own zone, as the tenant set it. The limits form edits them as rows.

// windowLine is one window of one tenant, as the windows tables show it.
type windowLine struct {
	Tenant  string
	Depth   int
	Current bool
	// EndUser is the end user's id when the tenant is one of the page's
	// tenant's end users (a leaf below it).
	EndUser string
	Name    string
	// Counts is "tokens" or "money"; Unit the window's length.
	Counts, Unit string
	Gauge        gauge
	// Ceiling is the limit plus the overage of a soft budget ("" when the
	// limit is hard).
	Ceiling string
	Overage int64
	// Spent is the money the tenant's entries moved in the window's span.
	Spent string
	// Resets is the next reset on the window's wall clock and its zone;
	// ResetsAt the same instant for machines (RFC 3339, in that zone).
	Resets, ResetsAt string
}

// windowsView is the windows of a page's tenants, in tree order.
type windowsView struct {
	Lines    []windowLine
	Currency string
}

// windowLines renders the windows of snaps in the order of rows (tree
// order), with one ledger query for all their spend.
func (d *Dashboard) windowLines(ctx context.Context, snaps []rule.Snapshot, rows []*tenantRow) (windowsView, error) {
	byID := make(map[string]rule.Snapshot, len(snaps))
	for _, s := range snaps {
		byID[s.TenantID] = s
	}
	var (
		v       windowsView
		ws      []rule.WindowSnapshot
		ordered []rule.Snapshot
	)
	for _, r := range rows {
		s, ok := byID[r.ID]
		if !ok {
			continue
		}
		ordered = append(ordered, s)
		for _, w := range s.Windows {
			ws = append(ws, w)
			v.Lines = append(v.Lines, windowLine{Tenant: r.ID, Depth: r.Depth, Current: r.Current})
		}
	}
	spend, err := d.admin.WindowSpend(ctx, ordered...)
	if err != nil || len(ws) == 0 {
		return v, err
	}
	v.Currency = spend.Currency
	spent := spend.Money
	for i, w := range ws {
		amount := func(n int64) string {
			if w.Counts == rule.CountMoney {
				return fmtMoney(n, v.Currency)
			}
			return groupDigits(n)
		}
		l := &v.Lines[i]
		l.Name, l.Counts, l.Unit, l.Overage = w.Name, string(w.Counts), string(w.Unit), w.OveragePercent
		l.Gauge = gauge{Name: "window-" + w.Name, Set: true, Text: amount(w.Used) + " / " + amount(w.Limit), Pct: pct(w.Used, w.Limit), Level: "ok"}
		switch {
		case w.Used >= w.Ceiling():
			l.Gauge.Level = "bad"
		case !scaledLess(w.Used, 10, w.Limit, 9): // 90 % of the limit, or into the overage
			l.Gauge.Level = "warn"
		}
		if w.OveragePercent > 0 {
			l.Ceiling = amount(w.Ceiling())
		}
		l.Spent = fmtMoney(spent[i], v.Currency)
		loc := w.Location
		if loc == nil {
			loc = time.UTC
		}
		l.Resets = w.End.In(loc).Format("2006-01-02 15:04") + " " + loc.String()
		l.ResetsAt = w.End.In(loc).Format(time.RFC3339)
	}
	return v, nil
}

// withEndUsers appends the windows of a tenant's end users (shown on its
// page) to rows and snaps, one level below it, for windowLines.
func withEndUsers(snaps []rule.Snapshot, rows []*tenantRow, tenant *tenantRow, users []account.EndUser) ([]rule.Snapshot, []*tenantRow, map[string]string) {
	names := map[string]string{}
	if tenant == nil || len(users) == 0 {
		return snaps, rows, names
	}
	snaps, rows = slices.Clone(snaps), slices.Clone(rows)
	for _, u := range users {
		snaps = append(snaps, u.Snapshot)
		rows = append(rows, &tenantRow{ID: u.Snapshot.TenantID, Depth: tenant.Depth + 1})
		names[u.Snapshot.TenantID] = u.EndUserID
	}
	return snaps, rows, names
}

// fmtMoney writes micro-units of currency with thousands separators and at
// least two decimals, exactly: "1,234.50 USD", "0.000125 USD".
func fmtMoney(micro int64, currency string) string {
	sign := ""
	if micro < 0 {
		sign, micro = "-", -micro
	}
	whole, frac, _ := strings.Cut(rule.FormatRate(micro), ".")
	for len(frac) < 2 {
		frac += "0"
	}
	return sign + groupDecimal(whole+"."+frac) + " " + currency
}

// The limits form has one row per window, and blank rows to add more (up
// to rule.MaxWindows); a row is removed with its checkbox, or by
// blanking its name and amount. Each row's fields are named win<i>_<col>.
// Its errors are the API's (windows[i].money), i being the row.

// windowCols are a row's columns, each with the WindowJSON field its
// errors name.
var windowCols = []struct{ col, field string }{
	{"name", "name"}, {"unit", "unit"}, {"zone", "time_zone"}, {"reset", "reset_at"}, {"week", "week_start"},
	{"counts", "tokens"}, {"amount", "money"}, {"overage", "overage_percent"}, {"thresholds", "thresholds"},
}

// windowBlankRows are the empty rows the form offers for new windows.
const windowBlankRows = 2

// windowRow is one row of the form, with each column's value and error.
type windowRow struct {
	Index  int
	Values map[string]string
	Errs   map[string]string
	Remove bool
}

// Field is the posted name of one of the row's columns.
func (r windowRow) Field(col string) string { return fmt.Sprintf("win%d_%s", r.Index, col) }

// windowsIntoForm fills f's window rows from ws, and the hidden was
// value that tells whether the admin edited them.
func windowsIntoForm(f *form, ws []rule.WindowLimit) {
	for i, w := range ws {
		j := w.JSON()
		row := map[string]string{"name": j.Name, "unit": j.Unit, "zone": j.TimeZone, "reset": j.ResetAt, "week": j.WeekStart,
			"counts": string(w.Counts), "overage": "", "thresholds": ""}
		if j.Money != nil {
			row["amount"] = *j.Money
		} else if j.Tokens != nil {
			row["amount"] = strconv.FormatInt(*j.Tokens, 10)
		}
		if j.OveragePercent > 0 {
			row["overage"] = strconv.FormatInt(j.OveragePercent, 10)
		}
		ts := make([]string, len(j.Thresholds))
		for k, p := range j.Thresholds {
			ts[k] = strconv.FormatInt(p, 10)
		}
		row["thresholds"] = strings.Join(ts, ", ")
		for col, val := range row {
			f.Set(fmt.Sprintf("win%d_%s", i, col), val)
		}
	}
	f.Set("win_rows", strconv.Itoa(len(ws)))
	js, _ := windowsFromForm(f)
	f.Set(wasPrefix+"windows", windowsKey(js))
}

// windowRows are the rows the template shows: f's, then blank ones.
func windowRows(f *form) []windowRow {
	n, _ := strconv.Atoi(f.Get("win_rows"))
	n = min(max(n, 0), rule.MaxWindows)
	total := min(n+windowBlankRows, rule.MaxWindows)
	if total == n && n < rule.MaxWindows {
		total++
	}
	rows := make([]windowRow, total)
	for i := range rows {
		r := windowRow{Index: i, Values: map[string]string{}, Errs: map[string]string{}}
		for _, c := range windowCols {
			r.Values[c.col] = f.Get(r.Field(c.col))
			if e := f.Err(fmt.Sprintf("windows[%d].%s", i, c.field)); e != "" {
				r.Errs[c.col] = e
			}
		}
		if e := f.Err(fmt.Sprintf("windows[%d].money", i)); e != "" {
			r.Errs["amount"] = e
		}
		if e := f.Err(fmt.Sprintf("windows[%d].tokens", i)); e != "" {
			r.Errs["amount"] = e
		}
		if r.Values["counts"] == "" {
			r.Values["counts"] = "tokens"
		}
		if r.Values["unit"] == "" {
			r.Values["unit"] = "day"
		}
		r.Remove = f.Get(r.Field("remove")) != ""
		rows[i] = r
	}
	return rows
}

// windowsFromPost copies the posted window rows into f.
func windowsFromPost(f *form, posted url.Values) {
	n, _ := strconv.Atoi(posted.Get("win_rows_total"))
	n = min(max(n, 0), rule.MaxWindows)
	f.Set(wasPrefix+"windows", posted.Get(wasPrefix+"windows"))
	rows := 0 // up to the last row with something typed: a refused form does not grow blank rows
	for i := range n {
		for _, c := range append(windowCols, struct{ col, field string }{"remove", ""}) {
			name := fmt.Sprintf("win%d_%s", i, c.col)
			f.Set(name, strings.TrimSpace(posted.Get(name)))
		}
		if f.Get(fmt.Sprintf("win%d_name", i)) != "" || f.Get(fmt.Sprintf("win%d_amount", i)) != "" {
			rows = i + 1
		}
	}
	f.Set("win_rows", strconv.Itoa(rows))
}

var thresholdSep = regexp.MustCompile(`[\s,/]+`)

// windowsFromForm reads f's rows into windows as the API spells them,
// skipping removed and blank rows. rowOf maps a window's index to its
// row, so an error about windows[k] lands on the row it came from; a
// column that is not a number fails under its row's field.
func windowsFromForm(f *form) (js []rule.WindowJSON, rowOf []int) {
	n, _ := strconv.Atoi(f.Get("win_rows"))
	for i := range min(n, rule.MaxWindows) {
		get := func(col string) string { return f.Get(fmt.Sprintf("win%d_%s", i, col)) }
		if get("remove") != "" || get("name") == "" && get("amount") == "" {
			continue
		}
		field := func(name string) string { return fmt.Sprintf("windows[%d].%s", i, name) }
		j := rule.WindowJSON{Name: get("name"), Unit: get("unit"), TimeZone: get("zone"), ResetAt: get("reset"), WeekStart: get("week")}
		if rule.WindowUnit(j.Unit) != rule.WindowWeek {
			j.WeekStart = "" // the row's week start applies to weeks only
		}
		amount := cleanNumber(get("amount"))
		switch {
		case amount == "":
			f.Fail(field(get("counts")), "is required: the window's limit")
		case get("counts") == string(rule.CountMoney):
			j.Money = &amount
		default:
			t, err := strconv.ParseInt(amount, 10, 64)
			if err != nil {
				f.Fail(field("tokens"), "must be a whole number of cost units")
			}
			j.Tokens = &t
		}
		if o := get("overage"); o != "" {
			p, err := strconv.ParseInt(o, 10, 64)
			if err != nil {
				f.Fail(field("overage_percent"), "must be a whole percent, 0 to 1000")
			}
			j.OveragePercent = p
		}
		for _, s := range thresholdSep.Split(get("thresholds"), -1) {
			if s == "" {
				continue
			}
			p, err := strconv.ParseInt(strings.TrimSuffix(s, "%"), 10, 64)
			if err != nil {
				f.Fail(field("thresholds"), "must be percents of the limit, e.g. 50, 80, 100")
				break
			}
			j.Thresholds = append(j.Thresholds, p)
		}
		js = append(js, j)
		rowOf = append(rowOf, i)
	}
	return js, rowOf
}

// windowsKey is the windows as typed, to compare with what the page showed.
func windowsKey(js []rule.WindowJSON) string {
	b, _ := json.Marshal(js) // strings, integers and pointers to them
	return string(b)
}

var windowErrField = regexp.MustCompile(`^windows\[(\d+)\]`)

// windowsPatch sets p.Windows when the admin edited the rows (or when the
// post has no was value: a script sets every field), validated as the API
// validates windows; errors land on the row.
func (f *form) windowsPatch(posted url.Values, p *rule.LimitsPatch) {
	if !posted.Has("win_rows_total") {
		return // a post without the window rows leaves the windows alone
	}
	windowsFromPost(f, posted)
	js, rowOf := windowsFromForm(f)
	if posted.Has(wasPrefix+"windows") && windowsKey(js) == posted.Get(wasPrefix+"windows") {
		return
	}
	f.windowRows = rowOf
	if !f.OK() {
		return
	}
	if len(js) == 0 {
		p.Windows = rule.Unset[[]rule.WindowLimit]()
		return
	}
	ws, err := rule.ParseWindows(js)
	if err != nil {
		f.limitError(err)
		return
	}
	p.Windows = rule.Set(ws)
	// Windows replace the period fields (rule.LimitsPatch.Apply), so a
	// period budget edited with them goes whole, amount and period, or
	// the half not edited would be lost.
	if !p.PeriodBudget.Absent() || !p.Period.Absent() {
		if p.Period.Absent() && f.Get("period") != "" {
			p.Period = rule.Set(rule.Period(f.Get("period")))
		}
		if p.PeriodBudget.Absent() && f.Get("period_budget") != "" {
			p.PeriodBudget = rule.Set(f.Int("period_budget", false))
		}
	}
}

// windowField maps an error's windows[k] (k: the window's index in what
// was sent) to windows[row] (the form's row).
func (f *form) windowField(field string) string {
	m := windowErrField.FindStringSubmatch(field)
	if m == nil {
		return field
	}
	k, _ := strconv.Atoi(m[1])
	if k < len(f.windowRows) {
		return fmt.Sprintf("windows[%d]", f.windowRows[k]) + field[len(m[0]):]
	}
	return field
}
