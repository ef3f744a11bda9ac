package web

import (
	"cmp"
	"slices"
	"strings"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// Budgets nest (rule.MaxDepth levels: organisation, team, ...), and an
// admission must fit every level, so the dashboard shows tenants as trees:
// a tenant is listed right under its parent, indented by its depth, and a
// busy team is never read apart from the organisation it draws on.

// gaugeLimit is the limit each gauge of a row shows.
var gaugeLimit = map[string]rule.Limit{
	"tokens":   rule.LimitTokens,
	"requests": rule.LimitRequests,
	"period":   rule.LimitPeriodBudget,
	"open":     rule.LimitConcurrency,
}

// treeOrder lists rows depth first, each tenant right after its parent,
// and sets their Depth. Roots, and the children of one parent, come in the
// order the flat list had: by the most urgent status anywhere below them
// (throttled, low, ok, disabled), then by rejections below them, then by
// id. So a throttled key-level tenant brings its whole tree to the top
// rather than leaving it. A row whose parent is not among rows is a root.
func treeOrder(rows []*tenantRow) []*tenantRow {
	byID := make(map[string]*tenantRow, len(rows))
	for _, r := range rows {
		byID[r.ID] = r
	}
	children := map[string][]*tenantRow{}
	var roots []*tenantRow
	for _, r := range rows {
		if _, ok := byID[r.Parent]; ok && r.Parent != r.ID {
			children[r.Parent] = append(children[r.Parent], r)
		} else {
			roots = append(roots, r)
		}
	}
	type urgency struct {
		rank     int
		rejected int64
	}
	memo := map[string]urgency{}
	var urgencyOf func(r *tenantRow, seen int) urgency
	urgencyOf = func(r *tenantRow, seen int) urgency {
		if u, ok := memo[r.ID]; ok {
			return u
		}
		u := urgency{rank: r.rank, rejected: r.Rejected + r.RejectedPrev}
		if seen <= rule.MaxDepth { // the store keeps trees this shallow; never loop
			for _, c := range children[r.ID] {
				cu := urgencyOf(c, seen+1)
				u.rank = min(u.rank, cu.rank)
				u.rejected += cu.rejected
			}
		}
		memo[r.ID] = u
		return u
	}
	order := func(a, b *tenantRow) int {
		ua, ub := urgencyOf(a, 0), urgencyOf(b, 0)
		return cmp.Or(cmp.Compare(ua.rank, ub.rank), cmp.Compare(ub.rejected, ua.rejected), strings.Compare(a.ID, b.ID))
	}
	out := make([]*tenantRow, 0, len(rows))
	placed := map[string]bool{}
	var walk func(r *tenantRow, depth int)
	walk = func(r *tenantRow, depth int) {
		if placed[r.ID] {
			return
		}
		placed[r.ID] = true
		r.Depth = depth
		out = append(out, r)
		kids := slices.Clone(children[r.ID])
		slices.SortStableFunc(kids, order)
		for _, c := range kids {
			walk(c, depth+1)
		}
	}
	slices.SortStableFunc(roots, order)
	for _, r := range roots {
		walk(r, 0)
	}
	for _, r := range rows { // unreachable only if parents formed a cycle
		walk(r, 0)
	}
	return out
}

// wouldRefuse says, per limit and one a line, how many requests a tenant's
// shadow limits would have refused ("tokens: 12\nrequests: 0"): every shadow limit it
// has now, with 0 when it refused nothing (tried, and harmless to
// enforce), and any limit that was shadow earlier in the window and
// counted, a model's shadow input_tokens and output_tokens buckets
// included (after the tenant's own limits). "—" when there is neither.
func wouldRefuse(shadow rule.LimitSet, counts map[rule.Limit]int64) string {
	var parts []string
	for _, l := range slices.Concat(rule.AllLimits, rule.ModelLimitNames) {
		n, counted := counts[l]
		if shadow.Has(l) || counted {
			parts = append(parts, string(l)+": "+groupDigits(n))
		}
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, "\n")
}

// parentOption is a tenant the create form offers as a parent, labelled
// with its path ("acme / search").
type parentOption struct {
	ID, Label string
	Selected  bool
}

// parentOptions lists, in tree order, the tenants that can take a child
// (those above the deepest level). A selected id that is not among them
// (gone, too deep, or typed) is offered too, so a refused form comes back
// as it was sent, with the store's reason next to it.
func parentOptions(snaps []rule.Snapshot, selected string) []parentOption {
	rows := make([]*tenantRow, 0, len(snaps))
	paths := map[string][]string{}
	for _, s := range snaps {
		rows = append(rows, &tenantRow{ID: s.TenantID, Parent: s.Parent()})
		paths[s.TenantID] = s.Path
	}
	var out []parentOption
	found := false
	for _, r := range treeOrder(rows) {
		path := paths[r.ID]
		if len(path)+1 >= rule.MaxDepth {
			continue
		}
		o := parentOption{ID: r.ID, Label: strings.Join(append(slices.Clone(path), r.ID), " / "), Selected: r.ID == selected}
		found = found || o.Selected
		out = append(out, o)
	}
	if selected != "" && !found {
		out = append(out, parentOption{ID: selected, Label: selected, Selected: true})
	}
	return out
}

// treeSnapshots returns what a tenant page shows of node's tree: the
// tenant at id, its ancestors (root first) and its children, and the
// tenant's own snapshot. ok is false when id is not in the tree.
func treeSnapshots(root *account.TreeNode, id string) (snaps []rule.Snapshot, self rule.Snapshot, ok bool) {
	var find func(n *account.TreeNode, chain []rule.Snapshot) bool
	find = func(n *account.TreeNode, chain []rule.Snapshot) bool {
		chain = append(chain, n.Snapshot)
		if n.Snapshot.TenantID == id {
			snaps = chain
			for _, c := range n.Children {
				snaps = append(snaps, c.Snapshot)
			}
			self = n.Snapshot
			return true
		}
		if len(chain) > rule.MaxDepth {
			return false
		}
		for _, c := range n.Children {
			if find(c, slices.Clip(chain)) {
				return true
			}
		}
		return false
	}
	if root == nil || !find(root, nil) {
		return nil, rule.Snapshot{}, false
	}
	return snaps, self, true
}
