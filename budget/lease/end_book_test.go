package lease_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
)

// endInJournal ends a leased admission as a journal group will
// (docs/leasing.md, item 5; nothing in the product makes one yet): state
// settled at actual tokens, its refund taken off the lease's use, its end
// placed in the lease's order (lease_end_seq, 00036), in one transaction
// holding the lease row, as a group does.
func (b *testBundle) endInJournal(t *testing.T, leaseID, id string, actual int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var refund int64
	err = tx.QueryRow(ctx, `WITH l AS (SELECT id FROM leases WHERE id = $1 FOR NO KEY UPDATE)
		UPDATE admissions a SET state = 'settled', actual_input = $3, actual_output = 0, actual_cost = $3,
			ended_at = $4, end_delta_micro = 0, lease_end_seq = nextval('admissions_lease_seq')
		FROM l WHERE a.id = $2 AND a.lease_id = l.id AND a.state = 'reserved'
		RETURNING (a.cost - $3) * 1000000`, leaseID, id, actual, b.clock()).Scan(&refund)
	if err != nil {
		t.Fatalf("end %s: %v", id, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE leases SET used_micro = used_micro - $2 WHERE id = $1`, leaseID, refund); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// A lease's booking writes its events in the order they were journaled,
// admissions and the ends its journal made alike, from one cursor: a
// settle entry that moves nothing (the refund went back into the lease)
// and frees the admission's slot, always after its reserve entry and
// before the lease's return, whichever booking meets it (a renew's, an
// exact settle's of a later admission, the return's). The return refunds
// what the lease holds unused, the refunds included, so the balance is the
// capacity less what was used, and the chain verifies.
func TestBookEndsInLeaseOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 200 * tok})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []struct {
		id   string
		cost int64
	}{{"a1", 10}, {"a2", 20}, {"a3", 30}} {
		if err := b.r.journal.Append(ctx, l.ID, adm(a.id, a.cost)); err != nil {
			t.Fatal(err)
		}
	}
	b.endInJournal(t, l.ID, "a2", 5) // refund 15
	if err := b.r.journal.Append(ctx, l.ID, adm("a4", 40)); err != nil {
		t.Fatal(err)
	}
	if pending, err := b.r.acct.LeasePending(ctx, l.ID); err != nil || !pending {
		t.Fatalf("LeasePending: %v, %v; want the events to book", pending, err)
	}
	// An exact settle of a3 books the lease up to a3 first: a1, a2 and a3,
	// not a2's end, which came after a3.
	if _, err := b.r.acct.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: "a3", InputTokens: 30}); err != nil {
		t.Fatal(err)
	}
	b.endInJournal(t, l.ID, "a1", 10) // refund 0, after the booking
	if n, err := b.r.leases.Book(ctx, l.ID); err != nil || n != 3 {
		t.Fatalf("Book booked %d (%v), want a2's end, a4 and a1's end", n, err)
	}
	if pending, err := b.r.acct.LeasePending(ctx, l.ID); err != nil || pending {
		t.Fatalf("LeasePending after the booking: %v, %v", pending, err)
	}
	type ent struct {
		kind, id        string
		delta, estimate int64
		actual          *int64
	}
	rows, err := b.r.pool.Query(ctx, `SELECT kind, admission_id, delta_micro, estimate, actual FROM ledger_entries
		WHERE tenant_id = 'acme' AND kind IN ('reserve', 'settle') ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ent, error) {
		var e ent
		return e, r.Scan(&e.kind, &e.id, &e.delta, &e.estimate, &e.actual)
	})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, e := range got {
		order = append(order, e.kind+" "+e.id)
		if e.kind == "settle" && e.id != "a3" && (e.delta != 0 || e.actual == nil) {
			t.Errorf("the journal's end of %s: delta %d, actual %v; want a settle that moves nothing, with its actual", e.id, e.delta, e.actual)
		}
	}
	want := []string{"reserve a1", "reserve a2", "reserve a3", "settle a3", "settle a2", "reserve a4", "settle a1"}
	if !slices.Equal(order, want) {
		t.Fatalf("entries %v, want %v", order, want)
	}
	// Open at acme: a4 alone (a1 and a2 ended in the journal, a3 settled).
	var open int
	if err := b.r.pool.QueryRow(ctx, "SELECT open_reservations FROM tenants WHERE id = 'acme'").Scan(&open); err != nil || open != 1 {
		t.Fatalf("open reservations %d (%v), want 1", open, err)
	}
	if _, err := b.r.leases.Return(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	// Used: a1 10 and a2 5 (ended in the journal), a3 what its exact
	// settle charged (its refund went to the tenant at once), a4 40.
	var a3 int64
	for _, e := range got {
		if e.kind == "settle" && e.id == "a3" {
			a3 = *e.actual
		}
	}
	if got, want := b.balance(t, "acme"), (1000-10-5-a3-40)*tok; got != want {
		t.Fatalf("balance %d after the return, want %d (a3 used %d)", got, want, a3)
	}
	b.verify(t, "acme")
}
