package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/outage"
	"github.com/tokengate/tokengate/budget/rule"
)

// Settle reconciles an admission (account.Store.Settle), named by id or by
// idempotency key. While the store is down, the settle is journaled for the
// recovery loop as it was stated (its key, cached tokens or refund
// included; outage.Local.Settle) and journaled is true: the accounting is
// kept, the balance is not known yet.
//
// A settle by key that finds no admission while some replica may have
// made it on its own and not replayed it yet (the request's failure policy
// could be local: its model's, p.Family's, else its tenant's, else the
// replica's default) is kept in the store and applied when that admission
// is replayed: account.ErrDeferred, which is an ErrAdmissionNotFound. A
// gateway's stream-end call is never retried, so answering it "not found"
// alone would lose its usage.
//
// Every outcome is counted here, by face: tokengate_settlements_total.
func (a *Admitter) Settle(ctx context.Context, face Face, p account.SettleParams) (st *account.Settlement, journaled bool, err error) {
	if a.tracer != nil {
		var span trace.Span
		ctx, span = a.tracer.Start(ctx, SpanSettle)
		tenantID := p.TenantID
		defer func() {
			endSettleSpan(span, face, tenantID, p.AdmissionID, st, journaled, a.metrics.outcomeOf(ctx, st, journaled, err), err)
		}()
	}
	p.Face = face // only the face that made the admission may end it
	if p.IdempotencyKey != "" && p.Defer == nil {
		p.Defer = a.deferral(p.Family)
	}
	if p.TenantID, err = a.endUserOfAdmission(ctx, p.TenantID, p.AdmissionID); err != nil {
		a.metrics.ended(ctx, face, kindSettle, nil, false, err)
		return nil, false, err
	}
	st, journaled, err = a.end(p.TenantID, p.AdmissionID,
		func() (*account.Settlement, error) {
			if st, ok, err := a.settleLeased(ctx, p); ok {
				a.metrics.settlePath(face, PathLease)
				return st, err
			}
			a.metrics.settlePath(face, PathExact)
			return a.pipeline.Settle(ctx, p)
		},
		func(l *outage.Local) error {
			a.metrics.settlePath(face, PathLocal)
			return l.Settle(p)
		})
	a.metrics.ended(ctx, face, kindSettle, st, journaled, err)
	return st, journaled, err
}

// settleLeased settles p in its lease's journal when this replica made
// the admission from a lease it still holds (Leases.Settle); ok false
// sends it to the pipeline.
func (a *Admitter) settleLeased(ctx context.Context, p account.SettleParams) (*account.Settlement, bool, error) {
	l := a.cfg.Leases
	if l == nil || a.est == nil {
		return nil, false, nil
	}
	return l.Settle(ctx, p, a.est.Table())
}

// Release refunds an admission whose request never ran, like Settle (one
// by key is kept the same way).
func (a *Admitter) Release(ctx context.Context, face Face, p account.ReleaseParams) (st *account.Settlement, journaled bool, err error) {
	if a.tracer != nil {
		var span trace.Span
		ctx, span = a.tracer.Start(ctx, SpanRelease)
		tenantID := p.TenantID
		defer func() {
			endSettleSpan(span, face, tenantID, p.AdmissionID, st, journaled, a.metrics.outcomeOf(ctx, st, journaled, err), err)
		}()
	}
	p.Face = face
	if p.IdempotencyKey != "" && p.Defer == nil {
		p.Defer = a.deferral(p.Family)
	}
	if p.TenantID, err = a.endUserOfAdmission(ctx, p.TenantID, p.AdmissionID); err != nil {
		a.metrics.ended(ctx, face, kindRelease, nil, false, err)
		return nil, false, err
	}
	st, journaled, err = a.end(p.TenantID, p.AdmissionID,
		func() (*account.Settlement, error) { return a.pipeline.Release(ctx, p) },
		func(l *outage.Local) error { return l.Release(p) })
	a.metrics.ended(ctx, face, kindRelease, st, journaled, err)
	return st, journaled, err
}

// notReplayedWindow is how long after its making an unknown local
// admission is answered "not replayed yet" rather than "not found": a
// replica replays within seconds of reaching the store, and a day covers a
// replica down for long, and clocks that disagree.
const notReplayedWindow = 24 * time.Hour

// end decides a settle or release through the store, or, while the store
// is down, journals it. admissionID is "" for one named by idempotency key:
// a key the store does not know is not found, whether or not some replica
// admitted it on its own (only an id tells).
func (a *Admitter) end(tenantID, admissionID string, decide func() (*account.Settlement, error),
	journal func(*outage.Local) error) (*account.Settlement, bool, error) {
	if !a.Down() {
		st, err := decide()
		if err == nil {
			a.remember(st.Snapshot)
			if !st.Replayed {
				a.waiters.wake(tenantID) // a slot or tokens came free
				root := tenantID
				if len(st.Snapshot.Path) > 0 {
					root = st.Snapshot.Path[0]
				}
				a.wakeTree(root)
				if st.Admission != nil && st.Admission.PoolID != "" {
					a.pools.wake(st.Admission.PoolID)
				}
			}
			return st, false, nil
		}
		if errors.Is(err, rule.ErrAdmissionNotFound) {
			// Made by a replica on its own in an outage, and not replayed
			// yet (its replica may be replaying, or still cut off): the
			// caller should retry, not give the admission up as unknown.
			if at, local := rule.LocalAdmissionTime(admissionID); local && time.Since(at).Abs() < notReplayedWindow {
				return nil, false, fmt.Errorf("%w: %s", rule.ErrNotReplayed, admissionID)
			}
		}
		if !errors.Is(err, rule.ErrUnavailable) || errors.Is(err, rule.ErrOutcomeUnknown) {
			return nil, false, err
		}
		a.MarkDown(err)
	}
	if a.cfg.Local == nil {
		return nil, false, rule.ErrUnavailable
	}
	if err := journal(a.cfg.Local); err != nil {
		return nil, false, err
	}
	return nil, true, nil
}
