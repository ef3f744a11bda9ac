package admission

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// Leases is quota leasing on this replica (budget/replica builds it): the
// tenants' lease modes, and a lease holder per tenant. A tenant in mode
// auto is admitted from this replica's lease of its budget, journaled
// before the answer, without its row lock (docs/leasing.md); anything the
// lease cannot decide goes to the exact pipeline.
type Leases interface {
	// Auto reports whether the tenant's lease mode is auto, from a copy
	// of the modes (no query per admission); false when it cannot tell.
	Auto(ctx context.Context, tenantID string) bool
	// Pooled reports whether a request of e's model draws on an upstream
	// pool (from the store's copy of the routes); true when it cannot
	// tell.
	Pooled(ctx context.Context, e estimator.Estimate) bool
	// Admit prices a as a reserve is priced (account.PriceAdmission, from
	// a copy of the price book, no query per admission), makes it from
	// the tenant's lease on this replica and returns once it is
	// journaled, with the tenant's snapshot as the answer shows it
	// (leaseReservation). Any error means it was not made: the
	// request is decided exactly (lease.ErrExhausted, lease.ErrExactOnly,
	// no lease held yet, a store error), or answered as a replay
	// (*lease.ReplayError, rule.ErrIdempotencyMismatch). When keep is
	// non-nil (a keyed request that keeps its answer), Admit calls it
	// with the snapshot it will answer, before journaling, and journals
	// what it returns as a.Response: the answer a retry replays is then
	// byte for byte the first one. It returns the admission's id: the
	// journal gives a Grouped admission its own (lease.Admission.Grouped),
	// written in place of a.ID in what keep returned.
	Admit(ctx context.Context, tenantID string, a lease.Admission, keep func(rule.Snapshot) ([]byte, error)) (string, rule.Snapshot, error)
	// Settle settles p in the lease's journal when it ends an admission
	// this replica made from a lease it still holds, its usage and cost
	// computed with table as an exact settle computes them. ok false: the
	// exact pipeline decides p, as it does every settle otherwise.
	Settle(ctx context.Context, p account.SettleParams, table *estimator.Table) (st *account.Settlement, ok bool, err error)
}

// Decision paths, the values of tokengate_admission_paths_total's path
// label: what decided a request.
const (
	// PathExact: the store's pipeline, under the tenant's row locks.
	PathExact = "exact"
	// PathLease: this replica's lease of the tenant (quota leasing).
	PathLease = "lease"
	// PathLocal: the local failure policy, without the store.
	PathLocal = "local"
)

// AttrPath is the decision span's path attribute (PathExact, PathLease,
// PathLocal). A lease admission's tokengate.decided_by is "store": its
// journal row is in Postgres before it is answered.
var AttrPath = attribute.Key("tokengate.path")

// pathOf is the path that decided a request.
func pathOf(leased, local bool) string {
	switch {
	case leased:
		return PathLease
	case local:
		return PathLocal
	}
	return PathExact
}

// exactPerRequest reports whether a request must be decided exactly
// whatever its tenant's lease mode (docs/leasing.md, "Rules that keep a
// tenant in exact mode"): one of a model routed to an upstream pool (a
// pool's fair share depends on every tenant's live state). The request's
// credentials do not keep it exact: the journal checks its tenant key
// (lease.Admission.KeyID) and its gateway credential (GatewayID) per
// admission, as a decision does, and keeps its Idempotency-Key unique with
// the exact path's, with the answer a retry replays (leaseReplay); so the
// rate limit service's requests (a gateway, and a key per request id) are
// leased. The rules of a tenant's tree (end users, request and concurrency
// limits, windows, model limits, shadow limits, a disabled level) are the
// lease store's: its take refuses with lease.ErrExactOnly. This is the one
// place per-request rules are kept, so relaxing one is a change here.
func exactPerRequest(pooled func() bool) bool {
	return pooled()
}

// leaseAdmission is the journal's record of the admission made from a
// lease for p, booked later as its admissions row: the one place a
// lease.Admission is built from a request. id is a placeholder of the
// admission's instant: the journal gives it an id naming its group
// (Grouped, rule.GroupedAdmissionID). Leases.Admit prices it (its
// price and money estimate, as a reserve's, from the replica's price book:
// account.PriceAdmission); a tenant whose windows count money stays exact
// only, so no money rule reads it before its booking. Its expiry is the
// tenant's reservation TTL from its booking's journal time (ExpiresAt
// zero).
func leaseAdmission(id string, p *account.ReserveParams) lease.Admission {
	return lease.Admission{
		Admission: account.Admission{ID: id, TenantID: p.TenantID, State: account.StateReserved, Estimate: p.Estimate,
			Family: account.ModelKey(p.Estimate), Face: p.Face.Or()},
		CostMicro: p.Estimate.Cost * rule.Micro, KeyID: p.KeyID, GatewayID: p.GatewayID, Actor: p.Actor,
		IdempotencyKey: p.IdempotencyKey, RequestHash: p.RequestHash, Grouped: true,
	}
}

// reserveLeased admits req from its tenant's lease on this replica when it
// may be (leased true), and says false when it must be decided exactly: no
// leasing, mode off, a per-request exact rule, callers of the tenant
// waiting in this replica (they are served first, by the exact path), or
// anything the lease could not decide (a refusal is always exact). An
// error is returned when the caller's ctx ended while the lease
// journaled (the admission's outcome is then unknown, and deciding it
// again exactly could charge it twice), and for a key reused with another
// request (rule.ErrIdempotencyMismatch, as the exact path answers it).
func (a *Admitter) reserveLeased(ctx context.Context, req *Request) (*account.Reservation, bool, error) {
	l := a.cfg.Leases
	p := &req.ReserveParams
	if l == nil || a.Down() || p.Estimate.Cost <= 0 || !l.Auto(ctx, p.TenantID) {
		return nil, false, nil
	}
	if exactPerRequest(func() bool { return l.Pooled(ctx, p.Estimate) }) || a.waiters.ahead(p.TenantID, nil) > 0 {
		return nil, false, nil
	}
	now := time.Now()
	placeholder := rule.NewStoreAdmissionID(now)
	// A keyed request keeps its answer as the exact path does
	// (account.EncodeReservation of the reservation answered; nothing
	// with ReplayNow), so a retry replays the same bytes whichever path
	// made the admission or answers the retry. It is encoded with the
	// placeholder, which the journal replaces by the admission's id.
	var kept *account.Reservation
	var keep func(rule.Snapshot) ([]byte, error)
	if p.IdempotencyKey != "" && !p.ReplayNow {
		keep = func(snap rule.Snapshot) ([]byte, error) {
			kept = leaseReservation(placeholder, p, now, snap)
			return account.EncodeReservation(kept)
		}
	}
	id, snap, err := l.Admit(ctx, p.TenantID, leaseAdmission(placeholder, p), keep)
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		return leaseReplay(err)
	}
	if kept != nil {
		kept.AdmissionID = id
		return kept, true, nil
	}
	return leaseReservation(id, p, now, snap), true, nil
}

// leaseReplay answers a request whose Idempotency-Key the journal found
// (the lease admitted nothing) as the exact path would: the kept answer,
// Replayed, or rule.ErrIdempotencyMismatch for another request with the
// key. A key kept with ReplayNow (no answer: the rate limit service's) is
// decided again exactly, which finds the key in the journal or in
// idempotency_keys and answers its id with the balances as they are, as
// exact mode does; so is anything else the lease could not decide.
func leaseReplay(err error) (*account.Reservation, bool, error) {
	if errors.Is(err, rule.ErrIdempotencyMismatch) {
		return nil, true, rule.ErrIdempotencyMismatch
	}
	var re *lease.ReplayError
	if !errors.As(err, &re) || len(re.Response) == 0 {
		return nil, false, nil
	}
	r, derr := account.DecodeReservation(re.Response)
	if derr != nil {
		return nil, false, nil // the exact path reads the key again and answers it
	}
	r.Replayed = true
	return r, true, nil
}

// leaseReservation is the answer of an admission made from a lease. Its
// snapshot is the one the replica's lease keeps (Leases.Admit): the
// tenant's limits as last read, and for TokensMicro what this replica can
// still admit at once, its lease's unused part plus the balance outside
// every lease at the lease's last take or renew. That is at most what an
// exact decision would report (it leaves out other replicas' unused
// slices and the refill since the renew), so a client pacing itself on
// the rate headers never overruns.
func leaseReservation(id string, p *account.ReserveParams, now time.Time, snap rule.Snapshot) *account.Reservation {
	ttl := snap.Limits.ReservationTTL
	if ttl <= 0 {
		ttl = rule.DefaultReservationTTL
	}
	snap.At = now
	return &account.Reservation{AdmissionID: id, Estimate: p.Estimate, CreatedAt: now, ExpiresAt: now.Add(ttl), Snapshot: snap}
}
