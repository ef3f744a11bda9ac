//go:build cluster && soak

package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/ledger"
)

// The checker: a single-threaded model of the admission contract (docs/contract.md),
// written from the contract and not from package budget (it imports none
// of it). It replays each tenant's ledger in order, recomputing every
// refill, balance and count from the tenant's limits and the entries'
// database times, and checks the history the clients recorded against it.
//
// Every face admits by the same contract, so the replay of the ledger knows
// no faces. The checker asks which face a request came through only where
// they differ by design: the cost reserved (the API's answered estimate;
// the proxy's estimate of the body, which the API computes alike; the
// RLS's hits, with no estimation), the truth settled (the usage an API
// client reports; what the proxy's upstream reported, clamped to what the
// request could produce, or the estimate if it reported none; the hits of
// the RLS's stream-end call), and who ends an admission (the API's client
// settles or releases; the proxy settles what the upstream answered and
// releases what it failed; a gateway settles at stream end, or lets it
// expire).

const micro = 1_000_000

// sweepInterval is the replicas' TOKENGATE_SWEEP_INTERVAL in the soak.
const sweepInterval = 500 * time.Millisecond

type mlimits struct {
	capacity, rate       int64 // tokens, micro-tokens a second
	reqCapacity, reqRate int64
	maxConcurrent        int64
	periodBudget         int64
}

// bucket is the contract's token bucket, in micro units: refill is
// floor(rate × elapsed µs / 1e6), never past capacity (a balance above it
// stays), elapsed clamped at zero, and the time never moves back.
type bucket struct {
	capacity, rate, balance int64
	at                      time.Time
}

func (b *bucket) refill(now time.Time) int64 {
	if b.at.IsZero() || !now.After(b.at) {
		if b.at.IsZero() {
			b.at = now
		}
		return 0
	}
	us := now.Sub(b.at).Microseconds()
	b.at = now
	if b.balance >= b.capacity {
		return 0
	}
	add := new(big.Int).Div(new(big.Int).Mul(big.NewInt(b.rate), big.NewInt(us)), big.NewInt(micro)).Int64()
	return b.add(min(add, b.capacity-b.balance))
}

func (b *bucket) add(n int64) int64 { b.balance += n; return n }

// charge is what a charge of n micro-units (n <= 0) applies: it stops at
// the debt floor, minus one capacity, and a balance already below the
// floor (the capacity was lowered) is not charged at all.
func (b *bucket) charge(n int64) int64 {
	floor := -b.capacity
	switch {
	case b.balance <= floor:
		return 0
	case n < floor-b.balance:
		return floor - b.balance
	}
	return n
}

type mtenant struct {
	lim        mlimits
	tokens     bucket
	requests   bucket
	open       int64
	periodUsed int64
	seq        int64
	reserved   map[string]int64 // admission -> cost, until it ends
	// debited is what a replayed local admission's reserve took from its
	// own tenant when the debt floor stopped it short of its cost: its end
	// refunds at most that (docs/contract.md, the debt floor).
	debited map[string]int64
	ended   map[string]string
}

type entry struct {
	Seq          int64      `db:"seq"`
	Kind         string     `db:"kind"`
	CreatedAt    time.Time  `db:"created_at"`
	AdmissionID  *string    `db:"admission_id"`
	Estimate     *int64     `db:"estimate"`
	Actual       *int64     `db:"actual"`
	RefillMicro  int64      `db:"refill_micro"`
	DeltaMicro   int64      `db:"delta_micro"`
	BalanceMicro int64      `db:"balance_micro"`
	PeriodStart  *time.Time `db:"period_start"`
	PeriodUsed   int64      `db:"period_used"`
	Late         bool       `db:"late"`
	Detail       *string    `db:"detail"`
	Reason       *string    `db:"reason"`
}

// replayedLocal marks a reserve entry that a replica's replay wrote: an
// admission the replica made on its own while Postgres was away (the
// local failure policy). The contract lets it exceed the shared limits by
// what the other replicas spent meanwhile, so its limits are not checked;
// its debit, and everything after it, are.
const replayedLocal = "admitted locally during a store outage"

// missing returns the admissions clients were told of that are not in the
// ledger (yet: a replica's spool of local decisions may not be replayed),
// and the requests a gateway was told it may run that no admission is
// keyed by yet.
func missing(pool *pgxpool.Pool, h *history) []string {
	var told, tenants, keys []string
	for _, e := range h.events {
		switch {
		case e.face == faceRLS && e.told():
			tenants, keys = append(tenants, e.tenant), append(keys, e.key)
		case e.told():
			told = append(told, e.admission)
		}
	}
	rows, err := pool.Query(context.Background(), `SELECT t.id FROM unnest($1::text[]) AS t(id)
		WHERE NOT EXISTS (SELECT 1 FROM ledger_entries WHERE admission_id = t.id AND kind = 'reserve')
		UNION ALL
		SELECT k.tenant || '/' || k.key FROM unnest($2::text[], $3::text[]) AS k(tenant, key)
		WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys i WHERE i.tenant_id = k.tenant AND i.key = k.key)`, told, tenants, keys)
	if err != nil {
		return []string{err.Error()}
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return []string{err.Error()}
	}
	return out
}

// limitsOf reads the limits a tenant or limits entry records (the
// ledger's own description of the change).
func limitsOf(detail string, old mlimits) (mlimits, error) {
	var d struct {
		Limits, After *struct {
			TokensCapacity    int64  `json:"tokens_capacity"`
			TokensPerSecond   string `json:"tokens_per_second"`
			RequestsCapacity  int64  `json:"requests_capacity"`
			RequestsPerSecond string `json:"requests_per_second"`
			MaxConcurrent     int64  `json:"max_concurrent"`
			PeriodBudget      int64  `json:"period_budget"`
		}
	}
	if err := json.Unmarshal([]byte(detail), &d); err != nil {
		return old, err
	}
	l := d.Limits
	if l == nil {
		l = d.After
	}
	if l == nil {
		return old, nil // a key or disable event
	}
	return mlimits{capacity: l.TokensCapacity * micro, rate: decimalMicro(l.TokensPerSecond),
		reqCapacity: l.RequestsCapacity * micro, reqRate: decimalMicro(l.RequestsPerSecond),
		maxConcurrent: l.MaxConcurrent, periodBudget: l.PeriodBudget}, nil
}

// decimalMicro reads "2.5" or "-0.25" as micro units.
func decimalMicro(s string) int64 {
	if s == "" {
		return 0
	}
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	whole, frac, _ := strings.Cut(s, ".")
	w, _ := strconv.ParseInt(whole, 10, 64)
	f, _ := strconv.ParseInt((frac + "000000")[:6], 10, 64)
	v := w*micro + f
	if neg {
		v = -v
	}
	return v
}

// check replays every tenant's ledger through the model and checks the
// history against it; it returns every divergence, the first first.
// parents nests tenants: an admission of a tenant is in its chain and in
// every ancestor's, once each.
func check(t *testing.T, pool *pgxpool.Pool, h *history, up *provider, streamed [3]int64, tenants []string, parents map[string]string) []string {
	t.Helper()
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	expiresAt, createdAt, tenantOf := map[string]time.Time{}, map[string]time.Time{}, map[string]string{}
	rows, err := pool.Query(context.Background(), `SELECT id, tenant_id, created_at, expires_at FROM admissions
		UNION ALL SELECT id, tenant_id, created_at, expires_at FROM lease_group_admissions`)
	if err != nil {
		t.Fatal(err)
	}
	var aid, tid string
	var created, expires time.Time
	if _, err := pgx.ForEachRow(rows, []any{&aid, &tid, &created, &expires}, func() error {
		createdAt[aid], expiresAt[aid], tenantOf[aid] = created, expires, tid
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	onTime := 0                     // expiries checked for timeliness (no fault going on)
	reserves := map[string]int{}    // tenant/admission -> reserve entries
	endsOf := map[string]entry{}    // tenant/admission -> its settle or release entry
	reserveOf := map[string]entry{} // tenant/admission -> its reserve entry
	expired := map[string]bool{}    // tenant/admission -> it expired
	owner := map[string]string{}    // admission -> the deepest tenant whose chain has it
	depth := func(id string) int {
		n := 0
		for ; parents[id] != ""; id = parents[id] {
			n++
		}
		return n
	}
	local := 0 // replayed local admissions
	away := h.storeAway()
	// Quota leasing (model_lease_test.go): the leases as their table has
	// them, each level's replay of its leases, each level's balances over
	// time, and each lease's takes at its own tenant.
	leases := leaseRows(t, pool)
	timeline := map[string][]point{}
	takes := map[string][]point{}
	tokenOnly := map[string]bool{}
	leaseCount, leased := map[string]int{}, map[string]int{}
	// By level: the settles made in their lease's journal, replayed.
	journalSettles := map[string]int{}
	js := unbookedRows(t, pool) // and, in the replay, the booked ones
	journals := leaseJournals(t, pool)
	for _, id := range tenants {
		rows, err := pool.Query(context.Background(), `SELECT seq, kind, created_at, admission_id, estimate, actual, refill_micro,
			delta_micro, balance_micro, period_start, period_used, late, detail, reason FROM ledger_entries WHERE tenant_id = $1 ORDER BY seq`, id)
		if err != nil {
			t.Fatal(err)
		}
		es, err := pgx.CollectRows(rows, pgx.RowToStructByName[entry])
		if err != nil {
			t.Fatal(err)
		}
		m := &mtenant{reserved: map[string]int64{}, ended: map[string]string{}, debited: map[string]int64{}}
		ml := newLeaseLedger(journals)
		var periodStart *time.Time
		for _, e := range es {
			where := fmt.Sprintf("tenant %s entry %d (%s at %s)", id, e.Seq, e.Kind, e.CreatedAt.Format("15:04:05.000000"))
			if e.Seq != m.seq+1 {
				fail("%s: follows entry %d", where, m.seq)
			}
			m.seq = e.Seq
			if e.Kind == "tenant" || e.Kind == "limits" {
				if e.Detail != nil {
					l, err := limitsOf(*e.Detail, m.lim)
					if err != nil {
						fail("%s: detail %q: %v", where, *e.Detail, err)
					}
					if e.Kind == "limits" && l.reqCapacity != m.lim.reqCapacity {
						fail("%s: the model does not follow request bucket changes", where)
					}
					m.lim = l
					ml.limits(e.CreatedAt, l.capacity)
				}
			}
			if m.tokens.at.IsZero() { // created: a full bucket
				m.tokens = bucket{capacity: m.lim.capacity, rate: m.lim.rate, at: e.CreatedAt}
				m.requests = bucket{capacity: m.lim.reqCapacity, rate: m.lim.reqRate, balance: m.lim.reqCapacity, at: e.CreatedAt}
			}
			refill := m.tokens.refill(e.CreatedAt)
			if m.requests.capacity > 0 {
				m.requests.refill(e.CreatedAt)
			}
			if refill != e.RefillMicro {
				fail("%s: refill %d, the model computes %d (balance before %d)", where, e.RefillMicro, refill, m.tokens.balance-refill)
			}
			m.tokens.capacity, m.tokens.rate = m.lim.capacity, m.lim.rate
			adm := ""
			if e.AdmissionID != nil && !strings.HasPrefix(e.Kind, "lease_") { // a lease entry names its lease
				adm = *e.AdmissionID
				if o, ok := owner[adm]; !ok || depth(id) > depth(o) {
					owner[adm] = id
				}
			}
			samePeriod := periodStart != nil && e.PeriodStart != nil && periodStart.Equal(*e.PeriodStart)
			usedBefore := int64(0)
			if samePeriod {
				usedBefore = m.periodUsed
			}
			switch e.Kind {
			case "reserve":
				reserves[id+"/"+adm]++
				reserveOf[id+"/"+adm] = e
				cost := *e.Estimate
				exempt := e.Reason != nil && strings.HasPrefix(*e.Reason, replayedLocal)
				if exempt {
					local++
				}
				// Admitted from a lease: its cost was taken with the lease
				// (model_lease_test.go), and it moves nothing.
				lid, costMicro, journaledAt := leaseRef(e.Detail)
				if lid != "" {
					ml.reserve(fail, where, lid, adm, cost, costMicro, e)
					if r, ok := leases[lid]; ok && r.TenantID == id {
						js = append(js, journalRow{LeaseID: lid, CostMicro: costMicro, CreatedAt: journaledAt, Booked: true})
					}
				}
				// Would the contract admit it, at this entry's time?
				if exempt || lid != "" {
					// Admitted by a replica on its own: not checked.
				} else if m.tokens.balance < cost*micro {
					fail("%s: admitted %s costing %d with %d micro-tokens", where, adm, cost, m.tokens.balance)
				}
				if !exempt && m.lim.reqCapacity > 0 && m.requests.balance < micro {
					fail("%s: admitted %s with %d micro-requests", where, adm, m.requests.balance)
				}
				if !exempt && m.lim.maxConcurrent > 0 && m.open >= m.lim.maxConcurrent {
					fail("%s: admitted %s with %d open of %d", where, adm, m.open, m.lim.maxConcurrent)
				}
				if !exempt && m.lim.periodBudget > 0 && usedBefore+cost > m.lim.periodBudget {
					fail("%s: admitted %s costing %d with %d of the period's %d used", where, adm, cost, usedBefore, m.lim.periodBudget)
				}
				// (Only a replayed local admission can meet the debt floor.)
				want := m.tokens.charge(-cost * micro)
				if lid == "" && e.DeltaMicro != want {
					fail("%s: delta %d for a cost of %d; the model says %d", where, e.DeltaMicro, cost, want)
				}
				if lid == "" && want != -cost*micro && tenantOf[adm] == id {
					m.debited[adm] = -want // at its own tenant only, as the store keeps it
				}
				m.tokens.add(e.DeltaMicro)
				if m.lim.reqCapacity > 0 {
					m.requests.add(-micro)
				}
				m.open++
				m.reserved[adm] = cost
			case "settle", "release", "expire":
				cost, ok := m.reserved[adm]
				// After expiry, a settle or a release still reconciles
				// against the estimate expiry charged, marked late.
				if !ok && !(e.Kind != "expire" && e.Late && m.ended[adm] == "expire") {
					fail("%s: ends %s, which is not open (ended: %q)", where, adm, m.ended[adm])
				}
				if e.Kind == "expire" {
					// On time: not before it was due, and within the TTL
					// plus the sweep interval (and a second for the sweep's
					// own work), unless a fault was going on.
					due, known := expiresAt[adm]
					if known && e.CreatedAt.Before(due) {
						fail("%s: %s expired before it was due (%s)", where, adm, due.Format("15:04:05.000000"))
					}
					// One admitted locally is the store's from its replay
					// only: it cannot expire before the store has it.
					swept := due
					if r, ok := reserveOf[id+"/"+adm]; ok && r.Reason != nil && strings.HasPrefix(*r.Reason, replayedLocal) && r.CreatedAt.After(due) {
						swept = r.CreatedAt
					}
					// (And unless every replica's clients saw the store away
					// when it was due: the sweepers need it, see storeAway.)
					timely := known && h.quiet(due.Add(-time.Second), e.CreatedAt.Add(time.Second)) && !away(swept, swept.Add(sweepInterval+time.Second))
					if timely {
						onTime++
					}
					if timely && e.CreatedAt.Sub(swept) > sweepInterval+time.Second {
						fail("%s: %s expired %s after it was due, with no fault going on", where, adm, e.CreatedAt.Sub(swept).Round(time.Millisecond))
					}
					if e.DeltaMicro != 0 {
						fail("%s: an expiry moved the balance by %d", where, e.DeltaMicro)
					}
					m.open--
					delete(m.reserved, adm)
					m.ended[adm] = "expire"
					expired[id+"/"+adm] = true
					break
				}
				if e.Late {
					cost = *e.Estimate
				}
				actual := int64(0)
				if e.Kind == "settle" {
					actual = *e.Actual
				}
				// Settled in its lease's journal: the refund went back into
				// the lease (model_lease_test.go), and it moves nothing.
				if lid, refund, endedAt := leaseEndRef(e.Detail); e.Kind == "settle" && lid != "" {
					ml.end(fail, where, lid, adm, cost, actual, refund, e)
					journalSettles[id]++
					if r, ok := leases[lid]; ok && r.TenantID == id {
						js = append(js, journalRow{LeaseID: lid, CostMicro: -refund, CreatedAt: endedAt, Booked: true})
					}
					m.open--
					delete(m.reserved, adm)
					m.ended[adm] = e.Kind
					endsOf[id+"/"+adm] = e
					break
				}
				// A refund stops at capacity (or at a balance above it);
				// an extra charge stops at the debt floor, minus one
				// capacity. An admission debited short at the floor (a
				// replayed local one) is refunded what it was debited less
				// the usage, not its cost less the usage: the contract's
				// rule, which this model missed until a run replayed a
				// "loc" admission into the floor and settled it (seed 1,
				// on Patroni, the store starved: "moved the balance
				// -42807900; the model says 18000000").
				want := (cost - actual) * micro
				if d, ok := m.debited[adm]; ok {
					want = d - actual*micro
				}
				if want > 0 {
					limit := max(m.tokens.capacity, m.tokens.balance)
					want = min(limit, m.tokens.balance+want) - m.tokens.balance
				} else {
					want = m.tokens.charge(want)
				}
				if e.DeltaMicro != want {
					fail("%s: %s of %s (estimate %d, actual %d) moved the balance %d; the model says %d", where, e.Kind, adm, cost, actual, e.DeltaMicro, want)
				}
				m.tokens.add(e.DeltaMicro)
				if !e.Late {
					m.open--
				}
				delete(m.reserved, adm)
				m.ended[adm] = e.Kind
				endsOf[id+"/"+adm] = e
			case "lease_take", "lease_return":
				m.tokens.add(ml.entry(fail, where, e, &m.tokens))
				if r, ok := leases[*e.AdmissionID]; ok && e.Kind == "lease_take" && r.TenantID == id {
					takes[r.ID] = append(takes[r.ID], point{at: e.CreatedAt, balance: -e.DeltaMicro})
				}
			case "adjust", "limits", "tenant":
				// An adjustment moves the balance by its delta; a lowered
				// capacity cuts a balance above it.
				if e.Kind == "limits" && e.DeltaMicro != 0 && m.tokens.balance+e.DeltaMicro != m.lim.capacity {
					fail("%s: a limits change cut the balance to %d, not to the capacity %d", where, m.tokens.balance+e.DeltaMicro, m.lim.capacity)
				}
				if e.Kind == "tenant" && e.Seq == 1 && e.DeltaMicro != m.lim.capacity {
					fail("%s: created with %d, not a full bucket of %d", where, e.DeltaMicro, m.lim.capacity)
				}
				if e.Kind == "adjust" && e.DeltaMicro < 0 && m.tokens.balance+e.DeltaMicro < -m.tokens.capacity {
					fail("%s: an adjustment of %d took the balance %d below the debt floor %d", where, e.DeltaMicro, m.tokens.balance, -m.tokens.capacity)
				}
				m.tokens.add(e.DeltaMicro)
			}
			if m.tokens.balance != e.BalanceMicro {
				fail("%s: balance %d, the model has %d", where, e.BalanceMicro, m.tokens.balance)
				m.tokens.balance = e.BalanceMicro // report each divergence once
			}
			if e.PeriodStart != nil {
				periodStart, m.periodUsed = e.PeriodStart, e.PeriodUsed
			}
			timeline[id] = append(timeline[id], point{at: e.CreatedAt, balance: m.tokens.balance, capacity: m.tokens.capacity, rate: m.tokens.rate})
		}
		leaseCount[id], leased[id] = ml.finish(fail, id, leases)
		tokenOnly[id] = m.lim.reqCapacity == 0 && m.lim.maxConcurrent == 0 && m.lim.periodBudget == 0
		// The tenant row agrees with the model; nothing is left open.
		var balance, open, seq int64
		if err := pool.QueryRow(context.Background(), `SELECT tokens_micro, open_reservations, ledger_seq FROM tenants WHERE id = $1`, id).Scan(&balance, &open, &seq); err != nil {
			t.Fatal(err)
		}
		if balance != m.tokens.balance || open != m.open || seq != m.seq {
			fail("tenant %s: the row holds balance %d, %d open, seq %d; the model %d, %d, %d", id, balance, open, seq, m.tokens.balance, m.open, m.seq)
		}
		for adm := range m.reserved {
			fail("tenant %s: admission %s never ended (settled, released or expired) within its TTL and the sweep", id, adm)
		}
		if _, err := ledger.Verify(context.Background(), pool, id); err != nil {
			fail("tenant %s: the ledger chain does not verify: %v", id, err)
		}
	}

	// The history: every admission a client was told of, through any face,
	// is in the ledger exactly once, at the cost the client knows; each
	// entry not told of is explained by a request whose outcome the client
	// could not know; retries got the original; settle answers match their
	// entries; every refusal says when to retry.
	keyed := admissionsByKey(t, pool)
	for i, e := range h.events {
		if e.face == faceRLS {
			// A gateway knows its request id; the store keys the
			// admission by it.
			h.events[i].admission = keyed[e.tenant+"/"+e.key]
		}
	}
	told := map[string]bool{}
	firstTry := map[string]time.Duration{} // tenant/key -> when its first attempt began
	for _, e := range h.events {
		if k := e.tenant + "/" + e.key; e.admits() && e.key != "" {
			if _, ok := firstTry[k]; !ok {
				firstTry[k] = e.begin
			}
		}
	}
	unknown := map[string]int{} // tenant -> reserve attempts with an unknown outcome
	byKey := map[string]string{}
	for _, e := range h.events {
		if e.code == http.StatusTooManyRequests && e.retryAfter == "" {
			fail("client %d at %s: a refusal by the %s (%s) without Retry-After", e.client, e.end, e.face, e.op)
		}
		switch {
		case e.told() && e.admission == "":
			fail("client %d at %s: the %s admitted request %s, but no admission has its key", e.client, e.end, e.face, e.key)
		case e.told():
			told[e.admission] = true
			if owner[e.admission] != e.tenant {
				fail("client %d at %s: told of %s for %s; the ledger has it for %q", e.client, e.end, e.admission, e.tenant, owner[e.admission])
			}
			for lv := e.tenant; lv != ""; lv = parents[lv] {
				if n := reserves[lv+"/"+e.admission]; n != 1 {
					fail("client %d at %s: admission %s is in %s's ledger %d times", e.client, e.end, e.admission, lv, n)
				}
			}
			// Every face reserves the cost its client knows: the API's
			// answered estimate, the proxy's estimate of the body, the
			// RLS's hits.
			if res, ok := reserveOf[e.tenant+"/"+e.admission]; ok && *res.Estimate != e.reservedCost {
				fail("client %d at %s: %s admitted %s at a cost of %d; the ledger reserved %d", e.client, e.end, e.face, e.admission, e.reservedCost, *res.Estimate)
			}
			// Made while the client waited, by the database's clock (the
			// containers share this host's clock), whatever a replica's
			// own clock said: its TTL runs from then.
			begin := e.begin
			if e.key != "" {
				begin = firstTry[e.tenant+"/"+e.key] // a retry answers the first attempt's admission
			}
			if at := createdAt[e.admission]; at.Before(h.start.Add(begin-time.Second)) || at.After(h.start.Add(e.end+time.Second)) {
				fail("client %d at %s: admission %s was made at %s by the store's clock, outside the request (%s to %s)", e.client, e.end, e.admission,
					at.Format("15:04:05.000"), h.start.Add(begin).Format("15:04:05.000"), h.start.Add(e.end).Format("15:04:05.000"))
			}
			if e.key != "" {
				k := e.tenant + "/" + e.key
				if prev, ok := byKey[k]; ok && prev != e.admission {
					fail("client %d at %s: key %s answered %s, then %s", e.client, e.end, k, prev, e.admission)
				}
				byKey[k] = e.admission
			}
		case e.unknown():
			unknown[e.tenant]++
		case e.face != faceAPI:
			// The proxy's and the RLS's ends are checked by call, below.
		case e.op == "settle" && strings.Contains(e.body, absurdUsage) && e.code == http.StatusOK:
			// Usage no request could produce is refused (422) and moves
			// nothing; the model never sees it, as no entry is written.
			fail("client %d at %s: a settle of %s with absurd usage answered %d", e.client, e.end, e.admission, e.code)
		case e.op == "settle" && e.code == http.StatusUnprocessableEntity && (e.typ != "usage_out_of_bounds" || !strings.Contains(e.body, absurdUsage) && e.body != conflictUsage):
			fail("client %d at %s: a settle of %s with usage %s answered 422 %s", e.client, e.end, e.admission, e.body, e.typ)
		case (e.op == "settle" || e.op == "release") && e.code == http.StatusOK && !e.local:
			// (An answer a replica gave alone, during an outage, is its
			// share's; the store applies the settle when it replays it.)
			en, ok := endsOf[e.tenant+"/"+e.admission]
			if !ok {
				fail("client %d at %s: %s of %s answered 200, but the ledger has no such entry", e.client, e.end, e.op, e.admission)
				continue
			}
			if lid, refund, _ := leaseEndRef(en.Detail); lid != "" {
				// Settled in its lease's journal: the answer's delta is the
				// refund, back in the lease; its balance is what a lease
				// admission answers (this replica's view), not the entry's,
				// which the booking wrote later.
				if decimalMicro(e.applied) != refund {
					fail("client %d at %s: %s of %s answered delta %s; settled in lease %s, the entry %d gave back %d",
						e.client, e.end, e.op, e.admission, e.applied, lid, en.Seq, refund)
				}
			} else if decimalMicro(e.applied) != en.DeltaMicro || decimalMicro(e.balance) != en.BalanceMicro {
				fail("client %d at %s: %s of %s answered delta %s, balance %s; the ledger entry %d says %d, %d",
					e.client, e.end, e.op, e.admission, e.applied, e.balance, en.Seq, en.DeltaMicro, en.BalanceMicro)
			}
			// The truth settled is the usage reported.
			if in, out := usageOf(e.body); e.op == "settle" && (en.Kind != "settle" || *en.Actual != in+out) {
				fail("client %d at %s: settle of %s with usage %s answered 200; the ledger's %s entry %d has an actual cost of %v",
					e.client, e.end, e.admission, e.body, en.Kind, en.Seq, deref(en.Actual))
			}
		}
	}
	// A settle or release of an admission a client was told of is never
	// answered "not found" (one made locally and not replayed yet is a 503).
	for _, e := range h.events {
		if (e.op == "settle" || e.op == "release") && e.code == http.StatusNotFound && told[e.admission] {
			fail("client %d at %s: %s of %s answered 404, yet a client was told of it", e.client, e.end, e.op, e.admission)
		}
	}
	for id := range tokenOnly {
		for lv := parents[id]; lv != ""; lv = parents[lv] {
			tokenOnly[id] = tokenOnly[id] && tokenOnly[lv]
		}
	}
	// The groups shape's replica (soak_test.go) journaled group rows: every
	// replica admitted from leases of its own (checkLeases).
	var groupRows, grouped, groupEnds int
	if err := pool.QueryRow(context.Background(), `SELECT count(*), coalesce(sum(cardinality(ids)), 0), coalesce(sum(cardinality(end_ids)), 0)
		FROM lease_groups`).Scan(&groupRows, &grouped, &groupEnds); err != nil {
		t.Fatal(err)
	}
	if grouped == 0 {
		fail("no lease admission was journaled in a group row: the groups shape's replica made none")
	}
	t.Logf("checker: %d group rows of the groups shape's replica, with %d admissions and %d ends in its journal", groupRows, grouped, groupEnds)
	leaseProblems, ls := checkLeases(h, leases, js)
	refusalProblems, refusals, inLeases := checkRefusals(h, timeline, parents, tokenOnly, leasesHeld(leases, js, takes))
	failoverProblems, failoverReport := checkFailoverLeases(h, leases, js)
	problems = append(append(append(problems, leaseProblems...), refusalProblems...), failoverProblems...)
	for _, r := range failoverReport {
		t.Logf("checker: %s", r)
	}
	t.Logf("checker: leases by level %v, admissions made from them by level %v, settled in their lease's journal by level %v; leases %d (%d returned, %d expired by a sweeper, %d of these checked for timeliness), %d held by a replica when it was killed, %d when it was cut off past the TTL; %d lease admissions journaled, by tenant %v",
		leaseCount, leased, journalSettles, ls.leases, ls.returned, ls.expired, ls.onTime, ls.killedHeld, ls.cutHeld, ls.journaled, ls.byTenant)
	t.Logf("checker: %d refusals of token-only trees checked against the balances outside the leases; %d of them with the cost within a level's balance plus what its live leases held", refusals, inLeases)
	if ls.journaled == 0 {
		fail("no admission was made from a lease: the soak exercised none of leasing")
	}
	if len(h.kills) > 0 && ls.killedHeld+ls.cutHeld == 0 {
		fail("%d replicas killed or cut off, none holding a lease: no fault tested a lost holder", len(h.kills))
	}
	l := ledgerView{owner: owner, reserveOf: reserveOf, endsOf: endsOf, expired: expired, keyed: keyed}
	proxyProblems, exact, lenient, geminiExact := checkProxyCalls(h, up, l, streamed)
	geminiProblems, geminiCounts := checkGeminiEvents(h, up)
	problems = append(append(append(problems, proxyProblems...), geminiProblems...), checkRLSRequests(h, l)...)
	ends := map[string]map[string]int{} // face -> how its admissions clients were told of ended
	counted := map[string]bool{}
	for _, e := range h.events {
		if e.told() && e.admission != "" && !counted[e.admission] {
			counted[e.admission] = true
			face := e.face
			if e.proxy.gemini {
				face = "gemini"
			}
			if ends[face] == nil {
				ends[face] = map[string]int{}
			}
			kind, en := l.end(e.admission)
			if en.Late {
				kind += " (late)"
			}
			ends[face][kind]++
		}
	}
	t.Logf("checker: admissions clients were told of, by face (the proxy's Gemini wire apart) and end: %v; proxy calls held to their upstream's answer exactly %d, during a fault %d", ends, exact, lenient)
	t.Logf("checker: Gemini calls held exactly, by form and answer: %v; countTokens answered, by status: %v", geminiExact, geminiCounts)
	t.Logf("checker: %d admissions (%d of them made locally and replayed), %d expiries checked for timeliness outside faults", len(owner), local, onTime)
	untold := map[string]int{}
	for adm, id := range owner {
		if !told[adm] {
			untold[id] += reserves[id+"/"+adm]
		}
	}
	ids := make([]string, 0, len(untold))
	for id := range untold {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if untold[id] > unknown[id] {
			fail("tenant %s: %d admissions in the ledger that no client was told of, and only %d requests whose outcome was unknown", id, untold[id], unknown[id])
		}
	}
	return problems
}

// The soak's model, gpt-4o-mini, as the seeded model table has it: its
// input and output tokens weigh 1 each (measurePrompts checks it), so a
// cost is their sum, and its context window bounds a settle's usage.
const contextWindow = 128_000

// told reports whether the client was told of an admission (e.admission:
// for the RLS, once check has found it by its request id).
func (e event) told() bool {
	switch e.face {
	case faceProxy:
		return e.admission != "" // X-Tokengate-Admission
	case faceRLS:
		return e.op == "reserve" && e.code == http.StatusOK
	}
	return e.op == "reserve" && e.code == http.StatusCreated
}

// admits reports whether the request asked for an admission.
func (e event) admits() bool { return e.op == "reserve" || e.op == "call" }

// unknown reports whether a request for an admission ended with an outcome
// the client could not know: it may or may not have been admitted.
func (e event) unknown() bool {
	return e.admits() && !e.told() && (e.code == 0 || e.code >= 500)
}

// detail renders what only a face's client knows.
func (e event) detail() string {
	switch e.face {
	case faceProxy:
		if e.proxy.gemini {
			return fmt.Sprintf(" call=%s in=%d maxOut=%d form=%s vertex=%t keyVia=%d cands=%d sawFinish=%t sawUsage=%t retryInfo=%t counted=%d",
				e.proxy.call, e.proxy.in, e.proxy.maxOut, e.proxy.form, e.proxy.vertex, e.proxy.keyVia, e.proxy.cands, e.proxy.sawFinish,
				e.proxy.sawUsage, e.proxy.retryInfo, e.proxy.counted)
		}
		return fmt.Sprintf(" call=%s in=%d max=%d stream=%t asked=%t sawUsage=%t sawDone=%t",
			e.proxy.call, e.proxy.in, e.proxy.maxOut, e.proxy.stream, e.proxy.askedUsage, e.proxy.sawUsage, e.proxy.sawDone)
	case faceRLS:
		return fmt.Sprintf(" request=%s hits=%d decided=%t remaining=%d", e.rls.requestID, e.rls.hits, e.rls.decided, e.rls.remaining)
	}
	return ""
}

// admissionsByKey maps tenant/idempotency key to the admission the store
// keeps under it.
func admissionsByKey(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT tenant_id || '/' || key, admission_id FROM idempotency_keys`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var k, adm string
	if _, err := pgx.ForEachRow(rows, []any{&k, &adm}, func() error {
		out[k] = adm
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// usageOf reads a settle's usage.
func usageOf(body string) (in, out int64) {
	var v struct {
		Usage struct {
			In  int64 `json:"prompt_tokens"`
			Out int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	_ = json.Unmarshal([]byte(body), &v)
	return v.Usage.In, v.Usage.Out
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// ledgerView is what the checker read of the ledger, by admission, in
// each tenant's chain ("tenant/admission"), and the admissions by key.
type ledgerView struct {
	owner     map[string]string // admission -> the deepest tenant whose chain has it
	reserveOf map[string]entry
	endsOf    map[string]entry // its settle or release
	expired   map[string]bool
	keyed     map[string]string // tenant/key -> admission
}

// end says how an admission ended in its tenant's chain: "settle" or
// "release" (with the entry; after an expiry, late), or "expire".
func (l ledgerView) end(adm string) (string, entry) {
	k := l.owner[adm] + "/" + adm
	if en, ok := l.endsOf[k]; ok {
		return en.Kind, en
	}
	if l.expired[k] {
		return "expire", entry{}
	}
	return "", entry{}
}

// proxySettles is the cost the proxy settles for the usage its upstream
// reported: usage no request could produce is clamped (docs/contract.md), the output
// to what was reserved, then the input to what the model's window leaves
// (or what was reserved, if more).
func proxySettles(in, maxOut, reportedIn, reportedOut int64) int64 {
	window := max(contextWindow, in+maxOut)
	out := min(reportedOut, maxOut)
	return min(reportedIn, window-out) + out
}

// storeTrouble returns whether a replica was cut off from the store at any
// time near [from, to], by what its clients saw: an answer that the store
// could not decide (503), a decision journaled or made alone (202, local),
// or no answer at all. A replica may lose its store with no fault injected
// (two busy cores starve Postgres past the store timeout), and then
// journals settles and releases, or fails them, by design.
func (h *history) storeTrouble() func(replica string, from, to time.Duration) bool {
	const near = 3 * time.Second // a replica's recovery loop and reconnection
	at := map[string][]time.Duration{}
	for _, e := range h.events {
		if e.code == 0 || e.code == http.StatusServiceUnavailable || e.code == http.StatusAccepted || e.local {
			at[e.replica] = append(at[e.replica], e.end)
		}
	}
	for _, ts := range at {
		slices.Sort(ts)
	}
	return func(replica string, from, to time.Duration) bool {
		ts := at[replica]
		i, _ := slices.BinarySearch(ts, from-near)
		return i < len(ts) && ts[i] <= to+near
	}
}

// storeAway returns whether every replica was cut off from the store near
// [from, to], by what its clients saw (storeTrouble). No fault injected is
// not enough for a timeliness bound: the sweepers need the store, and on a
// shared two-core machine a Patroni primary took over 2 s to authenticate
// connections, every replica answering 503 for 30 s of a run with no fault
// going on. The store answering any one replica (whose sweeper runs every
// interval) keeps the bound.
func (h *history) storeAway() func(from, to time.Time) bool {
	troubled := h.storeTrouble()
	return func(from, to time.Time) bool {
		for _, name := range h.replicas {
			if !troubled(name, from.Sub(h.start), to.Sub(h.start)) {
				return false
			}
		}
		return len(h.replicas) > 0
	}
}

// checkProxyCalls holds each call through the proxy, on either wire, to
// what its upstream answered: a call the upstream answered is settled from
// the usage it reported (clamped; a Gemini call's as model_gemini_test.go
// models it, a broken answer too), or at the estimate if it reported none;
// a call the upstream failed, or never got, is released. The client saw the
// upstream's answer, and a stream that ended, with the usage chunk only if
// it asked for it. Where a fault struck during the call, or its replica
// lost its store (storeTrouble), the proxy may have lost its client, its
// store or its upstream on the way: the call may
// then also be released, expire, or be settled at the estimate or from
// what was streamed (the prompt and at most 2 tokens of "ok").
func checkProxyCalls(h *history, up *provider, l ledgerView, streamed [3]int64) (problems []string, exact, lenient int, geminiExact map[string]int) {
	geminiExact = map[string]int{}
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	troubled := h.storeTrouble()
	calls := map[string][]event{}
	var order []string
	for _, e := range h.events {
		if e.face == faceProxy && e.op != "count" {
			if _, ok := calls[e.proxy.call]; !ok {
				order = append(order, e.proxy.call)
			}
			calls[e.proxy.call] = append(calls[e.proxy.call], e)
		}
	}
	for _, id := range order {
		es := calls[id]
		first, last := es[0], es[len(es)-1]
		answers := up.answers(id)
		if len(answers) > 1 {
			fail("proxy call %s (%s): the upstream was called %d times", id, first.tenant, len(answers))
		}
		var adm string
		var admitted event
		quiet := h.quiet(h.start.Add(first.begin), h.start.Add(last.end+time.Second))
		unknown := false
		for _, e := range es {
			if e.admission != "" {
				adm, admitted = e.admission, e
			}
			quiet = quiet && e.code != 0 && !troubled(e.replica, e.begin, e.end)
			unknown = unknown || e.unknown()
		}
		if adm == "" && first.key != "" {
			adm = l.keyed[first.tenant+"/"+first.key] // admitted, but the client never heard
		}
		if adm == "" {
			// Refused, or admitted without a key and its answer lost.
			if len(answers) > 0 && !unknown {
				fail("proxy call %s (%s): the upstream was called for a call the proxy refused", id, first.tenant)
			}
			continue
		}
		seen := first.proxy
		want, actual := "release", int64(0)
		broken, also, kind := false, []int64{seen.in + seen.maxOut}, "failed"
		switch {
		case len(answers) > 0 && answers[0].status == http.StatusOK && seen.gemini:
			a := answers[0]
			want = "settle"
			actual, broken = geminiSettles(seen, a, streamed)
			also = geminiLenient(seen, a, streamed)
			kind = geminiKind(a, broken)
		case len(answers) > 0 && answers[0].status == http.StatusOK:
			a := answers[0]
			want, actual = "settle", seen.in+seen.maxOut // no usage: the estimate stands
			if a.reported {
				actual = proxySettles(seen.in, seen.maxOut, a.in, a.out)
			}
			if seen.stream {
				// What was streamed: the prompt and at most 2 tokens of "ok".
				also = append(also, seen.in, seen.in+1, seen.in+2)
			}
			if a.stream && !a.askedUsage {
				fail("proxy call %s (%s, %s): a stream forwarded without asking for usage", id, first.tenant, adm)
			}
		}
		got, en := l.end(adm)
		if quiet {
			exact++
			if seen.gemini {
				geminiExact[seen.form+" "+kind]++
			}
		} else {
			lenient++
		}
		switch {
		case got == want && (got != "settle" || *en.Actual == actual):
		case quiet:
			fail("proxy call %s (%s, %s), with no fault going on: the upstream answered %+v, so the model says %s (actual %d); the ledger says %s %v",
				id, first.tenant, adm, answers, want, actual, got, deref(en.Actual))
		case got == "expire" || got == "release":
		case got == "settle" && want == "settle" && slices.Contains(also, *en.Actual):
		default:
			fail("proxy call %s (%s, %s), during a fault: the upstream answered %v, so the model says %s (actual %d); the ledger says %s %v",
				id, first.tenant, adm, answers, want, actual, got, deref(en.Actual))
		}
		if !quiet || admitted.admission == "" {
			continue
		}
		// What the client saw of it.
		if seen.gemini {
			if p := geminiSeen(want, broken, answers, admitted); p != "" {
				fail("gemini call %s (%s, %s): %s", id, first.tenant, adm, p)
			}
		}
		switch {
		case seen.gemini && want == "settle" && en.CreatedAt.After(h.start.Add(admitted.end+time.Second)):
			fail("gemini call %s (%s, %s): settled at %s, after the client had its answer (%s)", id, first.tenant, adm,
				en.CreatedAt.Format("15:04:05.000"), h.start.Add(admitted.end).Format("15:04:05.000"))
		case seen.gemini:
			// The rest of what its client saw is geminiSeen's.
		case want == "settle" && admitted.code != http.StatusOK:
			fail("proxy call %s (%s, %s): the upstream answered 200; the client saw %d %s", id, first.tenant, adm, admitted.code, admitted.typ)
		case want == "settle" && seen.stream && (!admitted.proxy.sawDone || admitted.proxy.sawUsage != seen.askedUsage):
			fail("proxy call %s (%s, %s): a stream that asked for usage %t ended %t with a usage chunk %t", id, first.tenant, adm,
				seen.askedUsage, admitted.proxy.sawDone, admitted.proxy.sawUsage)
		case want == "settle" && en.CreatedAt.After(h.start.Add(admitted.end+time.Second)):
			fail("proxy call %s (%s, %s): settled at %s, after the client had its answer (%s)", id, first.tenant, adm,
				en.CreatedAt.Format("15:04:05.000"), h.start.Add(admitted.end).Format("15:04:05.000"))
		case want == "release" && len(answers) > 0 && admitted.code != answers[0].status:
			fail("proxy call %s (%s, %s): the upstream answered %d; the client saw %d", id, first.tenant, adm, answers[0].status, admitted.code)
		}
	}
	return problems, exact, lenient, geminiExact
}

// checkRLSRequests holds each request a gateway made through the rate
// limit service to the two phases: the request's call reserved its hits
// (checked with every admission); a stream-end call answered OK settles it
// with its usage, exactly once whatever the repeats (other usage after the
// first is ignored), and, when it was decided there and then, answers the
// balance the settle left; a stream end that never came lets it expire;
// usage no request could produce is refused with INVALID_ARGUMENT and
// moves nothing; a stream end of a refused request changes nothing; a
// tenant outside the gateway's scope is refused.
func checkRLSRequests(h *history, l ledgerView) []string {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	requests := map[string][]event{}
	var order []string
	for _, e := range h.events {
		if e.face == faceRLS {
			k := e.tenant + "/" + e.key
			if _, ok := requests[k]; !ok {
				order = append(order, k)
			}
			requests[k] = append(requests[k], e)
		}
	}
	for _, k := range order {
		es := requests[k]
		adm := l.keyed[k]
		admitted, unknown := false, false
		usage, ended, endUnknown := int64(-1), false, false
		for _, e := range es {
			switch {
			case e.tenant == "org" && (e.code == http.StatusOK || e.code == http.StatusBadRequest):
				fail("rls request %s: a tenant outside the gateway's scope answered %d", k, e.code)
			case e.op == "reserve":
				admitted = admitted || e.code == http.StatusOK
				unknown = unknown || e.unknown()
			case e.rls.hits == rlsAbsurdHits:
				if e.code == http.StatusOK && e.rls.decided {
					fail("rls request %s (%s): a stream end with usage %d was decided", k, adm, e.rls.hits)
				}
			case usage < 0 || e.rls.hits == usage:
				usage = e.rls.hits
				// The first answer, if nothing before it may have settled
				// and it was decided, has the balance the settle left. (A
				// repeat's is the balance at its own time: Envoy's
				// limit_remaining is always about now.)
				first := e.code == http.StatusOK && !ended && !endUnknown
				ended = ended || e.code == http.StatusOK
				endUnknown = endUnknown || e.code == 0 || e.code >= 500
				if first && e.rls.decided {
					// (One settled in its lease's journal answers what a lease
					// admission answers: this replica's view, not the entry's
					// balance, which its lease's booking wrote later.)
					if got, en := l.end(adm); got != "settle" || (!journalEnd(en) && max(0, floorDiv(en.BalanceMicro, micro)) != e.rls.remaining) {
						fail("rls request %s (%s): a stream end answered a remaining %d; the ledger's end is %s with a balance of %d micro-tokens",
							k, adm, e.rls.remaining, got, en.BalanceMicro)
					}
				}
			case e.code == http.StatusOK && e.rls.decided:
				fail("rls request %s (%s): a stream end with other usage (%d, not %d) was decided", k, adm, e.rls.hits, usage)
			}
		}
		if adm == "" {
			continue // none; a request told it was admitted is reported with the admissions
		}
		got, en := l.end(adm)
		switch {
		case !admitted && !unknown:
			fail("rls request %s: refused, yet the store has admission %s for it", k, adm)
		case ended && (got != "settle" || *en.Actual != usage):
			fail("rls request %s (%s): a stream end with usage %d answered OK; the ledger says %s %v", k, adm, usage, got, deref(en.Actual))
		case !ended && endUnknown && (got != "expire" && (got != "settle" || *en.Actual != usage)):
			fail("rls request %s (%s): a stream end with usage %d had an unknown outcome; the ledger says %s %v", k, adm, usage, got, deref(en.Actual))
		case !ended && !endUnknown && got != "expire":
			fail("rls request %s (%s): no stream end came, so it expires; the ledger says %s %v", k, adm, got, deref(en.Actual))
		}
	}
	return problems
}

// floorDiv is a / b rounded down.
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && (a < 0) != (b < 0) {
		q--
	}
	return q
}
