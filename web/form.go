package web

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// form keeps what an admin typed and the message of each bad field, so a
// refused form comes back filled in with the reason next to the field.
type form struct {
	values map[string]string
	errs   map[string]string
	// Order lists the fields with errors in the order they were found, for
	// the summary at the top of the form.
	order []string
	// windowRows maps the index of a window sent to the limits form's row
	// it came from (windowsPatch), so its errors land on that row.
	windowRows []int
}

func newForm() *form { return &form{values: map[string]string{}, errs: map[string]string{}} }

// listFields are the fields sent once per ticked checkbox; the form keeps
// their values joined with commas.
var listFields = map[string]bool{"shadow": true}

// formFrom copies the named fields of a POST body.
func formFrom(v url.Values, names ...string) *form {
	f := newForm()
	for _, n := range names {
		if listFields[n] {
			var vals []string
			for _, x := range v[n] {
				if x = strings.TrimSpace(x); x != "" {
					vals = append(vals, x)
				}
			}
			f.values[n] = strings.Join(vals, ",")
			continue
		}
		f.values[n] = strings.TrimSpace(v.Get(n))
	}
	return f
}

// Get returns a field's value.
func (f *form) Get(name string) string {
	if f == nil {
		return ""
	}
	return f.values[name]
}

// Set fills a field.
func (f *form) Set(name, value string) { f.values[name] = value }

// List returns the values of a checkbox field (listFields).
func (f *form) List(name string) []string {
	if v := f.Get(name); v != "" {
		return strings.Split(v, ",")
	}
	return nil
}

// Checked reports whether a checkbox field has value ticked.
func (f *form) Checked(name, value string) bool {
	for _, v := range f.List(name) {
		if v == value {
			return true
		}
	}
	return false
}

// Err returns the message of a bad field, "" when it is fine.
func (f *form) Err(name string) string {
	if f == nil {
		return ""
	}
	return f.errs[name]
}

// Fail records a bad field; the first message of a field wins.
func (f *form) Fail(name, message string) {
	if _, ok := f.errs[name]; ok {
		return
	}
	f.errs[name] = message
	f.order = append(f.order, name)
}

// OK reports whether no field failed.
func (f *form) OK() bool { return f == nil || len(f.errs) == 0 }

// Problems lists "field: message" for the summary.
func (f *form) Problems() []string {
	if f == nil {
		return nil
	}
	out := make([]string, 0, len(f.order))
	for _, n := range f.order {
		out = append(out, n+": "+f.errs[n])
	}
	return out
}

// cleanNumber drops the thousands separators people type or paste.
func cleanNumber(s string) string {
	return strings.NewReplacer(",", "", "_", "", " ", "").Replace(s)
}

// Int parses a whole number; empty is 0 unless required.
func (f *form) Int(name string, required bool) int64 {
	s := cleanNumber(f.Get(name))
	if s == "" {
		if required {
			f.Fail(name, "is required")
		}
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		f.Fail(name, "must be a whole number, 0 or more")
		return 0
	}
	return n
}

// SignedInt parses a whole number that may be negative (a debit).
func (f *form) SignedInt(name string) int64 {
	s := cleanNumber(f.Get(name))
	if s == "" {
		f.Fail(name, "is required")
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimPrefix(s, "+"), 10, 64)
	if err != nil {
		f.Fail(name, "must be a whole number such as 5000 or -5000")
		return 0
	}
	return n
}

// Decimal parses a decimal with up to six places into micro units, exactly
// (rule.ParseRate, no floating point); empty is 0 unless required.
func (f *form) Decimal(name string, required bool) int64 {
	s := cleanNumber(f.Get(name))
	if s == "" {
		if required {
			f.Fail(name, "is required")
		}
		return 0
	}
	n, err := rule.ParseRate(s)
	if err != nil || strings.ContainsAny(s, "+-") {
		f.Fail(name, "must be a decimal number such as 2.5, with at most 6 decimal places")
		return 0
	}
	return n
}

// Duration parses a duration such as 10m or 90s; empty is 0 (the default).
func (f *form) Duration(name string) time.Duration {
	s := f.Get(name)
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		f.Fail(name, "must be a duration such as 90s, 10m or 1h")
		return 0
	}
	return d
}

// limitFields are the fields of the tenant forms; their names are the
// rule.LimitError field names, so a refusal lands next to its field.
var limitFields = []string{"tokens_capacity", "tokens_per_second", "requests_capacity", "requests_per_second",
	"max_concurrent", "period_budget", "period", "reservation_ttl", "max_wait", "on_store_unavailable", "shadow"}

// limits reads the limit fields and validates them with budget's own
// rules.
func (f *form) limits() rule.Limits {
	l := rule.Limits{
		TokensCapacity:     f.Int("tokens_capacity", true),
		TokensRateMicro:    f.Decimal("tokens_per_second", true),
		RequestsCapacity:   f.Int("requests_capacity", false),
		RequestsRateMicro:  f.Decimal("requests_per_second", false),
		MaxConcurrent:      f.Int("max_concurrent", false),
		PeriodBudget:       f.Int("period_budget", false),
		Period:             rule.Period(f.Get("period")),
		ReservationTTL:     f.Duration("reservation_ttl"),
		MaxWait:            f.Duration("max_wait"),
		OnStoreUnavailable: rule.Policy(f.Get("on_store_unavailable")),
	}
	shadow, err := rule.ParseLimitSet("shadow", f.List("shadow"))
	f.limitError(err)
	l.Shadow = shadow
	// A blank optional limit is none; 0 is refused rather than taken to
	// mean "no cap".
	for _, n := range optionalNumbers {
		if f.Get(n) != "" && f.Err(n) == "" && cleanNumber(f.Get(n)) != "" && isZero(f.Get(n)) {
			f.Fail(n, "must be at least 1 (leave it blank for none)")
		}
	}
	if !f.OK() {
		return l
	}
	f.limitError(l.Validate())
	return l
}

// optionalNumbers are the limit fields whose blank means none.
var optionalNumbers = []string{"requests_capacity", "requests_per_second", "max_concurrent", "period_budget"}

func isZero(s string) bool {
	n, err := rule.ParseRate(cleanNumber(s))
	return err == nil && n == 0
}

// wasPrefix names the hidden fields of the limits form that carry each
// field's value as the page showed it: a field the admin did not edit is
// not sent in the patch, so a concurrent change of it is not undone.
const wasPrefix = "was_"

// wasFields are the hidden fields of the limits form.
var wasFields = func() []string {
	out := make([]string, len(limitFields))
	for i, n := range limitFields {
		out[i] = wasPrefix + n
	}
	return out
}()

// limitsPatch reads the fields the admin edited into a patch: a field
// whose value equals its hidden was value is left out; a blank optional
// field is unset (none, or a timing limit's default). A post without was
// fields (a script) sets every field, as the form shows them all.
func (f *form) limitsPatch(posted url.Values) rule.LimitsPatch {
	var p rule.LimitsPatch
	edited := func(n string) bool {
		if !posted.Has(wasPrefix + n) {
			return true
		}
		if listFields[n] {
			now, err1 := rule.ParseLimitSet(n, f.List(n))
			was, err2 := rule.ParseLimitSet(n, strings.Split(f.Get(wasPrefix+n), ","))
			return err1 != nil || err2 != nil || now != was
		}
		return f.Get(n) != f.Get(wasPrefix+n)
	}
	num := func(n string, dst *rule.Change[int64], required, rate bool) {
		if !edited(n) {
			return
		}
		if f.Get(n) == "" && !required {
			*dst = rule.Unset[int64]()
			return
		}
		if rate {
			*dst = rule.Set(f.Decimal(n, required))
		} else {
			*dst = rule.Set(f.Int(n, required))
		}
	}
	num("tokens_capacity", &p.TokensCapacity, true, false)
	num("tokens_per_second", &p.TokensRateMicro, true, true)
	num("requests_capacity", &p.RequestsCapacity, false, false)
	num("requests_per_second", &p.RequestsRateMicro, false, true)
	num("max_concurrent", &p.MaxConcurrent, false, false)
	num("period_budget", &p.PeriodBudget, false, false)
	if edited("period") {
		p.Period = rule.Set(rule.Period(f.Get("period")))
		if f.Get("period") == "" {
			p.Period = rule.Unset[rule.Period]()
		}
	}
	for _, d := range []struct {
		name string
		dst  *rule.Change[int64]
	}{{"reservation_ttl", &p.ReservationTTLMS}, {"max_wait", &p.MaxWaitMS}} {
		switch {
		case !edited(d.name):
		case f.Get(d.name) == "":
			*d.dst = rule.Unset[int64]()
		default:
			if v := f.Duration(d.name); f.Err(d.name) == "" {
				*d.dst = rule.Set(v.Milliseconds())
			}
		}
	}
	if edited("on_store_unavailable") {
		p.OnStoreUnavailable = rule.Set(rule.Policy(f.Get("on_store_unavailable")))
		if f.Get("on_store_unavailable") == "" {
			p.OnStoreUnavailable = rule.Unset[rule.Policy]()
		}
	}
	if edited("shadow") {
		set, err := rule.ParseLimitSet("shadow", f.List("shadow"))
		f.limitError(err)
		p.Shadow = rule.Set(set)
	}
	if f.OK() {
		f.limitError(p.Check())
	}
	return p
}

// limitError records a *rule.LimitError under its field; it reports
// whether err was one. The API's millisecond fields are the form's
// duration fields, and the API's null is the form's blank.
func (f *form) limitError(err error) bool {
	var le *rule.LimitError
	if errors.As(err, &le) {
		field := le.Field
		switch field {
		case "reservation_ttl_ms":
			field = "reservation_ttl"
		case "max_wait_ms":
			field = "max_wait"
		}
		field = f.windowField(field)
		// A form field has no null: a blank one removes the limit.
		f.Fail(field, strings.ReplaceAll(le.Reason, "null", "blank"))
		return true
	}
	return false
}

// limitsForm fills the limit fields from a tenant's current limits.
func limitsForm(l rule.Limits) *form {
	f := newForm()
	f.Set("tokens_capacity", strconv.FormatInt(l.TokensCapacity, 10))
	f.Set("tokens_per_second", rule.FormatRate(l.TokensRateMicro))
	if l.RequestsCapacity > 0 {
		f.Set("requests_capacity", strconv.FormatInt(l.RequestsCapacity, 10))
		f.Set("requests_per_second", rule.FormatRate(l.RequestsRateMicro))
	}
	if l.MaxConcurrent > 0 {
		f.Set("max_concurrent", strconv.FormatInt(l.MaxConcurrent, 10))
	}
	if l.PeriodBudget > 0 {
		f.Set("period_budget", strconv.FormatInt(l.PeriodBudget, 10))
	}
	f.Set("period", string(l.Period))
	f.Set("reservation_ttl", fmtDuration(l.ReservationTTL))
	f.Set("max_wait", fmtDuration(l.MaxWait))
	f.Set("on_store_unavailable", string(l.OnStoreUnavailable))
	f.Set("shadow", strings.Join(l.Shadow.Strings(), ","))
	for _, n := range limitFields {
		f.Set(wasPrefix+n, f.Get(n))
	}
	windowsIntoForm(f, l.Windows)
	return f
}

// modelFields are the model form's fields, named like the
// estimator.InvalidError fields of estimator.Model.Validate.
var modelFields = []string{"name", "encoding", "input_weight", "output_weight", "cached_input_weight", "cache_write_weight",
	"cache_write_1h_weight", "default_output_tokens",
	"context_window", "part_tokens", "on_store_unavailable"}

// model reads a model; weights are decimals (0.25, 4) turned into micro
// units exactly.
func (f *form) model() estimator.Model {
	m := estimator.Model{
		Name:              f.Get("name"),
		Encoding:          f.Get("encoding"),
		InputWeightMicro:  f.Decimal("input_weight", true),
		OutputWeightMicro: f.Decimal("output_weight", true),
		// Blank: cached input tokens count as any input token.
		CachedInputWeightMicro: f.Decimal("cached_input_weight", false),
		// Blank: cache writes count as any input token, and an hour's as
		// the 5 minute ones.
		CacheWriteWeightMicro:   f.Decimal("cache_write_weight", false),
		CacheWrite1hWeightMicro: f.Decimal("cache_write_1h_weight", false),
		DefaultOutputTokens:     f.Int("default_output_tokens", true),
		ContextWindow:           f.Int("context_window", true),
		PartTokens:              f.Int("part_tokens", true),
		OnStoreUnavailable:      f.Get("on_store_unavailable"),
	}
	if m.Name == "" {
		f.Fail("name", "is required")
	}
	return m
}

func modelForm(m estimator.Model) *form {
	f := newForm()
	f.Set("name", m.Name)
	f.Set("encoding", m.Encoding)
	f.Set("input_weight", rule.FormatRate(m.InputWeightMicro))
	f.Set("output_weight", rule.FormatRate(m.OutputWeightMicro))
	for _, w := range []struct {
		field string
		micro int64
	}{{"cached_input_weight", m.CachedInputWeightMicro}, {"cache_write_weight", m.CacheWriteWeightMicro}, {"cache_write_1h_weight", m.CacheWrite1hWeightMicro}} {
		if w.micro > 0 {
			f.Set(w.field, rule.FormatRate(w.micro))
		}
	}
	f.Set("default_output_tokens", strconv.FormatInt(m.DefaultOutputTokens, 10))
	f.Set("context_window", strconv.FormatInt(m.ContextWindow, 10))
	f.Set("part_tokens", strconv.FormatInt(m.PartTokens, 10))
	f.Set("on_store_unavailable", m.OnStoreUnavailable)
	return f
}
