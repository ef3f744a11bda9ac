// Package admission is how a replica admits, whatever face the request came
// through (the HTTP API, a gateway's rate limit service, a proxy): it picks
// the failure policy of each request, decides through the replica's
// account.Pipeline, lets a caller wait for tokens, and when the store does
// not answer, fails over to the local policy (budget/outage) and replays
// what was decided without the store once it is back.
//
// Waiting is fair in two ways. A tenant's callers are served first in,
// first out (wait.go). The callers waiting for an upstream pool are served
// by priority class, then by their tenant's virtual token counter, which is
// kept in Postgres (pool_wait.go). A reservation ending anywhere in a
// budget tree wakes the tree's waiting callers.
//
// It is the admission use case, written once for every face: Reserve
// applies the rules every request follows (the idempotency key's form and
// the request's fingerprint, admission.go), decides, waits and fails over;
// Settle and Release end an admission by id or by idempotency key inside
// the pipeline. A face parses its wire's body into an *estimator.Request
// and hands it over: Admit estimates and prices it with the replica's
// model table and reserves it, Quote estimates a count alone, CountOutput
// counts a stream's text that came without usage, and SettleReported
// bounds the usage an upstream reported before settling it (estimate.go);
// no face holds the model table. Every outcome is counted here, once (metrics.go):
// tokengate_admissions_total and tokengate_settlements_total by face, and
// a refusal in the dashboard's tally that the throttled alerts read, so
// that the API, the proxy and the rate limit service cannot disagree on
// what was admitted, refused or settled. Every decision is traced here
// too, once (trace.go): a face only puts its caller's trace context in
// ctx. A face decodes its wire format into a Request, calls, and encodes
// the answer through its one table of the domain's errors; adding a face
// is a handful of files that do only that (see api/rls, the smallest).
//
// A tenant in lease mode auto is admitted from its replica's lease of its
// budget (quota leasing, lease.go and docs/leasing.md) when no per-request
// rule keeps the request exact; anything the lease cannot decide, a
// refusal above all, goes to the pipeline. tokengate_admission_paths_total
// counts the decisions by path (exact, lease, local).
//
// The replica builds one Admitter (budget/replica) and hands it to every
// face.
//
// It may import budget, budget/lease, budget/outage and estimator, never a
// face.
package admission
