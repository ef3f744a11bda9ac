// Package batch admits batch traffic (OpenAI's Batch API, Anthropic's
// Message Batches) against an enqueued-tokens allowance of its own.
//
// Invariants:
//
//   - The allowance is a capacity, not a rate: a tenant's open batches
//     hold at most capacity_micro at once. A batch's whole estimate, every
//     line as its single request would be estimated, at the batch
//     discount (PriceMicro), is taken when it is created and given back line by
//     line as its lines settle or are refunded; time alone never refills
//     it.
//   - Every change of an allowance, a batch or its lines happens under the
//     tenant's row lock (account.Store.Locked), lock order tenant,
//     allowance, batch: the bound is exact across replicas, and a batch's
//     lines end once (a second report of the same outcome settles nothing).
//   - A batch is one story in the ledger: its entries carry its id as
//     their admission_id. batch_reserve (the whole batch), then, when it
//     ends, batch_settle (the lines with usage: estimate and actual) and
//     batch_refund (its failed, expired, cancelled or missing lines, given
//     back whole). Per line, batch_lines holds the estimate and outcome.
//     These entries move the allowance, never the token balance.
//   - A batch is held for its completion window (24 h); the sweeper
//     (ExpireOverdue) refunds the lines of a batch still open after it.
//
// Money (money.go): a batch's lines are priced at the batch price
// (estimator.PriceBook.AtBatch), reserved with the batch in the money
// windows of the tenant and its ancestors under the same lock
// (account.LockedMoney: a batch that does not fit an enforced money
// window is refused whole), and corrected line by line as they settle or
// are refunded; the entries carry that money. The per-minute buckets and
// the token windows are never moved: a batch is admitted by its allowance
// and its money.
//
// Housekeeping (housekeeping.go): file records are purged after their
// retention by the sweeper; Stats counts batches and lines for metrics.
package batch
