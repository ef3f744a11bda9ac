//go:build cluster && soak

package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The checker's part for quota leasing (docs/leasing.md), written from
// that document as the rest of the model is from the contract. A lease is
// a slice of a tenant's budget debited at every level of its tree
// (lease_take entries, one per take or renew, admission_id the lease's
// id), an admission made from it is a reserve entry that moves nothing
// (its detail names the lease and the cost it took), and what the lease
// did not use is refunded at its end (lease_return, capped at capacity as
// every refund). The replay holds each lease, at each level, to:
//
//   - bound 1, spending never passes the budget: a take never drives a
//     level below zero, and the admissions of a lease never use more than
//     was taken for it;
//   - bound 2, the budget held in leases: a take or renew brings a lease's
//     unused part up to at most half the level's capacity (the slice is
//     capped at capacity / (2R), R ≥ 1), never above what it held before
//     if that was more (counting as used what the holder had set aside in
//     memory, journaled within a second after); and a refusal is only ever decided exactly, so a
//     request refused had, at some moment while it waited, a level whose
//     balance outside every lease was short of its cost (checkRefusals):
//     what leases made it miss is within what they held;
//   - conservation: the return refunds exactly what was taken less what
//     was used (capped), once, after every admission of the lease and
//     before nothing else of it; the lease's row agrees with its ledger.
//
// checkLeases holds the leases table to bound 3 and the faults: a lease
// the sweepers expire is expired within a sweep interval (TTL/2) of its
// expiry when no fault is going on and some replica's clients saw the
// store answer then (storeTrouble); a killed replica's leases are ended
// (their unused part back) within TTL + the sweep interval of its death,
// whatever the kill's own fault window says (the other replicas' sweepers
// do it); no journal row is written after its lease's expiry; every
// journal row of an ended lease is booked; and no lease is live once the
// load is over and the sweepers ran.
//
// On a Patroni cluster (TestSoakHA) every check above stands as it is,
// with no tolerance for a failover: the cluster runs in synchronous mode,
// which answers a commit only once the synchronous standby has it, the
// rule the rest of the model holds the HA soak to (a failover may only
// lose what no one was told of). So a failover loses no lease take,
// journal group, booking or return a replica was told committed. A group
// whose commit's answer the failover cut off has an unknown outcome: its
// holder answers none of its admissions as made (lease.Journal.Append), and
// what the new primary has of it is what the ledger, and the replay of it
// here, has. (SOAK_HA_PLANT=async, which acknowledges commits before the
// standby has them, is what these checks must then catch.)
// checkFailoverLeases holds the run to failovers that struck with leases
// live and their admissions in flight.

// leaseTTL is the replicas' TOKENGATE_LEASE_TTL in the soak; the lease
// sweeper runs every half of it.
const leaseTTL = 2 * time.Second

// leaseSweep is how often each replica sweeps expired leases.
const leaseSweep = leaseTTL / 2

// inFlight is how long after a take or renew an admission its holder had
// set aside before it may still be journaled (its group commit).
const inFlight = time.Second

// mlease is one lease as one level's chain tells it.
type mlease struct {
	taken, used int64 // micro-tokens
	returned    bool
	admissions  int
}

// leaseRef reads the lease a reserve entry was admitted from ("" for an
// exact admission), the cost it took from it and when it was journaled.
func leaseRef(detail *string) (string, int64, time.Time) {
	if detail == nil {
		return "", 0, time.Time{}
	}
	var d struct {
		Lease       string    `json:"lease"`
		CostMicro   int64     `json:"cost_micro"`
		JournaledAt time.Time `json:"journaled_at"`
	}
	if json.Unmarshal([]byte(*detail), &d) != nil {
		return "", 0, time.Time{}
	}
	return d.Lease, d.CostMicro, d.JournaledAt
}

// leaseEndRef reads the lease a settle entry was settled in, in that
// lease's journal ("" for a settle of the exact pipeline), the refund that
// went back into the lease, and when.
func leaseEndRef(detail *string) (string, int64, time.Time) {
	if detail == nil {
		return "", 0, time.Time{}
	}
	var d struct {
		Lease       string    `json:"lease"`
		RefundMicro *int64    `json:"refund_micro"`
		EndedAt     time.Time `json:"ended_at"`
	}
	if json.Unmarshal([]byte(*detail), &d) != nil || d.RefundMicro == nil {
		return "", 0, time.Time{}
	}
	return d.Lease, *d.RefundMicro, d.EndedAt
}

// journalEnd reports whether a settle entry was made in its lease's
// journal.
func journalEnd(e entry) bool {
	lid, _, _ := leaseEndRef(e.Detail)
	return lid != ""
}

// leaseLedger is the replay of one level's lease entries.
type leaseLedger struct {
	leases map[string]*mlease
	// journaled is each lease's journal (by the reserve entries' detail),
	// in journal order: a renew books its backlog before its take, but
	// not what is journaled between the two.
	journaled map[string][]journalRow
	// capAt is the level's capacity in force, and the highest it had in
	// the last two TTLs (a holder sizes a take from the limits it read at
	// its last take or renew, at most a TTL before).
	caps []capAt
}

type capAt struct {
	at       time.Time
	capacity int64
}

func newLeaseLedger(journaled map[string][]journalRow) *leaseLedger {
	return &leaseLedger{leases: map[string]*mlease{}, journaled: journaled}
}

// usedBy is what the lease's journal held at a moment, or what the ledger
// booked of it if more: at least what the lease row held when a take or
// renew read it then.
func (l *leaseLedger) usedBy(lid string, at time.Time, booked int64) int64 {
	var sum int64
	for _, j := range l.journaled[lid] {
		if j.CreatedAt.After(at) {
			break
		}
		sum += j.CostMicro
	}
	return max(sum, booked)
}

// leaseJournals reads every lease's booked journal from the ledger: each
// leased admission once, with the cost it took and its journal time, in
// journal order.
func leaseJournals(t *testing.T, pool *pgxpool.Pool) map[string][]journalRow {
	t.Helper()
	// An admission's end in the lease's journal gives its refund back: a
	// row of the journal whose cost is the refund, negative.
	rows, err := pool.Query(context.Background(), `SELECT lease_id, cost_micro, created_at, true AS booked FROM (
		SELECT DISTINCT ON (admission_id) detail::json->>'lease' AS lease_id, (detail::json->>'cost_micro')::bigint AS cost_micro,
			(detail::json->>'journaled_at')::timestamptz AS created_at
		FROM ledger_entries WHERE kind = 'reserve' AND detail LIKE '{"lease":%' ORDER BY admission_id) j
		UNION ALL
		SELECT lease_id, cost_micro, created_at, true FROM (
		SELECT DISTINCT ON (admission_id) detail::json->>'lease' AS lease_id, -(detail::json->>'refund_micro')::bigint AS cost_micro,
			(detail::json->>'ended_at')::timestamptz AS created_at
		FROM ledger_entries WHERE kind = 'settle' AND detail LIKE '{"lease":%' ORDER BY admission_id) e
		ORDER BY created_at`)
	if err != nil {
		t.Fatal(err)
	}
	js, err := pgx.CollectRows(rows, pgx.RowToStructByName[journalRow])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]journalRow{}
	for _, j := range js {
		out[j.LeaseID] = append(out[j.LeaseID], j)
	}
	return out
}

func (l *leaseLedger) limits(at time.Time, capacity int64) {
	l.caps = append(l.caps, capAt{at, capacity})
}

// recentCap is the highest capacity in force within two TTLs before at.
func (l *leaseLedger) recentCap(at time.Time) int64 {
	c := int64(0)
	for i := len(l.caps) - 1; i >= 0; i-- {
		c = max(c, l.caps[i].capacity)
		if l.caps[i].at.Before(at.Add(-2 * leaseTTL)) {
			break
		}
	}
	return c
}

// reserve replays a reserve entry admitted from a lease.
func (l *leaseLedger) reserve(fail func(string, ...any), where, lid, adm string, cost, costMicro int64, e entry) {
	ls := l.leases[lid]
	switch {
	case ls == nil:
		fail("%s: %s admitted from lease %s, which took nothing at this level before", where, adm, lid)
		return
	case ls.returned:
		fail("%s: %s admitted from lease %s after its return", where, adm, lid)
	}
	if costMicro != cost*micro {
		fail("%s: %s took %d micro-tokens from lease %s for a cost of %d", where, adm, costMicro, lid, cost)
	}
	if e.DeltaMicro != 0 {
		fail("%s: %s, admitted from lease %s, moved the balance by %d", where, adm, lid, e.DeltaMicro)
	}
	ls.used += costMicro
	ls.admissions++
	if ls.used > ls.taken {
		fail("%s: lease %s has admitted %d micro-tokens, more than the %d taken for it (bound 1)", where, lid, ls.used, ls.taken)
	}
}

// end replays a settle entry of an admission settled in its lease's
// journal: it moves nothing, and gives its refund back to the lease, whose
// return then gives it back to the level.
func (l *leaseLedger) end(fail func(string, ...any), where, lid, adm string, cost, actual, refundMicro int64, e entry) {
	ls := l.leases[lid]
	switch {
	case ls == nil:
		fail("%s: %s settled in lease %s, which took nothing at this level before", where, adm, lid)
		return
	case ls.returned:
		fail("%s: %s settled in lease %s after its return", where, adm, lid)
	}
	if refundMicro != (cost-actual)*micro {
		fail("%s: %s settled in lease %s at %d of %d gave back %d micro-tokens", where, adm, lid, actual, cost, refundMicro)
	}
	if e.DeltaMicro != 0 {
		fail("%s: %s, settled in lease %s, moved the balance by %d", where, adm, lid, e.DeltaMicro)
	}
	ls.used -= refundMicro
	if ls.used < 0 {
		fail("%s: lease %s gave back more than its admissions used", where, lid)
	}
}

// entry replays a lease_take or lease_return entry on b (refilled to the
// entry's time already) and returns the delta the model says it applies.
func (l *leaseLedger) entry(fail func(string, ...any), where string, e entry, b *bucket) int64 {
	lid := ""
	if e.AdmissionID != nil {
		lid = *e.AdmissionID
	}
	ls := l.leases[lid]
	if e.Kind == "lease_take" {
		if ls == nil {
			ls = &mlease{}
			l.leases[lid] = ls
		}
		if ls.returned {
			fail("%s: lease %s takes after its return", where, lid)
		}
		if e.DeltaMicro >= 0 {
			fail("%s: lease %s takes %d", where, lid, e.DeltaMicro)
		}
		if b.balance+e.DeltaMicro < 0 {
			fail("%s: lease %s takes %d from a balance of %d: below zero (bound 1)", where, lid, -e.DeltaMicro, b.balance)
		}
		// The holder asks for what its slice lacks by its own count, which
		// has already set aside the admissions in flight (journaled just
		// after the take): those are used by the take's time.
		used := l.usedBy(lid, e.CreatedAt.Add(inFlight), ls.used)
		before := ls.taken - used
		ls.taken -= e.DeltaMicro
		if after, half := ls.taken-used, l.recentCap(e.CreatedAt)/2; after > max(before, half, micro) {
			fail("%s: lease %s holds %d unused after a take or renew, above half the capacity (%d) and the %d it held (bound 2)",
				where, lid, after, half, before)
		}
		return e.DeltaMicro
	}
	// lease_return: the unused part, capped at capacity like every refund.
	switch {
	case ls == nil:
		fail("%s: lease %s returns, but took nothing at this level", where, lid)
		return e.DeltaMicro
	case ls.returned:
		fail("%s: lease %s returns a second time", where, lid)
	}
	ls.returned = true
	want := ls.taken - ls.used
	limit := max(b.capacity, b.balance)
	want = max(min(limit, b.balance+want)-b.balance, 0)
	if e.DeltaMicro != want {
		fail("%s: lease %s returned %d; took %d, used %d: the model says %d", where, lid, e.DeltaMicro, ls.taken, ls.used, want)
	}
	return want
}

// leaseRow is a lease as the leases table has it after the run.
type leaseRow struct {
	ID         string     `db:"id"`
	TenantID   string     `db:"tenant_id"`
	Holder     string     `db:"holder"`
	State      string     `db:"state"`
	Levels     []string   `db:"levels"`
	SliceMicro int64      `db:"slice_micro"`
	UsedMicro  int64      `db:"used_micro"`
	TakenAt    time.Time  `db:"taken_at"`
	RenewedAt  time.Time  `db:"renewed_at"`
	ExpiresAt  time.Time  `db:"expires_at"`
	EndedAt    *time.Time `db:"ended_at"`
}

func leaseRows(t *testing.T, pool *pgxpool.Pool) map[string]leaseRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, tenant_id, holder, state, levels, slice_micro, used_micro, taken_at, renewed_at, expires_at, ended_at FROM leases`)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := pgx.CollectRows(rows, pgx.RowToStructByName[leaseRow])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]leaseRow{}
	for _, l := range ls {
		out[l.ID] = l
	}
	return out
}

// finish holds one level's replay of its leases to their rows: an ended
// lease took its slice and used what its row says, and gave back what it
// did not use (no return when it used everything).
func (l *leaseLedger) finish(fail func(string, ...any), level string, rows map[string]leaseRow) (leases, admissions int) {
	for lid, ls := range l.leases {
		leases++
		admissions += ls.admissions
		r, ok := rows[lid]
		switch {
		case !ok:
			fail("tenant %s: lease %s is in the ledger, not in the leases table", level, lid)
			continue
		case r.State == "live":
			continue // the soak waits for none to be (checkLeases)
		}
		if ls.taken != r.SliceMicro || ls.used != r.UsedMicro {
			fail("tenant %s: lease %s (%s) took %d and admitted %d by the ledger; its row says %d and %d",
				level, lid, r.State, ls.taken, ls.used, r.SliceMicro, r.UsedMicro)
		}
		if !ls.returned && ls.taken > ls.used {
			fail("tenant %s: lease %s (%s) ended with %d unused, never returned", level, lid, r.State, ls.taken-ls.used)
		}
	}
	return leases, admissions
}

// point is a level's balance after one of its entries, and what refills it.
type point struct {
	at                      time.Time
	balance, capacity, rate int64
}

// minBalance is the lowest balance the level had within [from, to]: its
// balance at from (the last entry's, refilled since), or after an entry
// within. A refill only raises it between entries.
func minBalance(ps []point, from, to time.Time) (int64, bool) {
	i := sort.Search(len(ps), func(i int) bool { return ps[i].at.After(from) })
	if i == 0 {
		return 0, false
	}
	p := ps[i-1]
	b := p.balance
	if b < p.capacity && from.After(p.at) {
		b += min(p.rate*from.Sub(p.at).Microseconds()/micro, p.capacity-b)
	}
	for ; i < len(ps) && !ps[i].at.After(to); i++ {
		b = min(b, ps[i].balance)
	}
	return b, true
}

// checkRefusals holds every refusal by the token bucket of a tenant whose
// tree has only token buckets (leased, or exact beside and above leased
// ones) to the rule that a refusal is decided exactly: at some moment
// while the request waited, some level's balance outside every lease was
// short of its cost. With budget held in other replicas' leases, a
// request may be refused that exact mode would admit, but only for what
// those leases held (bound 2): never with every level's own balance
// enough. It returns the problems, how many refusals it checked, and how
// many of them had the cost within the level's balance plus what its live
// leases held unused (refused while budget sat in leases).
func checkRefusals(h *history, tl map[string][]point, parents map[string]string, tokenOnly map[string]bool, held func(level string, at time.Time) int64) (problems []string, checked, inLeases int) {
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	// The API's refusals do not say the cost: learn each prompt's tokens
	// from the same body's admissions (cost - max_tokens).
	prompt := map[string]int64{}
	for _, e := range h.events {
		if e.face == faceAPI && e.told() {
			if p, out, ok := apiBody(e.body); ok {
				prompt[p] = e.reservedCost - out
			}
		}
	}
	const pad = 500 * time.Millisecond // the decision's clock read, and its wait for the locks
	for _, e := range h.events {
		if !tokenOnly[e.tenant] || !e.admits() || e.code != http.StatusTooManyRequests || e.told() {
			continue
		}
		cost := e.reservedCost
		switch {
		case e.face == faceAPI:
			p, out, ok := apiBody(e.body)
			in, known := prompt[p]
			if !ok || !known {
				continue
			}
			cost = in + out
		case e.face == faceProxy && (e.proxy.gemini || e.typ != "rate_limit_exceeded"):
			continue // a Gemini refusal's cost is its form's; an upstream's 429 is no refusal of ours
		}
		from, to := h.start.Add(e.begin-pad), h.start.Add(e.end+pad)
		short, inLease := false, false
		var seen []string
		for lv := e.tenant; lv != ""; lv = parents[lv] {
			b, ok := minBalance(tl[lv], from, to)
			if !ok || b < cost*micro {
				short = true
			}
			if ok && b < cost*micro && cost*micro <= b+held(lv, h.start.Add(e.end)) {
				inLease = true
			}
			seen = append(seen, fmt.Sprintf("%s %d", lv, b))
		}
		checked++
		if inLease {
			inLeases++
		}
		if !short {
			fail("client %d at %s: the %s refused %s a cost of %d (%s), yet every level's balance outside the leases held it throughout the request (lowest: %s)",
				e.client, e.end, e.face, e.tenant, cost, e.typ, strings.Join(seen, ", "))
		}
	}
	return problems, checked, inLeases
}

// apiBody reads the soak's API body: its prompt and max_tokens.
func apiBody(body string) (string, int64, bool) {
	var v struct {
		Prompt    string `json:"prompt"`
		MaxTokens int64  `json:"max_tokens"`
	}
	if json.Unmarshal([]byte(body), &v) != nil || v.Prompt == "" {
		return "", 0, false
	}
	return v.Prompt, v.MaxTokens, true
}

// kill is a replica killed by the faults, or cut off from Postgres past
// the lease TTL (cut), and when.
type kill struct {
	replica      string
	before, at   time.Time // the kill's command began, and returned; the cut began
	faultWindows int       // len(h.faults) when it struck: its own window is the next
	cut          bool
}

// quietBut reports whether no fault but the own-th overlapped [from, to].
func (h *history) quietBut(own int, from, to time.Time) bool {
	for i, f := range h.faults {
		if i != own && f[0].Before(to) && f[1].After(from) {
			return false
		}
	}
	return true
}

// journalRow is one admission of a lease's journal: as the ledger's
// reserve entry of its own tenant tells it once booked, or as its
// admissions row tells it while its entries are still to write (booked
// false: above its lease's booking cursor).
type journalRow struct {
	LeaseID   string    `db:"lease_id"`
	CostMicro int64     `db:"cost_micro"`
	CreatedAt time.Time `db:"created_at"`
	Booked    bool      `db:"booked"`
}

// unbookedRows are the journal rows not booked (yet).
func unbookedRows(t *testing.T, pool *pgxpool.Pool) []journalRow {
	t.Helper()
	// A groups-shape journal's (00039) in its group rows, where its events
	// are booked from; a copy of one in admissions (lease_group) is not.
	rows, err := pool.Query(context.Background(), `SELECT * FROM (
		SELECT a.lease_id, a.cost * 1000000 AS cost_micro, a.created_at, false AS booked
		FROM admissions a
		WHERE a.lease_id IS NOT NULL AND a.lease_group IS NULL
		  AND a.lease_seq > coalesce((SELECT b.booked_seq FROM admission_lease_books b WHERE b.lease_id = a.lease_id), 0)
		UNION ALL
		SELECT g.lease_ids[i], g.cost[i] * 1000000, g.created_at, false
		FROM lease_groups g CROSS JOIN LATERAL generate_subscripts(g.ids, 1) AS i
		WHERE g.seq * 2048 + i > coalesce((SELECT b.booked_seq FROM admission_lease_books b WHERE b.lease_id = g.lease_ids[i]), 0)
		) j ORDER BY created_at`)
	if err != nil {
		t.Fatal(err)
	}
	js, err := pgx.CollectRows(rows, pgx.RowToStructByName[journalRow])
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// leaseStats is what checkLeases counted.
type leaseStats struct {
	leases, expired, returned, onTime, killedHeld, cutHeld int
	journaled                                              int
	byTenant                                               map[string]int // journal rows (lease admissions) by tenant
}

// checkLeases holds the leases table and the journal to bound 3 and to
// the faults (see the top of this file).
func checkLeases(h *history, rows map[string]leaseRow, js []journalRow) ([]string, leaseStats) {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	st := leaseStats{byTenant: map[string]int{}}
	storeAway := h.storeAway()
	sum := map[string]int64{}
	for _, j := range js {
		l, ok := rows[j.LeaseID]
		if !ok {
			fail("journal row of an unknown lease %s", j.LeaseID)
			continue
		}
		st.journaled++
		st.byTenant[l.TenantID]++
		sum[j.LeaseID] += j.CostMicro
		// The journal's check runs under the lease row's lock, by the
		// store's clock, a statement before the row's time is read.
		if j.CreatedAt.After(l.ExpiresAt.Add(time.Second)) {
			fail("lease %s (%s, %s): an admission journaled at %s, after its expiry at %s", l.ID, l.TenantID, l.Holder,
				j.CreatedAt.Format("15:04:05.000000"), l.ExpiresAt.Format("15:04:05.000000"))
		}
		if l.State != "live" && !j.Booked {
			fail("lease %s (%s): ended %s with an admission journaled at %s never booked", l.ID, l.TenantID, l.State, j.CreatedAt.Format("15:04:05.000000"))
		}
		if j.Booked && j.CreatedAt.Before(l.TakenAt) {
			fail("lease %s (%s): an admission journaled at %s, before the lease was taken at %s", l.ID, l.TenantID,
				j.CreatedAt.Format("15:04:05.000000"), l.TakenAt.Format("15:04:05.000000"))
		}
	}
	used := map[string]int64{} // holder -> what its leases admitted
	for _, l := range rows {
		st.leases++
		used[l.Holder] += l.UsedMicro
		if sum[l.ID] != l.UsedMicro {
			fail("lease %s (%s): its journal holds %d micro-tokens; the row says %d used", l.ID, l.TenantID, sum[l.ID], l.UsedMicro)
		}
		switch l.State {
		case "live":
			fail("lease %s (%s, %s): still live after the load and the sweeps (expires %s)", l.ID, l.TenantID, l.Holder, l.ExpiresAt.Format("15:04:05.000"))
			continue
		case "returned":
			st.returned++
		case "expired":
			st.expired++
			// Bound 3: not before it was due, and within a sweep of it.
			if l.EndedAt.Before(l.ExpiresAt) {
				fail("lease %s (%s, %s): expired at %s, before its expiry %s", l.ID, l.TenantID, l.Holder,
					l.EndedAt.Format("15:04:05.000000"), l.ExpiresAt.Format("15:04:05.000000"))
			}
			// No fault injected is not enough: the sweepers need the
			// store (storeAway). A lease due while every replica's clients
			// saw the store away may be swept late.
			if h.quiet(l.ExpiresAt.Add(-time.Second), l.EndedAt.Add(time.Second)) && !storeAway(l.ExpiresAt, l.ExpiresAt.Add(leaseSweep+time.Second)) {
				st.onTime++
				if late := l.EndedAt.Sub(l.ExpiresAt); late > leaseSweep+time.Second {
					fail("lease %s (%s, %s): expired %s after its expiry, with no fault going on (sweep every %s)", l.ID, l.TenantID, l.Holder,
						late.Round(time.Millisecond), leaseSweep)
				}
			}
		}
	}
	// Every replica admitted from leases of its own, the one whose clock
	// is off included: a holder that compared its clock with the store's
	// expiry admitted nothing from any lease when its clock was ahead.
	for _, name := range h.replicas {
		if used[name] == 0 {
			fail("replica %s admitted nothing from a lease of its own (leases of each holder, used: %v)", name, used)
		}
	}
	// A killed replica's leases, and those of a replica cut off from
	// Postgres past the TTL: never renewed after, and ended by the other
	// replicas' sweepers within TTL + a sweep of the fault (and a second
	// for the sweep's own work), unless another fault was going on.
	for _, k := range h.kills {
		for _, l := range rows {
			if l.Holder != k.replica || !l.TakenAt.Before(k.before) || l.EndedAt == nil || !l.EndedAt.After(k.before) {
				continue
			}
			what := "killed"
			if k.cut {
				what = "cut off"
				st.cutHeld++
			} else {
				st.killedHeld++
			}
			if l.ExpiresAt.After(k.at.Add(leaseTTL + time.Second)) {
				fail("lease %s (%s) of %s, %s at %s: renewed after (expires %s)", l.ID, l.TenantID, k.replica, what,
					k.at.Format("15:04:05.000"), l.ExpiresAt.Format("15:04:05.000"))
			}
			due := k.at.Add(leaseTTL + leaseSweep + time.Second)
			if l.EndedAt.After(due) && h.quietBut(k.faultWindows, k.before, l.EndedAt.Add(time.Second)) {
				fail("lease %s (%s) of %s, %s at %s: %s at %s, past TTL + sweep (%s), with no other fault going on", l.ID, l.TenantID, k.replica,
					what, k.at.Format("15:04:05.000"), l.State, l.EndedAt.Format("15:04:05.000"), due.Format("15:04:05.000"))
			}
		}
	}
	return problems, st
}

// leasesHeld returns what the live leases taken at (or below) a level held
// unused at a moment: taken by then (their lease_take entries at the
// lease's own tenant) less journaled by then.
func leasesHeld(rows map[string]leaseRow, js []journalRow, takes map[string][]point) func(level string, at time.Time) int64 {
	byLease := map[string][]journalRow{}
	for _, j := range js {
		byLease[j.LeaseID] = append(byLease[j.LeaseID], j)
	}
	return func(level string, at time.Time) int64 {
		var sum int64
		for _, l := range rows {
			if !l.TakenAt.Before(at) || (l.EndedAt != nil && !l.EndedAt.After(at)) || !slices.Contains(l.Levels, level) {
				continue
			}
			for _, p := range takes[l.ID] {
				if !p.at.After(at) {
					sum += p.balance // the take's amount
				}
			}
			for _, j := range byLease[l.ID] {
				if !j.CreatedAt.After(at) {
					sum -= j.CostMicro
				}
			}
		}
		return sum
	}
}

// checkFailoverLeases reports, for each change of leader of a Patroni
// soak, the leases live as it began (a kill's command can take seconds on
// a busy machine: taken before it began, ended after or not at all), the
// lease admissions journaled in the second before it began, and the
// requests for an admission of a leased tenant in flight across it (begun
// before it was done, ended after it began).
// A run whose failovers all struck with no lease live, or no request of a
// leased tenant in flight, tested no failover of leasing: that is a
// problem too.
func checkFailoverLeases(h *history, rows map[string]leaseRow, js []journalRow) (problems, report []string) {
	if len(h.failovers) == 0 {
		return nil, nil
	}
	leased := map[string]bool{}
	for _, l := range rows {
		leased[l.TenantID] = true
	}
	var first time.Time // the first lease taken
	for _, l := range rows {
		if first.IsZero() || l.TakenAt.Before(first) {
			first = l.TakenAt
		}
	}
	report = append(report, fmt.Sprintf("the first lease was taken at +%s", first.Sub(h.start).Round(100*time.Millisecond)))
	struck := false
	for i, f := range h.failovers {
		live, journaled, inFlight := 0, 0, 0
		for _, l := range rows {
			if l.TakenAt.Before(f.begin) && (l.EndedAt == nil || l.EndedAt.After(f.begin)) {
				live++
			}
		}
		for _, j := range js {
			if j.CreatedAt.After(f.begin.Add(-time.Second)) && !j.CreatedAt.After(f.begin) {
				journaled++
			}
		}
		for _, e := range h.events {
			if e.admits() && leased[e.tenant] && !h.start.Add(e.begin).After(f.at) && !h.start.Add(e.end).Before(f.begin) {
				inFlight++
			}
		}
		struck = struck || live > 0 && inFlight > 0
		report = append(report, fmt.Sprintf("failover %d (%s at +%s): %d leases live, %d lease admissions journaled in the second before, %d requests of leased tenants in flight across it",
			i+1, f.kind, f.at.Sub(h.start).Round(100*time.Millisecond), live, journaled, inFlight))
	}
	if !struck {
		problems = append(problems, fmt.Sprintf("%d failovers, none with a lease live and a request of a leased tenant in flight: no failover tested leasing", len(h.failovers)))
	}
	return problems, report
}
