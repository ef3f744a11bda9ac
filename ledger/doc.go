// Package ledger owns tokengate's audit ledger: one append-only row per
// state change of a tenant's budget (reserve, settle, release, expire,
// adjust, limits, tenant).
//
// Invariants, which Verify checks from the rows alone:
//
//   - Entries of a tenant have consecutive sequence numbers starting at 1.
//   - Each entry's hash is sha256(prev_hash || Canonical(entry)), and its
//     prev_hash is the previous entry's hash (empty for seq 1). Changing,
//     removing, reordering or forging any entry breaks the chain from there.
//   - The token balance is exact integer arithmetic in micro-tokens:
//     balance(n) = balance(n-1) + refill(n) + delta(n), with balance(0) = 0.
//     A tenant's creation entry therefore carries its starting balance as
//     its delta, and its stored balance always equals the last entry's.
//     Verify computes this sum exactly (in a big integer): a sum that
//     leaves int64 is a Problem of kind overflow, never a wrap that matches.
//
// Entries are written by the package that changes the balance, in the same
// transaction and under the same tenant row lock: the caller keeps the chain
// head (seq, hash) on the tenant row, seals each new entry from it with
// Head.Seal, and queues the insert with QueueInsert. Appending needs no read.
// The database rejects UPDATE, DELETE and TRUNCATE on the table (a trigger).
//
// It imports none of the module's packages: budget writes its entries in the
// decision's own transaction.
package ledger
