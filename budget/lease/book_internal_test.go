package lease

import (
	"context"
	"errors"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// One group commit holding a duplicate admission id and the same key
// twice: the duplicate fails alone (ErrDuplicate), the second use of the
// key is a replay of the first, and every other admission of the group is
// journaled; the lease counts exactly what was journaled.
func TestJournalGroupRowFailsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	jt := newJournalTest(t, "acme")
	adm := func(id, key string) Admission {
		return Admission{Admission: account.Admission{ID: id, TenantID: "acme", Estimate: estimator.Estimate{Model: "gpt-4o", Cost: 10}},
			CostMicro: 10 * rule.Micro, IdempotencyKey: key, RequestHash: []byte(key)}
	}
	send := func(as ...Admission) []error { return jt.send(ctx, as...) }
	if errs := send(adm("a1", "")); errs[0] != nil {
		t.Fatal(errs[0])
	}
	errs := send(adm("a2", ""), adm("a1", ""), adm("a3", "k"), adm("a4", "k"), adm("a5", ""), adm("a6", "j"))
	var re *ReplayError
	switch {
	case errs[0] != nil || errs[2] != nil || errs[4] != nil || errs[5] != nil:
		t.Fatalf("the rows not at fault: %v", errs)
	case !errors.Is(errs[1], ErrDuplicate):
		t.Fatalf("the duplicate id: %v", errs[1])
	case !errors.As(errs[3], &re) || re.AdmissionID != "a3":
		t.Fatalf("the key used twice: %v", errs[3])
	}
	// A key journaled in an earlier group is a replay too.
	if errs := send(adm("a7", "j")); !errors.As(errs[0], &re) || re.AdmissionID != "a6" {
		t.Fatalf("the key journaled before: %v", errs[0])
	}
	var used, rows int64
	if err := jt.pool.QueryRow(ctx, `SELECT (SELECT used_micro FROM leases WHERE id = $1), (SELECT count(*) FROM admissions WHERE lease_id = $1)`, jt.lease.ID).Scan(&used, &rows); err != nil {
		t.Fatal(err)
	}
	if used != 50*rule.Micro || rows != 5 {
		t.Fatalf("used %d for %d rows; want 50 tokens for 5", used, rows)
	}
}
