package web

import (
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/rule"
)

func TestTreeOrder(t *testing.T) {
	t.Parallel()
	// row is "id<parent:rank:rejected": rank 0 throttled, 1 low, 2 ok, 3 disabled.
	row := func(id, parent string, rank int, rejected int64) *tenantRow {
		return &tenantRow{ID: id, Parent: parent, rank: rank, Rejected: rejected}
	}
	for _, tc := range []struct {
		name string
		rows []*tenantRow
		want string // id:depth, in order
	}{
		{"flat: throttled first, most rejected first, then by id",
			[]*tenantRow{row("a", "", 2, 0), row("b", "", 0, 1), row("c", "", 0, 5), row("d", "", 1, 0)},
			"c:0 b:0 d:0 a:0"},
		{"children follow their parent, whatever the input order",
			[]*tenantRow{row("org.b", "org", 2, 0), row("zeta", "", 2, 0), row("org", "", 2, 0), row("org.a.k", "org.a", 2, 0), row("org.a", "org", 2, 0)},
			"org:0 org.a:1 org.a.k:2 org.b:1 zeta:0"},
		{"a throttled leaf brings its tree first, and its branch first in the tree",
			[]*tenantRow{row("alpha", "", 2, 0), row("org", "", 2, 0), row("org.a", "org", 2, 0), row("org.b", "org", 2, 0), row("org.b.k", "org.b", 0, 3)},
			"org:0 org.b:1 org.b.k:2 org.a:1 alpha:0"},
		{"a row whose parent is not shown is a root",
			[]*tenantRow{row("team", "org", 2, 0), row("team.k", "team", 2, 0)},
			"team:0 team.k:1"},
		{"a cycle (impossible in the store) still lists every row once",
			[]*tenantRow{row("x", "y", 2, 0), row("y", "x", 2, 0), row("r", "", 2, 0)},
			"r:0 x:0 y:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, r := range treeOrder(tc.rows) {
				got = append(got, r.ID+":"+string(rune('0'+r.Depth)))
			}
			if s := strings.Join(got, " "); s != tc.want {
				t.Errorf("got %s, want %s", s, tc.want)
			}
		})
	}
}

func TestWouldRefuse(t *testing.T) {
	t.Parallel()
	tokens := rule.LimitSet(0).With(rule.LimitTokens)
	for _, tc := range []struct {
		shadow rule.LimitSet
		counts map[rule.Limit]int64
		want   string
	}{
		{0, nil, "—"},
		{tokens, nil, "tokens: 0"},
		{tokens, map[rule.Limit]int64{rule.LimitTokens: 1234}, "tokens: 1,234"},
		// A limit shadow earlier in the window (enforced now) still shows
		// what it counted, in check order.
		{tokens.With(rule.LimitPeriodBudget), map[rule.Limit]int64{rule.LimitConcurrency: 2, rule.LimitTokens: 3},
			"tokens: 3\nconcurrency: 2\nperiod_budget: 0"},
		// A model's shadow buckets count too, after the tenant's limits.
		{tokens, map[rule.Limit]int64{rule.LimitOutputTokens: 4, rule.LimitInputTokens: 1},
			"tokens: 0\ninput_tokens: 1\noutput_tokens: 4"},
	} {
		if got := wouldRefuse(tc.shadow, tc.counts); got != tc.want {
			t.Errorf("wouldRefuse(%v, %v) = %q, want %q", tc.shadow.Strings(), tc.counts, got, tc.want)
		}
	}
}

func TestParentOptions(t *testing.T) {
	t.Parallel()
	snap := func(id string, path ...string) rule.Snapshot { return rule.Snapshot{TenantID: id, Path: path} }
	snaps := []rule.Snapshot{snap("a"), snap("a.b", "a"), snap("a.b.c", "a", "a.b"), snap("a.b.c.d", "a", "a.b", "a.b.c"), snap("z")}
	var got []string
	for _, o := range parentOptions(snaps, "gone") {
		s := o.ID + "=" + o.Label
		if o.Selected {
			s += "*"
		}
		got = append(got, s)
	}
	// a.b.c.d is at the deepest level: it cannot be a parent. The selected
	// id that is no tenant is kept, so the refused form shows what was sent.
	want := "a=a a.b=a / a.b a.b.c=a / a.b / a.b.c z=z gone=gone*"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("options %s, want %s", s, want)
	}
}
