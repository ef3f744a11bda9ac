package account

// Deferred settles: a settle or release that names by idempotency key an
// admission the store does not know yet, when a replica may have made that
// admission on its own during an outage and not replayed it, is kept
// (deferred_settles) and applied when the admission is replayed.
//
// Why: a gateway's stream-end call settles by its request id and is never
// retried. If it reaches a replica, or the store, before the replica that
// admitted the request locally has replayed its spool, answering "not
// found" loses the usage for good, and the reservation expires charged at
// its estimate. An id-named settle needs none of this: a local admission's
// id carries its time, so its caller is told to retry (ErrNotReplayed).
//
// Exactly once: the row is written by the settle's own decision, under the
// tenant's row lock, only when its read under that lock found no admission
// for the key; a replay writes the admission and its key under the same
// lock, and reads the row after taking it. So either the replay committed
// first (and the settle found the admission and settled it), or the row is
// there when the replay reads it, and the replay applies it and deletes it
// in its own transaction. A replay run again finds its admission written
// and does nothing.

import (
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
)

var (
	//go:embed sql/deferred_settle_put.sql
	deferredSettlePutSQL string
	//go:embed sql/deferred_settle_get.sql
	deferredSettleGetSQL string
	//go:embed sql/deferred_settle_delete.sql
	deferredSettleDeleteSQL string
	//go:embed sql/deferred_settle_purge.sql
	deferredSettlePurgeSQL string
)

// ErrDeferred: a settle or release named by idempotency key found no
// admission, and its request could have been admitted by a replica on its
// own (Deferral): it is kept, and applied when that admission is replayed
// into the store (ReplayReserve). It wraps ErrAdmissionNotFound, so a
// caller that answers "not found" as "nothing to do" answers it the same.
var ErrDeferred = fmt.Errorf("%w yet; the settle is kept for it until it is replayed", rule.ErrAdmissionNotFound)

// Deferral is the failure policy of the request a settle or release by
// idempotency key ends, as far as its caller knows it: Model is its
// model's (PolicyDefault: none, or the model is not known) and Default the
// replica's. When the key names no admission, the decision completes it
// with the tenant's own policy, read under the tenant's lock
// (rule.ResolvePolicy): under the local policy the settle is kept (ErrDeferred),
// otherwise no admission can arrive for the key and nothing is written (a
// refused request's stream end stays free). A nested tenant is never
// admitted locally, so nothing is kept for one either.
type Deferral struct {
	Model   rule.Policy `json:"model,omitempty"`
	Default rule.Policy `json:"default,omitempty"`
}

// keeps reports whether a settle by key with this deferral is kept for a
// tenant chain (root first) that did not know the key.
func (d *Deferral) keeps(chain []*tenant) bool {
	if d == nil || len(chain) != 1 {
		return false
	}
	return rule.ResolvePolicy(d.Model, chain[0].Limits.OnStoreUnavailable, d.Default) == rule.PolicyLocal
}

// deferredEnd is a kept settle (State settled) or release (State
// released), as deferred_settles holds it.
type deferredEnd struct {
	tenantID, key  string
	state          State
	usage          SettleParams // the usage fields, for a settle
	actor          string
	keyID, gateway string
	at             time.Time
}

// deferEnd keeps a settle (usage set) or release (usage nil) whose
// idempotency key named no admission in this batch, if its deferral says
// an admission may still arrive for the key. It returns ErrDeferred when
// it keeps it (or a settle earlier in the batch already did), else
// ErrAdmissionNotFound.
func (d *decision) deferEnd(key string, dp *Deferral, target State, actor, keyID, gatewayID string, usage *SettleParams) error {
	if key == "" || !dp.keeps(d.chain) {
		return rule.ErrAdmissionNotFound
	}
	k := deferredEnd{tenantID: d.t.id, key: key, state: target, actor: actorOr(actor, "api"), keyID: keyID, gateway: gatewayID, at: d.now}
	if usage != nil {
		k.usage = SettleParams{InputTokens: usage.InputTokens, OutputTokens: usage.OutputTokens,
			CachedInputTokens: usage.CachedInputTokens, CacheWriteTokens: usage.CacheWriteTokens,
			CacheWrite1hTokens: usage.CacheWrite1hTokens, RefundTokens: usage.RefundTokens, ReasoningTokens: usage.ReasoningTokens,
			ServiceTier: usage.ServiceTier}
	}
	d.w.deferEnd(k)
	return ErrDeferred
}

// maxKeptPerKey bounds the settles and releases kept for one key: a
// gateway sends one stream end per request, so more than a few for a key
// is a client's fault, and the rest are dropped (answered ErrDeferred all
// the same, as nothing can be checked yet).
const maxKeptPerKey = 8

// deferEnd records a kept settle or release, in the batch's order, up to
// maxKeptPerKey of a key in the batch (deferred_settle_put.sql bounds the
// rows of a key the same way).
func (w *writes) deferEnd(k deferredEnd) {
	n := 0
	for _, seen := range w.deferred {
		if seen.tenantID == k.tenantID && seen.key == k.key {
			n++
		}
	}
	if n < maxKeptPerKey {
		w.deferred = append(w.deferred, k)
	}
}

// queueDeferred queues the batch's kept settles and releases as one
// statement (deferred_settle_put.sql).
func queueDeferred(b *pgx.Batch, ks []deferredEnd) {
	n := len(ks)
	tenants, keys, kinds, actors, keyIDs, gateways := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	in, out, cached, refund, at := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]time.Time, n)
	w5, w1, reasoning, tiers := make([]int64, n), make([]int64, n), make([]int64, n), make([]string, n)
	for i, k := range ks {
		tenants[i], keys[i], kinds[i], actors[i], keyIDs[i], gateways[i], at[i] = k.tenantID, k.key, k.kind(), k.actor, k.keyID, k.gateway, k.at
		in[i], out[i], cached[i], refund[i] = k.usage.InputTokens, k.usage.OutputTokens, k.usage.CachedInputTokens, k.usage.RefundTokens
		w5[i], w1[i], reasoning[i], tiers[i] = k.usage.CacheWriteTokens, k.usage.CacheWrite1hTokens, k.usage.ReasoningTokens, k.usage.ServiceTier
	}
	b.Queue(deferredSettlePutSQL, tenants, keys, kinds, in, out, cached, refund, actors, keyIDs, gateways, at, w5, w1, reasoning, tiers)
}

func (k deferredEnd) kind() string {
	if k.state == StateReleased {
		return "release"
	}
	return "settle"
}

// scanDeferred reads the kept settles and releases of a replayed
// admission's key, in the order they came (deferred_settle_get.sql).
func scanDeferred(br pgx.BatchResults, tenantID, key string) ([]*deferredEnd, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("budget: deferred settles: %w", err)
	}
	defer rows.Close()
	var ks []*deferredEnd
	for rows.Next() {
		k := &deferredEnd{tenantID: tenantID, key: key}
		var kind string
		if err := rows.Scan(&kind, &k.usage.InputTokens, &k.usage.OutputTokens, &k.usage.CachedInputTokens,
			&k.usage.RefundTokens, &k.actor, &k.at, &k.usage.CacheWriteTokens, &k.usage.CacheWrite1hTokens, &k.usage.ReasoningTokens, &k.usage.ServiceTier); err != nil {
			return nil, fmt.Errorf("budget: deferred settle: %w", err)
		}
		k.state = StateSettled
		if kind == "release" {
			k.state = StateReleased
		}
		ks = append(ks, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("budget: deferred settles: %w", err)
	}
	return ks, nil
}

// applyDeferred ends a replayed admission a, as d's chain holds it after
// its reserve, with the settles and releases kept for its key, in the
// order they came, as the live path would have decided them: the first
// the decision accepts ends it, one it refuses (usage out of the
// admission's bounds) moves nothing and the next is tried, and the ones
// after the accepted one would have been repeats (the same answer, or a
// conflict that moves nothing). All are deleted, in the replay's
// transaction: the ledger shows the settle with its own actor, noted as
// kept. If the decision refuses them all, the reservation expires at its
// estimate.
func (d *decision) applyDeferred(a *Admission, ks []*deferredEnd) error {
	d.adms[a.ID] = a
	for _, k := range ks {
		d.note = "kept from " + k.at.UTC().Format(time.RFC3339Nano) + ": it arrived before its admission was replayed"
		var usage *SettleParams
		if k.state == StateSettled {
			usage = &k.usage
		}
		_, err := d.end(nil, a.ID, k.actor, a.Face, k.state, usage) // kept under a's key, in its face's namespace
		if err == nil {
			break
		}
		if !isDecision(err) {
			return err
		}
	}
	d.note = ""
	d.w.after = append(d.w.after, write{sql: deferredSettleDeleteSQL, expect: -1, args: []any{ks[0].tenantID, ks[0].key}})
	return nil
}
