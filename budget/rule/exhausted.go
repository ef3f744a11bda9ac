package rule

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// BudgetExhaustedError is the refusal of a calendar window (limit
// period_budget) that has no room left for the request: what it has
// spent, its cap and when it resets, in its own unit (cost units for a
// tokens window, micro-units of Currency for a money window). It embeds
// the *RejectedError every refusal is (Level, Window, RetryAfter to the
// reset, Snapshot), which errors.As finds through Unwrap, so rejection
// tallies, waits and metrics count it as the refusal it is; the faces look
// for it first and answer it as an exhausted budget, never as a rate limit.
type BudgetExhaustedError struct {
	RejectedError
	// Counts is what the window counts (tokens or money).
	Counts Counts
	// Spent is what the window has used in its current span; Budget its
	// limit, Cap its ceiling (the limit plus the overage of a soft budget:
	// what refuses); Cost what the refused request would have added.
	Spent, Budget, Cap, Cost int64
	// Currency is the ISO 4217 code of a money window's amounts ("" for a
	// tokens window, or before the decision priced the request).
	Currency string
	// Resets is when the window's next span begins.
	Resets time.Time
}

func (e *BudgetExhaustedError) Error() string {
	of := ""
	if e.Level != "" {
		of = " of " + e.Level
	}
	return fmt.Sprintf("budget: the %s budget of window %s%s is exhausted: spent %s of %s; it resets at %s",
		e.Counts, e.Window, of, e.Amount(e.Spent), e.Amount(e.Cap), e.Resets.UTC().Format(time.RFC3339))
}

// Unwrap makes errors.Is(err, ErrBudgetExhausted) and, through the
// embedded refusal, errors.Is(err, ErrRejected) and errors.As(err,
// **RejectedError) true.
func (e *BudgetExhaustedError) Unwrap() []error { return []error{ErrBudgetExhausted, &e.RejectedError} }

// Amount spells n in the window's unit: "1200 tokens", "25.5 USD".
func (e *BudgetExhaustedError) Amount(n int64) string {
	if e.Counts == CountMoney {
		s := FormatRate(max(0, n))
		if e.Currency != "" {
			s += " " + e.Currency
		}
		return s
	}
	return fmt.Sprintf("%d tokens", n)
}

// Remaining is what the window has left below its cap, never below zero.
func (e *BudgetExhaustedError) Remaining() int64 { return max(0, e.Cap-e.Spent) }

// Decimal spells an amount for headers and bodies: a money window's in
// decimal units of its currency ("25.5"), a tokens window's in whole cost units.
func (e *BudgetExhaustedError) Decimal(n int64) string {
	if e.Counts == CountMoney {
		if n < 0 {
			return "-" + FormatRate(-n)
		}
		return FormatRate(n)
	}
	return strconv.FormatInt(n, 10)
}

// Unit is what the window's amounts count: its currency for money
// ("USD"), "tokens" for tokens.
func (e *BudgetExhaustedError) Unit() string {
	if e.Counts == CountMoney {
		return e.Currency
	}
	return "tokens"
}

// RateHeaders are the headers of the limit that bound, in place of the
// token bucket's (which did not refuse, and whose remaining would read as
// room): the window's cap, what is left of it and the time to its reset,
// as X-Ratelimit-{Limit,Remaining,Reset}-Budget in the format of the token
// headers, its name and unit; and for a tokens window, the
// X-Ratelimit-*-Tokens headers of that window, so that a client reading
// only OpenAI's headers sees none left. Every face sends them.
func (e *BudgetExhaustedError) RateHeaders() []Header {
	reset := e.RetryAfter.String()
	h := []Header{
		{"X-Ratelimit-Limit-Budget", e.Decimal(e.Cap)},
		{"X-Ratelimit-Remaining-Budget", e.Decimal(e.Remaining())},
		{"X-Ratelimit-Reset-Budget", reset},
		{"X-Ratelimit-Budget-Window", e.Window},
		{"X-Ratelimit-Budget-Unit", e.Unit()},
	}
	if e.Counts == CountTokens {
		h = append(h,
			Header{"X-Ratelimit-Limit-Tokens", e.Decimal(e.Cap)},
			Header{"X-Ratelimit-Remaining-Tokens", e.Decimal(e.Remaining())},
			Header{"X-Ratelimit-Reset-Tokens", reset})
	}
	return h
}

// Message is the refusal as every face says it to the caller: the window,
// what it spent of its cap, what the request needed and when it resets.
// One sentence for every wire, so the HTTP API, the proxy's wires and the
// rate limit service's body never drift apart.
func (e *BudgetExhaustedError) Message() string {
	of := ""
	if e.Level != "" {
		of = " of " + e.Level
	}
	return "the " + string(e.Counts) + " budget of window " + e.Window + of + " is exhausted: spent " + e.Amount(e.Spent) + " of " +
		e.Amount(e.Cap) + ", and this request needs " + e.Amount(e.Cost) + "; it resets at " + e.Resets.UTC().Format(time.RFC3339)
}

// ExhaustedBudget is an exhausted window's amounts as the faces' JSON
// bodies carry them (the HTTP API's error, and the rate limit service's
// 429 body, which must be the same): exact decimals in the window's unit
// (tokens, or units of Currency).
type ExhaustedBudget struct {
	Window    string      `json:"window"`
	Counts    string      `json:"counts"`
	Spent     json.Number `json:"spent"`
	Limit     json.Number `json:"limit"`
	Cap       json.Number `json:"cap"`
	Remaining json.Number `json:"remaining"`
	Cost      json.Number `json:"cost"`
	Currency  string      `json:"currency,omitempty"`
	ResetsAt  time.Time   `json:"resets_at"`
}

// Amounts is the window's ExhaustedBudget.
func (e *BudgetExhaustedError) Amounts() *ExhaustedBudget {
	return &ExhaustedBudget{Window: e.Window, Counts: string(e.Counts), Spent: json.Number(e.Decimal(e.Spent)),
		Limit: json.Number(e.Decimal(e.Budget)), Cap: json.Number(e.Decimal(e.Cap)), Remaining: json.Number(e.Decimal(e.Remaining())),
		Cost: json.Number(e.Decimal(e.Cost)), Currency: e.Currency, ResetsAt: e.Resets.UTC()}
}
