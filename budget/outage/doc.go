// Package outage is what a replica does while it cannot reach the store,
// under the local failure policy: it admits against its share of each
// tenant's bucket (capacity and refill divided by the replica count),
// journals every decision in a durable local spool, and replays the spool
// into the store, exactly once, when the store is back.
//
// Exactly once: a replayed admission keeps the id the replica gave it, and
// the store writes it only if no admission has that id (account.Store.ReplayReserve);
// settles and releases are idempotent in the store already, and one by key
// whose admission another replica made and has not replayed yet is kept by
// the store for that replay (account.ErrDeferred). So a replay that
// a crash interrupts simply runs again from the start, and the spool is
// emptied only after every record is in the store.
//
// It may import budget and estimator, never a face: rule.Decide is the one
// decision it applies to its share.
package outage
