package rule_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestAdmissionIDs: a local id says when it was made (to the
// millisecond), a store's says it is not local, ids sort by creation, and
// a malformed id is never taken for a local one.
func TestAdmissionIDs(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 123_456_789, time.UTC)
	local := rule.NewLocalAdmissionID(now)
	if at, ok := rule.LocalAdmissionTime(local); !ok || !at.Equal(now.Truncate(time.Millisecond)) || len(local) != 30 {
		t.Fatalf("%s: %v %v", local, at, ok)
	}
	store := rule.NewStoreAdmissionID(now)
	if _, ok := rule.LocalAdmissionTime(store); ok || !strings.HasPrefix(store, "adm_") || len(store) != 30 {
		t.Fatalf("a store's id %s taken for a local one", store)
	}
	if later := rule.NewStoreAdmissionID(now.Add(time.Millisecond)); later <= store || later <= local {
		t.Fatalf("ids do not sort by creation: %s then %s, %s", store, local, later)
	}
	for _, bad := range []string{"", "adm_", local[:len(local)-1], "xyz" + local[3:], local[:len(local)-1] + "!"} {
		if _, ok := rule.LocalAdmissionTime(bad); ok {
			t.Errorf("%q taken for a local id", bad)
		}
	}
	if a, b := rule.NewLocalAdmissionID(now), rule.NewLocalAdmissionID(now); a == b {
		t.Fatal("two ids of one millisecond collide")
	}
}

// TestGroupedAdmissionIDs: a grouped id keeps its placeholder's instant
// (so ids still sort by creation), names its group and place at every
// width's edge, is never taken for a local id, and a local or malformed id
// names no group.
func TestGroupedAdmissionIDs(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 123_456_789, time.UTC)
	like := rule.NewStoreAdmissionID(now)
	for _, g := range []rule.AdmissionGroup{
		{},
		{Holder: 1, Count: 1, Place: 1},
		{Holder: rule.MaxGroupHolder, Count: rule.MaxGroupCount, Place: rule.MaxGroupPlace},
		{Holder: 0x2aaaaaaaaa, Count: 0x5555555, Place: 0x2aa},
		{Holder: 1 << 26, Count: 1 << 27, Place: 1 << 9},
	} {
		id, ok := rule.GroupedAdmissionID(like, g)
		if !ok || len(id) != 30 || id[:13] != like[:13] { // "adm_" and the 45 bits of milliseconds in whole characters
			t.Fatalf("%+v: %q %v (from %s)", g, id, ok, like)
		}
		if got, ok := rule.AdmissionGroupOf(id); !ok || got != g {
			t.Fatalf("%s names %+v %v, want %+v", id, got, ok, g)
		}
		if _, ok := rule.LocalAdmissionTime(id); ok {
			t.Fatalf("grouped id %s taken for a local one", id)
		}
		if later := rule.NewStoreAdmissionID(now.Add(time.Millisecond)); later <= id {
			t.Fatalf("a grouped id does not sort by its instant: %s, then %s", id, later)
		}
		if earlier := rule.NewStoreAdmissionID(now.Add(-time.Millisecond)); earlier >= id {
			t.Fatalf("a grouped id does not sort by its instant: %s, then %s", earlier, id)
		}
	}
	a, _ := rule.GroupedAdmissionID(like, rule.AdmissionGroup{Holder: 7, Count: 9, Place: 0})
	b, _ := rule.GroupedAdmissionID(like, rule.AdmissionGroup{Holder: 7, Count: 9, Place: 1})
	c, _ := rule.GroupedAdmissionID(like, rule.AdmissionGroup{Holder: 7, Count: 10, Place: 0})
	if !(a < b && b < c) {
		t.Fatalf("one instant's grouped ids do not sort by group and place: %s %s %s", a, b, c)
	}
	for _, g := range []rule.AdmissionGroup{{Holder: rule.MaxGroupHolder + 1}, {Count: rule.MaxGroupCount + 1}, {Place: rule.MaxGroupPlace + 1}, {Place: -1}} {
		if id, ok := rule.GroupedAdmissionID(like, g); ok {
			t.Errorf("%+v out of range made %s", g, id)
		}
	}
	local := rule.NewLocalAdmissionID(now)
	for _, bad := range []string{"", "adm_", local, "xyz" + like[3:], like[:len(like)-1] + "!"} {
		if g, ok := rule.AdmissionGroupOf(bad); ok {
			t.Errorf("%q names group %+v", bad, g)
		}
		if id, ok := rule.GroupedAdmissionID(bad, rule.AdmissionGroup{}); ok && bad != local {
			t.Errorf("%q made grouped id %s", bad, id)
		}
	}
}
