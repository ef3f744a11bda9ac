package outage_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/outage"
	"github.com/tokengate/tokengate/budget/rule"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestSpoolRecordFormat pins the spool's line format: records spooled by a
// replica must replay after an upgrade, so a change here must stay
// readable (add fields; never rename one). The lines of older records stay
// byte for byte what they were: new fields are omitted when empty.
func TestSpoolRecordFormat(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 3, 10, 0, 0, 123456000, time.UTC)
	est := account.StoredEstimate{Model: "gpt-4o", Family: "gpt-4o", InputTokens: 9, OutputTokens: 100, Cost: 109,
		InputWeightMicro: 1_000_000, OutputWeightMicro: 1_000_000}
	records := []outage.Record{
		{Kind: outage.KindReserve, AdmissionID: "adm_a", TenantID: "acme", Estimate: &est, CreatedAt: at, ExpiresAt: at.Add(10 * time.Minute),
			Actor: "key:abc", IdempotencyKey: "k-1", RequestHash: []byte{1, 2, 3}, Response: json.RawMessage(`{"admission_id":"adm_a"}`)},
		{Kind: outage.KindSettle, AdmissionID: "adm_a", TenantID: "acme", CreatedAt: at, InputTokens: 9, OutputTokens: 20, Actor: "key:abc"},
		{Kind: outage.KindRelease, AdmissionID: "adm_b", TenantID: "acme", CreatedAt: at, Actor: "key:abc"},
		// Settles and releases naming their admission by idempotency key,
		// with usage stated as cached input or as a refund.
		{Kind: outage.KindSettle, TenantID: "acme", IdempotencyKey: "rls:r-1", CreatedAt: at, InputTokens: 40, CachedInputTokens: 30,
			OutputTokens: 20, Actor: "gateway:edge"},
		{Kind: outage.KindSettle, TenantID: "acme", IdempotencyKey: "rls:r-2", CreatedAt: at, RefundTokens: 7, Actor: "gateway:edge"},
		{Kind: outage.KindRelease, TenantID: "acme", IdempotencyKey: "rls:r-3", CreatedAt: at, Actor: "gateway:edge"},
		// A settle by key with the request's failure policy, as far as the
		// replica knew it, for a replay that finds no admission yet.
		{Kind: outage.KindSettle, TenantID: "acme", IdempotencyKey: "rls:r-4", CreatedAt: at, InputTokens: 6, Actor: "gateway:edge",
			Defer: &account.Deferral{Model: rule.PolicyLocal, Default: rule.PolicyReject}},
		// A settle whose output was partly reasoning.
		{Kind: outage.KindSettle, AdmissionID: "adm_c", TenantID: "acme", CreatedAt: at, InputTokens: 9, OutputTokens: 20, ReasoningTokens: 12,
			Actor: "key:abc"},
		// A reserve through the proxy, which only the proxy may end, its
		// key in the proxy's namespace.
		{Kind: outage.KindReserve, AdmissionID: "adm_d", TenantID: "acme", Estimate: &est, CreatedAt: at, ExpiresAt: at.Add(10 * time.Minute),
			Actor: "proxy:key:abc", IdempotencyKey: "k-2", RequestHash: []byte{4}, Response: json.RawMessage(`{"admission_id":"adm_d"}`), Face: rule.FaceProxy},
	}
	var got bytes.Buffer
	for _, r := range records {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got.Write(append(line, '\n'))
	}
	path := filepath.Join("testdata", "spool_records.jsonl")
	if *update {
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("the spool's record format changed:\ngot:\n%s\nwant:\n%s", got.Bytes(), want)
	}
	for i, line := range bytes.Split(bytes.TrimSpace(want), []byte("\n")) {
		var r outage.Record
		if err := json.Unmarshal(line, &r); err != nil || !reflect.DeepEqual(r, records[i]) {
			t.Fatalf("line %d reads back as %+v (%v)", i+1, r, err)
		}
	}
}
