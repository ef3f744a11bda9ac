package lease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
)

// Eight goroutines journal 480 Grouped admissions (half of them keyed,
// their kept answers naming their placeholders) on one lease, in groups
// formed as they come: every id the journal returns is distinct and names
// the journal's one holder, a count and a place no other admission has;
// the admissions rows are exactly those ids; and each kept answer names
// its admission's new id, never the placeholder.
func TestJournalGroupedIDsConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 100_000, TokensRateMicro: tok})
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 50_000 * tok, MinMicro: 1})
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 60
	type made struct{ id, placeholder, key string }
	out := make([][]made, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				a := adm(rule.NewStoreAdmissionID(b.clock()), 1)
				a.TenantID, a.Grouped = "acme", true
				m := made{placeholder: a.ID}
				if i%2 == 0 {
					m.key = fmt.Sprintf("k-%d-%d", w, i)
					a.IdempotencyKey, a.RequestHash = m.key, []byte(m.key)
					a.Response = []byte(`{"admission_id":"` + a.ID + `","again":"` + a.ID + `"}`)
				}
				id, err := b.r.journal.AppendID(ctx, l.ID, a)
				if err != nil {
					t.Error(err)
					return
				}
				m.id = id
				out[w] = append(out[w], m)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	ids := map[string]bool{}
	places := map[[2]int]bool{}
	counts := map[uint32]bool{}
	var holder uint64
	for _, ms := range out {
		for _, m := range ms {
			g, ok := rule.AdmissionGroupOf(m.id)
			switch {
			case !ok || m.id == m.placeholder || m.id[:13] != m.placeholder[:13]:
				t.Fatalf("%s (placeholder %s): not a grouped id of the placeholder's instant", m.id, m.placeholder)
			case holder != 0 && g.Holder != holder:
				t.Fatalf("%s names holder %d, another %d", m.id, g.Holder, holder)
			case ids[m.id] || places[[2]int{int(g.Count), g.Place}]:
				t.Fatalf("%s (%+v) given twice", m.id, g)
			}
			holder = g.Holder
			ids[m.id], places[[2]int{int(g.Count), g.Place}], counts[g.Count] = true, true, true
			if m.key == "" {
				continue
			}
			var resp []byte
			if err := b.r.pool.QueryRow(ctx, "SELECT response FROM idempotency_keys WHERE tenant_id = 'acme' AND admission_id = $1", m.id).Scan(&resp); err != nil {
				t.Fatalf("%s: its key row: %v", m.id, err)
			}
			if want := `{"admission_id":"` + m.id + `","again":"` + m.id + `"}`; string(resp) != want {
				t.Fatalf("kept answer %s, want %s", resp, want)
			}
		}
	}
	if len(ids) != workers*each || len(counts) < 2 {
		t.Fatalf("%d ids in %d groups, want %d in several", len(ids), len(counts), workers*each)
	}
	rows, err := b.r.pool.Query(ctx, "SELECT id FROM admissions WHERE lease_id = $1", l.ID)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		if !ids[id] {
			t.Fatalf("admissions row %s is no id the journal returned", id)
		}
		n++
	}
	if rows.Err() != nil || n != len(ids) {
		t.Fatalf("%d admissions rows (%v), want %d", n, rows.Err(), len(ids))
	}
}
