package account

import (
	"context"
	"slices"

	"github.com/tokengate/tokengate/budget/rule"
)

// ReserveAll is Store.Reserve of several requests as one decision, all or
// none (Item.Group), through the pipeline: they queue as one call, in the
// shard of their lowest tenant id, and are decided in one transaction, so
// that a gateway's call naming several tenants debits every one of them or
// none, with no undo. Each result is a Reservation, or the request's own
// refusal, or a *rule.WithheldError for one refused with its group.
//
// A group's tenants may map to other shards than its lowest one: their
// transactions then lock the same rows in the same (id) order, so they
// queue on each other and never deadlock.
func (p *Pipeline) ReserveAll(ctx context.Context, rps []ReserveParams) []OpResult {
	items := make([]Item, len(rps))
	for i := range rps {
		items[i] = Item{TenantID: rps[i].TenantID, Op: Op{Reserve: &rps[i]}, Group: 1}
	}
	return p.doAll(ctx, items)
}

// lowestTenant is the shard key of a group: its lowest tenant id.
func lowestTenant(items []Item) string {
	low := items[0].TenantID
	for _, it := range items[1:] {
		low = min(low, it.TenantID)
	}
	return low
}

// broken lists the groups that some of their reserves passed and others
// did not: deciding them moved what must not move (nil for none). A group
// whose reserves all failed, or all passed, is whole; a replay of an
// earlier admission moved nothing now, and counts as neither.
func broken(items []Item, results []OpResult) []int {
	if !slices.ContainsFunc(items, func(it Item) bool { return it.Group != 0 }) {
		return nil // the usual batch: nothing to look at
	}
	passed, failed := map[int]bool{}, map[int]bool{}
	for i, it := range items {
		if it.Group == 0 {
			continue
		}
		if results[i].Err != nil {
			failed[it.Group] = true
		} else if r := results[i].Reservation; r != nil && !r.Replayed {
			passed[it.Group] = true
		}
	}
	var out []int
	for g := range passed {
		if failed[g] {
			out = append(out, g)
		}
	}
	return out
}

// withhold returns items with the reserves of groups answered by their
// first try: each keeps its refusal, and one that passed is withheld
// (*rule.WithheldError). They are answered without being decided again.
func withhold(items []Item, results []OpResult, groups []int) []Item {
	out := slices.Clone(items)
	for i, it := range items {
		if it.Group == 0 || !slices.Contains(groups, it.Group) {
			continue
		}
		err := results[i].Err
		if err == nil {
			err = &rule.WithheldError{}
		}
		out[i].Op.answered = err
	}
	return out
}
