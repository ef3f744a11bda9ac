package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// Ends in the journal: one that is open is ended in one round trip, its
// refund back in the lease; a second end of it, an end of an admission of
// no lease or past its expiry is not open, and the group that carried it
// is written the careful way, where the admissions beside it commit and
// the lease's use is as if it had not been sent. The booking then writes
// the ends' settle entries after their reserve entries, the return gives
// back the refunds, and the chain verifies.
func TestJournalEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	jt := newJournalTest(t, "acme")
	adm := func(id string, cost int64) Admission {
		return Admission{Admission: account.Admission{ID: id, TenantID: "acme", Estimate: estimator.Estimate{Model: "gpt-4o", Cost: cost}},
			CostMicro: cost * rule.Micro}
	}
	end := func(id string, cost, actual int64) *appendReq {
		e := End{AdmissionID: id, TenantID: "acme", InputTokens: actual, ActualCost: actual, RefundMicro: (cost - actual) * rule.Micro}
		return &appendReq{leaseID: jt.lease.ID, done: make(chan error, 1), end: &e,
			a: Admission{Admission: account.Admission{ID: id, TenantID: "acme"}, CostMicro: -e.RefundMicro}}
	}
	send := func(reqs ...*appendReq) []error { return jt.sendReqs(ctx, reqs...) }
	req := func(a Admission) *appendReq { return &appendReq{leaseID: jt.lease.ID, a: a, done: make(chan error, 1)} }
	used := func() int64 {
		t.Helper()
		var u int64
		if err := jt.pool.QueryRow(ctx, "SELECT used_micro FROM leases WHERE id = $1", jt.lease.ID).Scan(&u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	late := adm("late", 5)
	late.ExpiresAt = time.Now().Add(-time.Minute) // already past its expiry
	if errs := send(req(adm("a1", 10)), req(adm("a2", 20)), req(late)); errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatal(errs)
	}
	once := jt.j.rounds.once.Load()
	if errs := send(end("a1", 10, 4)); errs[0] != nil {
		t.Fatalf("the end of an open admission: %v", errs[0])
	}
	if got := jt.j.rounds.once.Load(); got != once+1 {
		t.Fatalf("the end's group: %d groups in one round trip, want %d", got, once+1)
	}
	if u := used(); u != 29*rule.Micro {
		t.Fatalf("used %d after a1's end, want 29 tokens (35 less a1's refund of 6)", u)
	}
	stopped := jt.j.rounds.stopped.Load()
	errs := send(end("a1", 10, 4), req(adm("a3", 7)), end("nowhere", 10, 1), end("late", 5, 1), end("a2", 20, 20))
	switch {
	case !errors.Is(errs[0], ErrNotOpen), !errors.Is(errs[2], ErrNotOpen), !errors.Is(errs[3], ErrNotOpen):
		t.Fatalf("ends of no open admission: %v", errs)
	case errs[1] != nil || errs[4] != nil:
		t.Fatalf("the admission and the open end beside them: %v", errs)
	case jt.j.rounds.stopped.Load() != stopped+1:
		t.Fatalf("the group with ends not open was not stopped and written the careful way")
	}
	if u := used(); u != 36*rule.Micro {
		t.Fatalf("used %d, want 36 tokens (a1 4, a2 20, late 5, a3 7)", u)
	}
	var state string
	var seq *int64
	if err := jt.pool.QueryRow(ctx, "SELECT state, lease_end_seq FROM admissions WHERE id = 'late'").Scan(&state, &seq); err != nil || state != "reserved" || seq != nil {
		t.Fatalf("the admission past its expiry: %s, end seq %v (%v); want it reserved, for the sweeper", state, seq, err)
	}
	if n, err := jt.j.s.Book(ctx, jt.lease.ID); err != nil || n != 6 {
		t.Fatalf("Book: %d, %v; want 4 admissions and 2 ends", n, err)
	}
	rows, err := jt.pool.Query(ctx, `SELECT kind || ' ' || admission_id FROM ledger_entries
		WHERE tenant_id = 'acme' AND kind IN ('reserve', 'settle') ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"reserve a1", "reserve a2", "reserve late", "settle a1", "reserve a3", "settle a2"}
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entries %v, want %v", got, want)
		}
	}
	if _, err := jt.j.s.Return(ctx, jt.lease.ID); err != nil {
		t.Fatal(err)
	}
	// The take debited 500; the return gives back 500 - 36.
	if _, err := ledger.Verify(ctx, jt.pool, "acme"); err != nil {
		t.Fatal(err)
	}
	// The tenant refills a token a second on the real clock: what it
	// refilled meanwhile is in its entries.
	var balance, refilled int64
	if err := jt.pool.QueryRow(ctx, `SELECT (SELECT tokens_micro FROM tenants WHERE id = 'acme'),
		(SELECT sum(refill_micro) FROM ledger_entries WHERE tenant_id = 'acme')`).Scan(&balance, &refilled); err != nil {
		t.Fatal(err)
	}
	if want := (1000-36)*rule.Micro + refilled; balance != want {
		t.Fatalf("balance %d, want %d: 964 tokens and the %d refilled", balance, want, refilled)
	}
}

// Journal.End refuses what it cannot journal before any group sees it.
func TestJournalEndRefusesANegativeRefund(t *testing.T) {
	t.Parallel()
	j := &Journal{}
	if err := j.End(context.Background(), "L", End{AdmissionID: "a", RefundMicro: -1}); err == nil {
		t.Fatal("an end charging the lease more was accepted")
	}
}
