package account_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// One limit enforced on one tenant, the same limit in shadow on another,
// the same traffic to both on a frozen clock: the shadow tenant is never
// refused, its shadow limit would have refused exactly the requests the
// enforcing tenant was refused, and its state stays what the enforced
// limit's is, request after request.
func TestShadowLimitCountsWhatEnforcingRefuses(t *testing.T) {
	t.Parallel()
	for _, limit := range rule.AllLimits {
		t.Run(string(limit), func(t *testing.T) {
			t.Parallel()
			b, clock := setupFrozen(t)
			l := limits(1_000_000, "1000")
			switch limit {
			case rule.LimitTokens:
				l = limits(200, "5")
			case rule.LimitRequests:
				l.RequestsCapacity, l.RequestsRateMicro = 4, 500_000 // one every 2 s
			case rule.LimitConcurrency:
				l.MaxConcurrent = 3
			case rule.LimitPeriodBudget:
				l.PeriodBudget, l.Period = 700, rule.PeriodDay
			}
			b.tenant(t, "enf", l)
			l.Shadow = l.Shadow.With(limit)
			b.tenant(t, "sha", l)

			type pair struct {
				enf, sha string
				est      estimator.Estimate
			}
			var open []pair
			refused, wouldRefuse := 0, 0
			for i := range 120 {
				cost := int64(10 + (i*37)%90)
				enf, errE := b.reserve(t, "enf", cost)
				sha, errS := b.reserve(t, "sha", cost)
				if errS != nil {
					t.Fatalf("request %d: the shadow tenant was refused: %v", i, errS)
				}
				shadowed := len(sha.Shadow) > 0
				if shadowed {
					wouldRefuse++
					if sha.Shadow[0].Limit != limit || sha.Shadow[0].Level != "sha" {
						t.Fatalf("request %d: shadow refusal %+v", i, sha.Shadow)
					}
				}
				var tooLarge *rule.TooLargeError
				switch {
				case errE == nil:
				case errors.Is(errE, rule.ErrRejected), errors.As(errE, &tooLarge):
					refused++
				default:
					t.Fatal(errE)
				}
				if (errE != nil) != shadowed {
					t.Fatalf("request %d (cost %d): enforcing answered %v, shadow would-refuse %v", i, cost, errE, sha.Shadow)
				}
				p := pair{sha: sha.AdmissionID, est: sha.Estimate}
				if enf != nil {
					p.enf = enf.AdmissionID
				}
				open = append(open, p)
				// End the oldest now and then, with usage below and above the estimate.
				if i%3 == 2 {
					end := open[0]
					open = open[1:]
					in, out := fit(end.est, int64(i%50), int64(i%70))
					if end.enf != "" {
						if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "enf", AdmissionID: end.enf, InputTokens: in, OutputTokens: out}); err != nil {
							t.Fatal(err)
						}
					}
					if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "sha", AdmissionID: end.sha, InputTokens: in, OutputTokens: out}); err != nil {
						t.Fatal(err)
					}
				}
				clock.Advance(time.Duration(200+(i*131)%2000) * time.Millisecond)
				if i%40 == 39 && limit == rule.LimitPeriodBudget {
					clock.Advance(12 * time.Hour) // into the next day now and then
				}
				se, err1 := b.store.TenantSnapshot(ctx, "enf")
				ss, err2 := b.store.TenantSnapshot(ctx, "sha")
				if err1 != nil || err2 != nil {
					t.Fatal(err1, err2)
				}
				// The shadow limit's own state is the enforced one's (the
				// other limits saw the traffic that really ran).
				if got, want := stateOf(ss, limit), stateOf(se, limit); got != want {
					t.Fatalf("request %d: shadow %s state %d, enforced %d", i, limit, got, want)
				}
			}
			if refused == 0 || refused == 120 {
				t.Fatalf("the enforcing tenant refused %d of 120: the traffic does not test the limit", refused)
			}
			if wouldRefuse != refused {
				t.Fatalf("shadow would have refused %d, enforcing refused %d", wouldRefuse, refused)
			}
			var drift int64
			rows, err := b.store.DriftReport(ctx, account.DriftParams{TenantID: "sha", From: time.Time{}, To: clock.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				drift += r.ShadowRefused
			}
			if drift != int64(refused) {
				t.Fatalf("the drift report counts %d shadow refusals, want %d", drift, refused)
			}
			b.verify(t, "enf")
			b.verify(t, "sha")
			t.Logf("%s: %d of 120 refused by the enforced limit and by the shadow one", limit, refused)
		})
	}
}

// stateOf is the part of a snapshot that limit l keeps.
func stateOf(s rule.Snapshot, l rule.Limit) int64 {
	switch l {
	case rule.LimitTokens:
		return s.TokensMicro
	case rule.LimitRequests:
		return s.RequestsMicro
	case rule.LimitConcurrency:
		return s.OpenReservations
	}
	return s.PeriodUsed
}

// Under 200 callers over two replicas, a shadow token bucket refuses
// nothing, and its state holds the enforced bound exactly: what it let
// through came from its capacity and refill, never below zero.
func TestShadowBucketUnderConcurrency(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	l := limits(2000, "0.000001")
	l.Shadow = l.Shadow.With(rule.LimitTokens)
	b.tenant(t, "sha", l)
	var admitted, shadowed, through atomic.Int64
	hammer(stores, func(g int, s *account.Store) {
		for i := range 4 {
			cost := int64(1 + (g*7+i*13)%40)
			r, err := s.Reserve(ctx, reserveFor("sha", cost))
			if err != nil {
				t.Error(err)
				return
			}
			admitted.Add(1)
			if len(r.Shadow) > 0 {
				shadowed.Add(1)
			} else {
				through.Add(cost)
			}
		}
	})
	sum := sums(t, b, "sha")
	tally := b.verify(t, "sha")
	var debited, skipped int64
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(-sum(delta_micro), 0), count(*) FILTER (WHERE delta_micro = 0)
		FROM ledger_entries WHERE tenant_id = 'sha' AND kind = 'reserve'`).Scan(&debited, &skipped); err != nil {
		t.Fatal(err)
	}
	if admitted.Load() != 800 || sum.admitted != 800 || skipped != shadowed.Load() || shadowed.Load() == 0 {
		t.Fatalf("admitted %d (ledger %d), shadow-refused %d (ledger %d)", admitted.Load(), sum.admitted, shadowed.Load(), skipped)
	}
	if debited != through.Load()*rule.Micro || debited != 2000*rule.Micro+sum.refill-tally.BalanceMicro || sum.minReserveBalance < 0 {
		t.Fatalf("the shadow bucket let %d through (ledger %d); capacity + refill - balance = %d; lowest balance %d",
			through.Load(), debited/rule.Micro, 2000+(sum.refill-tally.BalanceMicro)/rule.Micro, sum.minReserveBalance)
	}
}

// Turning a shadow limit into an enforced one is a limits entry that
// records the change, and from then on the limit refuses.
func TestShadowOffIsALimitsEntry(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	l := limits(100, "1")
	l.Shadow = l.Shadow.With(rule.LimitTokens)
	b.tenant(t, "acme", l)
	b.mustReserve(t, "acme", 80)
	if r := b.mustReserve(t, "acme", 80); len(r.Shadow) != 1 {
		t.Fatalf("the shadow limit would have refused: %+v", r.Shadow)
	}
	if _, err := b.store.UpdateLimits(ctx, account.UpdateLimitsParams{TenantID: "acme", Patch: rule.LimitsPatch{Shadow: rule.Unset[rule.LimitSet]()}, Actor: "ops"}); err != nil {
		t.Fatal(err)
	}
	var kind, detail string
	if err := b.pool.QueryRow(ctx, `SELECT kind, detail FROM ledger_entries WHERE tenant_id = 'acme' ORDER BY seq DESC LIMIT 1`).Scan(&kind, &detail); err != nil {
		t.Fatal(err)
	}
	if kind != "limits" || !strings.Contains(detail, `"before":{`) || !strings.Contains(detail, `"shadow":["tokens"]`) || strings.Count(detail, `"shadow"`) != 1 {
		t.Fatalf("last entry %s %s", kind, detail)
	}
	_, err := b.reserve(t, "acme", 80)
	rejected(t, err, rule.LimitTokens)
	var le *rule.LimitError
	concurrency := rule.LimitSet(0).With(rule.LimitConcurrency)
	if _, err := b.store.UpdateLimits(ctx, account.UpdateLimitsParams{TenantID: "acme", Patch: rule.LimitsPatch{Shadow: rule.Set(concurrency)}}); !errors.As(err, &le) || le.Field != "shadow" {
		t.Fatalf("shadow of an unconfigured limit: %v", err)
	}
}
