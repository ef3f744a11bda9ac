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
