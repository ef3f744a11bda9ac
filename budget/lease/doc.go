// Package lease is quota leasing (docs/leasing.md): a replica takes a
// lease, a slice of a tenant's token budget pre-debited at every level of
// its tree, and admits from it in memory, each admission journaled before
// it is answered.
//
// Invariants:
//
//   - A lease's slice is debited at every level in one transaction under
//     the tree's row locks (account.Store.LockedLevels), with a lease_take
//     entry at each level, and never takes a level below zero: what is
//     admitted from leases can never pass a budget.
//   - A journal write (group commit) locks the lease row, never a tenant
//     row, and keeps used <= slice in the database, only while the lease
//     is live and unexpired by the store's clock.
//   - A group commit writes each admission once, where it lives: its
//     admissions row and its Idempotency-Key row (account.QueueLeased).
//   - Renew, return and expiry lock the tree's rows (a return and an
//     expiry then the lease row: the one lock order), append a reserve
//     entry at every level for each admission of the lease not yet in the
//     ledger (delta zero: the take debited it), in journal order, and
//     refund slice - used (lease_return) when the lease ends. The chain
//     stays verifiable: every balance move has its entry, appended under
//     the lock that orders it. A decision that ends an admission not booked
//     yet books its lease first, in its own transaction (account's
//     leaseBookRead): it settles as an exact admission.
//   - An Idempotency-Key is unique per tenant in idempotency_keys: a group
//     reads it under the advisory lock a decision takes too, and answers a
//     key in use as a replay.
//   - A group is sent in one round trip, COMMIT included, only when no read
//     could change what it writes (journal_once.go): each read it skips is
//     a guard in the statement that would act on it (a lease refusing, a
//     live key, a credential changed since the journal read it), which
//     rolls the whole group back; the careful way, two round trips, then
//     writes it and answers each admission.
//   - A lease whose holder stops renewing is ended by the sweeper once its
//     expiry passes: a dead replica holds budget for at most the TTL.
//   - An admin change that takes a tenant out of leasing (a disable, new
//     limits or model scope, lease mode off) ends its live leases in its
//     own transaction, under the same tree locks (EndLocked, end.go): the
//     journal refuses their next admission from its commit on.
//   - The journal applies a decision's key rule to each admission
//     (Admission.KeyID): revoked, unknown or another tenant's is
//     rule.ErrKeyRevoked, a model outside the key's scope
//     *rule.ModelNotAllowedError, refused alone while the group's other
//     admissions commit. It reads the keys after it locks its leases, and a
//     key's revoke or rescope locks them too (LockLive), so no admission
//     with a revoked key is journaled after the revoke commits. So with a
//     gateway credential (Admission.GatewayID): revoked or unknown is
//     rule.ErrGatewayRevoked, a scope without the tenant rule.ErrOutOfScope;
//     a gateway's revoke locks the live leases of its tenants, or all of
//     them for a gateway of every tenant (LockLiveGateway).
//
// A tenant with a rule only exact mode keeps (account.Level.ExactOnly) is
// never leased (ErrExactOnly).
package lease
