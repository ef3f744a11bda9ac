package lease

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/budget/account"
)

// A groups-shape write keeps its leases' events when it committed; one
// Postgres answered with an error wrote nothing and keeps nothing, the
// leases still known; one whose outcome is unknown (a connection lost at
// its commit) forgets its leases, so that their bookings read the group
// rows it may have written. Book takes events in order, and drops what it
// booked, keeping what was kept meanwhile.
func TestJournalKeepsWhatItCommitted(t *testing.T) {
	t.Parallel()
	j := &Journal{s: &Store{}}
	j.s.kept.know("A")
	j.s.kept.know("B")
	ev := func(seqs ...int64) []account.LeasedAdmission {
		out := make([]account.LeasedAdmission, len(seqs))
		for i, s := range seqs {
			out[i] = account.LeasedAdmission{ID: "x", Seq: s}
		}
		return out
	}
	j.keep([]string{"A", "B", "C"}, map[string][]account.LeasedAdmission{"A": ev(1, 2), "B": ev(3), "C": ev(4)}, nil)
	j.keep([]string{"A"}, map[string][]account.LeasedAdmission{"A": ev(5)}, &pgconn.PgError{Code: account.GuardCode})
	j.keep([]string{"A"}, map[string][]account.LeasedAdmission{"A": ev(6)}, nil)
	if a, ok := j.s.kept.of("A"); !ok || len(a) != 3 || a[0].Seq != 1 || a[1].Seq != 2 || a[2].Seq != 6 {
		t.Fatalf("A kept %+v (%v), want seqs 1, 2, 6", a, ok)
	}
	if _, ok := j.s.kept.of("C"); ok {
		t.Fatal("a lease the store did not take is kept")
	}
	j.s.kept.drop("A", 2)
	j.keep([]string{"A"}, map[string][]account.LeasedAdmission{"A": ev(7)}, nil)
	if a, _ := j.s.kept.of("A"); len(a) != 2 || a[0].Seq != 6 || a[1].Seq != 7 {
		t.Fatalf("after a booking of two: %+v, want seqs 6, 7", a)
	}
	j.keep([]string{"B"}, nil, errors.New("conn closed"))
	if _, ok := j.s.kept.of("B"); ok {
		t.Fatal("a write of unknown outcome left its lease's events kept: a booking would skip what it committed")
	}
	j.keep([]string{"B"}, map[string][]account.LeasedAdmission{"B": ev(8)}, nil)
	if _, ok := j.s.kept.of("B"); ok {
		t.Fatal("a forgotten lease is kept again")
	}
}
