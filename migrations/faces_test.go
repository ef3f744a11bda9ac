package migrations_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestAdmissionsLearnTheirFace: open admissions of the proxy, a gateway
// and the API, their live Idempotency-Keys and a gateway's kept stream end,
// as the release before wrote them, are upgraded (00019): each admission
// gets the face its reserve entry's actor names, the proxy's and the
// gateway's keys move into their faces' namespaces, and they all work as
// before for the face that made them, and for no other.
func TestAdmissionsLearnTheirFace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, m := migratorAt(t, 18)
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	hash := bytes.Repeat([]byte{7}, 32)
	response := func(id string) []byte {
		r, err := account.EncodeReservation(&account.Reservation{AdmissionID: id, Estimate: estimatorEstimate(100), CreatedAt: now, ExpiresAt: now.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, reservation_ttl_ms, tokens_micro, tokens_at, created_at, ledger_seq, ledger_hash, open_reservations)
		  VALUES ('acme', 100000, 1000000, 3600000, 99700000000, $1, $1, 3, $2, 3)`, []any{now, hash}},
		{`INSERT INTO admissions (id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate, input_weight_micro, output_weight_micro,
		                         created_at, expires_at)
		  VALUES ('adm_proxy', 'acme', 'reserved', 'gpt-4o', 100, 0, 100, false, 1000000, 1000000, $1, $2),
		         ('adm_gateway', 'acme', 'reserved', 'gpt-4o', 100, 0, 100, false, 1000000, 1000000, $1, $2),
		         ('adm_api', 'acme', 'reserved', 'gpt-4o', 100, 0, 100, false, 1000000, 1000000, $1, $2)`, []any{now, now.Add(time.Hour)}},
		{`INSERT INTO ledger_entries (tenant_id, seq, kind, created_at, admission_id, model, estimate, refill_micro, delta_micro, balance_micro,
		                             period_used, actor, prev_hash, hash)
		  VALUES ('acme', 1, 'reserve', $1, 'adm_proxy', 'gpt-4o', 100, 0, -100000000, 99900000000, 0, 'proxy:key:k1', '\x', $2),
		         ('acme', 2, 'reserve', $1, 'adm_gateway', 'gpt-4o', 100, 0, -100000000, 99800000000, 0, 'gateway:envoy-1', $2, $2),
		         ('acme', 3, 'reserve', $1, 'adm_api', 'gpt-4o', 100, 0, -100000000, 99700000000, 0, 'key:k1', $2, $2)`, []any{now, hash}},
		{`INSERT INTO idempotency_keys (tenant_id, key, admission_id, request_hash, response, created_at)
		  VALUES ('acme', 'call-1', 'adm_proxy', '\x01', $2, $1), ('acme', 'rls:req-1', 'adm_gateway', '\x02', '\x', $1),
		         ('acme', 'k-api', 'adm_api', '\x03', $3, $1)`, []any{now, response("adm_proxy"), response("adm_api")}},
		{`INSERT INTO deferred_settles (tenant_id, key, kind, input_tokens, actor, gateway_id, created_at)
		  VALUES ('acme', 'rls:req-2', 'settle', 40, 'gateway:envoy-1', 'gw_1', $1)`, []any{now}},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}

	var keys, deferred []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(key ORDER BY key) FROM idempotency_keys`).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT array_agg(key) FROM deferred_settles`).Scan(&deferred); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 || keys[0] != "k-api" || keys[1] != "proxy call-1" || keys[2] != "rls rls:req-1" || len(deferred) != 1 || deferred[0] != "rls rls:req-2" {
		t.Fatalf("keys %q, kept stream ends %q", keys, deferred)
	}

	store := account.NewStore(pool).WithClock(func() time.Time { return now }) // no refill
	for id, face := range map[string]rule.Face{"adm_proxy": rule.FaceProxy, "adm_gateway": rule.FaceRLS, "adm_api": rule.FaceAPI} {
		if a, err := store.AdmissionGet(ctx, "acme", id); err != nil || a.Face != face {
			t.Fatalf("%s: %+v %v; want the %s face", id, a, err, face)
		}
	}
	// Each face's retry of its key finds its admission.
	for _, c := range []struct {
		face      rule.Face
		key, id   string
		hash      byte
		replayNow bool // the gateway's keys keep no answer
	}{
		{rule.FaceProxy, "call-1", "adm_proxy", 1, false},
		{rule.FaceRLS, "rls:req-1", "adm_gateway", 2, true},
		{rule.FaceAPI, "k-api", "adm_api", 3, false},
	} {
		r, err := store.Reserve(ctx, account.ReserveParams{TenantID: "acme", Estimate: estimatorEstimate(100), IdempotencyKey: c.key,
			RequestHash: []byte{c.hash}, ReplayNow: c.replayNow, Face: c.face})
		if err != nil || !r.Replayed || r.AdmissionID != c.id {
			t.Fatalf("the %s face's retry of %s: %+v %v; want %s", c.face, c.key, r, err, c.id)
		}
	}
	// Only the face that made it ends it.
	if _, err := store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: "adm_proxy"}); !errors.Is(err, rule.ErrOtherFace) {
		t.Fatalf("the API's release of the proxy's admission: %v", err)
	}
	if _, err := store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: "adm_proxy", InputTokens: 60, Face: rule.FaceProxy}); err != nil {
		t.Fatal(err)
	}
	st, err := store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: "rls:req-1", InputTokens: 30, Face: rule.FaceRLS})
	if err != nil || st.Admission.ID != "adm_gateway" {
		t.Fatalf("the gateway's stream end: %+v %v", st, err)
	}
	if _, err := store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: "adm_api"}); err != nil {
		t.Fatal(err)
	}
	var micro int64
	if err := pool.QueryRow(ctx, `SELECT tokens_micro FROM tenants WHERE id = 'acme'`).Scan(&micro); err != nil || micro != (100_000-60-30)*rule.Micro {
		t.Fatalf("balance %d (%v); want 100,000 less the 60 and 30 used", micro, err)
	}
}
