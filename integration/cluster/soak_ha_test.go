//go:build cluster && soak

package cluster_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/integration/await"
)

// The soak's faults on a Patroni cluster (TestSoakHA): the cluster's own
// take the place of the one Postgres's pause and restart, and the others
// (sharedFault) are the same.

// failover is one change of leader the soak caused.
type failover struct {
	kind     string    // "primary killed", "primary restarted", "switchover"
	from, to string    // the old leader and the new
	at       time.Time // the kill, the restart or the switchover asked
	begin    time.Time // the kill's command began (else at)
	elected  time.Duration
	healthy  time.Duration // until every node was up again, the old one a replica
}

// haTimeout bounds a failover and a rejoin: Patroni's leader key lives
// 10 s, and a rejoin may need pg_rewind or a new base backup, on two busy
// cores.
const haTimeout = 120 * time.Second

// haFaults strikes at random moments, one at a time: the primary killed
// (docker kill: Patroni promotes the synchronous standby once the leader
// key expires, and the old primary is started again a few seconds later
// and rejoins as a replica), the primary restarted (docker restart: a
// clean shutdown hands over at once), a planned switchover, a node paused
// (the primary, or a standby: a paused synchronous standby holds every
// commit), and the faults of sharedFault. The first fault of every run is
// a primary killed, so that the shortest run has a failover too. Each
// fault that moves the leader ends once the three nodes are up again.
func (w *workload) haFaults(t *testing.T, r *rand.Rand, stop <-chan struct{}, count map[string]int) {
	ha := w.c.ha
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(3000+r.IntN(4000)) * time.Millisecond):
		}
		if n == 0 {
			// The first failover strikes leasing in use: every replica
			// admitting from a live lease (soak_lease_test.go).
			if ok, waited := w.leasesInUse(stop, 30*time.Second); !ok {
				t.Logf("soak: the first failover strikes after %s with not every replica admitting from a lease", waited.Round(100*time.Millisecond))
			}
		}
		began, before := time.Now(), total(count)
		func() {
			defer func() { w.h.fault(began, time.Now().Add(3*time.Second), count, before) }()
			k := r.IntN(10)
			if n == 0 {
				k = 7
			}
			switch k {
			case 0:
				node := ha.Nodes()[r.IntN(3)]
				role := "a standby"
				if p, err := ha.Primary(ctx); err == nil && p == node {
					role = "the primary"
				}
				docker(t, "pause", ha.ContainerID(node))
				time.Sleep(time.Duration(500+r.IntN(2500)) * time.Millisecond) // real time: how long the node stays paused is the fault
				docker(t, "unpause", ha.ContainerID(node))
				count["node paused ("+role+")"]++
			case 1, 7, 8, 9:
				if _, err := ha.WaitHealthy(ctx, haTimeout); err != nil {
					t.Errorf("soak: before a failover: %v", err)
					return
				}
				f, err := w.failover(r, k)
				if err != nil {
					t.Errorf("soak: %s: %v", f.kind, err)
					return
				}
				w.h.mu.Lock()
				w.h.failovers = append(w.h.failovers, f)
				w.h.mu.Unlock()
				count[f.kind]++
			default:
				w.sharedFault(t, r, k, count)
			}
		}()
	}
}

// failover moves the leader: k is 1 for the primary restarted, 8 for a
// switchover, and otherwise the primary killed. It returns once every
// node is up again.
func (w *workload) failover(r *rand.Rand, k int) (failover, error) {
	ha := w.c.ha
	f := failover{kind: "primary killed"}
	switch k {
	case 1:
		f.kind = "primary restarted"
	case 8:
		f.kind = "switchover"
	}
	var err error
	if f.from, err = ha.Primary(ctx); err != nil {
		return f, err
	}
	f.at = time.Now() // a kill's is when it is done, below
	f.begin = f.at
	switch f.kind {
	case "switchover":
		if _, f.to, err = ha.Switchover(ctx); err != nil {
			return f, err
		}
		f.elected = time.Since(f.at)
	case "primary restarted":
		// SIGTERM: Patroni stops Postgres and gives up the leader key;
		// SIGKILL after 5 s if it has not.
		if out, err := dockerOut("restart", "--time", "5", ha.ContainerID(f.from)); err != nil {
			return f, fmt.Errorf("docker restart: %v: %s", err, out)
		}
		w.proxies.retarget(w.c, f.from) // its host port may have moved
	default:
		// Down on the spot: the leader key expires (Patroni's ttl), and
		// the synchronous standby, which has every acknowledged commit,
		// is promoted. The old primary stays down a few seconds, the
		// cluster on two nodes, and then comes back as a replica.
		behind := ""
		if w.plantAsync {
			// The planted weakness's worst moment: the synchronous
			// standby a second behind (paused) when the primary dies.
			ms, err := ha.Members(ctx)
			if err != nil {
				return f, err
			}
			for _, m := range ms {
				if m.Role == "sync_standby" {
					behind = m.Name
					docker(w.c.t, "pause", ha.ContainerID(behind))
				}
			}
			// 30 MB of WAL first, more than the standby's socket buffers
			// hold while it is paused: what is committed after it never
			// reaches the standby.
			if _, err := w.c.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS soak_pad (b text);
				INSERT INTO soak_pad SELECT repeat(md5(i::text), 32) FROM generate_series(1, 30000) i`); err != nil {
				return f, err
			}
			// real time: a second for the primary to send that WAL into the
			// paused standby's full socket buffers, a real network stall.
			time.Sleep(time.Second)
		}
		f.begin = time.Now()
		if err := ha.Kill(ctx, f.from); err != nil {
			return f, err
		}
		if behind != "" {
			docker(w.c.t, "unpause", ha.ContainerID(behind))
		}
		f.at = time.Now() // no request that begins after it reaches the old primary
		w.proxies.down(f.from)
		if f.to, err = ha.WaitLeader(ctx, haTimeout, f.from); err != nil {
			return f, err
		}
		f.elected = time.Since(f.at)
		time.Sleep(time.Duration(1000+r.IntN(5000)) * time.Millisecond) // real time: how long the old primary stays down is the fault
		if err := ha.Start(ctx, f.from); err != nil {
			return f, err
		}
		w.proxies.retarget(w.c, f.from)
	}
	if _, err := ha.WaitHealthy(ctx, haTimeout); err != nil {
		return f, err
	}
	f.healthy = time.Since(f.at)
	if f.to == "" {
		f.to, _ = ha.Primary(ctx)
		f.elected = f.healthy // not watched more closely
	}
	return f, nil
}

func dockerOut(args ...string) (string, error) {
	out, err := exec.Command("docker", args...).CombinedOutput()
	return string(out), err
}

// logFailovers reports each failover: when it struck, how long until a
// new leader (with a synchronous standby) and until every node was up,
// the errors clients saw while it lasted (5xx, or no answer, through any
// face, until 3 s after every node was up; but the upstream's own 500s
// through the proxy, and the Gemini wire's 502s of answers its upstream
// broke off), and, for a kill, the recovery
// the clients saw: the first admission decided by the store (a 201 from
// the API, not a local decision) that a client asked for after the kill.
func (h *history) logFailovers(t *testing.T) {
	t.Helper()
	for i, f := range h.failovers {
		since, until := f.at.Sub(h.start), f.at.Sub(h.start)+f.healthy+3*time.Second
		first, last := time.Duration(-1), time.Duration(-1)
		errs := map[string]int{}
		for _, e := range h.events {
			if e.begin < since || e.begin > until {
				continue
			}
			if e.face == faceAPI && e.op == "reserve" && e.code == http.StatusCreated && !e.local && (first < 0 || e.end < first) {
				first = e.end
			}
			// (A proxy's 500 is the upstream's own, as its client planned,
			// and so is a Gemini call's 502: its answer broken off.)
			planned := e.face == faceProxy && (e.code == http.StatusInternalServerError || e.proxy.gemini && e.code == http.StatusBadGateway)
			if e.code == 0 || e.code >= 500 && !planned {
				errs[fmt.Sprintf("%s %d %s", e.face, e.code, e.typ)]++
				last = max(last, e.end)
			}
		}
		recovered := "-"
		if f.kind == "primary killed" && first >= 0 {
			recovered = (first - since).Round(10 * time.Millisecond).String()
		}
		lastErr := "-"
		if last >= 0 {
			lastErr = (last - since).Round(10 * time.Millisecond).String()
		}
		t.Logf("soak: failover %d: %s at +%s, %s -> %s: new leader and a synchronous standby after %s, every node up after %s; "+
			"first 201 after %s, last error after %s; errors %v",
			i+1, f.kind, since.Round(100*time.Millisecond), f.from, f.to, f.elected.Round(10*time.Millisecond),
			f.healthy.Round(10*time.Millisecond), recovered, lastErr, errs)
	}
}

// sameOnEveryNode checks, once the run is over, that the nodes agree:
// every standby (old primaries among them) has caught up to the primary's
// ledger and tenants, and none holds a history of its own.
func sameOnEveryNode(t *testing.T, c *cluster) {
	t.Helper()
	if _, err := c.ha.WaitHealthy(ctx, haTimeout); err != nil {
		t.Fatal(err)
	}
	digest := func(node string) (string, bool, error) {
		url, err := c.ha.NodeURL(ctx, node)
		if err != nil {
			return "", false, err
		}
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return "", false, err
		}
		defer conn.Close(ctx)
		var d string
		var standby bool
		err = conn.QueryRow(ctx, `SELECT (SELECT format('%s entries, seq sum %s, balance sum %s', count(*), sum(seq), sum(balance_micro)) FROM ledger_entries)
			|| (SELECT format('; %s tenants, seq sum %s', count(*), sum(ledger_seq)) FROM tenants), pg_is_in_recovery()`).Scan(&d, &standby)
		return d, standby, err
	}
	primary, err := c.ha.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, standby, err := digest(primary)
	if err != nil || standby {
		t.Fatalf("the primary %s: %q, in recovery %t, %v", primary, want, standby, err)
	}
	for _, node := range c.ha.Nodes() {
		if node == primary {
			continue
		}
		var got string
		var standby bool
		var err error
		if !await.For(60*time.Second, 500*time.Millisecond, func() bool {
			got, standby, err = digest(node)
			return err == nil && got == want && standby
		}) {
			t.Fatalf("the standby %s holds %q (in recovery %t, %v); the primary %s holds %q", node, got, standby, err, primary, want)
		}
	}
	t.Logf("soak: every node holds %s (primary %s)", want, primary)
}

// dumpHistory writes every request, a line each (begin and end since the
// start, replica, face, op, tenant, code, error type, local), to the file
// SOAK_DUMP names, if any: for a look at a run's timeline.
func (h *history) dumpHistory(t *testing.T) {
	path := os.Getenv("SOAK_DUMP")
	if path == "" {
		return
	}
	var b strings.Builder
	for i, f := range h.faults {
		fmt.Fprintf(&b, "# fault %s from %.3f to %.3f\n", h.faultKinds[i], f[0].Sub(h.start).Seconds(), f[1].Sub(h.start).Seconds())
	}
	for _, f := range h.failovers {
		fmt.Fprintf(&b, "# %s %s -> %s at %.3f, healthy after %.3f\n", f.kind, f.from, f.to, f.at.Sub(h.start).Seconds(), f.healthy.Seconds())
	}
	for _, e := range h.events {
		fmt.Fprintf(&b, "%.3f\t%.3f\t%s\t%s\t%s\t%s\t%d\t%s\t%t\n", e.begin.Seconds(), e.end.Seconds(), e.replica, e.face, e.op, e.tenant, e.code, e.typ, e.local)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Log(err)
	}
}
