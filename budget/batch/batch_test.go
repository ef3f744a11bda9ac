package batch_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type testBundle struct {
	key   string // a key of acme's
	pool  *pgxpool.Pool
	store *account.Store
	svc   *batch.Service
	now   *atomic.Int64 // the frozen clock, unix nanoseconds
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtest.New(t, func(c *pgxpool.Config) { c.MaxConns = 24 })
	b := &testBundle{pool: pool, now: &atomic.Int64{}}
	b.now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	b.store = account.NewStore(pool).WithClock(func() time.Time { return time.Unix(0, b.now.Load()).UTC() })
	svc, err := batch.New(batch.Config{Store: b.store})
	if err != nil {
		t.Fatal(err)
	}
	b.svc = svc
	ctx := context.Background()
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}}); err != nil {
		t.Fatal(err)
	}
	k, _, err := credential.KeyCreate(ctx, pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	b.key = k.ID
	return b
}

func (b *testBundle) advance(d time.Duration) { b.now.Add(int64(d)) }

// chat is a chat line's request.
func chat(t *testing.T, model, text string, maxTokens int) *estimator.Request {
	t.Helper()
	r, err := estimator.Parse(fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d}`, model, text, maxTokens))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// upload plans and records a file of n chat lines (custom ids r0..r{n-1}).
func (b *testBundle) upload(t *testing.T, fileID string, n int) *batch.Plan {
	t.Helper()
	lines := make([]batch.Line, n)
	for i := range lines {
		lines[i] = batch.Line{CustomID: fmt.Sprintf("r%d", i), Request: chat(t, "gpt-4o", "Hello there, line "+fmt.Sprint(i), 100)}
	}
	plan, err := b.svc.Plan(context.Background(), "acme", "", lines)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.svc.FileRecord(context.Background(), batch.FileParams{Provider: batch.OpenAI, FileID: fileID, TenantID: "acme", Endpoint: "/v1/chat/completions", Plan: plan}); err != nil {
		t.Fatal(err)
	}
	return plan
}

func (b *testBundle) entries(t *testing.T, batchID string) []ledger.Entry {
	t.Helper()
	es, _, err := ledger.EntryQuery(context.Background(), b.pool, ledger.Filter{TenantID: "acme", AdmissionID: batchID, Oldest: true, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return es
}

func (b *testBundle) enqueued(t *testing.T) int64 {
	t.Helper()
	a, err := b.svc.Allowance(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	return a.EnqueuedMicro
}

func TestPlanEstimatesEveryLineAsItsSingleRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.svc.Plan(ctx, "acme", "", []batch.Line{{CustomID: "a", Request: chat(t, "gpt-4o", "hi", 10)}}); !errors.Is(err, batch.ErrNoAllowance) {
		t.Fatalf("no allowance: %v", err)
	}
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 100_000}); err != nil {
		t.Fatal(err)
	}
	// The lines follow the tenant's model scope, as its single requests do.
	if _, err := b.store.SetModels(ctx, account.SetModelsParams{TenantID: "acme", Models: []string{"gpt-4o"}}); err != nil {
		t.Fatal(err)
	}
	req := chat(t, "gpt-4o", "Hello there", 100)
	single, err := estimator.New(nil).Estimate(req)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := b.svc.Plan(ctx, "acme", "", []batch.Line{{CustomID: "a", Request: req}})
	if err != nil {
		t.Fatal(err)
	}
	l := plan.Lines[0]
	if l.InputTokens != single.InputTokens || l.OutputTokens != single.OutputTokens ||
		l.ReservedMicro != single.Cost*rule.Micro/2 || plan.ReservedMicro != l.ReservedMicro {
		t.Fatalf("line %+v, single %+v", l, single)
	}

	cases := []struct {
		name  string
		lines []batch.Line
		want  batch.LineError
	}{
		{"forbidden model", []batch.Line{{CustomID: "a", Request: chat(t, "gpt-4o", "hi", 10)}, {CustomID: "b", Request: chat(t, "gpt-4o-mini", "hi", 10)}},
			batch.LineError{Line: 2, CustomID: "b", Field: "body.model"}},
		{"over the window", []batch.Line{{CustomID: "a", Request: chat(t, "gpt-4o", "hi", 10)}, {CustomID: "b", Request: chat(t, "gpt-4o", "hi", 200_000)}},
			batch.LineError{Line: 2, CustomID: "b", Field: "body.max_tokens"}},
		{"duplicate custom_id", []batch.Line{{CustomID: "a", Request: chat(t, "gpt-4o", "hi", 10)}, {CustomID: "a", Request: chat(t, "gpt-4o", "hi", 10)}},
			batch.LineError{Line: 2, CustomID: "a", Field: "custom_id"}},
	}
	for _, c := range cases {
		_, err := b.svc.Plan(ctx, "acme", "", c.lines)
		var le *batch.LineError
		if !errors.As(err, &le) || le.Line != c.want.Line || le.CustomID != c.want.CustomID || le.Field != c.want.Field {
			t.Errorf("%s: %v (%+v)", c.name, err, le)
		}
		if forbidden := c.name == "forbidden model"; errors.Is(err, rule.ErrModelNotAllowed) != forbidden {
			t.Errorf("%s: %v; a model outside the scope (only) is a *rule.ModelNotAllowedError", c.name, err)
		}
	}
}

// A batch of N lines with k failed: the N-k settle from their usage, the
// k are refunded whole, the allowance gets all back, and the ledger tells
// it in three entries carrying the batch's id. A second report moves
// nothing.
func TestPartialFailureRefundsExactlyTheFailedLines(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 100_000}); err != nil {
		t.Fatal(err)
	}
	const n, k = 10, 3
	plan := b.upload(t, "file-1", n)
	bt, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "file-1", Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if bt.ReservedMicro != plan.ReservedMicro || bt.Lines != n || b.enqueued(t) != plan.ReservedMicro {
		t.Fatalf("reserved %+v, plan %d, enqueued %d", bt, plan.ReservedMicro, b.enqueued(t))
	}
	if err := b.svc.Bind(ctx, "acme", bt.ID, "batch_up_1"); err != nil {
		t.Fatal(err)
	}
	if id, err := b.svc.Find(ctx, batch.OpenAI, "batch_up_1", "acme"); err != nil || id != bt.ID {
		t.Fatalf("find %q %v", id, err)
	}
	var results []batch.Result
	var wantRefund, wantSettled, wantActual int64
	for i, l := range plan.Lines {
		if i < k {
			results = append(results, batch.Result{CustomID: l.CustomID})
			wantRefund += l.ReservedMicro
			continue
		}
		results = append(results, batch.Result{CustomID: l.CustomID, Succeeded: true, Input: 5, Output: 7})
		wantSettled += l.ReservedMicro
		wantActual += batch.PriceMicro(5, 7, l.InputWeightMicro, l.OutputWeightMicro)
	}
	sum, err := b.svc.End(ctx, batch.EndParams{TenantID: "acme", BatchID: bt.ID, Status: "completed", Results: results, Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Settled != n-k || sum.Refunded != k || sum.RefundedMicro != wantRefund || sum.SettledMicro != wantSettled || sum.ActualMicro != wantActual {
		t.Fatalf("summary %+v; want refund %d settled %d actual %d", sum, wantRefund, wantSettled, wantActual)
	}
	if got := b.enqueued(t); got != 0 {
		t.Fatalf("enqueued after the end: %d", got)
	}
	again, err := b.svc.End(ctx, batch.EndParams{TenantID: "acme", BatchID: bt.ID, Status: "completed", Results: results, Actor: "test"})
	if err != nil || !again.Already {
		t.Fatalf("second end: %+v %v", again, err)
	}
	es := b.entries(t, bt.ID)
	if len(es) != 3 || es[0].Kind != ledger.KindBatchReserve || es[1].Kind != ledger.KindBatchSettle || es[2].Kind != ledger.KindBatchRefund {
		t.Fatalf("entries %+v", es)
	}
	up := func(m int64) int64 { return (m + rule.Micro - 1) / rule.Micro }
	if *es[0].Estimate != up(plan.ReservedMicro) || *es[1].Estimate != up(wantSettled) || *es[1].Actual != up(wantActual) ||
		*es[2].Estimate != up(wantRefund) || *es[2].Actual != 0 {
		t.Fatalf("entry amounts: %d %d/%d %d", *es[0].Estimate, *es[1].Estimate, *es[1].Actual, *es[2].Estimate)
	}
	for _, e := range es {
		if e.DeltaMicro != 0 || e.RefillMicro != 0 {
			t.Fatalf("a batch entry moved the token balance: %+v", e)
		}
	}
	lines, err := b.svc.Lines(ctx, bt.ID)
	if err != nil {
		t.Fatal(err)
	}
	refunded := 0
	for _, l := range lines {
		if l.State == "refunded" {
			refunded++
			if l.Outcome != batch.Failed || l.ActualMicro != 0 {
				t.Fatalf("refunded line %+v", l)
			}
		} else if l.State != "settled" || l.ActualInput != 5 || l.ActualOutput != 7 {
			t.Fatalf("settled line %+v", l)
		}
	}
	if refunded != k {
		t.Fatalf("%d lines refunded, want %d", refunded, k)
	}
	if _, err := ledger.Verify(ctx, b.pool, "acme"); err != nil {
		t.Fatal(err)
	}
}

// A batch larger than what is left of the allowance is refused whole;
// one larger than the capacity is refused as never fitting.
func TestReserveRefusedPastTheAllowance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	plan := func() int64 {
		if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 1_000_000}); err != nil {
			t.Fatal(err)
		}
		return b.upload(t, "f", 4).ReservedMicro
	}()
	capTokens := (plan + plan/2) / rule.Micro // one batch fits, two do not
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: capTokens}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "f"}); err != nil {
		t.Fatal(err)
	}
	_, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "f"})
	var ae *batch.AllowanceError
	if !errors.As(err, &ae) || ae.Never || ae.EnqueuedMicro != plan {
		t.Fatalf("second batch: %v", err)
	}
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "f"}); !errors.As(err, &ae) || !ae.Never {
		t.Fatalf("past the capacity: %v", err)
	}
	if _, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "nope"}); !errors.Is(err, batch.ErrFileNotFound) {
		t.Fatalf("unknown file: %v", err)
	}
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	// Checked under the lock, as an admission's: a revoked key, and a
	// disabled tenant.
	if _, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: "nosuchkey", Provider: batch.OpenAI, FileID: "f"}); !errors.Is(err, rule.ErrKeyRevoked) {
		t.Fatalf("unknown key: %v", err)
	}
	if _, err := b.store.SetDisabled(ctx, account.SetDisabledParams{TenantID: "acme", Disabled: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "f"}); !errors.Is(err, rule.ErrTenantDisabled) {
		t.Fatalf("disabled tenant: %v", err)
	}
	if b.enqueued(t) != plan {
		t.Fatalf("refusals moved the allowance: %d", b.enqueued(t))
	}
}

// A batch still open after its completion window is refunded whole by the
// sweeper, as expired; a report after that settles nothing.
func TestExpiryRefundsAnOverdueBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 100_000}); err != nil {
		t.Fatal(err)
	}
	plan := b.upload(t, "f", 3)
	bt, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "f"})
	if err != nil {
		t.Fatal(err)
	}
	b.advance(batch.CompletionWindow - time.Second)
	if n, err := b.svc.ExpireOverdue(ctx, 100); err != nil || n != 0 {
		t.Fatalf("before the window: %d %v", n, err)
	}
	b.advance(time.Second)
	if n, err := b.svc.ExpireOverdue(ctx, 100); err != nil || n != 1 {
		t.Fatalf("at the window: %d %v", n, err)
	}
	if b.enqueued(t) != 0 {
		t.Fatalf("enqueued %d", b.enqueued(t))
	}
	es := b.entries(t, bt.ID)
	if len(es) != 2 || es[1].Kind != ledger.KindBatchRefund || es[1].Actor != "sweeper" || *es[1].Estimate != (plan.ReservedMicro+rule.Micro-1)/rule.Micro {
		t.Fatalf("entries %+v", es)
	}
	lines, _ := b.svc.Lines(ctx, bt.ID)
	for _, l := range lines {
		if l.Outcome != batch.Expired {
			t.Fatalf("line %+v", l)
		}
	}
	if sum, err := b.svc.End(ctx, batch.EndParams{TenantID: "acme", BatchID: bt.ID, Status: "completed",
		Results: []batch.Result{{CustomID: "r0", Succeeded: true, Input: 1, Output: 1}}}); err != nil || !sum.Already {
		t.Fatalf("late report: %+v %v", sum, err)
	}
}

// Many batches at once on one tenant's allowance: exactly as many are
// reserved as fit, never more enqueued than the capacity, and what is
// enqueued is exactly the sum of the batches admitted.
func TestConcurrentReservesNeverExceedTheAllowance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	per := b.upload(t, "f", 2).ReservedMicro
	const fit, tries = 7, 40
	capTokens := (fit*per + per/2) / rule.Micro
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: capTokens}); err != nil {
		t.Fatal(err)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, tries)
	for range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "f"})
			var ae *batch.AllowanceError
			switch {
			case err == nil:
				admitted.Add(1)
			case !errors.As(err, &ae):
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if admitted.Load() != fit || b.enqueued(t) != fit*per || b.enqueued(t) > capTokens*rule.Micro {
		t.Fatalf("admitted %d (want %d), enqueued %d of %d", admitted.Load(), fit, b.enqueued(t), capTokens*rule.Micro)
	}
	if _, err := ledger.Verify(ctx, b.pool, "acme"); err != nil {
		t.Fatal(err)
	}
}

// Reports of the same batches racing one another and new reserves: each
// batch ends once (one settle entry, its lines given back once), and what
// is enqueued is exactly the reservations of the batches still open.
func TestConcurrentEndsSettleOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	plan := b.upload(t, "f", 3)
	const batches, reports, fresh = 5, 4, 6
	ids := make([]string, batches)
	for i := range ids {
		bt, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "f"})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = bt.ID
	}
	results := []batch.Result{{CustomID: "r0", Succeeded: true, Input: 3, Output: 2}, {CustomID: "r1"}}
	var ended, already atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, batches*reports+fresh)
	for _, id := range ids {
		for range reports {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				sum, err := b.svc.End(ctx, batch.EndParams{TenantID: "acme", BatchID: id, Status: "completed", Results: results})
				switch {
				case err != nil:
					errs <- err
				case sum.Already:
					already.Add(1)
				default:
					ended.Add(1)
				}
			}()
		}
	}
	for range fresh {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "f"}); err != nil {
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if ended.Load() != batches || already.Load() != batches*(reports-1) {
		t.Fatalf("ended %d, already %d", ended.Load(), already.Load())
	}
	if got := b.enqueued(t); got != fresh*plan.ReservedMicro {
		t.Fatalf("enqueued %d, want the %d fresh batches' %d", got, fresh, fresh*plan.ReservedMicro)
	}
	for _, id := range ids {
		if es := b.entries(t, id); len(es) != 3 {
			t.Fatalf("batch %s: %d entries", id, len(es))
		}
	}
	if _, err := ledger.Verify(ctx, b.pool, "acme"); err != nil {
		t.Fatal(err)
	}
}

// A line that succeeded without stating its usage settles at its
// estimate, as a single call that reports none does; usage past what the
// line reserved is clamped to its bound.
func TestEndSettlesAtTheEstimateAndClamps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 100_000}); err != nil {
		t.Fatal(err)
	}
	plan := b.upload(t, "f", 2)
	bt, err := b.svc.Reserve(ctx, batch.ReserveParams{TenantID: "acme", KeyID: b.key, Provider: batch.OpenAI, FileID: "f"})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := b.svc.End(ctx, batch.EndParams{TenantID: "acme", BatchID: bt.ID, Status: "completed", Results: []batch.Result{
		{CustomID: "r0", Succeeded: true, AtEstimate: true},
		{CustomID: "r1", Succeeded: true, Input: 3, Output: 1_000_000},
	}})
	if err != nil {
		t.Fatal(err)
	}
	l0, l1 := plan.Lines[0], plan.Lines[1]
	want := l0.ReservedMicro + batch.PriceMicro(3, l1.OutputTokens, l1.InputWeightMicro, l1.OutputWeightMicro)
	if sum.Settled != 2 || sum.ActualMicro != want {
		t.Fatalf("summary %+v, want actual %d", sum, want)
	}
}
