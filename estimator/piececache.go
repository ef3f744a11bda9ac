// A cache of the counts of short pieces that are not one token.

package estimator

import "sync/atomic"

// pieceCache remembers the token counts of pieces of mergePiece+1 to 16
// bytes that are not a token: the words of scripts whose words are several
// tokens (Cyrillic, Arabic, Hindi in cl100k_base), which natural text
// repeats as it repeats English words. A hit costs one probe where a miss
// runs the backtracking encoder (a trie walk and a compatibility check per
// token). Entries are direct mapped and shared by all goroutines; each is
// guarded by a sequence number (odd while written), so a reader that races
// a writer sees a miss, never a mix of two pieces.
type pieceCache struct {
	entries []pieceEntry
	shift   uint // 64 - log2(len(entries))
}

// pieceEntry is one cached piece: its first 16 bytes (zero padded; exact
// with the length), and length<<32 | count. 32 bytes, two to a cache line.
type pieceEntry struct {
	seq, k0, k1, meta atomic.Uint64
}

const (
	pieceCacheBits = 12 // 4096 entries, 128 KB
	pieceCacheMax  = 16 // longest piece cached: key16 holds it whole
)

// newPieceCache returns a cache of 1<<bits entries.
func newPieceCache(bits uint) pieceCache {
	return pieceCache{entries: make([]pieceEntry, 1<<bits), shift: 64 - bits}
}

func (c *pieceCache) entry(k0, k1 uint64, n int) *pieceEntry {
	return &c.entries[hash16(k0, k1, n)>>c.shift]
}

// get returns the count of piece (len(piece) <= pieceCacheMax) if cached.
func (c *pieceCache) get(piece string) (int, bool) {
	k0, k1 := key16(piece)
	e := c.entry(k0, k1, len(piece))
	seq := e.seq.Load()
	if seq&1 != 0 {
		return 0, false
	}
	ok := e.k0.Load() == k0 && e.k1.Load() == k1
	meta := e.meta.Load()
	if !ok || meta>>32 != uint64(len(piece)) || e.seq.Load() != seq {
		return 0, false
	}
	return int(uint32(meta)), true
}

// put caches the count n of piece (len(piece) <= pieceCacheMax), unless
// another goroutine is writing the entry.
func (c *pieceCache) put(piece string, n int) {
	k0, k1 := key16(piece)
	e := c.entry(k0, k1, len(piece))
	seq := e.seq.Load()
	if seq&1 != 0 || !e.seq.CompareAndSwap(seq, seq+1) {
		return
	}
	e.k0.Store(k0)
	e.k1.Store(k1)
	e.meta.Store(uint64(len(piece))<<32 | uint64(uint32(n)))
	e.seq.Store(seq + 2)
}
