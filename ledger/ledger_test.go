package ledger_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestCanonicalIsUnambiguous(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 10, 0, 0, 123456000, time.UTC)
	est := int64(5)
	a := ledger.Entry{TenantID: "ab", Seq: 1, Kind: ledger.KindReserve, CreatedAt: at, Actor: "c", Estimate: &est}
	b := a
	b.TenantID, b.Actor = "a", "bc" // same bytes if fields were merely concatenated
	if string(ledger.Canonical(&a)) == string(ledger.Canonical(&b)) {
		t.Fatal("different entries encode alike")
	}
	c := a
	c.Estimate = nil // null differs from any number
	if string(ledger.Canonical(&a)) == string(ledger.Canonical(&c)) {
		t.Fatal("null and a value encode alike")
	}
	var h ledger.Head
	h = h.Seal(&a)
	if a.Seq != 1 || len(a.Hash) != 32 || len(a.PrevHash) != 0 || string(h.Hash) != string(a.Hash) {
		t.Fatalf("seal: %+v", a)
	}
	b.Kind = ledger.KindSettle
	h2 := h.Seal(&b)
	if b.Seq != 2 || string(b.PrevHash) != string(a.Hash) || string(h2.Hash) == string(h.Hash) {
		t.Fatal("the second entry is not chained to the first")
	}
}

func TestVerifyNamesTheFirstBrokenEntry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := store.Reserve(ctx, account.ReserveParams{TenantID: "acme", Estimate: estimator.Estimate{Model: "m", Cost: 10, InputWeightMicro: 1, OutputWeightMicro: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	tally, err := ledger.Verify(ctx, pool, "acme")
	if err != nil || tally.Entries != 5 || tally.BalanceMicro != 960*rule.Micro+tally.BalanceMicro%rule.Micro {
		t.Fatalf("intact ledger: %+v %v", tally, err)
	}
	// Tamper as a superuser with the trigger disabled: an amount changes.
	if _, err := pool.Exec(ctx, `ALTER TABLE ledger_rows DISABLE TRIGGER USER;
		UPDATE ledger_rows SET delta_micro = delta_micro + 1, balance_micro = balance_micro + 1 WHERE seq = 3;
		ALTER TABLE ledger_rows ENABLE TRIGGER USER`); err != nil {
		t.Fatal(err)
	}
	_, err = ledger.Verify(ctx, pool, "acme")
	var p *ledger.Problem
	if !errors.As(err, &p) || p.Seq != 3 || !errors.Is(err, ledger.ErrBroken) {
		t.Fatalf("tampered ledger: %v, want a problem at seq 3", err)
	}
}

// TestSQLCanonicalMatchesGo: the SQL reference encoding that auditors use
// (migration 00004) hashes every entry the Go code wrote to the same value.
func TestSQLCanonicalMatchesGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	l := rule.Limits{TokensCapacity: 1000, TokensRateMicro: 333_333, PeriodBudget: 5000, Period: rule.PeriodMonth}
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: l, Actor: "ünïcode-actor"}); err != nil {
		t.Fatal(err)
	}
	r, err := store.Reserve(ctx, account.ReserveParams{TenantID: "acme", Estimate: estimator.Estimate{Model: "gpt-4o-2024-08-06", Cost: 10, InputTokens: 3_000_000, OutputTokens: 1, InputWeightMicro: 1, OutputWeightMicro: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 3_000_000, OutputTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Adjust(ctx, account.AdjustParams{TenantID: "acme", Tokens: 5, Reason: "naïve \"quoted\" reason; 5:x ~"}); err != nil {
		t.Fatal(err)
	}
	var total, matching int
	err = pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE hash = sha256(prev_hash || ledger_canonical(e))) FROM ledger_entries e`).Scan(&total, &matching)
	if err != nil {
		t.Fatal(err)
	}
	if total != 4 || matching != total {
		t.Fatalf("%d of %d entries hash alike in SQL and Go", matching, total)
	}
}

// TestPagingIsStableUnderConcurrentInserts pages through the ledger, oldest
// first and newest first, while other tenants' admissions keep committing:
// every entry that existed when paging began is seen exactly once.
func TestPagingIsStableUnderConcurrentInserts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	store := account.NewStore(pool)
	for _, id := range []string{"a", "b", "c"} {
		if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	reserve := func(id string) {
		if _, err := store.Reserve(ctx, account.ReserveParams{TenantID: id, Estimate: estimator.Estimate{Model: "m", Cost: 1, InputWeightMicro: 1, OutputWeightMicro: 1}}); err != nil {
			t.Error(err)
		}
	}
	for i := range 150 {
		reserve([]string{"a", "b", "c"}[i%3])
	}
	var before int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries`).Scan(&before); err != nil || before != 153 {
		t.Fatalf("%d entries before paging (%v), want 153", before, err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				reserve([]string{"a", "b", "c"}[i%3])
			}
		}
	}()
	for _, oldest := range []bool{true, false} {
		seen := map[string]int{}
		f := ledger.Filter{Limit: 7, Oldest: oldest}
		for {
			entries, next, err := ledger.EntryQuery(ctx, pool, f)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				seen[e.TenantID+"/"+strconv.FormatInt(e.Seq, 10)]++
			}
			if next == nil {
				break
			}
			f.After = next
		}
		for k, n := range seen {
			if n != 1 {
				t.Fatalf("oldest=%v: entry %s seen %d times", oldest, k, n)
			}
		}
		// Every entry of the starting set: seq 1..51 of each tenant.
		for _, id := range []string{"a", "b", "c"} {
			for seq := 1; seq <= 51; seq++ {
				if seen[id+"/"+strconv.Itoa(seq)] != 1 {
					t.Fatalf("oldest=%v: entry %s/%d missed", oldest, id, seq)
				}
			}
		}
	}
}
