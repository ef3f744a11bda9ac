package account_test

import (
	"errors"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// grouped is item in group g of its batch.
func grouped(g int, tenant string, cost int64) account.Item {
	it := item(tenant, cost)
	it.Group = g
	return it
}

// TestDecideBatchGroupIsAllOrNone: the reserves of a group are one
// decision. A group with a refused reserve, or one naming no tenant,
// debits none of its reserves (the others are withheld), and the requests
// after it in the batch see the balances as if it had not been asked: the
// exact fits below would be refused had any withheld reserve moved.
func TestDecideBatchGroupIsAllOrNone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(100, "0.001"))
	b.tenant(t, "globex", limits(1000, "0.001"))
	res, err := b.store.DecideBatch(ctx, []account.Item{
		item("acme", 70),         // 0: fits, 30 left
		grouped(1, "globex", 40), // 1: fits, withheld with 2
		grouped(1, "acme", 50),   // 2: refused
		item("acme", 30),         // 3: fits exactly
		item("globex", 970),      // 4: fits only if 1 moved nothing
		grouped(2, "globex", 10), // 5: fits, withheld with 6
		grouped(2, "nobody", 10), // 6: no such tenant
		item("globex", 30),       // 7: fits only if 5 moved nothing
		grouped(3, "globex", 0),  // 8: a whole group: admitted
		grouped(3, "acme", 0),    // 9
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 3, 4, 7, 8, 9} {
		if res[i].Err != nil || res[i].Reservation == nil {
			t.Fatalf("request %d: %+v, want admitted", i, res[i])
		}
	}
	var wh *rule.WithheldError
	for _, i := range []int{1, 5} {
		if !errors.As(res[i].Err, &wh) || wh.Snapshot.TenantID != "globex" || res[i].Reservation != nil {
			t.Fatalf("request %d: %+v, want withheld with globex's balances", i, res[i])
		}
	}
	if !errors.Is(res[2].Err, rule.ErrRejected) || !errors.Is(res[6].Err, rule.ErrTenantNotFound) {
		t.Fatalf("the group's refusals: %v, %v", res[2].Err, res[6].Err)
	}
	for tenant, want := range map[string]int64{"acme": 1 + 3, "globex": 1 + 3} {
		if tally, err := ledger.Verify(ctx, b.pool, tenant); err != nil || tally.Entries != want {
			t.Fatalf("%s: %+v %v, want %d entries", tenant, tally, err, want)
		}
	}
}
