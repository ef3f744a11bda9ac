package outage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// Local decides admissions while the store is unreachable, against this
// replica's share of each tenant's limits: capacity, refill, request bucket
// and concurrency cap divided by Replicas. A share starts from the replica's
// share of the last balance it saw, never more than its share of capacity.
// Every decision is journaled in Spool before it is answered.
//
// The overshoot bound: during an outage of length T, all replicas together
// admit at most (balance they last saw) + refill x T, which exceeds what the
// store would have allowed by at most what other replicas spent since this
// one last saw the balance: one tenant capacity in the worst case, provided
// Replicas is the number of replicas actually running. Period budgets are
// not enforced locally (no replica knows what the others spent in the
// period); the token bucket still bounds spending.
type Local struct {
	Replicas int
	Replica  string
	Spool    *Spool
	Logger   *slog.Logger
	// NowFunc is the clock; tests freeze it. Defaults to time.Now.
	NowFunc func() time.Time
	// ModelsFunc is the model table that bounds a settle's usage
	// (account.SettleBounds), as the store's does; nil is the seeded table.
	ModelsFunc func() *estimator.Table

	mu     sync.Mutex
	shares map[string]*share
	// idempotent holds this outage's admissions by tenant, face and
	// Idempotency-Key, so a retry to this replica is not admitted twice
	// (and a key sent through another face never meets it).
	idempotent map[idemKey]idempotent
}

// idemKey is an Idempotency-Key in its tenant and face.
type idemKey struct {
	tenantID string
	face     rule.Face
	key      string
}

type idempotent struct {
	hash []byte
	r    *account.Reservation
}

// share is this replica's share of one tenant: the tenant's state with its
// limits divided by Replicas, decided with rule.Decide like the store's.
type share struct {
	tenant rule.Limits // the tenant's own limits, shown in snapshots
	state  rule.TenantState
	open   map[string]opened // admissions made here and not yet ended
}

type opened struct {
	est  estimator.Estimate
	at   time.Time
	face rule.Face // the face that made it, the only one that may end it
}

func (l *Local) now() time.Time {
	if l.NowFunc != nil {
		return l.NowFunc()
	}
	return time.Now()
}

func (l *Local) divide(n int64) int64 {
	return n / int64(max(1, l.Replicas))
}

func (l *Local) shareOf(snap rule.Snapshot, now time.Time) *share {
	if l.shares == nil {
		l.shares = map[string]*share{}
	}
	if sh, ok := l.shares[snap.TenantID]; ok {
		return sh
	}
	lim := snap.Limits
	// Windows (the period budget among them) are not enforced locally: no
	// replica knows what the others spend in the window. The replay counts
	// the admission in every window, priced as of its creation.
	mine := rule.Limits{TokensCapacity: l.divide(lim.TokensCapacity*rule.Micro) / rule.Micro,
		TokensRateMicro: l.divide(lim.TokensRateMicro), ReservationTTL: lim.ReservationTTL}
	sh := &share{tenant: lim, open: map[string]opened{}}
	sh.state.Tokens = rule.Bucket{CapacityMicro: l.divide(lim.TokensCapacity * rule.Micro), RateMicro: mine.TokensRateMicro, At: now}
	sh.state.Tokens.BalanceMicro = min(sh.state.Tokens.CapacityMicro, max(0, l.divide(snap.TokensMicro)))
	if lim.RequestsCapacity > 0 {
		mine.RequestsCapacity, mine.RequestsRateMicro = max(1, l.divide(lim.RequestsCapacity)), l.divide(lim.RequestsRateMicro)
		sh.state.Requests = rule.Bucket{CapacityMicro: l.divide(lim.RequestsCapacity * rule.Micro), RateMicro: mine.RequestsRateMicro, At: now}
		sh.state.Requests.BalanceMicro = min(sh.state.Requests.CapacityMicro, max(0, l.divide(snap.RequestsMicro)))
	}
	if lim.MaxConcurrent > 0 {
		mine.MaxConcurrent = max(1, l.divide(lim.MaxConcurrent))
	}
	sh.state.Limits = mine
	l.shares[snap.TenantID] = sh
	return sh
}

func (sh *share) snapshot(tenantID string, now time.Time) rule.Snapshot {
	s := sh.state.Snapshot(tenantID, now)
	s.Limits = sh.tenant
	return s
}

// Reserve admits p for the tenant of snap (the last snapshot this replica
// saw of it) against this replica's share, or refuses it like the store
// would, with rule.Decide: *rule.TooLargeError, or
// *rule.RejectedError naming the limit. A request larger than the share
// but not than the tenant is refused by the tokens limit with a 1 s hint:
// another replica, or the store once back, may admit it. A retry with p's
// Idempotency-Key returns the admission made in this outage, or
// rule.ErrIdempotencyMismatch if its request differs. An admission is in
// the spool, with its key, before Reserve returns it.
func (l *Local) Reserve(snap rule.Snapshot, p account.ReserveParams) (*account.Reservation, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	est, actor, face := p.Estimate, p.Actor, faceOr(p.Face)
	if p.IdempotencyKey != "" {
		if prior, ok := l.idempotent[idemKey{snap.TenantID, face, p.IdempotencyKey}]; ok {
			if !bytes.Equal(prior.hash, p.RequestHash) {
				return nil, rule.ErrIdempotencyMismatch
			}
			c := *prior.r
			c.Replayed = true
			return &c, nil
		}
	}
	if snap.Limits.TokensCapacity > 0 && est.Cost > snap.Limits.TokensCapacity {
		return nil, &rule.TooLargeError{Limit: rule.LimitTokens, Cost: est.Cost, Capacity: snap.Limits.TokensCapacity}
	}
	sh := l.shareOf(snap, now)
	sh.state.Advance(now)
	if err := rule.Decide(sh.state, est.Cost, now); err != nil {
		var tl *rule.TooLargeError
		var rej *rule.RejectedError
		switch {
		case errors.As(err, &tl):
			rej = &rule.RejectedError{Limit: rule.LimitTokens, RetryAfter: time.Second}
			err = rej
		case !errors.As(err, &rej):
			return nil, err
		}
		rej.Snapshot = sh.snapshot(snap.TenantID, now)
		return nil, err // an exhausted window stays a *rule.BudgetExhaustedError

	}
	ttl := snap.Limits.ReservationTTL
	if ttl <= 0 {
		ttl = rule.DefaultReservationTTL
	}
	id := rule.NewLocalAdmissionID(now)
	r := &account.Reservation{AdmissionID: id, Estimate: est, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	applied, err := sh.state.Debit(est.Cost)
	if err != nil {
		return nil, err
	}
	r.Snapshot = sh.snapshot(snap.TenantID, now)
	stored := account.StoreEstimate(est)
	rec := Record{Kind: KindReserve, AdmissionID: id, TenantID: snap.TenantID, Estimate: &stored, CreatedAt: now,
		ExpiresAt: r.ExpiresAt, Actor: actor, Face: face, ServiceTier: est.ServiceTier}
	if p.IdempotencyKey != "" {
		response, err := account.EncodeReservation(r)
		if err != nil {
			sh.state.Undebit(est.Cost, applied)
			return nil, err
		}
		rec.IdempotencyKey, rec.RequestHash, rec.Response = p.IdempotencyKey, p.RequestHash, response
	}
	if err := l.Spool.Append(rec); err != nil {
		sh.state.Undebit(est.Cost, applied) // not journaled: not admitted
		return nil, err
	}
	sh.open[id] = opened{est: est, at: now, face: face}
	if p.IdempotencyKey != "" {
		if l.idempotent == nil {
			l.idempotent = map[idemKey]idempotent{}
		}
		l.idempotent[idemKey{snap.TenantID, face, p.IdempotencyKey}] = idempotent{hash: p.RequestHash, r: r}
	}
	return r, nil
}

// Settle journals a settle, to be applied when the store is back. An
// admission made here (named by id, or by the Idempotency-Key it was made
// with) also gives its refund (or extra charge) back to the local share at
// once, priced as the store prices it (SettleParams.Usage). A settle that
// names by key an admission the store made is journaled by key, and the
// replay settles it by key. It returns what p.Validate returns, and a
// *rule.UsageError as the store would.
func (l *Local) Settle(p account.SettleParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return l.end(p.TenantID, p.AdmissionID, p.IdempotencyKey, p.Actor, faceOr(p.Face), p.Defer, &p)
}

// Release journals a release like Settle; the whole estimate comes back.
// It returns what p.Validate returns.
func (l *Local) Release(p account.ReleaseParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return l.end(p.TenantID, p.AdmissionID, p.IdempotencyKey, p.Actor, faceOr(p.Face), p.Defer, nil)
}

// faceOr is f, or the API for none (rule.Face's zero).
func faceOr(f rule.Face) rule.Face {
	if f == "" {
		return rule.FaceAPI
	}
	return f
}

// End is Settle (usage in and out) or Release of an admission named by id.
func (l *Local) End(tenantID, admissionID string, settle bool, in, out int64, actor string) error {
	if settle {
		return l.Settle(account.SettleParams{TenantID: tenantID, AdmissionID: admissionID, InputTokens: in, OutputTokens: out, Actor: actor})
	}
	return l.Release(account.ReleaseParams{TenantID: tenantID, AdmissionID: admissionID, Actor: actor})
}

// end journals a settle (usage set) or a release of any admission; one by
// key keeps its deferral (dp) for the replay. An admission made here
// through another face is refused as the store refuses it
// (*rule.OtherFaceError); of any other, the replay's store decides.
func (l *Local) end(tenantID, admissionID, key, actor string, face rule.Face, dp *account.Deferral, usage *account.SettleParams) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if prior, ok := l.idempotent[idemKey{tenantID, face, key}]; key != "" && ok {
		admissionID, key = prior.r.AdmissionID, "" // made here: journaled by its id
	}
	if s, ok := l.shares[tenantID]; ok && admissionID != "" {
		if o, ok := s.open[admissionID]; ok && o.face != face {
			return &rule.OtherFaceError{AdmissionID: admissionID, Face: o.face}
		}
	}
	rec := Record{Kind: KindRelease, AdmissionID: admissionID, IdempotencyKey: key, TenantID: tenantID, CreatedAt: l.now(), Actor: actor, Face: face}
	if key != "" {
		rec.Defer = dp
	}
	if usage != nil {
		rec.Kind, rec.InputTokens, rec.OutputTokens = KindSettle, usage.InputTokens, usage.OutputTokens
		rec.CachedInputTokens, rec.RefundTokens = usage.CachedInputTokens, usage.RefundTokens
		rec.CacheWriteTokens, rec.CacheWrite1hTokens = usage.CacheWriteTokens, usage.CacheWrite1hTokens
		rec.ReasoningTokens, rec.ServiceTier = usage.ReasoningTokens, usage.ServiceTier
	}
	// Usage no request could have produced is refused here, as the store
	// would refuse it: of an admission made here the reservation is known;
	// of any other, the replay's settle is checked by the store.
	var mine *opened
	var sh *share
	if s, ok := l.shares[tenantID]; ok && admissionID != "" {
		if o, ok := s.open[admissionID]; ok {
			sh, mine = s, &o
		}
	}
	if usage != nil && (usage.InputTokens < 0 || usage.OutputTokens < 0) {
		return account.SettleBounds(estimator.Estimate{}, nil).Check(usage.InputTokens, usage.OutputTokens)
	}
	var table *estimator.Table
	if l.ModelsFunc != nil {
		table = l.ModelsFunc()
	}
	actual := int64(0)
	if usage != nil && mine != nil {
		in, out := usage.Usage(mine.est, table)
		rawIn, rawOut := usage.Tokens(mine.est) // the bounds count raw tokens, before cache weights
		if err := account.SettleBounds(mine.est, table).Check(rawIn, rawOut); err != nil {
			return err
		}
		actual = estimator.Cost(in, out, mine.est.InputWeightMicro, mine.est.OutputWeightMicro)
	}
	if mine != nil {
		// Checked before the journal: an overflow refuses the settle.
		probe := sh.state
		if _, err := probe.End(mine.est.Cost, actual, mine.at, false); err != nil {
			return err
		}
	}
	if err := l.Spool.Append(rec); err != nil {
		return err
	}
	if mine != nil {
		if _, err := sh.state.End(mine.est.Cost, actual, mine.at, false); err != nil {
			return err // cannot happen: the probe above succeeded on the same state
		}
		delete(sh.open, admissionID)
	}
	return nil
}

// Store is what a replay needs from the store.
type Store interface {
	ReplayReserve(ctx context.Context, p account.ReplayReserveParams) (bool, error)
	Settle(ctx context.Context, p account.SettleParams) (*account.Settlement, error)
	Release(ctx context.Context, p account.ReleaseParams) (*account.Settlement, error)
}

// ReplayReport says what a replay did.
type ReplayReport struct {
	Records, Reserved, Ended, Skipped int
	// Deferred settles and releases by key found no admission yet, and
	// were kept in the store for the replay of another replica's spool.
	Deferred int
	// Rejected lines could not be read, or were refused by the store for
	// good (not for an outage): they are in the spool's rejected file.
	Rejected int
}

// Replay applies the spool to the store, in order, then discards what it
// applied and forgets the local shares. It stops at the first record the
// store cannot take because it is unavailable or busy (the next replay
// resumes from the start: what was applied is recognised and not applied
// twice). A line that cannot be read, or that the store refuses for good,
// is moved to the rejected file, logged, and never blocks the lines after
// it.
func (l *Local) Replay(ctx context.Context, store Store) (ReplayReport, error) {
	var rep ReplayReport
	lines, size, err := l.Spool.Lines()
	if err != nil {
		return rep, err
	}
	rep.Records = len(lines)
	for i, line := range lines {
		err := line.Err
		if err == nil {
			err = l.apply(ctx, store, line.Record, &rep)
		}
		switch {
		case err == nil:
		case errors.Is(err, rule.ErrUnavailable), errors.Is(err, rule.ErrBusy), ctx.Err() != nil:
			return rep, err // the store is away again: resume later
		default:
			if rerr := l.Spool.reject(line.Raw, err.Error()); rerr != nil {
				return rep, rerr
			}
			rep.Rejected++
			if l.Logger != nil {
				l.Logger.Error("SPOOL RECORD REJECTED: a decision made during the outage cannot be replayed; it is kept in the rejected file",
					"line", i+1, "error", err.Error(), "file", l.Spool.RejectedPath())
			}
		}
	}
	if err := l.Spool.Discard(size); err != nil {
		return rep, err
	}
	l.mu.Lock()
	l.shares, l.idempotent = nil, nil
	l.mu.Unlock()
	return rep, nil
}

// apply replays one record.
func (l *Local) apply(ctx context.Context, store Store, r Record, rep *ReplayReport) error {
	switch r.Kind {
	case KindReserve:
		if r.Estimate == nil {
			return errors.New("outage: a reserve without an estimate")
		}
		est := r.Estimate.Estimate()
		est.ServiceTier = r.ServiceTier
		wrote, err := store.ReplayReserve(ctx, account.ReplayReserveParams{AdmissionID: r.AdmissionID, TenantID: r.TenantID,
			Estimate: est, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, ReplicaClock: l.now, Replica: l.Replica,
			IdempotencyKey: r.IdempotencyKey, RequestHash: r.RequestHash, Response: r.Response, Face: r.FaceOf()})
		if err != nil {
			return err
		}
		if wrote {
			rep.Reserved++
		} else {
			rep.Skipped++
		}
		return nil
	case KindSettle, KindRelease:
		var st *account.Settlement
		var err error
		if r.Kind == KindSettle {
			st, err = store.Settle(ctx, account.SettleParams{TenantID: r.TenantID, AdmissionID: r.AdmissionID, IdempotencyKey: r.IdempotencyKey,
				InputTokens: r.InputTokens, OutputTokens: r.OutputTokens, CachedInputTokens: r.CachedInputTokens, RefundTokens: r.RefundTokens,
				CacheWriteTokens: r.CacheWriteTokens, CacheWrite1hTokens: r.CacheWrite1hTokens, ReasoningTokens: r.ReasoningTokens, ServiceTier: r.ServiceTier,
				Actor: r.Actor, Defer: r.Defer, Face: r.FaceOf()})
		} else {
			st, err = store.Release(ctx, account.ReleaseParams{TenantID: r.TenantID, AdmissionID: r.AdmissionID, IdempotencyKey: r.IdempotencyKey,
				Actor: r.Actor, Defer: r.Defer, Face: r.FaceOf()})
		}
		switch {
		case errors.Is(err, account.ErrDeferred):
			// Its admission was made by another replica on its own, which
			// has not replayed it yet: the store keeps it for that replay.
			rep.Deferred++
		case errors.Is(err, rule.ErrConflict), errors.Is(err, rule.ErrAdmissionNotFound), errors.Is(err, rule.ErrOtherFace):
			// Settled otherwise meanwhile, never existed, or another face's
			// to end: the store's answer stands; the record has nothing
			// left to apply.
			if l.Logger != nil {
				l.Logger.Warn("spooled settle or release not applied", "admission", r.AdmissionID, "tenant", r.TenantID, "error", err.Error())
			}
			rep.Skipped++
		case err != nil:
			return err
		case st.Replayed:
			rep.Skipped++
		default:
			rep.Ended++
		}
		return nil
	}
	return fmt.Errorf("outage: unknown record kind %q", r.Kind)
}
