package lease

import (
	"bytes"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestJournalNamesGroups: a group's Grouped admissions get ids naming the
// journal's holder, one count per group and distinct places, keeping their
// placeholders' instants; every occurrence of a placeholder in the kept
// answer is the new id; ends and admissions that are not Grouped keep
// their ids, and a group with none Grouped takes no count; the holder is
// drawn again when the count would wrap.
func TestJournalNamesGroups(t *testing.T) {
	t.Parallel()
	j := &Journal{s: &Store{}}
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	req := func(grouped bool) *appendReq {
		id := rule.NewStoreAdmissionID(now)
		resp := []byte(`{"admission_id":"` + id + `","x":1,"again":"` + id + `"}`)
		return &appendReq{a: Admission{Admission: account.Admission{ID: id}, Grouped: grouped, Response: resp}}
	}
	end := &appendReq{a: Admission{Admission: account.Admission{ID: "adm_end"}}, end: &End{AdmissionID: "adm_end"}}
	plain := req(false)
	plainID := plain.a.ID
	group := []*appendReq{req(true), end, plain, req(true), req(true)}
	placeholders := make([]string, len(group))
	for i, r := range group {
		placeholders[i] = r.a.ID
	}
	j.name(group)
	if end.a.ID != "adm_end" || plain.a.ID != plainID {
		t.Fatalf("an end (%s) or an admission not Grouped (%s) was renamed", end.a.ID, plain.a.ID)
	}
	var first rule.AdmissionGroup
	for k, i := range []int{0, 3, 4} {
		r := group[i]
		g, ok := rule.AdmissionGroupOf(r.a.ID)
		if !ok || g.Place != k || g.Count != 1 || g.Holder == 0 || (k > 0 && g.Holder != first.Holder) {
			t.Fatalf("admission %d: %s names %+v %v, want count 1, place %d, one holder", i, r.a.ID, g, ok, k)
		}
		if k == 0 {
			first = g
		}
		if r.a.ID[:13] != placeholders[i][:13] {
			t.Fatalf("%s does not keep the instant of %s", r.a.ID, placeholders[i])
		}
		if want := []byte(`{"admission_id":"` + r.a.ID + `","x":1,"again":"` + r.a.ID + `"}`); !bytes.Equal(r.a.Response, want) {
			t.Fatalf("kept answer %s, want %s", r.a.Response, want)
		}
	}
	j.name([]*appendReq{req(false), end})
	next := req(true)
	j.name([]*appendReq{next})
	if g, _ := rule.AdmissionGroupOf(next.a.ID); g.Count != 2 || g.Place != 0 || g.Holder != first.Holder {
		t.Fatalf("the next group named %+v, want count 2 (a group with none Grouped takes no count)", g)
	}
	j.count = rule.MaxGroupCount
	wrapped := req(true)
	j.name([]*appendReq{wrapped})
	if g, _ := rule.AdmissionGroupOf(wrapped.a.ID); g.Count != 1 || g.Holder == first.Holder {
		t.Fatalf("after the last count: %+v, want a new holder's count 1", g)
	}
	// The groups shape names every admission, Grouped or not, and marks
	// one whose id is no admission id, which no reader could find.
	j.s.groups = true
	plain, odd := req(false), &appendReq{a: Admission{Admission: account.Admission{ID: "not-an-id"}}}
	j.name([]*appendReq{plain, odd})
	if g, ok := rule.AdmissionGroupOf(plain.a.ID); !ok || g.Count != 2 || g.Place != 0 || plain.ungrouped {
		t.Fatalf("groups shape: an admission not Grouped named %+v %v (ungrouped %v), want count 2, place 0", g, ok, plain.ungrouped)
	}
	if !odd.ungrouped || odd.a.ID != "not-an-id" {
		t.Fatalf("groups shape: an id that is none kept %q, ungrouped %v", odd.a.ID, odd.ungrouped)
	}
}
