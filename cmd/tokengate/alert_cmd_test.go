package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
)

const testAlertKey = "test-alert-key-0123456789abcdefghijklmnop"

type alertBundle struct {
	url  string
	pool *pgxpool.Pool
}

func setupAlert(t *testing.T) *alertBundle {
	t.Helper()
	url := pgtest.URL(t)
	return &alertBundle{url: url, pool: pgtest.Pool(t, url, nil)}
}

// cli runs a command on the bundle's database.
func (b *alertBundle) cli(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	return cli2(t, append(args, "--database-url", b.url)...)
}

// must runs a command that must succeed.
func (b *alertBundle) must(t *testing.T, args ...string) (string, string) {
	t.Helper()
	out, notes, err := b.cli(t, args...)
	if err != nil {
		t.Fatalf("%v: %v (%s)", args, err, notes)
	}
	return out, notes
}

// endpoint creates an endpoint and returns its id and secret.
func (b *alertBundle) endpoint(t *testing.T, url string) (string, string) {
	t.Helper()
	out, _ := b.must(t, "alert", "endpoint", "create", "--url", url, "--alert-key", testAlertKey, "--json")
	var e struct {
		ID     string `json:"id"`
		Secret string `json:"secret"`
	}
	if err := json.Unmarshal([]byte(out), &e); err != nil || e.ID == "" || !strings.HasPrefix(e.Secret, alert.SecretPrefix) {
		t.Fatalf("endpoint create --json: %q %v", out, err)
	}
	return e.ID, e.Secret
}

// TestAlertEndpointCommands: a secret is printed once, alone on stdout,
// and stored nowhere; http:// needs --allow-http, a loopback address
// --allow-private, and a NUL is refused by its flag; rotate gives a new
// secret; a disabled endpoint is listed as such and cannot be rotated.
func TestAlertEndpointCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupAlert(t)

	out, notes := b.must(t, "alert", "endpoint", "create", "--url", "https://hooks.example.com/tg", "--description", "ops\tpager",
		"--alert-key", testAlertKey)
	secret := strings.TrimSpace(out)
	if strings.Count(out, "\n") != 1 || !strings.HasPrefix(secret, "whsec_") {
		t.Fatalf("stdout %q: want the secret alone on one line", out)
	}
	if !strings.Contains(notes, "shown once") || strings.Contains(notes, secret) || strings.Contains(notes+out, testAlertKey) {
		t.Fatalf("notes %q", notes)
	}
	id := regexp.MustCompile(`ep_[a-z0-9]+`).FindString(notes)
	if id == "" {
		t.Fatalf("notes name no endpoint: %q", notes)
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	var stored int
	err = b.pool.QueryRow(ctx, `SELECT count(*) FROM alert_endpoints e
		WHERE strpos(row_to_json(e)::text, $1) > 0 OR strpos(row_to_json(e)::text, $2) > 0 OR e.secret_salt = $3
		   OR position($3 IN e.secret_salt) > 0`, secret, strings.TrimPrefix(secret, "whsec_"), raw).Scan(&stored)
	if err != nil || stored != 0 {
		t.Fatalf("the secret is in alert_endpoints: %d rows (%v)", stored, err)
	}

	_, _, err = b.cli(t, "alert", "endpoint", "create", "--url", "http://127.0.0.1:9/hook", "--alert-key", testAlertKey)
	if err == nil || !strings.Contains(err.Error(), "--url: must be https://") {
		t.Fatalf("http:// without --allow-http: %v", err)
	}
	httpID, _ := b.endpoint(t, "https://second.example.com/")
	_, _, err = b.cli(t, "alert", "endpoint", "create", "--url", "http://127.0.0.1:9/hook", "--alert-key", testAlertKey, "--allow-http")
	if err == nil || !strings.Contains(err.Error(), "--url: is not a public address") || !strings.Contains(err.Error(), "--alert-allow-private") {
		t.Fatalf("a loopback address without --allow-private: %v", err)
	}
	out, _ = b.must(t, "alert", "endpoint", "create", "--url", "http://127.0.0.1:9/hook", "--alert-key", testAlertKey, "--allow-http", "--allow-private")
	if !strings.HasPrefix(out, "whsec_") {
		t.Fatalf("http:// with --allow-http --allow-private: %q", out)
	}
	_, _, err = b.cli(t, "alert", "endpoint", "create", "--url", "https://x.example.com/", "--description", "pager\x00", "--alert-key", testAlertKey)
	if err == nil || !strings.Contains(err.Error(), "--description: must not contain a NUL character") {
		t.Fatalf("a NUL in --description: %v", err)
	}
	_, _, err = b.cli(t, "alert", "endpoint", "create", "--url", "https://x.example.com/", "--alert-key", "short-key")
	if err == nil || !strings.Contains(err.Error(), "at least 32 bytes") || strings.Contains(err.Error(), "short-key") {
		t.Fatalf("a short key: %v", err)
	}

	out, _ = b.must(t, "alert", "endpoint", "list")
	if !regexp.MustCompile(`(?m)^`+id+`\s+https://hooks\.example\.com/tg\s+ops pager\s+\S+\s+-\s+0\s+0$`).MatchString(out) ||
		!strings.Contains(out, httpID) || !strings.Contains(out, "http://127.0.0.1:9/hook") || strings.Contains(out, "whsec_") {
		t.Fatalf("list:\n%s", out)
	}

	out, notes = b.must(t, "alert", "endpoint", "rotate", id, "--alert-key", testAlertKey)
	rotated := strings.TrimSpace(out)
	if !strings.HasPrefix(rotated, "whsec_") || rotated == secret || strings.Contains(notes, rotated) || !strings.Contains(notes, "shown once") {
		t.Fatalf("rotate: %q / %q", out, notes)
	}
	if _, _, err := b.cli(t, "alert", "endpoint", "rotate", "ep_nosuch", "--alert-key", testAlertKey); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("rotate an unknown endpoint: %v", err)
	}

	b.must(t, "alert", "endpoint", "disable", id)
	if _, _, err := b.cli(t, "alert", "endpoint", "disable", id); err == nil || !strings.Contains(err.Error(), "no enabled endpoint") {
		t.Fatalf("disable twice: %v", err)
	}
	if _, _, err := b.cli(t, "alert", "endpoint", "rotate", id, "--alert-key", testAlertKey); err == nil {
		t.Fatal("rotated a disabled endpoint")
	}
	out, _ = b.must(t, "alert", "endpoint", "list", "--json")
	var eps []alert.Endpoint
	if err := json.Unmarshal([]byte(out), &eps); err != nil || len(eps) != 3 || eps[0].ID != id || eps[0].DisabledAt == nil || eps[1].DisabledAt != nil {
		t.Fatalf("list --json: %s (%v)", out, err)
	}
}

// TestAlertKeyRequired: without a key there is no secret to print, and
// the error says where the key comes from. Not parallel: it sets the
// environment, as an operator would.
func TestAlertKeyRequired(t *testing.T) {
	t.Setenv("TOKENGATE_ALERT_KEY", "")
	b := setupAlert(t)
	_, _, err := b.cli(t, "alert", "endpoint", "create", "--url", "https://hooks.example.com/")
	if !errors.Is(err, alert.ErrNoKey) || !strings.Contains(err.Error(), "TOKENGATE_ALERT_KEY") || !strings.Contains(err.Error(), "--alert-key") {
		t.Fatalf("create without a key: %v", err)
	}
	if _, _, err := b.cli(t, "alert", "endpoint", "rotate", "ep_any"); !errors.Is(err, alert.ErrNoKey) {
		t.Fatalf("rotate without a key: %v", err)
	}
	t.Setenv("TOKENGATE_ALERT_KEY", testAlertKey)
	if out, _ := b.must(t, "alert", "endpoint", "create", "--url", "https://hooks.example.com/"); !strings.HasPrefix(out, "whsec_") {
		t.Fatalf("create with TOKENGATE_ALERT_KEY: %q", out)
	}
}

func TestAlertRuleCommands(t *testing.T) {
	t.Parallel()
	b := setupAlert(t)
	b.must(t, "tenant", "create", "acme", "--tokens-capacity", "1000", "--tokens-per-second", "1", "--period-budget", "5000", "--period", "month")
	ep, _ := b.endpoint(t, "https://hooks.example.com/")

	create := func(args ...string) string {
		t.Helper()
		out, notes := b.must(t, append([]string{"alert", "rule", "create", "--endpoint", ep}, args...)...)
		if !regexp.MustCompile(`^\d+\n$`).MatchString(out) || !strings.Contains(notes, "created rule "+strings.TrimSpace(out)) {
			t.Fatalf("rule create printed %q / %q", out, notes)
		}
		return strings.TrimSpace(out)
	}
	budgetRule := create("--kind", "period_budget", "--tenant", "acme", "--thresholds", "100,50,80")
	throttled := create("--kind", "throttled", "--tenant", "acme", "--limit", "tokens", "--minutes", "5")
	invariant := create("--kind", "invariant")

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--kind", "period_budget"}, "--thresholds: "},
		{[]string{"--kind", "period_budget", "--thresholds", "0"}, "--thresholds: "},
		{[]string{"--kind", "period_budget", "--thresholds", "50", "--minutes", "3"}, "--kind: "},
		{[]string{"--kind", "throttled"}, "--minutes: must be from 1 to 1440"},
		{[]string{"--kind", "throttled", "--minutes", "5", "--limit", "bogus"}, "--limit: "},
		{[]string{"--kind", "invariant", "--tenant", "nobody"}, "--tenant: no such tenant"},
		{[]string{"--kind", "invariant", "--tenant", "ac\x00me"}, "--tenant: must not contain a NUL character"},
		{[]string{"--kind", "weekly"}, "--kind"},
	} {
		_, _, err := b.cli(t, append([]string{"alert", "rule", "create", "--endpoint", ep}, bad.args...)...)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want an error with %q", bad.args, err, bad.want)
		}
	}
	if _, _, err := b.cli(t, "alert", "rule", "create", "--endpoint", "ep_nosuch", "--kind", "invariant"); err == nil ||
		!strings.Contains(err.Error(), "--endpoint: no such endpoint") {
		t.Errorf("an unknown endpoint: %v", err)
	}

	out, _ := b.must(t, "alert", "rule", "list")
	for _, re := range []string{
		`(?m)^` + budgetRule + `\s+acme\s+period_budget\s+50,80,100% of the period budget\s+` + ep + `\s+\S+$`,
		`(?m)^` + throttled + `\s+acme\s+throttled\s+tokens refusing for 5 min\s+` + ep + `\s`,
		`(?m)^` + invariant + `\s+\*\s+invariant\s+the ledger does not recompute\s+` + ep + `\s`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("list does not match %s:\n%s", re, out)
		}
	}
	out, _ = b.must(t, "alert", "rule", "list", "--tenant", "beta", "--json")
	var rules []alert.Rule
	if err := json.Unmarshal([]byte(out), &rules); err != nil || len(rules) != 1 || rules[0].Kind != alert.KindInvariant || rules[0].TenantID != nil {
		t.Fatalf("rules of another tenant: %s (%v)", out, err)
	}

	b.must(t, "alert", "rule", "delete", throttled)
	if _, _, err := b.cli(t, "alert", "rule", "delete", throttled); err == nil || !strings.Contains(err.Error(), "no rule "+throttled) {
		t.Fatalf("delete twice: %v", err)
	}
	out, _ = b.must(t, "alert", "rule", "list", "--tenant", "acme", "--json")
	rules = nil
	if err := json.Unmarshal([]byte(out), &rules); err != nil || len(rules) != 2 || rules[0].Kind != alert.KindPeriodBudget ||
		len(rules[0].Thresholds) != 3 || rules[0].Thresholds[0] != 50 || rules[0].Thresholds[2] != 100 {
		t.Fatalf("after delete: %s (%v)", out, err)
	}
}

// TestAlertEventsAndRedeliver: a decision crossing 50 % of the period
// budget writes an event that `alert events` lists pending; its attempts
// are summarised one per line; only a failed event is redelivered.
func TestAlertEventsAndRedeliver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupAlert(t)
	store := account.NewStore(b.pool)
	t.Cleanup(store.Close)
	_, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 1_000_000,
		TokensRateMicro: rule.Micro, PeriodBudget: 1000, Period: rule.PeriodDay}})
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := b.endpoint(t, "https://hooks.example.com/")
	b.must(t, "alert", "rule", "create", "--endpoint", ep, "--kind", "period_budget", "--tenant", "acme", "--thresholds", "50")

	out, _ := b.must(t, "alert", "events", "--tenant", "acme")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "EVENT") {
		t.Fatalf("events before any decision:\n%s", out)
	}
	_, err = store.Reserve(ctx, account.ReserveParams{TenantID: "acme", Actor: "key:t", Estimate: estimator.Estimate{Model: "gpt-4o",
		InputTokens: 300, OutputTokens: 300, Cost: 600, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}})
	if err != nil {
		t.Fatal(err)
	}

	out, _ = b.must(t, "alert", "events", "--tenant", "acme")
	m := regexp.MustCompile(`(?m)^(evt_\w+)\s+acme\s+budget\.threshold_crossed\s+pending\s+\S+\s+50%: 600/1000 used\s+` + ep + `\s+-$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("events:\n%s", out)
	}
	id := m[1]
	if out, _ := b.must(t, "alert", "events", "--tenant", "acme", "--state", "delivered"); strings.Contains(out, id) {
		t.Fatalf("a pending event listed as delivered:\n%s", out)
	}
	if out, _ := b.must(t, "alert", "events", "--tenant", "beta"); strings.Contains(out, id) {
		t.Fatalf("another tenant's events:\n%s", out)
	}
	for _, bad := range [][]string{{"--state", "lost"}, {"--limit", "0"}, {"--limit", "5000"}} {
		if _, _, err := b.cli(t, append([]string{"alert", "events"}, bad...)...); err == nil {
			t.Errorf("events %v succeeded", bad)
		}
	}
	_, _, err = b.cli(t, "alert", "redeliver", id)
	if !errors.Is(err, alert.ErrNotFound) || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("redeliver a pending event: %v", err)
	}

	// The dispatcher gave up after two attempts (written here as it would).
	if _, err := b.pool.Exec(ctx, `
		WITH v AS (UPDATE alert_events SET state = 'failed', attempts = 2 WHERE id = $1 RETURNING id)
		INSERT INTO alert_attempts (event_id, attempt, replica, started_at, finished_at, outcome, status_code, error, duration_ms)
		SELECT id, n, 'r1', now(), now(), 'failed', s, e, 120
		FROM v, (VALUES (1, 503, 'answered 503:'||E'\n'||'upstream down'), (2, NULL, 'dial tcp: connection refused')) AS a(n, s, e)`, id); err != nil {
		t.Fatal(err)
	}
	out, _ = b.must(t, "alert", "events", "--state", "failed")
	if !regexp.MustCompile(`(?m)^`+id+`\s.*\sfailed\s.*#1 failed 503 120ms: answered 503: upstream down$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^\s+#2 failed 120ms: dial tcp: connection refused$`).MatchString(out) {
		t.Fatalf("failed events:\n%s", out)
	}
	out, _ = b.must(t, "alert", "events", "--json")
	var events []alert.Event
	if err := json.Unmarshal([]byte(out), &events); err != nil || len(events) != 1 || len(events[0].Log) != 2 || events[0].Type != alert.TypeThresholdCrossed {
		t.Fatalf("events --json: %s (%v)", out, err)
	}

	b.must(t, "alert", "redeliver", id)
	if out, _ := b.must(t, "alert", "events", "--state", "pending"); !strings.Contains(out, id) {
		t.Fatalf("redelivered event not pending:\n%s", out)
	}
	if _, _, err := b.cli(t, "alert", "redeliver", "evt_nosuch"); !errors.Is(err, alert.ErrNotFound) {
		t.Fatalf("redeliver an unknown event: %v", err)
	}
}

// TestServeAlertPolicy: serve's --alert-allow-http and
// --alert-allow-private (and their variables) reach the store its
// dispatcher delivers with; without them both are off.
func TestServeAlertPolicy(t *testing.T) {
	t.Parallel()
	for _, want := range []alert.Policy{{}, {AllowHTTP: true}, {AllowPrivate: true}, {AllowHTTP: true, AllowPrivate: true}} {
		s, err := alertFlags{AllowHTTP: want.AllowHTTP, AllowPrivate: want.AllowPrivate}.store(nil)
		if err != nil || s.Policy != want {
			t.Errorf("flags %+v: store policy %+v, %v", want, s.Policy, err)
		}
	}
	f, _ := reflect.TypeFor[alertFlags]().FieldByName("AllowPrivate")
	if f.Tag.Get("name") != "alert-allow-private" || f.Tag.Get("env") != "TOKENGATE_ALERT_ALLOW_PRIVATE" {
		t.Errorf("AllowPrivate's flag: %s", f.Tag)
	}
}
