package lease

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// The common group commits in one round trip. Each case the careful way
// reads for (a credential not read yet, a live Idempotency-Key or a
// forgotten one not purged yet, a key
// revoked or a gateway revoked since the journal read them, a lease that
// refuses) stops the group sent in one round trip, with nothing of it
// written, and the careful way answers it as before. The lease counts
// exactly what was journaled.
func TestJournalOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	jt := newJournalTest(t, "acme", "rival")
	pool, j := jt.pool, jt.j
	k, _, err := credential.KeyCreate(ctx, pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	gw, _, err := credential.GatewayCreate(ctx, pool, "edge", []string{"acme", "rival"})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	adm := func(key string, cost int64) Admission {
		n++
		return Admission{Admission: account.Admission{ID: fmt.Sprintf("a%d", n), TenantID: "acme",
			Estimate: estimator.Estimate{Model: "gpt-4o", Cost: cost}},
			CostMicro: cost * rule.Micro, KeyID: k.ID, GatewayID: gw.ID, IdempotencyKey: key, RequestHash: []byte(key)}
	}
	send := func(as ...Admission) []error { return jt.send(ctx, as...) }
	var want struct{ once, stopped, careful int64 }
	rounds := func(step string) {
		t.Helper()
		if got := [3]int64{j.rounds.once.Load(), j.rounds.stopped.Load(), j.rounds.careful.Load()}; got != [3]int64{want.once, want.stopped, want.careful} {
			t.Fatalf("%s: groups once, stopped, careful %v; want %v", step, got, [3]int64{want.once, want.stopped, want.careful})
		}
	}

	// Nothing read yet: the careful way, which reads the credentials.
	if errs := send(adm("k1", 10), adm("", 10)); errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	want.careful++
	rounds("the first group")
	// Then one round trip.
	if errs := send(adm("k2", 10), adm("", 10)); errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	want.once++
	rounds("the next group")
	// A retry of k1: its key is live, the guard stops the group, and the
	// careful way answers the retry as a replay and journals the other.
	var re *ReplayError
	if errs := send(adm("k1", 10), adm("", 10)); !errors.As(errs[0], &re) || re.AdmissionID != "a1" || errs[1] != nil {
		t.Fatalf("a retry with a live key: %v", errs)
	}
	want.stopped++
	want.careful++
	rounds("a live key")
	// k2 forgotten (older than 24 h) but not purged yet: the plain insert
	// stops the group, and the careful way deletes the old key and writes
	// it anew, naming the new admission: not a replay.
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = created_at - interval '25 hours' WHERE admission_id = 'a3'`); err != nil {
		t.Fatal(err)
	}
	if errs := send(adm("k2", 10)); errs[0] != nil {
		t.Fatalf("a forgotten key: %v", errs[0])
	}
	want.stopped++
	want.careful++
	rounds("a forgotten key")
	var named string
	if err := pool.QueryRow(ctx, `SELECT admission_id FROM idempotency_keys WHERE request_hash = 'k2'`).Scan(&named); err != nil || named != fmt.Sprintf("a%d", n) {
		t.Fatalf("the forgotten key names %q (%v); want a%d", named, err, n)
	}
	// The key revoked after the journal read it: the rules pass on what it
	// read, the check of the row's version stops the group, and the
	// careful way reads the revoke.
	if err := credential.KeyRevoke(ctx, pool, "acme", k.ID); err != nil {
		t.Fatal(err)
	}
	if errs := send(adm("", 10)); !errors.Is(errs[0], rule.ErrKeyRevoked) {
		t.Fatalf("the revoked key: %v", errs[0])
	}
	want.stopped++
	want.careful++
	rounds("a key revoked")
	// The revoke read, its group is refused the careful way at once.
	if errs := send(adm("", 10)); !errors.Is(errs[0], rule.ErrKeyRevoked) {
		t.Fatalf("the revoked key, known: %v", errs[0])
	}
	want.careful++
	rounds("a key known revoked")
	// Without the key: one round trip again.
	noKey := func(a Admission) Admission { a.KeyID = ""; return a }
	if errs := send(noKey(adm("", 10))); errs[0] != nil {
		t.Fatal(errs[0])
	}
	want.once++
	rounds("no key")
	// The gateway revoked since: stopped, then refused.
	if err := credential.GatewayRevoke(ctx, pool, gw.ID); err != nil {
		t.Fatal(err)
	}
	if errs := send(noKey(adm("", 10))); !errors.Is(errs[0], rule.ErrGatewayRevoked) {
		t.Fatalf("the revoked gateway: %v", errs[0])
	}
	want.stopped++
	want.careful++
	rounds("a gateway revoked")
	// A lease that refuses: 70 of its 500 tokens are used, and 450 more
	// would pass its slice.
	noGateway := func(a Admission) Admission { a.GatewayID = ""; return a }
	if errs := send(noGateway(noKey(adm("", 450)))); !errors.Is(errs[0], ErrOver) {
		t.Fatalf("past the slice: %v", errs[0])
	}
	want.stopped++
	want.careful++
	rounds("a lease that refuses")
	// An admission of another tenant on the lease: refused, never written
	// as acme's.
	theirs := noGateway(noKey(adm("", 10)))
	theirs.TenantID = "rival"
	if errs := send(theirs); errs[0] == nil {
		t.Fatal("an admission of rival journaled on a lease of acme")
	}
	want.stopped++
	want.careful++
	rounds("another tenant's admission")
	if errs := send(noGateway(noKey(adm("", 430)))); errs[0] != nil {
		t.Fatal(errs[0])
	}
	want.once++
	rounds("the rest of the slice")

	var used, rows, costs, keys int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT used_micro FROM leases WHERE id = $1),
		(SELECT count(*) FROM admissions WHERE lease_id = $1), (SELECT sum(cost) FROM admissions WHERE lease_id = $1),
		(SELECT count(*) FROM idempotency_keys WHERE tenant_id = 'acme')`, jt.lease.ID).Scan(&used, &rows, &costs, &keys); err != nil {
		t.Fatal(err)
	}
	if used != 500*rule.Micro || costs != 500 || rows != 8 || keys != 2 {
		t.Fatalf("lease used %d, %d rows costing %d, %d keys; want 500 tokens, 8 rows costing 500, 2 keys", used, rows, costs, keys)
	}
}
