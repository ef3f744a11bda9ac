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
	raw, ok := strings.CutPrefix(id, "adm_")
	if !ok || len(raw) != 26 {
		return time.Time{}, false
	}
	b, err := idEncoding.DecodeString(raw)
	if err != nil || len(b) != 16 || b[6]&0x80 == 0 {
		return time.Time{}, false
	}
	ms := binary.BigEndian.Uint64(append([]byte{0, 0}, b[:6]...))
	return time.UnixMilli(int64(ms)), true
}
