package rule

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Counts says what a window counts: tokens (cost units, as the token
// bucket does) or money (micro-units of the deployment's currency, from the
// price table in effect when each admission was reserved).
type Counts string

// What a window can count.
const (
	CountTokens Counts = "tokens"
	CountMoney  Counts = "money"
)

// MaxWindows bounds a tenant's windows: every decision checks each of them.
const MaxWindows = 8

// WindowLimit is one of a tenant's period windows (issue 25): a budget of
// tokens or money per calendar hour, day, week or month in the tenant's time
// zone. A tenant may have several at once (1 h + 1 d + 1 mo), at any level
// of a tree; an admission must fit each, and each is debited.
//
// A soft budget allows OveragePercent above Limit before it refuses: the
// alert thresholds (Thresholds, and the limit itself for a soft budget)
// tell someone it is being spent, while requests keep running up to the
// ceiling.
type WindowLimit struct {
	// Name is how the window is named in rejections, alerts, the ledger
	// and the API: 1 to 32 of a-z, 0-9, '_', '-'. "period" is the window
	// of the period_budget and period fields that came before windows.
	Name string
	Window
	Counts Counts
	// Limit is in cost units (CountTokens) or micro-units of money.
	Limit int64
	// OveragePercent (0 to 1000) lets usage run that far above Limit.
	OveragePercent int64
	// Thresholds are percents of Limit (1 to 1000) at which the alert
	// outbox raises a threshold event, once per window.
	Thresholds []int64
}

// PeriodWindowName names the window the period_budget and period fields set.
const PeriodWindowName = "period"

var windowNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// Ceiling is the most the window lets be used: the limit and its overage.
func (w WindowLimit) Ceiling() int64 { return w.Limit + w.Limit*w.OveragePercent/100 }

// AlertThresholds are the percents at which the window raises threshold
// events: its own, and for a soft budget 100 (it passed its limit but still
// admits). Sorted, each once.
func (w WindowLimit) AlertThresholds() []int64 {
	out := slices.Clone(w.Thresholds)
	if w.OveragePercent > 0 && !slices.Contains(out, 100) {
		out = append(out, 100)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// plainPeriod reports whether w is what period_budget and period express:
// named "period", tokens, day or month in UTC at midnight, no overage.
func (w WindowLimit) plainPeriod() (Period, bool) {
	if w.Name != PeriodWindowName || w.Counts != CountTokens || w.OveragePercent != 0 || w.ResetAt != 0 || w.loc() != time.UTC {
		return PeriodNone, false
	}
	switch w.Unit {
	case WindowDay:
		return PeriodDay, true
	case WindowMonth:
		return PeriodMonth, true
	}
	return PeriodNone, false
}

// SameCalendar reports whether two windows count the same spans of time in
// the same unit: a change of anything else (its limit, overage,
// thresholds) keeps what was used in the current window.
func (w WindowLimit) SameCalendar(o WindowLimit) bool {
	return w.Unit == o.Unit && w.loc().String() == o.loc().String() && w.ResetAt == o.ResetAt &&
		(w.Unit != WindowWeek || w.WeekStart == o.WeekStart) && w.Counts == o.Counts
}

// validateWindows returns a *LimitError naming windows[i].field for the
// first invalid window.
func validateWindows(ws []WindowLimit) error {
	if len(ws) > MaxWindows {
		return &LimitError{"windows", fmt.Sprintf("at most %d windows", MaxWindows)}
	}
	seen := map[string]bool{}
	for i, w := range ws {
		field := func(f string) string { return fmt.Sprintf("windows[%d].%s", i, f) }
		if err := w.Window.Validate(); err != nil {
			le := err.(*LimitError)
			return &LimitError{field(strings.TrimPrefix(le.Field, "window.")), le.Reason}
		}
		switch {
		case !windowNamePattern.MatchString(w.Name):
			return &LimitError{field("name"), "must be 1-32 characters of a-z, 0-9, '_', '-', starting with a letter or digit"}
		case seen[w.Name]:
			return &LimitError{field("name"), fmt.Sprintf("%q names two windows", w.Name)}
		case w.Counts != CountTokens && w.Counts != CountMoney:
			return &LimitError{field("tokens"), "set tokens or money (exactly one)"}
		case w.Limit <= 0 || w.Limit > MaxAmount*Micro && w.Counts == CountMoney || w.Limit > MaxAmount && w.Counts == CountTokens:
			if w.Counts == CountMoney {
				return &LimitError{field("money"), fmt.Sprintf("must be between 0.000001 and %d", int64(MaxAmount))}
			}
			return &LimitError{field("tokens"), fmt.Sprintf("must be between 1 and %d", int64(MaxAmount))}
		case w.OveragePercent < 0 || w.OveragePercent > 1000:
			return &LimitError{field("overage_percent"), "must be between 0 and 1000"}
		case len(w.Thresholds) > 10:
			return &LimitError{field("thresholds"), "at most 10 thresholds"}
		}
		for _, p := range w.Thresholds {
			if p < 1 || p > 1000 {
				return &LimitError{field("thresholds"), "each must be a percent of the limit between 1 and 1000"}
			}
		}
		seen[w.Name] = true
	}
	return nil
}

// WindowJSON is how a window is spelled in the API, the CLI's files, the
// tenants row and the ledger's limits entries: one shape everywhere.
// Exactly one of Tokens and Money is set; Money is a decimal amount of the
// deployment's currency ("25.50"), exact to the micro-unit.
type WindowJSON struct {
	Name           string  `json:"name"`
	Unit           string  `json:"unit"`
	TimeZone       string  `json:"time_zone,omitempty"`
	ResetAt        string  `json:"reset_at,omitempty"`
	WeekStart      string  `json:"week_start,omitempty"`
	Tokens         *int64  `json:"tokens,omitempty"`
	Money          *string `json:"money,omitempty"`
	OveragePercent int64   `json:"overage_percent,omitempty"`
	Thresholds     []int64 `json:"thresholds,omitempty"`
}

// JSON spells w as WindowJSON.
func (w WindowLimit) JSON() WindowJSON {
	out := WindowJSON{Name: w.Name, Unit: string(w.Unit), TimeZone: w.loc().String(),
		ResetAt:        fmt.Sprintf("%02d:%02d", int(w.ResetAt/time.Hour), int(w.ResetAt%time.Hour/time.Minute)),
		OveragePercent: w.OveragePercent, Thresholds: w.Thresholds}
	if w.Unit == WindowWeek {
		out.WeekStart = strings.ToLower(w.WeekStart.String())
	}
	if w.Counts == CountMoney {
		m := FormatRate(w.Limit)
		out.Money = &m
	} else {
		n := w.Limit
		out.Tokens = &n
	}
	return out
}

// Limit reads j, returning a *LimitError naming field.<part> (field is
// "windows[i]").
func (j WindowJSON) Limit(field string) (WindowLimit, error) { return j.limit(field, parseZone) }

// limit is Limit with the zone read by zoneOf.
func (j WindowJSON) limit(field string, zoneOf func(string) (*time.Location, error)) (WindowLimit, error) {
	cal, err := parseWindow(j.Unit, j.TimeZone, j.ResetAt, j.WeekStart, zoneOf)
	if err != nil {
		le := err.(*LimitError)
		return WindowLimit{}, &LimitError{field + "." + strings.TrimPrefix(le.Field, "window."), le.Reason}
	}
	w := WindowLimit{Name: strings.TrimSpace(j.Name), Window: cal, OveragePercent: j.OveragePercent, Thresholds: j.Thresholds}
	switch {
	case j.Tokens != nil && j.Money != nil, j.Tokens == nil && j.Money == nil:
		return WindowLimit{}, &LimitError{field + ".tokens", "set tokens or money (exactly one)"}
	case j.Tokens != nil:
		w.Counts, w.Limit = CountTokens, *j.Tokens
	default:
		m, err := ParseRate(*j.Money)
		if err != nil {
			return WindowLimit{}, &LimitError{field + ".money", "must be a decimal amount such as \"25.50\", at most 6 decimal places"}
		}
		w.Counts, w.Limit = CountMoney, m
	}
	return w, nil
}

// WindowsJSON spells ws.
func WindowsJSON(ws []WindowLimit) []WindowJSON {
	out := make([]WindowJSON, len(ws))
	for i, w := range ws {
		out[i] = w.JSON()
	}
	return out
}

// ParseWindows reads and validates windows as the API sends them.
func ParseWindows(js []WindowJSON) ([]WindowLimit, error) { return ParseWindowsWith(js, parseZone) }

// ParseWindowsWith is ParseWindows with the zones read by zoneOf (StoredZone
// for stored rows).
func ParseWindowsWith(js []WindowJSON, zoneOf func(string) (*time.Location, error)) ([]WindowLimit, error) {
	out := make([]WindowLimit, 0, len(js))
	for i, j := range js {
		w, err := j.limit(fmt.Sprintf("windows[%d]", i), zoneOf)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	if err := validateWindows(out); err != nil {
		return nil, err
	}
	return out, nil
}

// WindowUsage is what one window has counted: Used in its window starting
// at Start (nil before the tenant's first decision with the window).
type WindowUsage struct {
	Start *time.Time
	Used  int64
}

// usageJSON is a window's usage in the tenants row, by window name, so a
// change of the windows keeps the usage of those it keeps.
type usageJSON struct {
	Name  string     `json:"name"`
	Start *time.Time `json:"start,omitempty"`
	Used  int64      `json:"used"`
}

// EncodeUsage spells the usage of ws for the tenants row (nil: no windows).
func EncodeUsage(ws []WindowLimit, us []WindowUsage) []byte {
	if len(ws) == 0 {
		return nil
	}
	out := make([]usageJSON, len(ws))
	for i, w := range ws {
		out[i] = usageJSON{Name: w.Name, Start: us[i].Start, Used: us[i].Used}
	}
	b, _ := json.Marshal(out) // cannot fail: names, times and integers
	return b
}

// DecodeWindows reads the windows and their usage from the tenants row.
// The row only ever holds what validateWindows accepted.
func DecodeWindows(config, usage []byte) ([]WindowLimit, []WindowUsage, error) {
	if len(config) == 0 {
		return nil, nil, nil
	}
	var js []WindowJSON
	if err := json.Unmarshal(config, &js); err != nil {
		return nil, nil, fmt.Errorf("budget: decode windows: %w", err)
	}
	ws := make([]WindowLimit, len(js))
	for i, j := range js {
		w, err := j.limit("windows", StoredZone) // a zone this build cannot load never refuses the tenant
		if err != nil {
			return nil, nil, fmt.Errorf("budget: decode windows: %w", err)
		}
		ws[i] = w
	}
	var us []usageJSON
	if len(usage) > 0 {
		if err := json.Unmarshal(usage, &us); err != nil {
			return nil, nil, fmt.Errorf("budget: decode window usage: %w", err)
		}
	}
	return ws, usageFor(ws, us), nil
}

func usageFor(ws []WindowLimit, us []usageJSON) []WindowUsage {
	out := make([]WindowUsage, len(ws))
	for i, w := range ws {
		for _, u := range us {
			if u.Name == w.Name {
				out[i] = WindowUsage{Start: u.Start, Used: u.Used}
			}
		}
	}
	return out
}

// EncodeWindows spells ws for the tenants row (nil: none).
func EncodeWindows(ws []WindowLimit) []byte {
	if len(ws) == 0 {
		return nil
	}
	b, _ := json.Marshal(WindowsJSON(ws))
	return b
}

// SyncPeriod keeps the period_budget and period fields and the "period"
// window one thing: fields set make (or change) the window; the window, when
// plain, shows as the fields. Called by Validate, so every way limits are
// made (create, patch, template, the row) agrees.
func (l *Limits) SyncPeriod() {
	i := slices.IndexFunc(l.Windows, func(w WindowLimit) bool { return w.Name == PeriodWindowName })
	if l.PeriodBudget > 0 && l.Period != PeriodNone {
		cal, _ := l.Period.Window()
		w := WindowLimit{Name: PeriodWindowName, Window: cal, Counts: CountTokens, Limit: l.PeriodBudget}
		if i >= 0 {
			w.Thresholds = l.Windows[i].Thresholds
			if p, plain := l.Windows[i].plainPeriod(); !plain || p != l.Period || l.Windows[i].Limit != l.PeriodBudget {
				l.Windows[i] = w
			}
		} else {
			l.Windows = append(slices.Clip(l.Windows), w)
		}
		return
	}
	l.PeriodBudget, l.Period = 0, PeriodNone
	if i >= 0 {
		if p, plain := l.Windows[i].plainPeriod(); plain {
			l.PeriodBudget, l.Period = l.Windows[i].Limit, p
		}
	}
}
