package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/credential"
)

// TestWindowZoneOnlySomeHostsHaveIsRefused: a window's zone must be in the
// zone database built into tokengate, not merely on the host that takes
// the limits change: right/UTC, posix/ names and localtime are a 400
// naming the field, on any host (budget's TestWindowZonesIgnoreTheHostsZoneinfo
// shows the host's zoneinfo is never read), and nothing changes.
func TestWindowZoneOnlySomeHostsHaveIsRefused(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "alice")
	if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants", `{"id":"acme","tokens_capacity":1000,"tokens_per_second":10}`); r.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Code, r.Body)
	}
	for _, zone := range []string{"right/UTC", "posix/Europe/Paris", "localtime", "right/Europe/Paris"} {
		r := b.adminCall(t, token, http.MethodPatch, "/v1/admin/tenants/acme/limits",
			`{"windows":[{"name":"daily","unit":"day","time_zone":"`+zone+`","tokens":500}]}`)
		if e := r.errorBody().Error; r.Code != http.StatusBadRequest || e.Field != "windows[0].time_zone" {
			t.Fatalf("time_zone %s: %d %s, want a 400 naming windows[0].time_zone", zone, r.Code, r.Body)
		}
		if r = b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants", `{"id":"other","tokens_capacity":1000,"tokens_per_second":10,
			"windows":[{"name":"daily","unit":"day","time_zone":"`+zone+`","tokens":500}]}`); r.Code != http.StatusBadRequest {
			t.Fatalf("create with time_zone %s: %d %s, want a 400", zone, r.Code, r.Body)
		}
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM tenants WHERE windows IS NOT NULL`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d tenants with windows (%v), want none", n, err)
	}
}

// TestStoredZoneThisBuildCannotLoadStillAdmits: a zone an older build
// accepted from its host's zoneinfo (right/, posix/) or one only a newer
// build's database has is already in the tenants row: the tenant's
// requests are still decided (not a 400 to every request, forever).
// right/X and posix/X count as X; an unknown name keeps its name and
// counts in UTC; the tenant's next change of windows names a known zone.
func TestStoredZoneThisBuildCannotLoadStillAdmits(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "alice")
	if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants", `{"id":"acme","tokens_capacity":100000,"tokens_per_second":10,
		"windows":[{"name":"daily","unit":"day","time_zone":"Europe/Paris","tokens":50000},
		           {"name":"weekly","unit":"week","time_zone":"Europe/Paris","tokens":90000}]}`); r.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Code, r.Body)
	}
	// As an older build on a host with zoneinfo stored them.
	if _, err := b.pool.Exec(ctx, `UPDATE tenants SET windows = jsonb_set(jsonb_set(windows,
		'{0,time_zone}', '"Mars/Olympus"'), '{1,time_zone}', '"right/Europe/Paris"') WHERE id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, b.pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi")); r.Code != http.StatusCreated {
			t.Fatalf("admission %d under stored zones: %d %s", i, r.Code, r.Body)
		}
	}
	if r := b.call(t, key, http.MethodGet, "/v1/budget", ""); r.Code != http.StatusOK {
		t.Fatalf("budget: %d %s", r.Code, r.Body)
	}
	r := b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants/acme", nil)
	if r.Code != http.StatusOK || !strings.Contains(r.Body.String(), `"time_zone":"Mars/Olympus"`) ||
		!strings.Contains(r.Body.String(), `"time_zone":"Europe/Paris"`) {
		t.Fatalf("tenant: %d %s, want the windows in Mars/Olympus (kept) and Europe/Paris (right/ dropped)", r.Code, r.Body)
	}
	// A change of other limits keeps working.
	if r := b.adminCall(t, token, http.MethodPatch, "/v1/admin/tenants/acme/limits", `{"tokens_per_second":20}`); r.Code != http.StatusOK {
		t.Fatalf("limits change: %d %s", r.Code, r.Body)
	}
}
