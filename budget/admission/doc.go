// Package admission is how a replica admits, whatever face the request came
// through (the HTTP API, a gateway's rate limit service, a proxy): it picks
// the failure policy of each request, decides through the replica's
// budget.Pipeline, lets a caller wait for tokens, and when the store does
// not answer, fails over to the local policy (budget/outage) and replays
// what was decided without the store once it is back.
//
// Waiting is fair in two ways. A tenant's callers are served first in,
// first out (wait.go). The callers waiting for an upstream pool are served
// by priority class, then by their tenant's virtual token counter, which is
// kept in Postgres (pool_wait.go). A reservation ending anywhere in a
// budget tree wakes the tree's waiting callers.
//
// It is also where every face's admissions are counted, once (metrics.go):
// tokengate_admissions_total by face, and a refusal in the dashboard's
// tally that the throttled alerts read, so that the API, the proxy and the
// rate limit service cannot disagree on what was admitted or refused.
//
// It may import budget, budget/outage and estimator, never a face.
package admission
