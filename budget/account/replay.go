package account

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/admission_exists.sql
	admissionExistsSQL string
	//go:embed sql/idempotency_put_replay.sql
	idempotencyPutReplaySQL string
)

// ReplayReserveParams is an admission a replica made on its own while the
// store was unreachable (the local failure policy).
type ReplayReserveParams struct {
	AdmissionID string
	TenantID    string
	Estimate    estimator.Estimate
	CreatedAt   time.Time // the replica's clock when it admitted
	ExpiresAt   time.Time
	// ReplicaClock is the replica's clock (the one CreatedAt was read
	// from). The replica's clock may be off the database's (skew), so the
	// admission's times are moved by the difference between the two clocks:
	// an admission whose replica ran an hour fast must not hold its
	// reservation, and its concurrency slot, for an hour more than its TTL,
	// nor one whose replica ran slow expire before the client could settle
	// it. The replay reads it once the store has read its own clock (under
	// the tenant locks, in the same round trip), so that the two readings
	// differ by the skew and at most that round trip's way back: a reading
	// taken when the replay was sent would also count as skew the time the
	// replay then waited (for a connection while the store comes back, for
	// the tenant locks, between retries), and move the admission that much
	// later. Nil moves nothing.
	ReplicaClock func() time.Time
	Replica      string
	// IdempotencyKey, RequestHash and Response (EncodeReservation of the
	// admission as answered) are set when the admission had a key: the
	// replay writes the key with the admission, so a retry after the outage
	// gets the original admission instead of a second debit.
	IdempotencyKey string
	RequestHash    []byte
	Response       []byte
	// Face is the face the admission came through ("" is FaceAPI): the
	// admission remembers it, and IdempotencyKey is in its namespace
	// (ReserveParams.Face).
	Face rule.Face
}

// ReplayReserve writes a local admission into the store: the admission row
// and a reserve entry debiting its estimate, under the tenant lock like any
// decision. The caller already admitted it, so no limit is checked: the
// balance may go negative (down to the debt floor, minus one capacity, where
// the debit stops), and refill pays the debt back. It is idempotent
// by admission id, so a replay interrupted by a crash can run again from
// the start without debiting twice. It reports whether it wrote anything.
//
// A settle or release by p.IdempotencyKey that reached the store before
// this replay, and was kept for it (ErrDeferred), ends the admission in the
// same transaction, with its own actor, and is deleted with it: whichever
// replica's spool the admission comes from, and however often it is
// replayed, the kept settle is applied once.
func (s *Store) ReplayReserve(ctx context.Context, p ReplayReserveParams) (bool, error) {
	if p.IdempotencyKey != "" {
		if problem := rule.IdempotencyKeyProblem(p.IdempotencyKey); problem != "" {
			return false, fmt.Errorf("budget: replay %s: %w", p.AdmissionID, &rule.InvalidError{Field: "Idempotency-Key", Reason: problem})
		}
	}
	p.IdempotencyKey = p.Face.StoredKey(p.IdempotencyKey)
	var wrote bool
	err := retry(ctx, func() error {
		var exists int
		var kept []*deferredEnd
		var replicaNow time.Time // the replica's clock when the store's answered (ReplicaClock)
		tx, ts, now, err := s.lockTenants(ctx, []string{p.TenantID},
			func(b *pgx.Batch) {
				b.Queue(admissionExistsSQL, p.AdmissionID)
				if p.IdempotencyKey != "" {
					b.Queue(deferredSettleGetSQL, p.TenantID, p.IdempotencyKey, s.clock())
				}
			},
			func(br pgx.BatchResults) error {
				// Called as soon as the store's clock is read: the
				// replica's, read now, is its pair.
				if p.ReplicaClock != nil {
					replicaNow = p.ReplicaClock()
				}
				if err := br.QueryRow().Scan(&exists); err != nil || p.IdempotencyKey == "" {
					return err
				}
				var err error
				kept, err = scanDeferred(br, p.TenantID, p.IdempotencyKey)
				return err
			})
		if err != nil {
			return err
		}
		t, ok := ts[p.TenantID]
		if !ok {
			tx.abort()
			return rule.ErrTenantNotFound
		}
		chain, err := chainOf(ts, t)
		if err != nil || exists > 0 {
			tx.abort()
			wrote = false
			return err
		}
		created, expires := replayTimes(p, now, replicaNow)
		cost := p.Estimate.Cost
		w := &writes{}
		// Priced as the store would have priced it when it was made: the
		// price in effect at its (database) creation time. A model without
		// a price is counted in tokens only: the admission was made and
		// served, and refusing its replay would lose it from the ledger.
		book, err := s.priceBookFor(ctx, tx)
		if err != nil {
			tx.abort()
			return err
		}
		pricer := &decision{chain: chain, now: created, prices: book}
		money, price, _ := pricer.moneyOf(p.Estimate)
		a := &Admission{ID: p.AdmissionID, TenantID: p.TenantID, State: StateReserved,
			Estimate: p.Estimate, CreatedAt: created, ExpiresAt: expires, Face: p.Face.Or()}
		a.priced(price, money)
		for _, lv := range chain { // every level, as a decision of the store would
			lv.advance(now)
			applied, err := lv.DebitExcept(rule.Amount{Cost: cost, Money: money}, 0)
			if err != nil {
				tx.abort()
				return err
			}
			if full := cost * rule.Micro; lv == t && -applied != full { // cost*Micro: DebitExcept checked it fits
				// Stopped at the debt floor: its end refunds no more than
				// this (TenantState.EndDebited).
				debited := -applied
				a.DebitedMicro = &debited
			}
			e := lv.entry(ledger.KindReserve, now, "replica:"+p.Replica)
			e.AdmissionID, e.Model = p.AdmissionID, p.Estimate.Model
			e.Estimate = &cost
			e.MoneyMicro = a.MoneyEstimate
			e.DeltaMicro = applied
			e.Reason = "admitted locally during a store outage at " + p.CreatedAt.UTC().Format(time.RFC3339Nano)
			lv.seal(e)
			w.entry(lv, e)
		}
		w.inserted = append(w.inserted, a)
		if p.IdempotencyKey != "" {
			// In the same transaction: the admission and its key land
			// together or not at all. (A live key of the same request,
			// decided by the store before the outage, is kept.)
			w.after = append(w.after, write{sql: idempotencyPutReplaySQL, expect: -1,
				args: []any{p.TenantID, p.IdempotencyKey, p.AdmissionID, p.RequestHash, p.Response, created}})
		}
		if len(kept) > 0 {
			// Its settle (or release) came first and was kept: it ends the
			// admission in this transaction, after its reserve.
			d := &decision{t: t, chain: chain, now: now, w: w, adms: map[string]*Admission{}, table: s.modelTable(), prices: book}
			if err := d.applyDeferred(a, kept); err != nil {
				tx.abort()
				return err
			}
		}
		if err := tx.commit(ctx, w); err != nil {
			return err
		}
		wrote = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("budget: replay %s: %w", p.AdmissionID, err)
	}
	return wrote, nil
}

// replayTimes moves a local admission's times from the replica's clock to
// the database's by the skew between the two, now - replicaNow (readings
// taken together: ReplayReserveParams.ReplicaClock), and caps its expiry at
// one TTL after now: whatever the replica's clock said, a reservation is
// never held longer than its TTL from the moment the store learns of it.
// A zero replicaNow (no ReplicaClock) moves nothing.
func replayTimes(p ReplayReserveParams, now, replicaNow time.Time) (created, expires time.Time) {
	created, expires = p.CreatedAt, p.ExpiresAt
	if !replicaNow.IsZero() {
		skew := now.Sub(replicaNow)
		created, expires = created.Add(skew), expires.Add(skew)
	}
	ttl := p.ExpiresAt.Sub(p.CreatedAt)
	if latest := now.Add(ttl); expires.After(latest) {
		expires = latest
	}
	if created.After(now) {
		created = now
	}
	return created, expires
}
