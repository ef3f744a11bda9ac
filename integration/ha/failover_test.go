//go:build ha

package ha_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/patroni"
)

// reject is the failure policy of every test: between the old primary and
// the new one, a replica answers 503 store_unavailable with a Retry-After,
// and decides nothing.
var reject = map[string]string{"TOKENGATE_ON_STORE_UNAVAILABLE": "reject"}

var roomy = rule.Limits{TokensCapacity: 1_000_000_000, TokensRateMicro: 1_000_000 * rule.Micro, OnStoreUnavailable: rule.PolicyReject}

// assertOnlyPolicy503s fails on any answer but 201 and the reject policy's
// 503s. A 500 here is tokengate treating a failover as a bug: a read-only
// error (SQLSTATE 25006) from a demoted node, or a connection dropped by
// its shutdown (57P01), must count as the store being unavailable
// (issue 26, the store's side). A transport error is a replica that hung
// for the client's 20 s timeout or died.
func assertOnlyPolicy503s(t *testing.T, tl tally) {
	t.Helper()
	if len(tl.unexpected) > 0 {
		t.Errorf("answers other than 201 and the reject policy's 503s: %v (of %d; expected ones: %v)", tl.unexpected, tl.total, tl.expected)
	}
}

// recovery describes the outage clients saw after t0: the first refusal,
// and the first 201 to a call sent after that refusal (writes are back).
func recovery(t *testing.T, l *load, t0 time.Time) (firstRefusal, back time.Duration) {
	t.Helper()
	var first time.Time
	for _, s := range l.snapshot() {
		if s.code != 201 && s.end.After(t0) && (first.IsZero() || s.end.Before(first)) {
			first = s.end
		}
	}
	if first.IsZero() {
		return 0, 0 // no call was refused
	}
	ok, found := l.firstCreatedAfter(first)
	if !found {
		t.Fatalf("no admission after the first refusal at +%s", first.Sub(t0))
	}
	return first.Sub(t0), ok.Sub(t0)
}

func verifyLedger(t *testing.T, c *cluster, tenant string) {
	t.Helper()
	out := c.ledgerVerify(c.replicas[0])
	if !strings.Contains(out, tenant) || strings.Contains(out, "BROKEN") {
		t.Fatalf("tokengate ledger verify:\n%s", out)
	}
}

// TestPrimaryKilledUnderLoad: 200 callers over two replicas, each
// admission with its own Idempotency-Key and retried with it until
// admitted; the primary is `docker kill`ed mid-load. Patroni promotes the
// synchronous standby once the dead leader's key expires (ttl 10 s), and
// the replicas' new connections find it through the multi-host URL. On the
// new primary afterwards: every admission answered 201 is there as
// answered, each key was charged once, and `tokengate ledger verify`
// passes. Between the kill and the new primary, the answers are the reject
// policy's 503s, never a 500.
func TestPrimaryKilledUnderLoad(t *testing.T) {
	c := newCluster(t, 2, reject)
	old := c.leader()
	key := c.tenant(c.pool(old), "acme", roomy)
	c.readsOnStandby(30 * time.Second)

	l := startLoad(t, c.replicas, key, "k", 200)
	time.Sleep(4 * time.Second)
	if n := l.createdSince(time.Time{}); n == 0 {
		l.finish()
		t.Fatalf("no admission before the kill: %+v", l.tally())
	}
	if err := c.ha.Kill(ctx, old); err != nil {
		t.Fatal(err)
	}
	killed := time.Now() // docker kill has returned: the primary's processes are gone
	t.Logf("killed the primary %s", old)
	next, promoted := c.promoted(old, 60*time.Second)
	waitFor(t, "an admission after the kill", 60*time.Second, func() bool {
		_, ok := l.firstCreatedAfter(killed)
		return ok
	}, nil)
	firstOK, _ := l.firstCreatedAfter(killed)
	time.Sleep(5 * time.Second) // load on the new primary
	l.finish()

	ms := c.waitHealthy(60*time.Second, old)
	leader := c.byRole(ms, "leader")
	if leader == old {
		t.Fatalf("the killed node %s still leads: %+v", old, ms)
	}
	tl := l.tally()
	assertOnlyPolicy503s(t, tl)
	checkLedger(t, c.pool(leader), "acme", l.final)
	verifyLedger(t, c, "acme")
	// The reads keep working after the failover, and go back to a
	// standby: when the standby they were on is the one promoted, the lag
	// check finds them on the primary and has the reads pool choose again.
	c.readsOnStandby(60 * time.Second)

	refused, back := recovery(t, l, killed)
	if leader != next {
		t.Fatalf("%s was promoted, but %s leads: %+v", next, leader, ms)
	}
	t.Logf("RECOVERY (primary killed): first 201 sent after the kill at +%s; Patroni promoted %s at +%s (first refusal +%s, writes back +%s); %d keys admitted once each; answers %v",
		firstOK.Sub(killed).Round(10*time.Millisecond), next, promoted.Sub(killed).Round(10*time.Millisecond),
		refused.Round(10*time.Millisecond), back.Round(10*time.Millisecond), len(l.final), tl.expected)
}

// TestPlannedSwitchover: under load, Patroni hands the primary to the
// synchronous standby (POST /switchover). The old primary stops, so its
// connections drop; the answers meanwhile are the reject policy's 503s and
// nothing else, and they stop within 15 s of the switchover.
func TestPlannedSwitchover(t *testing.T) {
	c := newCluster(t, 2, reject)
	ms := c.waitHealthy(30 * time.Second)
	old, candidate := c.byRole(ms, "leader"), c.byRole(ms, "sync_standby")
	key := c.tenant(c.pool(old), "acme", roomy)

	l := startLoad(t, c.replicas, key, "s", 100)
	time.Sleep(3 * time.Second)
	asked := time.Now()
	// Patroni hands over to the synchronous standby, and answers once it
	// leads.
	if from, to, err := c.ha.Switchover(ctx); err != nil || from != old || to != candidate {
		t.Fatalf("switchover %s -> %s (wanted %s -> %s): %v", from, to, old, candidate, err)
	}
	switched := time.Now()
	const bound = 15 * time.Second
	time.Sleep(bound + 5*time.Second - time.Since(asked)) // load past the bound
	l.finish()

	ms = c.waitHealthy(60 * time.Second)
	if leader := c.byRole(ms, "leader"); leader != candidate {
		t.Fatalf("%s leads after the switchover to %s: %+v", leader, candidate, ms)
	}
	tl := l.tally()
	assertOnlyPolicy503s(t, tl)
	if !tl.lastRefusal.IsZero() && tl.lastRefusal.Sub(asked) > bound {
		t.Errorf("503s went on until +%s after the switchover (bound %s): %v", tl.lastRefusal.Sub(asked).Round(10*time.Millisecond), bound, tl.expected)
	}
	if n := l.createdSince(asked.Add(bound)); n == 0 {
		t.Errorf("no admission after +%s", bound)
	}
	checkLedger(t, c.pool(candidate), "acme", l.final)
	verifyLedger(t, c, "acme")

	refused, back := recovery(t, l, asked)
	last := time.Duration(0)
	if !tl.lastRefusal.IsZero() {
		last = tl.lastRefusal.Sub(asked)
	}
	t.Logf("RECOVERY (switchover): Patroni switched in %s; first refusal +%s, writes back +%s, last 503 +%s; %d keys admitted once each; answers %v",
		switched.Sub(asked).Round(10*time.Millisecond), refused.Round(10*time.Millisecond), back.Round(10*time.Millisecond),
		last.Round(10*time.Millisecond), len(l.final), tl.expected)
}

// TestOldPrimaryRejoinsAsReplica: the primary is killed, a standby takes
// over, and the old primary's container is started again with its data
// directory. Patroni rewinds it (or clones it afresh) and it follows the new
// primary: in recovery, streaming from it, on its timeline. The replicas
// keep writing to the new primary throughout, and the old one receives the
// new primary's rows by replication, never a write of its own.
func TestOldPrimaryRejoinsAsReplica(t *testing.T) {
	c := newCluster(t, 2, reject)
	old := c.leader()
	key := c.tenant(c.pool(old), "acme", roomy)
	l := startLoad(t, c.replicas, key, "r", 20)
	time.Sleep(2 * time.Second)
	if err := c.ha.Kill(ctx, old); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	ms := c.waitHealthy(60*time.Second, old)
	leader := c.byRole(ms, "leader")
	waitFor(t, "an admission after the failover", 60*time.Second, func() bool {
		_, ok := l.firstCreatedAfter(killed)
		return ok
	}, nil)

	if err := c.ha.Start(ctx, old); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	// Back in good health, and the old primary follows on the new
	// primary's timeline (the one the promotion began).
	var oldM, leaderM patroni.Member
	waitFor(t, old+" to follow on the leader's timeline", 90*time.Second, func() bool {
		ms = c.waitHealthy(90 * time.Second)
		oldM, leaderM = patroni.Member{}, patroni.Member{}
		for _, m := range ms {
			switch m.Name {
			case old:
				oldM = m
			case leader:
				leaderM = m
			}
		}
		return oldM.Timeline == leaderM.Timeline
	}, func() string { return fmt.Sprintf("members %+v", ms) })
	if leaderM.Role != "leader" || oldM.Role == "leader" || leaderM.Timeline < 2 {
		t.Fatalf("after the old primary's return: %+v (%s should lead, on a new timeline)", ms, leader)
	}
	leaderPool, oldPool := c.pool(leader), c.pool(old)
	var inRecovery bool
	if err := oldPool.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil || !inRecovery {
		t.Fatalf("%s: pg_is_in_recovery() = %v (%v), want true", old, inRecovery, err)
	}
	var state string
	waitFor(t, old+" streaming from the leader", 30*time.Second, func() bool {
		err := leaderPool.QueryRow(ctx, `SELECT state FROM pg_stat_replication WHERE application_name = $1`, old).Scan(&state)
		return err == nil && state == "streaming"
	}, func() string { return state })
	rejoined := time.Now()
	t.Logf("%s rejoined as %s %s after %s", old, oldM.Role, oldM.State, rejoined.Sub(restarted).Round(100*time.Millisecond))
	oldLogs, err := c.ha.Logs(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(oldLogs, "\n") {
		if strings.Contains(line, "pg_rewind exit code") || strings.Contains(line, "servers diverged") ||
			strings.Contains(line, "emoving data directory") {
			t.Logf("%s: %s", old, strings.TrimSpace(line)) // how it rejoined: rewound, or cloned afresh
		}
	}

	before := count(t, leaderPool)
	waitFor(t, "admissions after the rejoin", 30*time.Second, func() bool { return l.createdSince(rejoined) >= 100 }, nil)
	l.finish()
	after := count(t, leaderPool)
	if after <= before {
		t.Fatalf("the leader's admissions went from %d to %d after the rejoin", before, after)
	}
	// The old primary holds exactly the leader's admissions once it has
	// replayed: it follows, it was never written to.
	var onOld int
	waitFor(t, old+" to replay the leader's admissions", 30*time.Second, func() bool {
		onOld = count(t, oldPool)
		return onOld == after
	}, func() string { return fmt.Sprintf("%d on %s, %d on the leader", onOld, old, after) })
	if err := oldPool.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil || !inRecovery {
		t.Fatalf("%s: pg_is_in_recovery() = %v (%v) at the end, want true", old, inRecovery, err)
	}
	tl := l.tally()
	assertOnlyPolicy503s(t, tl)
	checkLedger(t, leaderPool, "acme", l.final)
	verifyLedger(t, c, "acme")
	t.Logf("admissions on the leader: %d at the rejoin, %d at the end; answers %v", before, after, tl.expected)
}

func count(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM admissions`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReadOnlyPrimaryIsAnOutage: the primary keeps answering but refuses
// writes, as a demoted node that still answers would (here by
// default_transaction_read_only, reloaded into every session, so the
// replicas' pooled connections meet SQLSTATE 25006 read_only_sql_transaction
// on their next write, and their new connections find no node that accepts
// writes). tokengate must treat that as the store being unavailable: the
// reject policy's 503s while it lasts, never a 500, and admissions again
// once the node accepts writes.
//
// This is issue 26's store side (the lead's change to budget): a binary
// that returns read-only errors as they come answers 500 here.
func TestReadOnlyPrimaryIsAnOutage(t *testing.T) {
	c := newCluster(t, 2, reject)
	leader := c.leader()
	key := c.tenant(c.pool(leader), "acme", roomy)
	// The test's own session keeps writing: a setting from the startup
	// packet outranks the configuration file.
	admin := c.pool(leader, "default_transaction_read_only=off")
	readOnly := func(on bool) {
		t.Helper()
		stmt := `ALTER SYSTEM RESET default_transaction_read_only`
		if on {
			stmt = `ALTER SYSTEM SET default_transaction_read_only = on`
		}
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
	}

	l := startLoad(t, c.replicas, key, "ro", 50)
	time.Sleep(2 * time.Second)
	readOnly(true)
	began := time.Now()
	time.Sleep(4 * time.Second)
	readOnly(false)
	ended := time.Now()
	waitFor(t, "admissions once the primary accepts writes", 30*time.Second, func() bool {
		_, ok := l.firstCreatedAfter(ended)
		return ok
	}, func() string { return fmt.Sprint(l.tally()) })
	back, _ := l.firstCreatedAfter(ended)
	time.Sleep(2 * time.Second)
	l.finish()

	tl := l.tally()
	assertOnlyPolicy503s(t, tl)
	var refusedWhileReadOnly int
	for _, s := range l.snapshot() {
		if s.code == 503 && s.typ == "store_unavailable" && s.end.After(began) && s.end.Before(ended) {
			refusedWhileReadOnly++
		}
	}
	if refusedWhileReadOnly == 0 {
		t.Errorf("no 503 store_unavailable while the primary refused writes: %v", tl.expected)
	}
	if leaderNow := c.leader(); leaderNow != leader {
		t.Fatalf("%s leads, not %s: Patroni saw no reason to fail over", leaderNow, leader)
	}
	checkLedger(t, c.pool(leader), "acme", l.final)
	verifyLedger(t, c, "acme")
	t.Logf("read-only for %s; writes back %s after; answers %v", ended.Sub(began).Round(10*time.Millisecond),
		back.Sub(ended).Round(10*time.Millisecond), tl.expected)
}
