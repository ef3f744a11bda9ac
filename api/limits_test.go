package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tokengate/tokengate/budget/replica"
)

// TestConcurrentLimitPatchesLoseNothing: admins patch different fields of
// one tenant at once through two replicas on one database, round after
// round. Every round's four values are all there afterwards, and the
// ledger holds exactly one limits entry per patch.
func TestConcurrentLimitPatchesLoseNothing(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	other, _ := newServer(t, &testConfig{replicaConfig: replica.Config{DB: pgtestPool(t, b)}})
	replicas := []http.Handler{b.srv, other}
	b.tenant(t, "acme", lim(1000, "1"))
	token := b.admin(t, "ops")

	const rounds = 30
	for r := range rounds {
		bodies := []string{
			fmt.Sprintf(`{"tokens_capacity":%d}`, 2000+r),
			fmt.Sprintf(`{"max_concurrent":%d}`, 10+r),
			fmt.Sprintf(`{"reservation_ttl_ms":%d}`, 60_000+r),
			fmt.Sprintf(`{"max_wait_ms":%d}`, 1_000+r),
		}
		codes := make([]int, len(bodies))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, body := range bodies {
			wg.Go(func() {
				<-start
				req := httptest.NewRequest(http.MethodPatch, "/v1/admin/tenants/acme/limits", strings.NewReader(body))
				req.RemoteAddr = "192.0.2.10:5555"
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				replicas[(i+r)%2].ServeHTTP(rec, req)
				codes[i] = rec.Code
			})
		}
		close(start)
		wg.Wait()
		for i, code := range codes {
			if code != http.StatusOK {
				t.Fatalf("round %d, %s: %d", r, bodies[i], code)
			}
		}
		var got tenantLimitsJSON
		b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants/acme", nil).json(&got)
		l := got.Limits
		if l.TokensCapacity != int64(2000+r) || l.MaxConcurrent == nil || *l.MaxConcurrent != int64(10+r) ||
			l.ReservationTTLMS != int64(60_000+r) || l.MaxWaitMS != int64(1_000+r) {
			t.Fatalf("round %d: limits %+v (max_concurrent %v), want tokens_capacity %d, max_concurrent %d, reservation_ttl_ms %d, max_wait_ms %d",
				r, l, l.MaxConcurrent, 2000+r, 10+r, 60_000+r, 1_000+r)
		}
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'limits'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 4*rounds {
		t.Fatalf("%d limits entries, want one per patch: %d", n, 4*rounds)
	}
}

type tenantLimitsJSON struct {
	Limits struct {
		TokensCapacity     int64       `json:"tokens_capacity"`
		TokensPerSecond    json.Number `json:"tokens_per_second"`
		RequestsCapacity   *int64      `json:"requests_capacity"`
		MaxConcurrent      *int64      `json:"max_concurrent"`
		PeriodBudget       *int64      `json:"period_budget"`
		Period             *string     `json:"period"`
		ReservationTTLMS   int64       `json:"reservation_ttl_ms"`
		MaxWaitMS          int64       `json:"max_wait_ms"`
		OnStoreUnavailable *string     `json:"on_store_unavailable"`
		Shadow             []string    `json:"shadow"`
	} `json:"limits"`
}

// TestLimitBoundsNameTheField: values out of range, huge ones that would
// overflow a time.Duration, and 0 for an optional limit (which used to
// remove it) are each a 400 naming the field, on the patch and on create,
// and change nothing. Null removes an optional limit or restores a timing
// default.
func TestLimitBoundsNameTheField(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "ops")
	l := lim(1000, "1")
	l.MaxConcurrent, l.RequestsCapacity, l.RequestsRateMicro = 4, 10, 1_000_000
	b.tenant(t, "acme", l)

	const huge = 1<<58 + 60_000
	for _, tc := range []struct {
		body  string
		field string
	}{
		{fmt.Sprintf(`{"reservation_ttl_ms":%d}`, int64(huge)), "reservation_ttl_ms"},
		{fmt.Sprintf(`{"max_wait_ms":%d}`, int64(huge)), "max_wait_ms"},
		{`{"reservation_ttl_ms":999}`, "reservation_ttl_ms"},
		{`{"reservation_ttl_ms":604800001}`, "reservation_ttl_ms"},
		{`{"reservation_ttl_ms":0}`, "reservation_ttl_ms"},
		{`{"max_wait_ms":0}`, "max_wait_ms"},
		{`{"max_wait_ms":600001}`, "max_wait_ms"},
		{`{"reservation_ttl_ms":1e20}`, "reservation_ttl_ms"},
		{`{"max_concurrent":0}`, "max_concurrent"},
		{`{"max_concurrent":-5}`, "max_concurrent"},
		{`{"max_concurrent":2147483648}`, "max_concurrent"},
		{`{"requests_capacity":0}`, "requests_capacity"},
		{`{"requests_per_second":0}`, "requests_per_second"},
		{`{"period_budget":0,"period":"day"}`, "period_budget"},
		{`{"tokens_capacity":null}`, "tokens_capacity"},
		{`{"tokens_per_second":null}`, "tokens_per_second"},
		{`{"tokens_capacity":9223372036854775807}`, "tokens_capacity"},
		{`{"period":"week","period_budget":5}`, "period"},
		{`{"on_store_unavailable":""}`, "on_store_unavailable"},
		{`{"requests_capacity":null,"requests_per_second":5}`, "requests_per_second"},
		{`{"shadow":"tokens"}`, "shadow"},
	} {
		r := b.adminCall(t, token, http.MethodPatch, "/v1/admin/tenants/acme/limits", tc.body)
		if r.Code != http.StatusBadRequest || r.errorBody().Error.Field != tc.field {
			t.Errorf("PATCH %s: %d %s, want 400 naming %s", tc.body, r.Code, r.Body, tc.field)
		}
		create := `{"id":"new","tokens_capacity":10,"tokens_per_second":1,` + strings.TrimPrefix(tc.body, "{")
		if strings.Contains(tc.body, "tokens_") {
			continue
		}
		if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants", create); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != tc.field {
			t.Errorf("POST %s: %d %s, want 400 naming %s", create, r.Code, r.Body, tc.field)
		}
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE kind = 'limits'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d limits entries after refused patches", n)
	}

	// The bounds themselves are accepted.
	r := b.adminCall(t, token, http.MethodPatch, "/v1/admin/tenants/acme/limits", `{"reservation_ttl_ms":604800000,"max_wait_ms":1}`)
	var got tenantLimitsJSON
	r.json(&got)
	if r.Code != http.StatusOK || got.Limits.ReservationTTLMS != 604_800_000 || got.Limits.MaxWaitMS != 1 {
		t.Fatalf("the bounds: %d %s", r.Code, r.Body)
	}
	// Null removes the optional limits and restores the timing defaults.
	r = b.adminCall(t, token, http.MethodPatch, "/v1/admin/tenants/acme/limits",
		`{"max_concurrent":null,"requests_capacity":null,"reservation_ttl_ms":null,"max_wait_ms":null}`)
	r.json(&got)
	if r.Code != http.StatusOK || got.Limits.MaxConcurrent != nil || got.Limits.RequestsCapacity != nil ||
		got.Limits.ReservationTTLMS != 600_000 || got.Limits.MaxWaitMS != 30_000 || got.Limits.TokensCapacity != 1000 {
		t.Fatalf("null: %d %s", r.Code, r.Body)
	}
}

// TestAdminBodiesRefuseTrailingData: an admin body followed by anything but
// white space (a second JSON value, stray bytes) is a 400 naming "body",
// as on the tenant routes, and is not applied.
func TestAdminBodiesRefuseTrailingData(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "ops")
	b.tenant(t, "acme", lim(1000, "1"))
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodPatch, "/v1/admin/tenants/acme/limits", `{"tokens_capacity":5}{"tokens_capacity":6}`},
		{http.MethodPatch, "/v1/admin/tenants/acme/limits", `{"tokens_capacity":5} garbage`},
		{http.MethodPatch, "/v1/admin/tenants/acme/limits", `{"tokens_capacity":5}]`},
		{http.MethodPost, "/v1/admin/tenants", `{"id":"x","tokens_capacity":5,"tokens_per_second":1} {}`},
		{http.MethodPost, "/v1/admin/tenants/acme/adjustments", `{"tokens":5,"reason":"x"}null`},
		{http.MethodPost, "/v1/admin/tenants/acme/disable", `{"reason":"x"} 1`},
	} {
		r := b.adminCall(t, token, tc.method, tc.path, tc.body)
		if r.Code != http.StatusBadRequest || r.errorBody().Error.Field != "body" {
			t.Errorf("%s %s %s: %d %s, want 400 naming body", tc.method, tc.path, tc.body, r.Code, r.Body)
		}
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE kind <> 'tenant' OR tenant_id <> 'acme'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d entries after refused bodies", n)
	}
	// Trailing white space is no data.
	if r := b.adminCall(t, token, http.MethodPatch, "/v1/admin/tenants/acme/limits", "{\"tokens_capacity\":5}\n  \t\n"); r.Code != http.StatusOK {
		t.Fatalf("trailing white space: %d %s", r.Code, r.Body)
	}
}
