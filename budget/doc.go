// Package budget is the map of tokengate's domain; it holds no code.
//
// Its packages are layered so that every import inside budget points down or
// across, never up (integration/layout_test.go enforces it):
//
//   - rule: the rules of a decision as pure values and arithmetic (limits,
//     windows, money, bounds on usage, the domain's errors). Standard
//     library only: no SQL, no clock reads, no tracing.
//   - alert: spend alerts, their tables and their rules.
//   - account: the store (tenants' balances, admissions, pools, end users
//     and model limits, in Postgres, with the caches of them) and the
//     pipeline that loads, decides and writes a decision in one transaction.
//   - credential: API keys and gateway credentials.
//   - outage: what a replica does while the store is unreachable.
//   - lease: quota leasing (docs/leasing.md): slices of a tenant's budget
//     pre-debited at every level of its tree, admitted from in memory and
//     journaled before the answer; not used by admissions yet.
//   - admission: the one admission use case every face calls (estimate,
//     reserve, settle, release).
//   - admin: the administration use cases, one method per operation, each
//     written with its ledger entry in one transaction.
//   - replica: one replica's services, built once and handed to every face.
//
// The root is a map rather than the store because the use cases below it
// import the store: a store at the root would make each of them import a
// shallower package.
package budget
