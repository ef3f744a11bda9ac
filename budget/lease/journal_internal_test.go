package lease

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// journalTest is a journal whose groups a test sends itself (send), on a
// lease of 500 tokens of the first of tenants (each of 1000 tokens; the
// first in lease mode auto), in a database of its own.
type journalTest struct {
	pool  *pgxpool.Pool
	j     *Journal
	lease Lease
}

func newJournalTest(t *testing.T, tenants ...string) *journalTest {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.URL(t), nil)
	acct := account.NewStore(pool)
	for _, id := range tenants {
		if _, err := acct.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(Config{Store: acct})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetMode(ctx, SetModeParams{TenantID: tenants[0], Mode: ModeAuto}); err != nil {
		t.Fatal(err)
	}
	l, err := s.Take(ctx, TakeParams{TenantID: tenants[0], WantMicro: 500 * rule.Micro})
	if err != nil {
		t.Fatal(err)
	}
	return &journalTest{pool: pool, j: NewJournal(s), lease: l}
}

// send commits as as one group on the test's lease and returns each one's
// outcome.
func (jt *journalTest) send(ctx context.Context, as ...Admission) []error {
	group := make([]*appendReq, len(as))
	for i, a := range as {
		group[i] = &appendReq{leaseID: jt.lease.ID, a: a, done: make(chan error, 1)}
	}
	return jt.sendReqs(ctx, group...)
}

// sendReqs commits reqs (admissions or ends) as one group and returns each
// one's outcome.
func (jt *journalTest) sendReqs(ctx context.Context, reqs ...*appendReq) []error {
	jt.j.commit(ctx, reqs)
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		errs[i] = <-r.done
	}
	return errs
}
