package rule

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"strings"
	"time"
)

// idEncoding is Crockford's base32 alphabet, lower case: ids sort as their
// bytes do.
var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// NewStoreAdmissionID returns the id of an admission the store makes:
// "adm_" and 26 characters: 48 bits of milliseconds since the epoch of now
// (so ids sort by creation, keeping the index append-mostly), one bit that
// marks ids made by a replica on its own (clear here), and 79 random bits.
func NewStoreAdmissionID(now time.Time) string { return admissionID(now, false) }

// NewLocalAdmissionID is NewStoreAdmissionID for replicas that admit
// without the store (the local failure policy): their ids never collide
// with the store's, and are marked as local (see LocalAdmissionTime).
func NewLocalAdmissionID(now time.Time) string { return admissionID(now, true) }

func admissionID(now time.Time, local bool) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	_, _ = rand.Read(b[6:])
	b[6] &^= 0x80
	if local {
		b[6] |= 0x80
	}
	return "adm_" + idEncoding.EncodeToString(b[:])
}

// LocalAdmissionTime reports whether id was made by a replica on its own
// (the local failure policy), and when by that replica's clock. Such an
// admission reaches the store only when its replica replays its spool, so
// until then the store does not know it.
func LocalAdmissionTime(id string) (time.Time, bool) {
	b, ok := decodeAdmissionID(id)
	if !ok || b[6]&0x80 == 0 {
		return time.Time{}, false
	}
	ms := binary.BigEndian.Uint64(append([]byte{0, 0}, b[:6]...))
	return time.UnixMilli(int64(ms)), true
}

// AdmissionGroup names the lease journal group commit an admission was
// made in, and its place there: the journal's holder number (drawn at
// random when the journal starts, 40 bits), the group's count in that
// journal (28 bits) and the admission's place among the group's
// admissions (10 bits; places are distinct in a group, not dense).
type AdmissionGroup struct {
	Holder uint64
	Count  uint32
	Place  int
}

// The widths of AdmissionGroup's parts in an id.
const (
	MaxGroupHolder = 1<<40 - 1
	MaxGroupCount  = 1<<28 - 1
	MaxGroupPlace  = 1<<10 - 1
)

// groupedMark is the bit after the local mark (byte 6's second bit) that
// marks a grouped id.
const groupedMark = 0x40

// GroupedAdmissionID returns the id a lease journal gives an admission as
// it forms the admission's group commit (docs/leasing.md, "The compact
// journal"): the 48 bits of milliseconds of like (the caller's own id for
// it, so the admission keeps the instant it was made and ids still sort by
// creation), the local mark clear, the grouped mark set, then g. Why: an
// id that names its group lets a reader find a leased admission's group
// row from the id alone, with no index entry per admission. ok false when
// like is no admission id or g is out of range.
func GroupedAdmissionID(like string, g AdmissionGroup) (string, bool) {
	b, ok := decodeAdmissionID(like)
	if !ok || g.Holder > MaxGroupHolder || g.Count > MaxGroupCount || g.Place < 0 || g.Place > MaxGroupPlace {
		return "", false
	}
	hi := binary.BigEndian.Uint64(b[:8])&^0xffff | groupedMark<<8 | g.Holder>>26
	lo := (g.Holder&(1<<26-1))<<38 | uint64(g.Count)<<10 | uint64(g.Place)
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo)
	return "adm_" + idEncoding.EncodeToString(b[:]), true
}

// AdmissionGroupOf reads the group and place a grouped id names
// (GroupedAdmissionID). ok false for a local id and for anything else that
// is not one. Ids made before grouped ids (79 random bits after the
// milliseconds) have the grouped mark set half the time: a reader that
// finds no group for such an id looks for the admission as before.
func AdmissionGroupOf(id string) (AdmissionGroup, bool) {
	b, ok := decodeAdmissionID(id)
	if !ok || b[6]&0x80 != 0 || b[6]&groupedMark == 0 {
		return AdmissionGroup{}, false
	}
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	return AdmissionGroup{
		Holder: (hi&(1<<14-1))<<26 | lo>>38,
		Count:  uint32(lo >> 10 & MaxGroupCount),
		Place:  int(lo & MaxGroupPlace),
	}, true
}

// decodeAdmissionID is id's 16 bytes.
func decodeAdmissionID(id string) ([16]byte, bool) {
	var out [16]byte
	raw, ok := strings.CutPrefix(id, "adm_")
	if !ok || len(raw) != 26 {
		return out, false
	}
	b, err := idEncoding.DecodeString(raw)
	if err != nil || len(b) != 16 {
		return out, false
	}
	copy(out[:], b)
	return out, true
}
