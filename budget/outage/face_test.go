package outage_test

import (
	"errors"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/outage"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestOutageKeepsTheFace: during an outage, an admission the proxy made on
// this replica cannot be ended through the API (refused at once, nothing
// journaled); a key sent through the API and the proxy makes two
// admissions; the replay keeps each admission's face, so the store refuses
// the API's release after it too, and the proxy's settle charges the real
// usage. A release through the API of an admission the store made for the
// proxy, journaled while the store was away, is skipped at the replay,
// not applied.
func TestOutageKeepsTheFace(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1}, 1)
	stored := rp(est(100), "")
	stored.Face = rule.FaceProxy
	fromStore, err := b.store.Reserve(ctx, stored) // before the outage
	if err != nil {
		t.Fatal(err)
	}

	viaProxy := rp(est(200), "call-1")
	viaProxy.Face = rule.FaceProxy
	r, err := b.local.Reserve(b.snap, viaProxy)
	if err != nil {
		t.Fatal(err)
	}
	viaAPI, err := b.local.Reserve(b.snap, rp(est(10), "call-1"))
	if err != nil || viaAPI.Replayed || viaAPI.AdmissionID == r.AdmissionID {
		t.Fatalf("the API's admission under the proxy's key: %+v %v", viaAPI, err)
	}
	var of *rule.OtherFaceError
	if err := b.local.Release(account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID, Actor: "key:k"}); !errors.As(err, &of) || of.Face != rule.FaceProxy {
		t.Fatalf("the API's release of the proxy's local admission: %v", err)
	}
	// Of the store's admission this replica knows nothing: journaled, and
	// left to the store at the replay.
	if err := b.local.Release(account.ReleaseParams{TenantID: "acme", AdmissionID: fromStore.AdmissionID, Actor: "key:k"}); err != nil {
		t.Fatal(err)
	}
	recs, err := b.local.Spool.Records()
	if err != nil || len(recs) != 3 || recs[0].Face != rule.FaceProxy || recs[1].Face != rule.FaceAPI || recs[2].Face != rule.FaceAPI {
		t.Fatalf("spool: %+v %v", recs, err)
	}

	rep, err := b.local.Replay(ctx, b.store)
	if err != nil || rep.Reserved != 2 || rep.Skipped != 1 || rep.Rejected != 0 {
		t.Fatalf("replay: %+v %v", rep, err)
	}
	for id, face := range map[string]rule.Face{r.AdmissionID: rule.FaceProxy, viaAPI.AdmissionID: rule.FaceAPI, fromStore.AdmissionID: rule.FaceProxy} {
		if a, err := b.store.AdmissionGet(ctx, "acme", id); err != nil || a.Face != face || a.State != account.StateReserved {
			t.Fatalf("after the replay, admission %s: %+v %v; want open, of the %s face", id, a, err, face)
		}
	}
	if _, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID}); !errors.Is(err, rule.ErrOtherFace) {
		t.Fatalf("the API's release of the replayed admission: %v", err)
	}
	// The proxy's retry of its key finds its own admission, in its namespace.
	again, err := b.store.Reserve(ctx, viaProxy)
	if err != nil || !again.Replayed || again.AdmissionID != r.AdmissionID {
		t.Fatalf("the proxy's retry after the replay: %+v %v", again, err)
	}
	for _, id := range []string{r.AdmissionID, fromStore.AdmissionID} {
		if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: id, InputTokens: 20, OutputTokens: 30, Face: rule.FaceProxy}); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil || snap.TokensMicro != (1000-50-50-10)*rule.Micro {
		t.Fatalf("balance %d micro-tokens (%v); want 1000 less 50, 50 and the API's open 10", snap.TokensMicro, err)
	}
}

// TestRecordFaceOfOlderRecords: a record spooled before faces were told
// apart has none; its face is the one its actor names, so that its replay
// finds its keys and its admission's owner where the migration put them.
func TestRecordFaceOfOlderRecords(t *testing.T) {
	t.Parallel()
	for actor, want := range map[string]rule.Face{"key:abc": rule.FaceAPI, "proxy:key:abc": rule.FaceProxy,
		"gateway:edge": rule.FaceRLS, "": rule.FaceAPI, "replica:r1": rule.FaceAPI} {
		if got := (outage.Record{Actor: actor}).FaceOf(); got != want {
			t.Errorf("actor %q: face %q, want %q", actor, got, want)
		}
	}
	if got := (outage.Record{Actor: "key:abc", Face: rule.FaceRLS}).FaceOf(); got != rule.FaceRLS {
		t.Errorf("a record's own face: %q", got)
	}
}
