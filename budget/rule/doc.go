// Package rule holds budget's rules as values: a tenant's limits and the
// patches that change them, calendar windows and their time zones, the
// token bucket and its micro-unit arithmetic, money amounts, the bounds of
// every amount, the state one decision reads and changes (TenantState:
// Decide, Debit, End), pools' and model limits' values, the Retry-After a
// refusal tells, idempotency keys, faces, and the domain's errors.
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
package rule
