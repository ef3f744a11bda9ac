package api_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/credential"
)

// TestAdminWindows: windows set through the admin API show with their span
// in the tenant's zone; a bad window is a 400 naming its field and changes
// nothing; a refusal by a window names it, with Retry-After the time to its
// reset; a money window without a price for the model refuses with a 400
// naming the model; removing the period budget removes its window only.
func TestAdminWindows(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "alice")
	r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants", `{"id":"acme","tokens_capacity":100000,"tokens_per_second":1000,
		"period_budget":1000000,"period":"month",
		"windows":[{"name":"hourly","unit":"hour","time_zone":"Asia/Kolkata","tokens":300},
		           {"name":"spend","unit":"day","time_zone":"America/New_York","reset_at":"06:00","money":"12.50","overage_percent":20,"thresholds":[80]}]}`)
	if r.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Code, r.Body)
	}
	var tj struct {
		Limits struct {
			PeriodBudget *int64            `json:"period_budget"`
			Windows      []json.RawMessage `json:"windows"`
		} `json:"limits"`
		Balances struct {
			Windows []struct {
				Name, Counts, Start, End, TimeZone string
				Limit, Ceiling, Used               json.Number
			} `json:"windows"`
		} `json:"balances"`
	}
	r.json(&tj)
	// The request made the "period" window of period_budget, after the two.
	if len(tj.Limits.Windows) != 3 || tj.Limits.PeriodBudget == nil || *tj.Limits.PeriodBudget != 1000000 {
		t.Fatalf("created: %s", r.Body)
	}
	var spend struct {
		Name, Counts, Start, End string
		TimeZone                 string `json:"time_zone"`
		Limit, Ceiling           json.Number
	}
	for _, w := range tj.Balances.Windows {
		if w.Name == "spend" {
			b, _ := json.Marshal(w)
			_ = json.Unmarshal(b, &spend)
		}
	}
	if spend.Counts != "money" || spend.Limit != "12.5" || spend.Ceiling != "15" ||
		!strings.HasSuffix(spend.Start, "T06:00:00-05:00") || !strings.HasSuffix(spend.End, "T06:00:00-05:00") {
		t.Fatalf("the money window's balance %+v in %s", spend, r.Body)
	}

	for _, bad := range []struct{ body, field string }{
		{`{"windows":[{"name":"x","unit":"fortnight","tokens":1}]}`, "windows[0].unit"},
		{`{"windows":[{"name":"x","unit":"day","time_zone":"Mars/Olympus","tokens":1}]}`, "windows[0].time_zone"},
		{`{"windows":[{"name":"x","unit":"day","reset_at":"25:00","tokens":1}]}`, "windows[0].reset_at"},
		{`{"windows":[{"name":"x","unit":"day","tokens":1,"money":"1"}]}`, "windows[0].tokens"},
		{`{"windows":[{"name":"x","unit":"day","money":"1.0000001"}]}`, "windows[0].money"},
		{`{"windows":[{"name":"x","unit":"day","tokens":5},{"name":"x","unit":"week","tokens":5}]}`, "windows[1].name"},
		{`{"windows":[{"name":"Bad Name","unit":"day","tokens":5}]}`, "windows[0].name"},
		{`{"windows":[{"name":"x","unit":"day","tokens":5,"overage_percent":1001}]}`, "windows[0].overage_percent"},
		{`{"windows":[{"name":"x","unit":"day","tokens":5,"thresholds":[0]}]}`, "windows[0].thresholds"},
		{`{"windows":[{"name":"x","unit":"day","tokens":5,"colour":"red"}]}`, "windows"},
	} {
		r := b.adminCall(t, token, http.MethodPatch, "/v1/admin/tenants/acme/limits", bad.body)
		if r.Code != http.StatusBadRequest || r.errorBody().Error.Field != bad.field {
			t.Fatalf("%s: %d %s, want a 400 naming %s", bad.body, r.Code, r.Body, bad.field)
		}
	}

	// The money window cannot count gpt-4o: it has no price yet.
	_, key, err := credential.KeyCreate(ctx, b.pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	r = b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi"))
	if r.Code != http.StatusBadRequest || r.errorBody().Error.Field != "model" {
		t.Fatalf("an unpriced model under a money window: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/prices", `{"model":"gpt-4o","input":"2.5","output":"10"}`); r.Code != http.StatusCreated {
		t.Fatalf("price: %d %s", r.Code, r.Body)
	}
	// 300 tokens an hour in Kolkata: the hour window refuses first.
	for {
		r = b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi"))
		if r.Code != http.StatusCreated {
			break
		}
	}
	e := r.errorBody().Error
	if r.Code != http.StatusTooManyRequests || e.Limit != "period_budget" || e.Window != "hourly" || e.RetryAfterMS == nil {
		t.Fatalf("beyond the hour window: %d %s", r.Code, r.Body)
	}
	// Kolkata is UTC+05:30: its hours start at :30 past a UTC hour.
	now := time.Now().UTC()
	reset := now.Truncate(time.Hour).Add(30 * time.Minute)
	if !reset.After(now) {
		reset = reset.Add(time.Hour)
	}
	if got := time.Duration(*e.RetryAfterMS) * time.Millisecond; got > reset.Sub(now)+time.Second || got < reset.Sub(now)-5*time.Second {
		t.Fatalf("retry after %s, want about %s (the next :30 UTC)", got, reset.Sub(now))
	}
	if ra, _ := strconv.Atoi(r.Header().Get("Retry-After")); int64(ra) != (*e.RetryAfterMS+999)/1000 {
		t.Fatalf("Retry-After %q, retry_after_ms %d", r.Header().Get("Retry-After"), *e.RetryAfterMS)
	}

	// Removing the period budget removes its window and keeps the others.
	r = b.adminCall(t, token, http.MethodPatch, "/v1/admin/tenants/acme/limits", `{"period_budget":null,"period":null}`)
	r.json(&tj)
	if r.Code != http.StatusOK || len(tj.Limits.Windows) != 2 || tj.Limits.PeriodBudget != nil {
		t.Fatalf("without the period budget: %d %s", r.Code, r.Body)
	}
}
