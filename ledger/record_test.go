package ledger_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

// history is a ledger written through QueueInsert, transaction by
// transaction, and the entries as sealed.
type history struct {
	heads   map[string]ledger.Head
	balance map[string]int64
	all     []ledger.Entry
}

// add seals an entry of tenant onto its chain: refill and delta move its
// balance; lease marks it as a lease's booking wrote it.
func (h *history) add(tenant string, kind ledger.Kind, at time.Time, adm, lease string, refill, delta int64, money *int64) *ledger.Entry {
	h.balance[tenant] += refill + delta
	est := int64(len(h.all) + 1)
	e := &ledger.Entry{TenantID: tenant, Kind: kind, CreatedAt: at, AdmissionID: adm, Model: "m", Estimate: &est,
		RefillMicro: refill, DeltaMicro: delta, BalanceMicro: h.balance[tenant], Actor: "lease", Reason: "r " + adm,
		Detail: fmt.Sprintf(`{"n":%d}`, len(h.all)), MoneyMicro: money, Lease: lease}
	if kind == ledger.KindSettle {
		act := est - 1
		e.Actual = &act
	}
	h.heads[tenant] = h.heads[tenant].Seal(e)
	return e
}

// write inserts entries in one transaction, as a decision or a booking
// does, and keeps them (their Lease dropped: storage, not read back).
func (h *history) write(t *testing.T, pool pgx.Tx, entries ...*ledger.Entry) {
	t.Helper()
	b := &pgx.Batch{}
	ledger.QueueInsert(b, entries...)
	if err := pool.SendBatch(context.Background(), b).Close(); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		c := *e
		c.Lease = ""
		h.all = append(h.all, c)
	}
}

// TestRecordsHoldALeaseBookingAsRows: a booking's entries are stored as
// one row per run (a tenant's consecutive entries of one lease that agree
// on what the row holds once), and every reader sees every entry as before:
// the list verify reads, keyset pages both ways with cursors inside a
// record, an admission's entries through its lease, SQL's canonical hash,
// the money a window sums.
func TestRecordsHoldALeaseBookingAsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := &history{heads: map[string]ledger.Head{}, balance: map[string]int64{}}
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	money := func(n int64) *int64 { return &n }

	// Plain entries: a take at each level (it moves the balance).
	h.write(t, tx, h.add("c", ledger.KindAdjust, t0, "", "", 0, 1000, nil), h.add("p", ledger.KindAdjust, t0, "", "", 0, 1000, nil),
		h.add("c", ledger.KindLeaseTake, t0, "L1", "", 0, -100, nil), h.add("p", ledger.KindLeaseTake, t0, "L1", "", 0, -100, nil))

	// A booking of lease L1 at two levels, as LeasedMoves orders it (an
	// admission at every level, then the next): the first entry of each
	// level carries the refill, the rest share its balance.
	t1 := t0.Add(time.Second)
	var b []*ledger.Entry
	for i := range 7 {
		refill := int64(0)
		if i == 0 {
			refill = 3
		}
		adm := fmt.Sprintf("adm-%d", i)
		b = append(b, h.add("c", ledger.KindReserve, t1, adm, "L1", refill, 0, money(int64(10+i))),
			h.add("p", ledger.KindReserve, t1, adm, "L1", refill, 0, money(int64(10+i))))
	}
	b = append(b, h.add("c", ledger.KindSettle, t1, "adm-2", "L1", 0, 0, money(-4)), h.add("p", ledger.KindSettle, t1, "adm-2", "L1", 0, 0, money(-4)))
	// An entry of no lease breaks c's run; two more of L1 make a record of
	// their own (its balance moved); one of L2 is a row of its own.
	b = append(b, h.add("c", ledger.KindAdjust, t1, "", "", 0, 5, nil),
		h.add("c", ledger.KindReserve, t1, "adm-7", "L1", 0, 0, nil), h.add("c", ledger.KindReserve, t1, "adm-8", "L1", 0, 0, nil),
		h.add("c", ledger.KindReserve, t1, "adm-9", "L2", 0, 0, nil))
	h.write(t, tx, b...)
	// A later booking of L1: a record of its own, after.
	t2 := t1.Add(time.Second)
	h.write(t, tx, h.add("c", ledger.KindSettle, t2, "adm-0", "L1", 1, 0, nil), h.add("c", ledger.KindSettle, t2, "adm-1", "L1", 0, 0, nil))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	var rows, entries int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger_rows), (SELECT count(*) FROM ledger_entries)`).Scan(&rows, &entries); err != nil {
		t.Fatal(err)
	}
	// 4 plain; c: L1's 8, the adjust, L1's 2, L2's 1; p: L1's 8; c's last 2.
	if rows != 4+4+1+1 || entries != len(h.all) {
		t.Fatalf("%d rows hold %d entries, want 10 holding %d", rows, entries, len(h.all))
	}

	of := func(tenant string) []ledger.Entry {
		var out []ledger.Entry
		for _, e := range h.all {
			if e.TenantID == tenant {
				out = append(out, e)
			}
		}
		return out
	}
	same := func(what string, got, want []ledger.Entry) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d entries, want %d", what, len(got), len(want))
		}
		for i := range got {
			g, w := got[i], want[i]
			g.CreatedAt, w.CreatedAt = g.CreatedAt.UTC(), w.CreatedAt.UTC()
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("%s: entry %d\n got %+v\nwant %+v", what, i, g, w)
			}
		}
	}
	for _, tenant := range []string{"c", "p"} {
		want := of(tenant)
		got, err := ledger.EntryList(ctx, pool, tenant, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		same("list "+tenant, got, want)
		// Pages of 2: each read's rows end within its range, or it is the
		// one record that follows, whole.
		var paged []ledger.Entry
		for after := int64(0); ; {
			page, err := ledger.EntryList(ctx, pool, tenant, after, 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			paged = append(paged, page...)
			after = page[len(page)-1].Seq
		}
		same("pages of "+tenant, paged, want)
		// A read may end inside a record (a tally's entry, a caller's
		// cursor) or find no row ending within its range (a record longer
		// than the limit): from every seq, it gives the entries that follow,
		// at least one, whole and in order.
		for after := range int64(len(want)) {
			for _, limit := range []int{1, 2, 1000} {
				page, err := ledger.EntryList(ctx, pool, tenant, after, limit)
				if err != nil || len(page) == 0 || int(after)+len(page) > len(want) {
					t.Fatalf("list %s after %d, limit %d: %d entries, %v", tenant, after, limit, len(page), err)
				}
				same(fmt.Sprintf("list %s after %d, limit %d", tenant, after, limit), page, want[after:int(after)+len(page)])
			}
		}
		if page, err := ledger.EntryList(ctx, pool, tenant, int64(len(want)), 10); err != nil || len(page) != 0 {
			t.Fatalf("list %s after its end: %d entries, %v", tenant, len(page), err)
		}
		tally, err := ledger.Verify(ctx, pool, tenant)
		if err != nil || tally.Entries != int64(len(want)) || tally.BalanceMicro != h.balance[tenant] {
			t.Fatalf("verify %s: %+v %v", tenant, tally, err)
		}
	}

	// Keyset pages of 3, both ways, across tenants.
	order := slices.Clone(h.all)
	slices.SortFunc(order, func(a, b ledger.Entry) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		if a.TenantID != b.TenantID {
			if a.TenantID < b.TenantID {
				return -1
			}
			return 1
		}
		return int(a.Seq - b.Seq)
	})
	for _, oldest := range []bool{true, false} {
		var got []ledger.Entry
		f := ledger.Filter{Oldest: oldest, Limit: 3}
		for {
			page, next, err := ledger.EntryQuery(ctx, pool, f)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, page...)
			if next == nil {
				break
			}
			f.After = next
		}
		want := order
		if !oldest {
			want = slices.Clone(order)
			slices.Reverse(want)
		}
		same(fmt.Sprintf("query oldest=%v", oldest), got, want)
	}

	// An admission's entries: through its lease, wherever stored.
	for _, c := range []struct {
		adm, lease string
		want       int
	}{{"adm-2", "L1", 4}, {"adm-0", "L1", 3}, {"adm-8", "L1", 1}, {"adm-7", "L1", 1}, {"adm-9", "L2", 1}, {"adm-9", "", 1}, {"adm-5", "", 0}} {
		got, _, err := ledger.EntryQuery(ctx, pool, ledger.Filter{AdmissionID: c.adm, Lease: c.lease, Oldest: true, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		var want []ledger.Entry
		if c.want > 0 {
			for _, e := range order {
				if e.AdmissionID == c.adm {
					want = append(want, e)
				}
			}
		}
		same(fmt.Sprintf("admission %s through %q", c.adm, c.lease), got, want)
	}

	// Filters on an entry's own columns see inside records.
	got, _, err := ledger.EntryQuery(ctx, pool, ledger.Filter{TenantID: "p", Kind: ledger.KindSettle, Oldest: true, Limit: 100})
	if err != nil || len(got) != 1 || got[0].AdmissionID != "adm-2" {
		t.Fatalf("p's settles: %+v %v", got, err)
	}

	// SQL's canonical bytes (00004, 00038) hash every entry as Go did.
	var total, matching int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE hash = sha256(prev_hash || ledger_canonical(e))) FROM ledger_entries e`).Scan(&total, &matching); err != nil {
		t.Fatal(err)
	}
	if total != len(h.all) || matching != total {
		t.Fatalf("%d of %d entries hash alike in SQL and Go", matching, total)
	}
	first := h.all[4] // c's first booked entry: its prev is the take's hash
	if sum := sha256.Sum256(append(slices.Clone(first.PrevHash), ledger.Canonical(&first)...)); string(sum[:]) != string(first.Hash) {
		t.Fatal("the test's own chain is wrong")
	}

	// A window's money sums the entries inside records.
	spent, err := ledger.MoneySpent(ctx, pool, []ledger.SpanParams{{TenantID: "c", Since: t0}, {TenantID: "p", Since: t0}})
	if err != nil {
		t.Fatal(err)
	}
	var want int64 = -4
	for i := range 7 {
		want += int64(10 + i)
	}
	if spent[0] != want || spent[1] != want {
		t.Fatalf("money spent %v, want %d each", spent, want)
	}
}

// TestRecordsStayAppendOnly: a record's row refuses update and delete as
// any ledger row does, and the view refuses them too.
func TestRecordsStayAppendOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	h := &history{heads: map[string]ledger.Head{}, balance: map[string]int64{}}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	h.write(t, tx, h.add("c", ledger.KindReserve, at, "a", "L", 0, 0, nil), h.add("c", ledger.KindReserve, at, "b", "L", 0, 0, nil))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`UPDATE ledger_rows SET earlier_kinds = '{settle}'`,
		`DELETE FROM ledger_rows`,
		`UPDATE ledger_entries SET kind = 'settle'`,
		`DELETE FROM ledger_entries`,
	} {
		if _, err := pool.Exec(ctx, stmt); err == nil {
			t.Fatalf("%s succeeded", stmt)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE kind = 'reserve'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d reserve entries (%v), want 2", n, err)
	}
}
