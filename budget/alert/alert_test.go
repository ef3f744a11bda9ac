package alert_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

var testKey = []byte("0123456789abcdef0123456789abcdef")

func reserve(tenant string, cost int64) account.ReserveParams {
	return account.ReserveParams{TenantID: tenant, Actor: "key:test", Estimate: estimator.Estimate{Model: "gpt-4o", InputTokens: cost / 2,
		OutputTokens: cost - cost/2, Cost: cost, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}
}

func TestSignatureVerifiesLikeStripes(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"id":"evt_1"}`)
	h := alert.Sign("whsec_a", now, body)
	if !strings.HasPrefix(h, "t=1800000000,v1=") || len(h) != len("t=1800000000,v1=")+64 {
		t.Fatalf("header %q", h)
	}
	if err := alert.Verify("whsec_a", h, body, 5*time.Minute, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	for name, check := range map[string]error{
		"tampered body":     alert.Verify("whsec_a", h, []byte(`{"id":"evt_2"}`), 5*time.Minute, now),
		"other secret":      alert.Verify("whsec_b", h, body, 5*time.Minute, now),
		"replayed too late": alert.Verify("whsec_a", h, body, 5*time.Minute, now.Add(6*time.Minute)),
		"no signature":      alert.Verify("whsec_a", "t=1800000000", body, 5*time.Minute, now),
		"garbage":           alert.Verify("whsec_a", "nonsense", body, 5*time.Minute, now),
	} {
		if !errors.Is(check, alert.ErrSignature) {
			t.Errorf("%s: %v", name, check)
		}
	}
	// During a rotation a header may carry both signatures.
	both := h + ",v1=" + strings.Repeat("0", 64)
	if err := alert.Verify("whsec_a", both, body, time.Minute, now); err != nil {
		t.Fatal(err)
	}
}

func TestEndpointsAndRulesValidate(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	s := alert.NewStore(pool, testKey)
	if _, err := account.NewStore(pool).CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 10, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	field := func(err error) string {
		var fe *alert.FieldError
		if errors.As(err, &fe) {
			return fe.Field
		}
		return "not a field error: " + errString(err)
	}
	for url, want := range map[string]string{"": "url", "http://example.com/hook": "url", "https://user:pw@example.com/": "url", "ftp://x/": "url", "not a url": "url"} {
		if _, _, err := s.CreateEndpoint(ctx, url, ""); field(err) != want {
			t.Errorf("url %q: %v", url, err)
		}
	}
	if _, _, err := alert.NewStore(pool, nil).CreateEndpoint(ctx, "https://example.com/hook", ""); !errors.Is(err, alert.ErrNoKey) {
		t.Fatalf("without a key: %v", err)
	}
	ep, secret, err := s.CreateEndpoint(ctx, "https://example.com/hook", "ops")
	if err != nil || !strings.HasPrefix(secret, alert.SecretPrefix) || !strings.HasPrefix(ep.ID, "ep_") {
		t.Fatalf("create: %+v %q %v", ep, secret, err)
	}
	// The secret is not in the database in any form.
	var leaked bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM alert_endpoints WHERE position($1::bytea IN secret_salt) > 0 OR url LIKE '%' || $2 || '%')`,
		[]byte(secret), secret).Scan(&leaked); err != nil || leaked {
		t.Fatalf("secret stored: %v %v", leaked, err)
	}
	rotated, err := s.RotateSecret(ctx, ep.ID)
	if err != nil || rotated == secret {
		t.Fatalf("rotate: %v (same: %v)", err, rotated == secret)
	}
	bad := []alert.RuleParams{
		{EndpointID: ep.ID, Kind: "period_budget"},
		{EndpointID: ep.ID, Kind: "period_budget", Thresholds: []int32{0}},
		{EndpointID: ep.ID, Kind: "throttled"},
		{EndpointID: ep.ID, Kind: "throttled", SustainMinutes: 5, Limit: "nope"},
		{EndpointID: ep.ID, Kind: "invariant", Thresholds: []int32{50}},
		{EndpointID: ep.ID, Kind: "weather"},
		{EndpointID: "ep_missing", Kind: "invariant"},
		{EndpointID: ep.ID, Kind: "invariant", TenantID: "ghost"},
	}
	want := []string{"thresholds", "thresholds", "sustain_minutes", "limit", "kind", "kind", "endpoint", "tenant"}
	for i, p := range bad {
		if _, err := s.CreateRule(ctx, p); field(err) != want[i] {
			t.Errorf("rule %d %+v: %v, want field %s", i, p, err, want[i])
		}
	}
	r, err := s.CreateRule(ctx, alert.RuleParams{TenantID: "acme", EndpointID: ep.ID, Kind: "period_budget", Thresholds: []int32{100, 50, 80, 50}})
	if err != nil || len(r.Thresholds) != 3 || r.Thresholds[0] != 50 || r.Thresholds[2] != 100 {
		t.Fatalf("rule: %+v %v", r, err)
	}
	if err := s.DeleteRule(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteRule(ctx, r.ID); !errors.Is(err, alert.ErrNotFound) {
		t.Fatalf("deleted twice: %v", err)
	}
	if err := s.DisableEndpoint(ctx, ep.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateRule(ctx, alert.RuleParams{EndpointID: ep.ID, Kind: "invariant"}); field(err) != "endpoint" {
		t.Fatalf("a rule on a disabled endpoint: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// events returns the outbox, oldest first.
func events(t *testing.T, s *alert.Store, tenant string) []alert.Event {
	t.Helper()
	es, err := s.Events(ctx, alert.EventFilter{TenantID: tenant, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for i, j := 0, len(es)-1; i < j; i, j = i+1, j-1 {
		es[i], es[j] = es[j], es[i]
	}
	return es
}

// TestThresholdsOncePerPeriodAcrossReplicas: 200 callers over two replicas
// (two pools) spend a period budget of 10 000 in admissions of 100. Each
// of the three thresholds is written exactly once, by the decision that
// crossed it (its period_used is the threshold exactly), for the tenant's
// own rule and for the rule for every tenant; usage that falls back and
// rises again across a threshold raises nothing more; the next period
// raises them again.
func TestThresholdsOncePerPeriodAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	cfg := func(c *pgxpool.Config) { c.MaxConns = 12 }
	p1, p2 := pgtest.Pool(t, url, cfg), pgtest.Pool(t, url, cfg)
	var mu sync.Mutex
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	stores := []*account.Store{account.NewStore(p1).WithClock(clock), account.NewStore(p2).WithClock(clock)}
	if _, err := stores[0].CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{
		TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro, PeriodBudget: 10_000, Period: rule.PeriodDay}}); err != nil {
		t.Fatal(err)
	}
	s := alert.NewStore(p1, testKey)
	ep, _, err := s.CreateEndpoint(ctx, "https://example.com/hook", "")
	if err != nil {
		t.Fatal(err)
	}
	own, err := s.CreateRule(ctx, alert.RuleParams{TenantID: "acme", EndpointID: ep.ID, Kind: "period_budget", Thresholds: []int32{50, 80, 100}})
	if err != nil {
		t.Fatal(err)
	}
	every, err := s.CreateRule(ctx, alert.RuleParams{EndpointID: ep.ID, Kind: "period_budget", Thresholds: []int32{80}})
	if err != nil {
		t.Fatal(err)
	}
	pipes := []*account.Pipeline{account.NewPipeline(stores[0], nil), account.NewPipeline(stores[1], nil)}
	var admitted []string
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 200 {
		wg.Go(func() {
			<-start
			r, err := pipes[g%2].Reserve(ctx, reserve("acme", 100))
			var rej *rule.RejectedError
			switch {
			case errors.As(err, &rej) && rej.Limit == rule.LimitPeriodBudget:
			case err != nil:
				t.Error(err)
			default:
				mu.Lock()
				admitted = append(admitted, r.AdmissionID)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if len(admitted) != 100 {
		t.Fatalf("admitted %d, want exactly 100", len(admitted))
	}
	check := func(wantUsed map[int64]map[float64]float64) {
		t.Helper()
		got := map[int64]map[float64]float64{}
		for _, e := range events(t, s, "acme") {
			var d map[string]any
			if err := json.Unmarshal(e.Data, &d); err != nil || e.Type != alert.TypeThresholdCrossed {
				t.Fatalf("event %+v: %v", e, err)
			}
			if got[e.RuleID] == nil {
				got[e.RuleID] = map[float64]float64{}
			}
			if _, dup := got[e.RuleID][d["threshold_percent"].(float64)]; dup {
				t.Fatalf("threshold %v of rule %d raised twice", d["threshold_percent"], e.RuleID)
			}
			got[e.RuleID][d["threshold_percent"].(float64)] = d["period_used"].(float64)
		}
		gotJSON, _ := json.Marshal(got)
		wantJSON, _ := json.Marshal(wantUsed)
		if string(gotJSON) != string(wantJSON) {
			t.Fatalf("events (rule -> threshold -> period_used when raised): %s, want %s", gotJSON, wantJSON)
		}
	}
	check(map[int64]map[float64]float64{own.ID: {50: 5000, 80: 8000, 100: 10_000}, every.ID: {80: 8000}})

	// Usage falls below 80 % (settled at 0 each) and rises again: nothing.
	for _, id := range admitted[:30] {
		if _, err := stores[0].Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: id}); err != nil {
			t.Fatal(err)
		}
	}
	for range 30 {
		if _, err := stores[1].Reserve(ctx, reserve("acme", 100)); err != nil {
			t.Fatal(err)
		}
	}
	check(map[int64]map[float64]float64{own.ID: {50: 5000, 80: 8000, 100: 10_000}, every.ID: {80: 8000}})

	// The next day is a new period: one admission of 5000 crosses 50 %.
	mu.Lock()
	now = now.Add(24 * time.Hour)
	mu.Unlock()
	if _, err := stores[0].Reserve(ctx, reserve("acme", 5000)); err != nil {
		t.Fatal(err)
	}
	es := events(t, s, "acme")
	if len(es) != 5 || !strings.Contains(string(es[4].Data), `"period_start": "2026-12-04T00:00:00`) {
		t.Fatalf("the next period: %d events, last %s", len(es), es[len(es)-1].Data)
	}
}

// TestThrottledOncePerEpisode: a tenant refused by its tokens limit in
// each of three minutes raises one event for a 3-minute rule, however
// often (and by however many replicas) it is evaluated; a minute without
// refusals ends the episode, and a new run of three raises a new event.
// A rule for another limit, or one that needs longer, raises nothing.
func TestThrottledOncePerEpisode(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	var mu sync.Mutex
	now := time.Date(2026, 12, 3, 10, 0, 5, 0, time.UTC)
	at := func(d time.Duration) {
		mu.Lock()
		now = time.Date(2026, 12, 3, 10, 0, 5, 0, time.UTC).Add(d)
		mu.Unlock()
	}
	store := account.NewStore(pool).WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 100, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	s := alert.NewStore(pool, testKey)
	ep, _, err := s.CreateEndpoint(ctx, "https://example.com/hook", "")
	if err != nil {
		t.Fatal(err)
	}
	ar, err := s.CreateRule(ctx, alert.RuleParams{TenantID: "acme", EndpointID: ep.ID, Kind: alert.KindThrottled, Limit: "tokens", SustainMinutes: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []alert.RuleParams{
		{TenantID: "acme", EndpointID: ep.ID, Kind: alert.KindThrottled, Limit: "requests", SustainMinutes: 1},
		{EndpointID: ep.ID, Kind: alert.KindThrottled, SustainMinutes: 10},
	} {
		if _, err := s.CreateRule(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Reserve(ctx, reserve("acme", 100)); err != nil { // the bucket is empty from now on
		t.Fatal(err)
	}
	tally := account.NewRejections(pool)
	refuse := func(minute int) {
		t.Helper()
		at(time.Duration(minute) * time.Minute)
		_, err := store.Reserve(ctx, reserve("acme", 50))
		var rej *rule.RejectedError
		if !errors.As(err, &rej) || rej.Limit != rule.LimitTokens {
			t.Fatalf("minute %d: %v", minute, err)
		}
		tally.Add(rej)
		if err := tally.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	raise := func(minute int, secs int) int64 {
		t.Helper()
		var total int64
		for range 2 { // two replicas evaluate
			n, err := s.RaiseThrottled(ctx, time.Date(2026, 12, 3, 10, minute, secs, 0, time.UTC))
			if err != nil {
				t.Fatal(err)
			}
			total += n
		}
		return total
	}
	refuse(0)
	refuse(1)
	if n := raise(2, 10); n != 0 {
		t.Fatalf("after two throttled minutes: %d events", n)
	}
	refuse(2)
	if n := raise(2, 50); n != 0 { // minute 2 is not complete yet
		t.Fatalf("during the third minute: %d events", n)
	}
	refuse(3)
	if n := raise(3, 10); n != 1 {
		t.Fatalf("after three throttled minutes: %d events, want 1", n)
	}
	if n := raise(4, 10); n != 0 { // minute 3 continues the same episode
		t.Fatalf("the same episode again: %d events", n)
	}
	// Minute 4 passes without a refusal: the episode is over.
	if n := raise(5, 10); n != 0 {
		t.Fatalf("after a quiet minute: %d", n)
	}
	for _, m := range []int{5, 6, 7} {
		refuse(m)
	}
	if n := raise(8, 1); n != 1 {
		t.Fatalf("a new episode: %d events, want 1", n)
	}
	es := events(t, s, "acme")
	if len(es) != 2 {
		t.Fatalf("%d events", len(es))
	}
	for i, since := range []string{"10:00:00", "10:05:00"} {
		var d struct {
			Limit   string
			Since   time.Time
			Minutes int
			Rule    int64
		}
		if err := json.Unmarshal(es[i].Data, &d); err != nil || es[i].Type != alert.TypeThrottled || d.Limit != "tokens" ||
			d.Since.UTC().Format("15:04:05") != since || d.Minutes < 3 || d.Rule != ar.ID {
			t.Fatalf("event %d: %s %s (%v)", i, es[i].Type, es[i].Data, err)
		}
	}
}

// TestInvariantViolationRaisedOnce: a balance changed behind the ledger's
// back is found by two replicas' watches, run after run; the invariant
// rule's event is written once for that finding.
func TestInvariantViolationRaisedOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 100, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	s := alert.NewStore(pool, testKey)
	ep, _, err := s.CreateEndpoint(ctx, "https://example.com/hook", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateRule(ctx, alert.RuleParams{EndpointID: ep.ID, Kind: alert.KindInvariant}); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	watches := []*account.Watch{{Store: store, Logger: logger, Alerts: s}, {Store: account.NewStore(pool), Logger: logger, Alerts: s}}
	for _, w := range watches {
		if err := w.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if es := events(t, s, "acme"); len(es) != 0 {
		t.Fatalf("a sound ledger raised %d events", len(es))
	}
	if _, err := pool.Exec(ctx, `UPDATE tenants SET tokens_micro = tokens_micro + 1 WHERE id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		for _, w := range watches {
			if err := w.Check(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	es := events(t, s, "acme")
	if len(es) != 1 || es[0].Type != alert.TypeInvariantViolated || !strings.Contains(string(es[0].Data), `"tenant": "acme"`) {
		t.Fatalf("events: %+v", es)
	}
}

// TestThresholdsAtEveryLevel: where budgets nest, a rule on the
// organisation fires when its children's admissions cross its threshold,
// and a rule for every tenant fires for each level that crosses.
func TestThresholdsAtEveryLevel(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	for _, p := range []account.CreateTenantParams{
		{ID: "org", Limits: rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro, PeriodBudget: 1000, Period: rule.PeriodMonth}},
		{ID: "team", Parent: "org", Limits: rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro, PeriodBudget: 400, Period: rule.PeriodDay}},
		{ID: "other", Parent: "org", Limits: rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro}},
	} {
		if _, err := store.CreateTenant(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	s := alert.NewStore(pool, testKey)
	ep, _, err := s.CreateEndpoint(ctx, "https://example.com/hook", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateRule(ctx, alert.RuleParams{EndpointID: ep.ID, Kind: alert.KindPeriodBudget, Thresholds: []int32{50}}); err != nil {
		t.Fatal(err)
	}
	// team: 300 of 400 (crosses its 50 %); org: 300 of 1000. other: 300
	// more, so org reaches 600 (crosses 50 %); other has no period budget.
	for _, tenant := range []string{"team", "other"} {
		if _, err := store.Reserve(ctx, reserve(tenant, 300)); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]string{}
	for _, e := range events(t, s, "") {
		var d struct{ PeriodUsed, PeriodBudget int64 }
		_ = json.Unmarshal(e.Data, &struct {
			PeriodUsed   *int64 `json:"period_used"`
			PeriodBudget *int64 `json:"period_budget"`
		}{&d.PeriodUsed, &d.PeriodBudget})
		got[e.TenantID] = fmt.Sprintf("%d/%d", d.PeriodUsed, d.PeriodBudget)
	}
	if len(got) != 2 || got["team"] != "300/400" || got["org"] != "600/1000" {
		t.Fatalf("events by level: %v, want team 300/400 and org 600/1000", got)
	}
}
