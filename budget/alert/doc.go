// Package alert tells admins about a tenant's budget before its users
// notice: a period budget crossing 50/80/100 %, a limit refusing for
// minutes on end, the ledger watch finding a balance that does not
// recompute. It owns the endpoints, the rules, the outbox of events and the
// log of delivery attempts.
//
// Exactly once where it matters, at least once where it cannot be better:
//   - an event is written in the transaction of what raised it (budget's
//     decision writes ThresholdsCrossedSQL beside the tenant's row), and at
//     most once per rule and dedupe key, so a threshold fires once per
//     period however many replicas decide at once;
//   - the dispatcher leases due events (FOR UPDATE SKIP LOCKED), delivers
//     them over HTTPS signed with HMAC-SHA256 and a timestamp, and records
//     the outcome only while its lease holds: an event is recorded
//     delivered once, and a replica that dies mid-delivery leaves it to be
//     delivered again (the receiver deduplicates by event id).
//
// Where a delivery may go is each replica's Policy, checked when an
// endpoint is created and again at every delivery: https:// only, public
// addresses only (every address connected to is checked, after DNS), and
// never on to where a redirect points.
//
// It imports nothing of budget: budget imports it for the outbox statement.
package alert
