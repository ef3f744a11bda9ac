package replica

import (
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

func openAdmission(tenant, model string, in int64) *account.Admission {
	a := &account.Admission{ID: rule.NewStoreAdmissionID(time.Unix(1_800_000_000, 0)), TenantID: tenant, Face: rule.FaceRLS}
	a.Estimate = estimator.Estimate{Model: model, Family: "gpt-4o", InputTokens: in, OutputTokens: 2 * in, Cost: 7 * in,
		Approximate: in%2 == 1, InputWeightMicro: 1_000_000, OutputWeightMicro: 3_000_000, ServiceTier: "flex", TextFactorMilli: 1100}
	return a
}

const openLeaseID = "lse_00112233445566778899aabb"

// The index gives back what a settle needs, exactly as the admission had
// it, by id or by its tenant's stored key, once, and only to its tenant.
func TestOpenIndexTake(t *testing.T) {
	x := openIndex{max: 8}
	a, b := openAdmission("acme", "gpt-4o", 3), openAdmission("beta", "gpt-4o-mini", 4)
	x.add(openLeaseID, a, "rls k1")
	x.add(openLeaseID, b, "rls k1") // the same key string, another tenant
	if _, ok := x.take("beta", a.ID, ""); ok {
		t.Fatal("another tenant took acme's admission by id")
	}
	o, ok := x.take("acme", "", "rls k1")
	if !ok || o.id != a.ID || o.lease != openLeaseID || o.tenant != "acme" || o.face != rule.FaceRLS || o.priced || o.est != a.Estimate {
		t.Fatalf("take by key: %+v, %v; want %+v", o, ok, a.Estimate)
	}
	if _, ok := x.take("acme", a.ID, ""); ok {
		t.Fatal("an admission was taken twice")
	}
	if o, ok := x.take("beta", b.ID, ""); !ok || o.est != b.Estimate {
		t.Fatalf("take by id: %+v, %v", o, ok)
	}
	if _, ok := x.take("beta", "", "rls k1"); ok {
		t.Fatal("a key whose admission was taken by id found it again")
	}
	// Ids of another form are not remembered: their settles are exact.
	c := openAdmission("acme", "gpt-4o", 5)
	c.ID = "local-1"
	x.add(openLeaseID, c, "")
	x.add("lease-7", openAdmission("acme", "gpt-4o", 6), "rls k2")
	if _, ok := x.take("acme", "local-1", ""); ok {
		t.Fatal("an id of another form was remembered")
	}
	if _, ok := x.take("acme", "", "rls k2"); ok {
		t.Fatal("a lease id of another form was remembered")
	}
}

// Two generations of max/2: the index holds at most max admissions and
// at least the last max/2, forgetting the oldest generation whole.
func TestOpenIndexGenerations(t *testing.T) {
	x := openIndex{max: 4}
	var as []*account.Admission
	for i := range 5 {
		a := openAdmission("acme", "gpt-4o", int64(i+1))
		as = append(as, a)
		x.add(openLeaseID, a, "")
	}
	for i, a := range as {
		_, ok := x.take("acme", a.ID, "")
		if want := i >= 2; ok != want {
			t.Fatalf("admission %d of 5 found %v, want %v", i, ok, want)
		}
	}
	if n := len(x.cur.byID) + len(x.prev.byID); n != 0 {
		t.Fatalf("%d left after every take", n)
	}
	none := openIndex{max: 0}
	a := openAdmission("acme", "gpt-4o", 1)
	none.add(openLeaseID, a, "k")
	if _, ok := none.take("acme", a.ID, ""); ok {
		t.Fatal("an index of none remembered")
	}
}

// A caller names the model, so the shapes are bounded: past maxShapes the
// index starts over, and what it forgot settles exactly.
func TestOpenIndexShapesBounded(t *testing.T) {
	x := openIndex{max: 1 << 16}
	first := openAdmission("acme", "m-first", 1)
	x.add(openLeaseID, first, "")
	for i := range maxShapes {
		x.add(openLeaseID, openAdmission("acme", "m-"+strconv.Itoa(i), 1), "")
	}
	if len(x.shapes) > maxShapes {
		t.Fatalf("%d shapes, at most %d", len(x.shapes), maxShapes)
	}
	if _, ok := x.take("acme", first.ID, ""); ok {
		t.Fatal("the index kept an admission past its start over")
	}
}

// The index's memory holds no pointer, so the collector never scans it
// (with strings in its entries, an admit-only load's full index cost 40 %
// of the server's CPU in collection).
func TestOpenIndexHoldsNoPointer(t *testing.T) {
	for _, v := range []any{openEntry{}, openID{}, openKey{}, openLease{}} {
		if typ := reflect.TypeOf(v); hasPointer(typ) {
			t.Errorf("%v holds a pointer", typ)
		}
	}
}

func hasPointer(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return false
	case reflect.Array:
		return hasPointer(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if hasPointer(t.Field(i).Type) {
				return true
			}
		}
		return false
	default:
		return true
	}
}

// LeaseOpenBytes covers what the maps of a full index take.
func TestLeaseOpenBytes(t *testing.T) {
	if LeaseOpenBytes(-1) != 0 || LeaseOpenBytes(0) != LeaseOpenBytes(DefaultLeaseOpenMax) {
		t.Fatal("none takes nothing, and 0 is the default")
	}
	if got, least := LeaseOpenBytes(DefaultLeaseOpenMax), int64(2*(DefaultLeaseOpenMax/2)*(80+48)); got < least {
		t.Fatalf("%d bytes for the default index, less than its entries' %d", got, least)
	}
}
