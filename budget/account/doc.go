// Package account owns tenants' limits and balances and decides admissions.
//
// Invariants:
//
//   - One tenant, one row, one lock. Every change of a tenant's balances
//     (reserve, settle, release, expire, and admin changes) happens in one
//     transaction that holds the tenant row lock (SELECT .. FOR UPDATE),
//     whichever replica makes it. Two decisions can never spend the same
//     balance. Lock order is tenant rows (with their ancestors, root first:
//     by depth, then id), then admission rows, then pool rows (by id); a
//     tenant's model limits and a pool's shares are written only under
//     their tenant's or pool's lock, so they need none of their own.
//   - Budgets nest (tree.go): an admission must fit every level of its
//     tenant's tree, debits each, and every level's ledger chain records
//     its own entry; a rejection consumes nothing at any level.
//   - End users (enduser.go) are tenant rows below their tenant, so the
//     rules of nested budgets hold for them unchanged. One is created (or
//     revived) only under its tenant's lock, after counting the tenant's
//     live end users: one row per end user, and the cap is exact.
//   - A shadow limit is evaluated and counted but never refuses; its state
//     is what it would be if enforced (a request it would refuse is not
//     debited from it), so enforcing it changes only the answers.
//   - A limit change is a LimitsPatch applied to the limits read under the
//     tenant row lock (UpdateLimits), in the transaction that writes its
//     limits entry: concurrent changes of different fields never undo one
//     another, whatever face (API, CLI, dashboard) or replica sends them.
//   - Time is the database's clock: clock_timestamp() read after the lock is
//     held, so replicas with skewed clocks agree. Elapsed time is clamped at
//     zero, and a stored timestamp never moves backwards.
//   - Amounts are integers. Token and request balances are micro-units
//     (1 token = 1 000 000), so refill at fractional rates is exact:
//     refill = floor(rate_micro_per_s * elapsed_us / 1e6), capped so the
//     balance does not exceed capacity. What floor drops is under one
//     micro-token per change.
//   - A rejected request changes nothing: its transaction is rolled back, so
//     neither the balances, the refill timestamp nor the ledger move.
//   - Every change appends its ledger entry in the same transaction; the
//     tenant row holds the chain head, so the stored balance always equals
//     the last entry's balance_after.
//   - Settle and release add back estimate - actual; a refund never lifts the
//     balance above capacity (the entry records the effective amount); an
//     extra charge may drive it negative, down to the debt floor (minus one
//     capacity, where it stops; the entry records the effective amount), and
//     refill pays that debt back. An admin debit past the floor is refused
//     (ErrDebtFloor).
//   - A settle's usage is bounded (rule.UsageBound, with the window of
//     the model read from the estimator's table by SettleBounds): output
//     up to the output reserved, input plus output up to the model's
//     context window (or rule.MaxUnknownModelUsage). Cached input is
//     priced at the model's cached-input weight, and a refund turned into
//     usage, first (SettleParams.Usage); the bounds apply to the raw
//     counts. Usage beyond is refused (ErrUsageOutOfBounds) before
//     anything moves. Micro-unit arithmetic is checked: an overflow is
//     ErrOverflow, never a wrap.
//   - Reservations that are never settled expire: they stay charged at their
//     estimate and their concurrency slot is freed. A settle that arrives
//     later still reconciles against that estimate, marked late.
//   - A settle or release by idempotency key that arrives before its
//     admission (made by a replica on its own during an outage, not
//     replayed yet) is not lost: when the key names no admission and the
//     request's failure policy could be local (Deferral), its decision
//     keeps it (deferred_settles, under the tenant lock, ErrDeferred), and
//     the replay of the admission applies and deletes it in its own
//     transaction (deferred.go): exactly once. Kept rows live 24 h.
//   - An admission belongs to the face that made it (face.go: the API, the
//     proxy, the rate limit service): only that face settles or releases
//     it (OtherFaceError), and Idempotency-Keys live in their face's
//     namespace (Face.StoredKey), so a tenant can neither end nor reach by
//     key what the proxy or a gateway ends from the upstream's usage.
//   - A replayed local admission whose debit stopped at the debt floor is
//     refunded at most what it was debited (Admission.DebitedMicro).
//   - An admission made from a lease (budget/lease) is written by the
//     journal's group commit, admissions and key rows at once (QueueLeased),
//     with debited_micro NULL (the lease debited its whole estimate at every
//     level); its lease's booking appends its reserve entries later
//     (LeasedToBook, LevelMove.Opens), and, for one its lease's journal
//     ended (lease_end_seq), its settle entry in the lease's order
//     (LevelMove.Closes). A decision that ends one whose
//     entries are still to write books that lease, up to it, first, in its
//     own transaction and lock round trip (leasebook.go, leaseBookRead);
//     the expiry sweeper leaves it
//     until it is booked; and a keyed reserve of a tenant with a live lease
//     takes the key's advisory lock a journal group takes too, decided in
//     the statement under its row lock: a key is admitted once, leased or
//     not.
//
// A decision is three steps and costs two round trips on one connection:
// load (load.go: BEGIN; lock the tenant rows; read the clock and all the
// requests need: model limits, whether their tenant keys and gateways are
// revoked, idempotency keys, the admissions they settle or release by id or
// by key, overdue reservations, pools), decide (decide.go and decision.go:
// the rules of budget/rule applied to what was loaded, with no I/O), write
// (writes.go: the writes; COMMIT). The lock is held from the first round
// trip's lock to the COMMIT, and no estimation or other work happens while
// it is held. A request's credentials are
// checked in that transaction too (rule.ErrKeyRevoked, rule.ErrGatewayRevoked,
// rule.ErrOutOfScope), so a revocation applies in every replica at once and a
// face needs no query of its own. So are the model scopes of a reserve
// (rule.CheckModelScopes over the key's list and every level's, read with
// the key and the locked tenant rows: *rule.ModelNotAllowedError), which
// their changes write under the same tenant lock (SetModels,
// RecordKeyEvent): each admission passes the lists in effect when it is
// decided, on every replica, with no cache to invalidate. Requests of any tenants (reserves,
// settles, releases, expiries) are decided under one lock statement
// (DecideBatch); a replica queues them in a Pipeline. The reserves of a
// group (Item.Group, Pipeline.ReserveAll: a gateway's call naming several
// tenants) are one decision, all or none: a try that admitted part of a
// group is rolled back before anything is written and the batch decided
// again without it, so no reserve of a refused group is ever debited, and
// none is undone.
//
// Busy is not down. A request that ran out of time while the store kept
// answering (other round trips, or a ping outside the pool) waited its turn
// and is rule.ErrBusy; only a store that answers nothing is
// rule.ErrUnavailable, the condition under which a failure policy may
// decide instead.
//
// account holds the store (SQL over budget's tables, and the caches of
// them: end-user policies, pool routes, the price book, which tenants have
// model limits) and the pipeline; the rules it applies are values and
// functions in budget/rule, a leaf that imports none of it (a tenant's
// state, the decision over a tree, pools' fair share, usage bounds,
// money's rules, end users' ids and policies' checks, admission ids,
// limits' JSON shape). What account keeps besides the SQL is glue: rows
// into rule values and back, the ledger entries that record each change,
// and the translation of the estimator's types (an Estimate, the model
// table, the price book) into the plain values the rules take
// (SettleBounds, moneyOf, ModelKey), since rule knows no estimator. It may
// import estimator, ledger, budget/rule and budget/alert, never a face,
// nor a tracing library (the pipeline is traced through PipelineTracer);
// the use cases beside it (admission, credential, outage, admin) build on
// it.
package account
