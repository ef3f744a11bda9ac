package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
)

// groupsLease is a groups-shape replica "g0" holding a lease of want
// tokens of tenant "acme", whose capacity is capacity tokens.
func (b *testBundle) groupsLease(t *testing.T, capacity, want int64) (*replica, lease.Lease) {
	t.Helper()
	g := b.groupsReplica(t, "g0")
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: capacity, TokensRateMicro: 1})
	l, err := g.leases.Take(context.Background(), lease.TakeParams{TenantID: "acme", WantMicro: want * tok})
	if err != nil {
		t.Fatal(err)
	}
	return g, l
}

// groupsReplica starts a replica whose journal writes the groups shape
// (lease.Config.JournalGroups).
func (b *testBundle) groupsReplica(t *testing.T, name string) *replica {
	t.Helper()
	return b.replicaWith(t, name, 8, func(c *lease.Config) { c.JournalGroups = true })
}

// bookedEntry is a ledger entry as the shapes are compared: everything
// but the admission's id, which each journal gives.
type bookedEntry struct {
	kind, model, actor, reason string
	delta, balance             int64
	estimate, actual           *int64
}

func (b *testBundle) bookedEntries(t *testing.T, tenant string) ([]bookedEntry, []string) {
	t.Helper()
	rows, err := b.r.pool.Query(context.Background(), `SELECT kind, coalesce(model, ''), actor, coalesce(reason, ''), delta_micro,
		balance_micro, estimate, actual, coalesce(admission_id, '') FROM ledger_entries WHERE tenant_id = $1 ORDER BY seq`, tenant)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	es, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (bookedEntry, error) {
		var e bookedEntry
		var id string
		err := r.Scan(&e.kind, &e.model, &e.actor, &e.reason, &e.delta, &e.balance, &e.estimate, &e.actual, &id)
		ids = append(ids, id)
		return e, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return es, ids
}

// The same lease's life (admissions, some keyed, ends in the journal, an
// end of one already ended, bookings between, the return) on a replica
// whose journal writes rows and on one whose journal writes groups gives
// the same ledger, entry for entry, and the same balance: the groups
// shape is a way of storing the journal, not a change of what is booked.
// The groups shape writes no admissions row, one group row (and its state
// row) per group, and marks the ends in the state rows.
func TestGroupsShapeBooksAsRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	g := b.groupsReplica(t, "g0")
	for _, id := range []string{"rows", "grp"} {
		b.tenant(t, id, "", rule.Limits{TokensCapacity: 10_000, TokensRateMicro: 1})
	}
	// What each exact-path step answered, in order, in each shape.
	outcomes := map[string][]string{}
	note := func(tenant, step string, err error) {
		outcomes[tenant] = append(outcomes[tenant], fmt.Sprintf("%s: %v", step, err))
	}
	life := func(r *replica, tenant string) {
		l, err := r.leases.Take(ctx, lease.TakeParams{TenantID: tenant, WantMicro: 2000 * tok})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		add := func(n int, cost int64) {
			a := adm(rule.NewStoreAdmissionID(b.clock()), cost)
			a.TenantID, a.Grouped, a.Actor = tenant, true, "key:k1"
			if n%2 == 0 {
				a.IdempotencyKey, a.RequestHash = fmt.Sprintf("k%d", n), []byte("h")
			}
			id, err := r.journal.AppendID(ctx, l.ID, a)
			if err != nil {
				t.Fatalf("%s: admission %d: %v", tenant, n, err)
			}
			ids = append(ids, id)
		}
		end := func(n int, cost, actual int64) error {
			return r.journal.End(ctx, l.ID, lease.End{AdmissionID: ids[n], TenantID: tenant,
				InputTokens: actual, ActualCost: actual, RefundMicro: (cost - actual) * tok})
		}
		for n := range 6 {
			add(n, int64(10*(n+1)))
		}
		for _, e := range []struct{ n, cost, actual int64 }{{1, 20, 5}, {3, 40, 40}} {
			if err := end(int(e.n), e.cost, e.actual); err != nil {
				t.Fatalf("%s: end %d: %v", tenant, e.n, err)
			}
		}
		if n, err := r.leases.Book(ctx, l.ID); err != nil || n != 8 {
			t.Fatalf("%s: the first booking booked %d events (%v), want 6 admissions and 2 ends", tenant, n, err)
		}
		if pending, err := r.acct.LeasePending(ctx, l.ID); err != nil || pending {
			t.Fatalf("%s: pending after the booking: %v, %v", tenant, pending, err)
		}
		// The exact path: a settle past the estimate (by id), a release
		// (by key), a settle of one the journal ended, then the journal's
		// end of the one settled exactly.
		_, err = r.acct.Settle(ctx, account.SettleParams{TenantID: tenant, AdmissionID: ids[4], InputTokens: 70})
		note(tenant, "settle past the estimate", err)
		_, err = r.acct.Release(ctx, account.ReleaseParams{TenantID: tenant, IdempotencyKey: "k2"})
		note(tenant, "release by key", err)
		_, err = r.acct.Settle(ctx, account.SettleParams{TenantID: tenant, AdmissionID: ids[3], InputTokens: 40})
		note(tenant, "settle of one ended in the journal", err)
		note(tenant, "journal's end of one settled exactly", end(4, 50, 50))
		got, err := r.acct.AdmissionGet(ctx, tenant, ids[1])
		note(tenant, "read of one ended in the journal", err)
		if err == nil {
			note(tenant, fmt.Sprintf("it reads %s %d/%v", got.State, got.Estimate.Cost, deref(got.ActualCost)), nil)
		}
		// The readers of many admissions: the drift report, the latest
		// admissions (the same instant: compared as a sorted multiset), an
		// admission's lease.
		rep, err := r.acct.DriftReport(ctx, account.DriftParams{TenantID: tenant, From: b.clock().Add(-time.Hour), To: b.clock().Add(time.Hour)})
		for i := range rep {
			rep[i].TenantID = ""
		}
		note(tenant, fmt.Sprintf("drift %+v", rep), err)
		recent, err := r.acct.AdmissionRecent(ctx, tenant, 50)
		var seen []string
		for _, a := range recent {
			seen = append(seen, fmt.Sprintf("%s %d/%v %v", a.State, a.Estimate.Cost, deref(a.ActualCost), deref(a.EndDeltaMicro)))
		}
		slices.Sort(seen)
		note(tenant, fmt.Sprintf("latest %q", seen), err)
		lid, err := r.acct.AdmissionLease(ctx, ids[1])
		note(tenant, fmt.Sprintf("lease of one ended in the journal named: %v", lid == l.ID), err)
		for n := 6; n < 9; n++ {
			add(n, 7)
		}
		if err := end(0, 10, 10); err != nil {
			t.Fatal(err)
		}
		if err := end(1, 20, 5); !errors.Is(err, lease.ErrNotOpen) {
			t.Fatalf("%s: a second end of one admission: %v, want ErrNotOpen", tenant, err)
		}
		if pending, err := r.acct.LeasePending(ctx, l.ID); err != nil || !pending {
			t.Fatalf("%s: pending before the second booking: %v, %v", tenant, pending, err)
		}
		if n, err := r.leases.Book(ctx, l.ID); err != nil || n != 4 {
			t.Fatalf("%s: the second booking booked %d events (%v), want 3 admissions and an end", tenant, n, err)
		}
		if _, err := r.leases.Return(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
		// The sweeper expires what is still open (5, 6, 7 and 8) once
		// their reservation TTL has passed.
		b.advance(rule.DefaultReservationTTL + time.Minute)
		n, err := r.acct.SweepOnce(ctx, nil)
		note(tenant, fmt.Sprintf("sweep expired %d", n), err)
		b.advance(-rule.DefaultReservationTTL - time.Minute)
	}
	life(b.r, "rows")
	life(g, "grp")
	if fmt.Sprint(outcomes["rows"]) != fmt.Sprint(outcomes["grp"]) {
		t.Fatalf("the exact path answered\n%q in the rows shape,\n%q in the groups shape", outcomes["rows"], outcomes["grp"])
	}
	rowsLedger, _ := b.bookedEntries(t, "rows")
	grpLedger, grpIDs := b.bookedEntries(t, "grp")
	if len(rowsLedger) != len(grpLedger) {
		t.Fatalf("%d entries in the groups shape, %d in the rows shape", len(grpLedger), len(rowsLedger))
	}
	for i := range rowsLedger {
		r, g := rowsLedger[i], grpLedger[i]
		if fmt.Sprint(r.kind, r.model, r.actor, r.reason, r.delta, r.balance, deref(r.estimate), deref(r.actual)) !=
			fmt.Sprint(g.kind, g.model, g.actor, g.reason, g.delta, g.balance, deref(g.estimate), deref(g.actual)) {
			t.Fatalf("entry %d: rows shape %+v, groups shape %+v", i, r, g)
		}
	}
	if got, want := b.balance(t, "grp"), b.balance(t, "rows"); got != want {
		t.Fatalf("balance %d in the groups shape, %d in the rows shape", got, want)
	}
	b.verify(t, "grp")
	var admissionRows, groups, states, ended int
	if err := b.r.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM admissions WHERE tenant_id = 'grp'),
		(SELECT count(*) FROM lease_groups WHERE replica = 'g0'),
		(SELECT count(*) FROM lease_group_states s JOIN lease_groups g USING (seq) WHERE g.replica = 'g0'),
		(SELECT coalesce(sum(cardinality(s.ended)), 0) FROM lease_group_states s JOIN lease_groups g USING (seq) WHERE g.replica = 'g0')`).
		Scan(&admissionRows, &groups, &states, &ended); err != nil {
		t.Fatal(err)
	}
	// Nine admissions, each its own group (one append at a time), and
	// three ends, each its own group too. Copied into admissions: the
	// three the exact path named (4, 2 and 3; 1 was only read), and the
	// four the sweeper expired (5 to 8); ended: three in the journal, two
	// by the exact path, four by the sweeper.
	if admissionRows != 6 || groups != 12 || states != 9 || ended != 9 {
		t.Fatalf("groups shape: %d admissions rows, %d groups, %d state rows, %d ended; want 7, 12, 9, 9",
			admissionRows, groups, states, ended)
	}
	// Every admission's id names its group, where its row holds it.
	for _, id := range grpIDs {
		if !strings.HasPrefix(id, "adm_") {
			continue // the lease's own entries
		}
		grp, ok := rule.AdmissionGroupOf(id)
		if !ok {
			t.Fatalf("%s names no group", id)
		}
		var n int
		if err := b.r.pool.QueryRow(ctx, `SELECT count(*) FROM lease_groups WHERE holder = $1 AND count = $2 AND $3 = ANY (ids)`,
			int64(grp.Holder), int64(grp.Count), id).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%s (%+v): in %d group rows (%v), want 1", id, grp, n, err)
		}
	}
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// Eight goroutines admit from one lease of a groups-shape journal and end
// half of what they admit in the journal, while another books the lease
// again and again: every admission is booked once (one reserve entry,
// with its estimate), every end once (a settle entry with its actual,
// after the admission's reserve), and the return leaves the balance at the
// capacity less exactly what was used; the chain verifies.
func TestGroupsShapeConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	g, l := b.groupsLease(t, 100_000, 50_000)
	const workers, each = 8, 50
	var mu sync.Mutex
	costs := map[string]int64{}
	used := int64(0)
	ended := 0
	var wg sync.WaitGroup
	stop := make(chan struct{})
	booked := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				booked <- nil
				return
			default:
			}
			if _, err := g.leases.Book(ctx, l.ID); err != nil {
				booked <- err
				return
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				cost := int64(1 + (w+i)%5)
				a := adm(rule.NewStoreAdmissionID(b.clock()), cost)
				a.TenantID = "acme"
				if i%3 == 0 {
					a.IdempotencyKey, a.RequestHash = fmt.Sprintf("k-%d-%d", w, i), []byte("h")
				}
				id, err := g.journal.AppendID(ctx, l.ID, a)
				if err != nil {
					t.Error(err)
					return
				}
				u := cost
				if i%2 == 0 {
					u = cost - 1
					if err := g.journal.End(ctx, l.ID, lease.End{AdmissionID: id, TenantID: "acme", InputTokens: u,
						ActualCost: u, RefundMicro: tok}); err != nil {
						grp, _ := rule.AdmissionGroupOf(id)
						var dump string
						_ = g.pool.QueryRow(ctx, `SELECT string_agg(format('%s %s %s %s %s', g.seq, g.ids, s.ended, g.expires_at, g.lease_ids), E'\n') FROM lease_groups g LEFT JOIN lease_group_states s USING (seq) WHERE holder = $1 AND count = $2`, int64(grp.Holder), int64(grp.Count)).Scan(&dump)
						t.Errorf("%s %+v: %v\n%s", id, grp, err, dump)
						return
					}
				}
				mu.Lock()
				costs[id], used = cost, used+u
				if i%2 == 0 {
					ended++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	if err := <-booked; err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		return
	}
	if _, err := g.leases.Return(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	es, ids := b.bookedEntries(t, "acme")
	reserved, settled := map[string]int{}, map[string]int{}
	for i, e := range es {
		switch e.kind {
		case "reserve":
			if reserved[ids[i]]++; e.estimate == nil || *e.estimate != costs[ids[i]] || e.delta != 0 {
				t.Fatalf("reserve entry of %s: %+v, want estimate %d moving nothing", ids[i], e, costs[ids[i]])
			}
		case "settle":
			if reserved[ids[i]] != 1 || e.actual == nil || *e.actual != costs[ids[i]]-1 {
				for k := range es {
					if ids[k] == ids[i] {
						t.Logf("%d %s %+v", k, ids[k], es[k])
					}
				}
				var dump string
				_ = g.pool.QueryRow(ctx, `SELECT string_agg(format('%s %s %s %s', g.seq, g.ids, s.ended, g.end_ids), E'\n' ORDER BY seq) FROM lease_groups g LEFT JOIN lease_group_states s USING (seq) WHERE $1 = ANY(g.ids) OR $1 = ANY(g.end_ids)`, ids[i]).Scan(&dump)
				t.Log(dump)
				t.Fatalf("settle entry of %s: %+v, after %d reserves; want its actual %d after its reserve", ids[i], e, reserved[ids[i]], costs[ids[i]]-1)
			}
			settled[ids[i]]++
		}
	}
	if len(reserved) != workers*each || len(settled) != ended {
		t.Fatalf("%d admissions and %d ends booked, want %d and %d", len(reserved), len(settled), workers*each, ended)
	}
	for id, n := range reserved {
		if n != 1 || costs[id] == 0 || settled[id] > 1 {
			t.Fatalf("%s: %d reserves, %d settles", id, n, settled[id])
		}
	}
	if got, want := b.balance(t, "acme"), (100_000-used)*tok; got != want {
		t.Fatalf("balance %d, want %d (used %d)", got, want, used)
	}
	b.verify(t, "acme")
}

// admission_group (00039) reads in SQL what rule.AdmissionGroupOf reads in
// Go, for grouped ids at every width's edge, and nothing of a local id, an
// id of the store's own (grouped mark clear) or anything else.
func TestAdmissionGroupInSQL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock()
	ids := []string{rule.NewLocalAdmissionID(now), "adm_x", "lse_0123456789abcdefghjkmnpqrs", "adm_0123456789abcdefghjkmnpqrU"}
	for _, g := range []rule.AdmissionGroup{{Holder: 1, Count: 1}, {Holder: rule.MaxGroupHolder, Count: rule.MaxGroupCount, Place: rule.MaxGroupPlace},
		{Holder: 1 << 39, Count: 1 << 27, Place: 1 << 9}, {Holder: 0x1234567890, Count: 0x0abcdef, Place: 0x155}} {
		id, ok := rule.GroupedAdmissionID(rule.NewStoreAdmissionID(now), g)
		if !ok {
			t.Fatalf("%+v: no id", g)
		}
		ids = append(ids, id)
	}
	for range 200 {
		ids = append(ids, rule.NewStoreAdmissionID(now)) // half of them grouped by chance
	}
	for _, id := range ids {
		var holder, count, place *int64
		if err := b.r.pool.QueryRow(ctx, "SELECT holder, count, place FROM admission_group($1)", id).Scan(&holder, &count, &place); err != nil {
			t.Fatal(err)
		}
		want, ok := rule.AdmissionGroupOf(id)
		switch {
		case !ok && (holder != nil || count != nil || place != nil):
			t.Fatalf("%s: SQL reads group %v/%v/%v, Go none", id, deref(holder), deref(count), deref(place))
		case ok && (holder == nil || uint64(*holder) != want.Holder || uint32(*count) != want.Count || int(*place) != want.Place):
			t.Fatalf("%s: SQL reads group %v/%v/%v, Go %+v", id, deref(holder), deref(count), deref(place), want)
		}
	}
}

// An admission whose id is no admission id cannot be grouped, and no
// reader could find it by its id: the groups shape refuses it
// (lease.ErrNotGrouped) without journaling it or keeping its cost, and the
// lease goes on admitting. Returned, the lease gives back all but the
// admission journaled, and the chain verifies.
func TestGroupsShapeRefusesAnIDItCannotGroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	g, l := b.groupsLease(t, 1000, 100)
	odd := adm("not-an-id", 40)
	odd.TenantID = "acme"
	if _, err := g.journal.AppendID(ctx, l.ID, odd); !errors.Is(err, lease.ErrNotGrouped) {
		t.Fatalf("an id that is no admission id journaled: %v, want ErrNotGrouped", err)
	}
	good := adm(rule.NewStoreAdmissionID(b.clock()), 7)
	good.TenantID = "acme"
	id, err := g.journal.AppendID(ctx, l.ID, good)
	if err != nil {
		t.Fatal(err)
	}
	var groups, journaled int
	if err := g.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(cardinality(ids)), 0) FROM lease_groups`).Scan(&groups, &journaled); err != nil {
		t.Fatal(err)
	}
	if groups != 1 || journaled != 1 {
		t.Fatalf("%d group rows with %d admissions, want the good one's alone", groups, journaled)
	}
	if _, err := g.leases.Return(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	_, ids := b.bookedEntries(t, "acme")
	if !slices.Contains(ids, id) || slices.Contains(ids, "not-an-id") {
		t.Fatalf("booked %v, want %s and not the refused one", ids, id)
	}
	if got, want := b.balance(t, "acme"), int64(1000-7)*tok; got != want {
		t.Fatalf("balance %d, want %d: the refused admission's cost was kept", got, want)
	}
	b.verify(t, "acme")
}

// The exact path books a lease up to an admission it ends, from the group
// rows, before the lease's Book reads the groups its journal recorded
// (hints.go): that Book books the events above the cursor only, every
// admission gets one reserve entry, in order, and the chain verifies.
func TestGroupsShapeBookAfterTheExactPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	g, l := b.groupsLease(t, 1000, 500)
	var ids []string
	for n := range 4 {
		a := adm(rule.NewStoreAdmissionID(b.clock()), int64(10*(n+1)))
		a.TenantID = "acme"
		id, err := g.journal.AppendID(ctx, l.ID, a)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	st, err := g.acct.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: ids[1], InputTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	if st.DeltaMicro <= 0 {
		t.Fatalf("the settle refunded %d, want a refund", st.DeltaMicro)
	}
	if n, err := g.leases.Book(ctx, l.ID); err != nil || n != 2 {
		t.Fatalf("the booking after the exact path's booked %d (%v), want the 2 admissions after the one settled", n, err)
	}
	if n, err := g.leases.Book(ctx, l.ID); err != nil || n != 0 {
		t.Fatalf("a second booking booked %d (%v), want none", n, err)
	}
	es, booked := b.bookedEntries(t, "acme")
	var reserved []string
	for i, e := range es {
		if e.kind == "reserve" {
			reserved = append(reserved, booked[i])
		}
	}
	if !slices.Equal(reserved, ids) {
		t.Fatalf("reserve entries of %v, want each of %v once, in order", reserved, ids)
	}
	if _, err := g.leases.Return(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if got, want := b.balance(t, "acme"), int64(1000-10-20-30-40)*tok+st.DeltaMicro; got != want {
		t.Fatalf("balance %d, want %d: the four costs less the settle's refund", got, want)
	}
	b.verify(t, "acme")
}
