// Package rule holds budget's rules as values: a tenant's limits, the
// patches that change them and their one JSON shape (LimitsDetail),
// calendar windows and their time zones, the token bucket and its
// micro-unit arithmetic, money amounts and money's rules (RequirePrice,
// MoneyKept), the bounds of every amount and of a settle's usage
// (UsageBounds), the state one decision reads and changes (TenantState:
// Decide, Debit, End) and the decision over a tree of them
// (DecideLevels), pools' values and fair share (Pool: the virtual token
// counter), model limits' values, end users' sources, ids and policies'
// checks, admission ids (local or the store's), admin adjustments, the
// form of a settle or release, the Retry-After a refusal tells,
// idempotency keys, faces, and the domain's errors.
//
// Why a package of its own: the store (SQL over budget's tables) and the
// pipeline (load, decide, write) apply these rules, and a replica applies
// the same ones in memory during an outage; the rules depend on neither.
// rule imports only the standard library: no driver, no clock (every
// function takes its now), no tracing, no metrics. Its tests run without a
// database, and integration/layout_test.go keeps it that way.
//
// Invariants kept here:
//   - Balances are in micro-units (Micro per token or request), and every
//     sum that could overflow is checked (AddMicro, Add64): an overflow is
//     an *OverflowError (ErrOverflow), never a wrapped balance.
//   - Refill: balance' = min(capacity, balance + rate × elapsed), with
//     rate in micro-units per second (Bucket.Refill).
//   - A refusal consumes nothing: Decide and Refusals change no state.
//   - A wait computed from a refill saturates at NeverRefills, and the
//     wait a face tells is never zero (RetryAfterMillis).
//   - A request fits only if every level of its tree allows it
//     (DecideLevels); a shadow limit refuses nothing but is recorded, and
//     the debit leaves it out.
//   - A settle's usage never passes its bound (UsageBound.Check refuses a
//     claim, UsageBound.Clamp bounds an upstream's fact), and a debit never
//     passes the debt floor (Bucket.Adjust: ErrDebtFloor).
package rule
