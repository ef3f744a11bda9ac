package replica

import (
	"encoding/hex"
	"hash/maphash"
	"strings"
	"sync"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// DefaultLeaseOpenMax is how many of its open leased admissions a replica
// remembers, to settle them in their lease's journal: about 5 MB. At
// 5,000 admissions a second it covers a settle that comes within 3 s; an
// older one settles exactly, as every admission can.
const DefaultLeaseOpenMax = 1 << 15

// LeaseOpenBytes bounds the memory of an index of openMax admissions (0:
// the default, negative: none), for a replica whose soft memory limit is
// for its requests' work: each of the two generations is two maps made for
// openMax/2 entries, whose tables round up to a power of two slots (of 80
// and 48 bytes, and a control byte each), and a third while one is made.
func LeaseOpenBytes(openMax int) int64 {
	if openMax == 0 {
		openMax = DefaultLeaseOpenMax
	}
	if openMax < 2 {
		return 0
	}
	slots := int64(1)
	for slots*7/8 < int64(openMax/2) {
		slots *= 2
	}
	return 3 * slots * (80 + 48 + 2)
}

// maxShapes bounds the distinct (tenant, face, model, family, tier,
// weights) the index names; a request names its model, so a caller could
// otherwise grow the table without end. Past it the index starts over:
// what it forgets is settled exactly.
const maxShapes = 1 << 12

// opened is a leased admission this replica made, as its settle in the
// journal needs it: its lease, tenant, face, whether it has a price, and
// its estimate.
type opened struct {
	id, lease, tenant string
	face              rule.Face
	priced            bool
	est               estimator.Estimate
}

// openID is an admission id ("adm_" and 26 characters) without its
// prefix, openLease a lease id ("lse_" and 24 hex digits) decoded, and
// openKey the 128-bit hash of a tenant and a stored Idempotency-Key.
type (
	openID    [26]byte
	openLease [12]byte
	openKey   [2]uint64
)

// openEntry is one open admission, held without a pointer: the index
// holds thousands of them in a replica whose every request allocates, and
// the garbage collector skips memory that holds no pointer. Its first
// version held strings, and after an admit-only load had filled it the
// collector's scans took 40 % of the server's CPU (profile.sh with BEFORE,
// BENCHMARKS.md). What the entry names by number is in its shape.
type openEntry struct {
	lease               openLease
	shape               uint32
	priced, approximate bool
	in, out, cost       int64
}

// shape is what many admissions share: the tenant, the face, and the
// estimate's fields other than its counts.
type shape struct {
	tenant                       string
	face                         rule.Face
	model, family, serviceTier   string
	inWeight, outWeight, textMil int64
}

// openGen is a generation of the index: the admissions added while it was
// the newest, by id and by key.
type openGen struct {
	byID  map[openID]openEntry
	byKey map[openKey]openID // entries may outlive their admission's take by id
}

func newGen(n int) openGen {
	return openGen{byID: make(map[openID]openEntry, n), byKey: make(map[openKey]openID, n)}
}

// openIndex is the leased admissions a replica made and has not seen
// settled, by id and by (tenant, stored Idempotency-Key). It keeps two
// generations of max/2 admissions each: when the newest is full the
// oldest is forgotten whole, so the index holds at most max admissions,
// at least the last max/2, and never walks or shifts its entries.
type openIndex struct {
	mu        sync.Mutex
	max       int
	seeds     [2]maphash.Seed
	cur, prev openGen
	shapes    []shape
	shapeOf   map[shape]uint32
}

func (x *openIndex) reset() {
	x.seeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}
	x.cur, x.prev = newGen(x.max/2), openGen{}
	x.shapes, x.shapeOf = nil, map[shape]uint32{}
}

// keyOf is the hash by which a stored key is found: 128 bits with seeds of
// this process, so two keys a replica holds collide with a chance near
// 2^-96 however they are chosen.
func (x *openIndex) keyOf(tenant, stored string) openKey {
	var k openKey
	for i, seed := range x.seeds {
		var m maphash.Hash
		m.SetSeed(seed)
		_, _ = m.WriteString(tenant)
		_ = m.WriteByte(0)
		_, _ = m.WriteString(stored)
		k[i] = m.Sum64()
	}
	return k
}

func idOf(id string) (openID, bool) {
	var o openID
	raw, ok := strings.CutPrefix(id, "adm_")
	if !ok || len(raw) != len(o) {
		return o, false
	}
	copy(o[:], raw)
	return o, true
}

func leaseOf(id string) (openLease, bool) {
	var o openLease
	raw, ok := strings.CutPrefix(id, "lse_")
	if !ok || hex.DecodedLen(len(raw)) != len(o) {
		return o, false
	}
	_, err := hex.Decode(o[:], []byte(raw))
	return o, err == nil
}

// add remembers a, made from leaseID, with its stored key ("" for none).
// An admission whose ids are not of the store's forms is not remembered:
// it settles exactly.
func (x *openIndex) add(leaseID string, a *account.Admission, stored string) {
	id, ok := idOf(a.ID)
	ls, lok := leaseOf(leaseID)
	if !ok || !lok || x.max < 2 {
		return
	}
	est := a.Estimate
	sh := shape{tenant: a.TenantID, face: a.Face.Or(), model: est.Model, family: est.Family, serviceTier: est.ServiceTier,
		inWeight: est.InputWeightMicro, outWeight: est.OutputWeightMicro, textMil: est.TextFactorMilli}
	e := openEntry{lease: ls, priced: a.MoneyEstimate != nil, approximate: est.Approximate, in: est.InputTokens, out: est.OutputTokens, cost: est.Cost}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.shapeOf == nil {
		x.reset()
	}
	n, ok := x.shapeOf[sh]
	if !ok {
		if len(x.shapes) >= maxShapes {
			x.reset()
		}
		n = uint32(len(x.shapes))
		x.shapes = append(x.shapes, sh)
		x.shapeOf[sh] = n
	}
	e.shape = n
	if len(x.cur.byID) >= x.max/2 {
		x.prev, x.cur = x.cur, newGen(x.max/2)
	}
	x.cur.byID[id] = e
	if stored != "" {
		x.cur.byKey[x.keyOf(a.TenantID, stored)] = id
	}
}

// take removes and returns the admission a settle names (by id, or by its
// tenant's stored key), if this replica made it from a lease.
func (x *openIndex) take(tenant, admissionID, stored string) (opened, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.shapeOf == nil {
		return opened{}, false
	}
	byKey := admissionID == "" && stored != ""
	var k openKey
	var want openID
	if byKey {
		k = x.keyOf(tenant, stored)
	} else if v, ok := idOf(admissionID); ok {
		want = v
	} else {
		return opened{}, false
	}
	for _, g := range [2]*openGen{&x.cur, &x.prev} {
		id := want
		if byKey {
			var ok bool
			if id, ok = g.byKey[k]; !ok {
				continue
			}
		}
		e, ok := g.byID[id]
		if !ok || x.shapes[e.shape].tenant != tenant {
			continue
		}
		delete(g.byID, id)
		if byKey {
			delete(g.byKey, k)
		}
		sh := x.shapes[e.shape]
		est := estimator.Estimate{Model: sh.model, Family: sh.family, InputTokens: e.in, OutputTokens: e.out, Cost: e.cost,
			Approximate: e.approximate, InputWeightMicro: sh.inWeight, OutputWeightMicro: sh.outWeight,
			ServiceTier: sh.serviceTier, TextFactorMilli: sh.textMil}
		return opened{id: "adm_" + string(id[:]), lease: "lse_" + hex.EncodeToString(e.lease[:]), tenant: sh.tenant,
			face: sh.face, priced: e.priced, est: est}, true
	}
	return opened{}, false
}
