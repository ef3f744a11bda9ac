package admission_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

func modelRequest(tenant, keyID, model string, cost int64) admission.Request {
	r := request(tenant, cost, 0)
	r.Estimate.Model = model
	r.KeyID = keyID
	return r
}

// TestModelScopes: an organisation may use gpt-* and claude-*, its team
// only gpt-4o*, and the team's key only gpt-4o-mini. Each scope refuses
// what it does not list (a key cannot widen its tenant, nor a child its
// parent), naming the scope that refused; a refusal debits nothing, adds
// no ledger entry and is counted as rejected by model_scope.
func TestModelScopes(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	lim := rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "org", Limits: lim}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "team", Parent: "org", Limits: lim}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetModels(ctx, account.SetModelsParams{TenantID: "org", Models: []string{"gpt-*", "claude-*"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetModels(ctx, account.SetModelsParams{TenantID: "team", Models: []string{"gpt-4o*", "o3"}}); err != nil {
		t.Fatal(err)
	}
	k, _, err := credential.KeyCreateRecorded(ctx, store, "team", []string{"gpt-4o-mini", "claude-*"}, "alice")
	if err != nil {
		t.Fatal(err)
	}
	open, _, err := credential.KeyCreateRecorded(ctx, store, "team", nil, "alice")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	a := admission.New(admission.Config{Store: store, Pool: pool, Registerer: reg})
	for _, tc := range []struct {
		key, model   string
		scope, level string // "" admitted
	}{
		{k.ID, "gpt-4o-mini", "", ""},
		{k.ID, "gpt-4o", "key", ""},                   // the team allows it, the key does not
		{k.ID, "claude-sonnet-4-5", "tenant", "team"}, // the key lists it, the team does not
		{open.ID, "gpt-4o", "", ""},                   // an open key: the team's scope
		{open.ID, "o3", "tenant", "org"},              // the team lists it, its parent does not
		{"", "gpt-4o-2024-08-06", "", ""},             // no key: the tenants' scopes
		{"", "gemini-2.0-flash", "tenant", "org"},
	} {
		before := snapshotTokens(t, store, "team", "org")
		seq := ledgerSeq(t, store, "team")
		r, _, err := a.Reserve(ctx, modelRequest("team", tc.key, tc.model, 10))
		if tc.scope == "" {
			if err != nil {
				t.Fatalf("%s with key %q: %v, want admitted", tc.model, tc.key, err)
			}
			if _, _, err := a.Release(ctx, admission.FaceAPI, account.ReleaseParams{TenantID: "team", AdmissionID: r.AdmissionID}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var mna *rule.ModelNotAllowedError
		if !errors.As(err, &mna) || mna.Scope != tc.scope || mna.Level != tc.level || mna.Model != tc.model || mna.FieldOr() != "model" {
			t.Fatalf("%s with key %q: %v, want refused by the %s scope of %q", tc.model, tc.key, err, tc.scope, tc.level)
		}
		if after := snapshotTokens(t, store, "team", "org"); after != before {
			t.Fatalf("%s: balances %v after a refusal, %v before: something was debited", tc.model, after, before)
		}
		if got := ledgerSeq(t, store, "team"); got != seq {
			t.Fatalf("%s: the refusal wrote ledger entries (seq %d -> %d)", tc.model, seq, got)
		}
	}
	if n := testutil.ToFloat64(admissionCounter(t, reg, "rejected", "model_scope")); n != 4 {
		t.Fatalf("tokengate_admissions_total{outcome=rejected,limit=model_scope} = %v, want 4", n)
	}
}

func snapshotTokens(t *testing.T, store *account.Store, ids ...string) [2]int64 {
	t.Helper()
	var out [2]int64
	for i, id := range ids[:2] {
		s, err := store.TenantSnapshot(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = s.OpenReservations*1_000_000_000 + s.Tokens()
	}
	return out
}

func ledgerSeq(t *testing.T, store *account.Store, id string) int64 {
	t.Helper()
	s, err := store.TenantSnapshot(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return s.LedgerSeq
}

// admissionCounter is tokengate_admissions_total's series of the API face.
func admissionCounter(t *testing.T, reg *prometheus.Registry, outcome, limit string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	for _, mf := range mfs {
		if mf.GetName() != "tokengate_admissions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["outcome"] == outcome && labels["limit"] == limit {
				c.Add(m.GetCounter().GetValue())
			}
		}
	}
	return c
}

// TestModelScopeChangesWhileAdmitting: administrators switch a key's scope
// between two lists while many callers admit on the key with models of
// either. Every admission's model was allowed by the list in effect in its
// transaction: walking the tenant's ledger in order, each reserve entry's
// model passes the list the last key_models entry before it set; every
// call admitted has its entry, and every call refused was refused by the
// key's scope.
func TestModelScopeChangesWhileAdmitting(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
	store := account.NewStore(pool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme",
		Limits: rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro}}); err != nil {
		t.Fatal(err)
	}
	lists := [][]string{{"gpt-4o*"}, {"claude-*", "o3"}}
	k, _, err := credential.KeyCreateRecorded(ctx, store, "acme", lists[0], "admin")
	if err != nil {
		t.Fatal(err)
	}
	a := admission.New(admission.Config{Store: store, Pool: pool})
	models := []string{"gpt-4o", "gpt-4o-mini", "claude-sonnet-4-5", "o3"}

	const callers, perCaller, changes = 12, 25, 40
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers+1)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perCaller {
				m := models[(c+i)%len(models)]
				_, _, err := a.Reserve(ctx, modelRequest("acme", k.ID, m, 1))
				var mna *rule.ModelNotAllowedError
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.As(err, &mna) && mna.Scope == "key" && mna.Model == m:
					refused.Add(1)
				default:
					errs <- fmt.Errorf("%s: %w", m, err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range changes {
			if _, err := credential.KeySetModelsRecorded(ctx, store, "acme", k.ID, lists[(i+1)%2], "admin"); err != nil {
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if admitted.Load()+refused.Load() != callers*perCaller {
		t.Fatalf("%d admitted + %d refused, want %d calls", admitted.Load(), refused.Load(), callers*perCaller)
	}

	entries, err := ledger.EntryList(ctx, pool, "acme", 0, 100_000)
	if err != nil {
		t.Fatal(err)
	}
	var current []string // before the key's entries: no key
	var reserves, switches int64
	for _, e := range entries {
		switch e.Kind {
		case ledger.KindTenant:
			var d struct {
				Event  string          `json:"event"`
				KeyID  string          `json:"key_id"`
				Models json.RawMessage `json:"models"`
			}
			if err := json.Unmarshal([]byte(e.Detail), &d); err != nil {
				t.Fatalf("entry %d: %v", e.Seq, err)
			}
			switch d.Event {
			case "key_created":
				if err := json.Unmarshal(d.Models, &current); err != nil {
					t.Fatalf("entry %d: %v", e.Seq, err)
				}
			case "key_models":
				var ch struct{ Before, After []string }
				if err := json.Unmarshal(d.Models, &ch); err != nil {
					t.Fatalf("entry %d: %v", e.Seq, err)
				}
				if !slices.Equal(ch.Before, current) {
					t.Fatalf("entry %d: the change says the list was %q, the ledger had %q", e.Seq, ch.Before, current)
				}
				current = ch.After
				switches++
			}
		case ledger.KindReserve:
			reserves++
			if current == nil || !rule.ModelsAllow(current, e.Model) {
				t.Fatalf("entry %d: %s admitted while the key's list was %q", e.Seq, e.Model, current)
			}
		}
	}
	if reserves != admitted.Load() || switches != changes {
		t.Fatalf("ledger: %d reserves, %d scope changes; want %d admitted, %d changes", reserves, switches, admitted.Load(), changes)
	}
	if admitted.Load() == 0 || refused.Load() == 0 {
		t.Fatalf("%d admitted, %d refused: the scope never bound either way", admitted.Load(), refused.Load())
	}
}
