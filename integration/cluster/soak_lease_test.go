//go:build cluster && soak

package cluster_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/integration/await"
)

// leaseModes puts part of the soak's tenants in lease mode auto, chosen by
// the seed, through the admin API: two or three of the four whose trees
// have token buckets only ("tok", whose limits the operator changes, which
// ends its leases; "lz"; "la" and "lb", nested in "lorg"), so that the
// others stay in mode off and both paths run, beside and above each other;
// and one tenant whose rules keep it exact whatever its mode (a request,
// concurrency or period limit), which must stay exact.
func leaseModes(t *testing.T, c *cluster, admin string, seed int64) {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(seed), 4000))
	leasable := []string{"tok", "lz", "la", "lb"}
	r.Shuffle(len(leasable), func(i, j int) { leasable[i], leasable[j] = leasable[j], leasable[i] })
	auto := leasable[:2+r.IntN(2)]
	exact := []string{"conc", "req", "per"}[r.IntN(3)]
	for _, id := range append(append([]string{}, auto...), exact) {
		resp, err := send(http.MethodPut, c.replicas[0].url+"/v1/admin/tenants/"+id+"/lease", admin, "", `{"mode":"auto"}`)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var v struct {
			Mode      string `json:"mode"`
			ExactOnly *struct {
				Rule string `json:"rule"`
			} `json:"exact_only"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &v) != nil || v.Mode != "auto" || (v.ExactOnly != nil) != (id == exact) {
			t.Fatalf("soak: lease mode auto for %s: %d %s", id, resp.StatusCode, raw)
		}
	}
	t.Logf("soak: lease mode auto for %v (leased) and %s (kept exact by its rules); the others off", auto, exact)
}

// logLeasePaths logs each replica's count of admissions and settles by
// path (tokengate_admission_paths_total, tokengate_settle_paths_total):
// since its last start, so a replica killed and started again counts only
// its last life.
func logLeasePaths(t *testing.T, c *cluster) {
	t.Helper()
	for _, rep := range c.replicas {
		resp, err := client.Get(rep.url + "/metrics")
		if err != nil {
			t.Logf("soak: %s /metrics: %v", rep.name, err)
			continue
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var paths, settles []string
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.HasPrefix(line, "tokengate_admission_paths_total{") {
				paths = append(paths, strings.TrimPrefix(line, "tokengate_admission_paths_total"))
			}
			if strings.HasPrefix(line, "tokengate_settle_paths_total{") {
				settles = append(settles, strings.TrimPrefix(line, "tokengate_settle_paths_total"))
			}
		}
		t.Logf("soak: %s admissions by path since its last start: %s; settles: %s", rep.name, strings.Join(paths, " "), strings.Join(settles, " "))
	}
}

// leaseOf renders a lease's row and its journal, for a divergence that
// names it.
func leaseOf(pool *pgxpool.Pool, id string) string {
	var b strings.Builder
	var tenant, holder, state string
	var slice, used, booked int64
	var taken, renewed, expires time.Time
	var ended *time.Time
	if err := pool.QueryRow(ctx, `SELECT tenant_id, holder, state, slice_micro, used_micro, booked_micro, taken_at, renewed_at, expires_at, ended_at
		FROM leases WHERE id = $1`, id).Scan(&tenant, &holder, &state, &slice, &used, &booked, &taken, &renewed, &expires, &ended); err != nil {
		return err.Error()
	}
	fmt.Fprintf(&b, "  %s of %s held by %s: %s, slice %d, used %d, booked %d, taken %s, renewed %s, expires %s, ended %v\n", id, tenant, holder, state,
		slice, used, booked, taken.Format("15:04:05.000000"), renewed.Format("15:04:05.000000"), expires.Format("15:04:05.000000"), ended)
	// The lease's admissions whose ledger entries are still to write.
	rows, err := pool.Query(ctx, `SELECT id, cost, created_at FROM (
		SELECT a.id, a.cost * 1000000 AS cost, a.created_at, a.lease_seq AS seq FROM admissions a
		WHERE a.lease_id = $1 AND a.lease_group IS NULL
		  AND a.lease_seq > coalesce((SELECT b.booked_seq FROM admission_lease_books b WHERE b.lease_id = $1), 0)
		UNION ALL
		SELECT g.ids[i], g.cost[i] * 1000000, g.created_at, g.seq * 2048 + i
		FROM lease_groups g CROSS JOIN LATERAL generate_subscripts(g.ids, 1) AS i
		WHERE g.lease_ids[i] = $1 AND g.seq * 2048 + i > coalesce((SELECT b.booked_seq FROM admission_lease_books b WHERE b.lease_id = $1), 0)
		) j ORDER BY seq`, id)
	if err != nil {
		return err.Error()
	}
	var adm string
	var cost int64
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&adm, &cost, &at}, func() error {
		fmt.Fprintf(&b, "  journal (not booked) %s %d at %s\n", adm, cost, at.Format("15:04:05.000000"))
		return nil
	})
	if err != nil {
		return err.Error()
	}
	return b.String()
}

// leasesInUse waits, up to limit or until stop, for every replica to hold
// a live lease it has admitted from (journaled), so that the first fault
// of a run (a replica killed; on a Patroni cluster, the primary killed)
// strikes with leasing in use, whatever a slow start on two busy cores
// delayed. It reports whether they did, and how long it waited.
func (w *workload) leasesInUse(stop <-chan struct{}, limit time.Duration) (bool, time.Duration) {
	began := time.Now()
	stopped := false
	ok := await.For(limit, 100*time.Millisecond, func() bool {
		select {
		case <-stop:
			stopped = true
			return true
		default:
		}
		var n int
		err := w.c.pool.QueryRow(ctx, `SELECT count(DISTINCT holder) FROM leases WHERE state = 'live' AND used_micro > 0 AND expires_at > now()`).Scan(&n)
		return err == nil && n >= len(w.c.replicas)
	})
	return ok && !stopped, time.Since(began)
}
