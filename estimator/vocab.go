// The vocabulary of one encoding in flat tables built for counting: an exact
// lookup of a byte string's rank, a trie for the longest token at a
// position, and the merge tree of every token, which decides whether two
// tokens can stand side by side in a BPE output.

package estimator

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"sync/atomic"
)

// vocab holds an encoding's tokens by rank (a token's id is its rank). It is
// immutable once built and safe for concurrent use.
//
// Memory, o200k_base (200k tokens): the lookup table 8.4 MB, the trie 6.8 MB
// and its first-character table 1 MB, the merge tables 10 MB (the answer
// cache 1 MB of it), the piece cache 128 KB, the tokens' bytes 2 MB (about
// 30 MB live in all, built in about a second); cl100k_base about half of
// that but the fixed-size tables.
type vocab struct {
	blob   string   // every token's bytes, in rank order
	starts []uint32 // token t is blob[starts[t]:starts[t+1]]
	maxLen int      // longest token, in bytes
	digits bool     // every string of one to three ASCII digits is a token

	// Exact lookup: open addressing with linear probing over the first 16
	// bytes and the length of a token (hashing costs the same whatever the
	// length; tokens over 12 bytes compare their tail with the blob).
	slots    []slot
	slotMask uint64

	// da is the trie of all tokens as a double array, for the longest token
	// at a position ([daNode]).
	da []daNode
	// chars is the walk over a first character of two or three bytes
	// ([charStep]), indexed by its code point.
	chars []charStep

	// prefix[t] is the longest token that is a proper prefix of t, or -1.
	prefix []int32
	// left[t], right[t]: the two tokens BPE merges last to make t (t, t for
	// a byte). pairs maps a (left, right) pair to the token it makes.
	left, right []uint32
	pairKeys    []uint64 // left<<32|right, +1 so that 0 is empty
	pairVals    []uint32
	pairMask    uint64
	// pairBits has the bit pairHash(key)>>pairShift set for every pair: 1 MB
	// that stays in cache and answers most absent pairs without a probe.
	pairBits []uint64

	// seen remembers the answers of compatible, which natural text asks
	// again and again: a two-way cache of ((a<<24|b)+1)<<1|answer in sets
	// of two neighbouring words (one cache line), the newer first, shared by
	// all goroutines (atomic words, so a race only loses an entry).
	seen []atomic.Uint64

	// pieces remembers the counts of short pieces that are not a token.
	pieces pieceCache
}

// seenBits sizes vocab.seen: 131072 entries, 1 MB. Random CJK asks about
// some 10,000 pairs a megabyte; at 32768 entries, one way, the collisions
// alone cost a fifth of its count (an uncached answer walks both merge
// trees, a few microseconds into tables that are not in cache).
const seenBits = 17

// seenSet is the first entry of vocab.seen's set for key (the second is
// the next one).
func seenSet(key uint64) uint64 { return key * 0x9e3779b97f4a7c15 >> (64 - seenBits) &^ 1 }

const pairShift = 64 - 23 // 1<<23 bits

func pairHash(key uint64) uint64 { return key * 0x9e3779b97f4a7c15 }

// slot is 16 bytes, four to a cache line: the first 8 bytes of the token,
// and the next 4, its length and its rank (meta == 0: empty). Tokens of up
// to 12 bytes compare in full here; longer ones compare their tail with
// the blob.
type slot struct {
	k0   uint64
	meta uint64 // bytes 8..11 <<32 | length <<24 | rank
}

// le64 loads 8 bytes of s at i, little endian (the compiler makes it one
// load).
func le64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func le32(s string, i int) uint64 {
	s = s[i : i+4]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24
}

// key16 returns the first 16 bytes of s as two words, zero padded, with
// overlapping loads instead of a byte loop.
func key16(s string) (k0, k1 uint64) {
	switch n := len(s); {
	case n >= 16:
		return le64(s, 0), le64(s, 8)
	case n > 8:
		return le64(s, 0), le64(s, n-8) >> (8 * (16 - n))
	case n == 8:
		return le64(s, 0), 0
	case n >= 4:
		return le32(s, 0) | le32(s, n-4)<<(8*(n-4)), 0
	case n > 0:
		return uint64(s[0]) | uint64(s[n/2])<<(8*(n/2)) | uint64(s[n-1])<<(8*(n-1)), 0
	}
	return 0, 0
}

func hash16(k0, k1 uint64, n int) uint64 {
	hi, lo := bits.Mul64(k0^0x243f6a8885a308d3, k1^0x13198a2e03707344^uint64(n)<<56)
	return hi ^ lo
}

// rank returns the rank of s, or -1 when s is not a token.
func (v *vocab) rank(s string) int {
	n := len(s)
	if n == 0 || n > v.maxLen {
		return -1
	}
	k0, k1 := key16(s)
	want := uint64(uint32(k1))<<32 | uint64(n)<<24
	for i := hash16(k0, k1, n) & v.slotMask; ; i = (i + 1) & v.slotMask {
		sl := &v.slots[i]
		if sl.meta == 0 {
			return -1
		}
		if sl.k0 == k0 && sl.meta&^(1<<24-1) == want {
			id := uint32(sl.meta & (1<<24 - 1))
			if n <= 12 || v.blob[v.starts[id]+12:v.starts[id+1]] == s[12:] {
				return int(id)
			}
		}
	}
}

func (v *vocab) token(t uint32) string { return v.blob[v.starts[t]:v.starts[t+1]] }

func (v *vocab) tokenLen(t uint32) int { return int(v.starts[t+1] - v.starts[t]) }

// longest returns the longest token that is a prefix of s[i:] and its
// length (s[i:] is not empty; every byte is a token).
func (v *vocab) longest(s string, i int) (uint32, int) {
	da := v.da
	start := i
	end := min(len(s), i+v.maxLen)
	if b0 := s[i]; b0 >= 0xC2 && b0 < 0xF0 {
		// A character of two or three bytes: one step from the table.
		r, sz := rune(-1), 0
		if b0 < 0xE0 {
			if i+1 < len(s) && s[i+1]&0xC0 == 0x80 {
				r, sz = rune(b0&0x1F)<<6|rune(s[i+1]&0x3F), 2
			}
		} else if i+2 < len(s) && s[i+1]&0xC0 == 0x80 && s[i+2]&0xC0 == 0x80 {
			r, sz = rune(b0&0x0F)<<12|rune(s[i+1]&0x3F)<<6|rune(s[i+2]&0x3F), 3
			if r < 0x800 || (0xD800 <= r && r < 0xE000) {
				r = -1
			}
		}
		if r >= 0 {
			c := &v.chars[uint16(r)]
			best, n := c.best&(1<<24-1), int(c.best>>24)
			if c.node == 0 {
				return best, n
			}
			return v.walk(s, i+sz, end, start, c.node, c.base, best, n)
		}
	}
	node := da[0].base + uint32(s[i])
	best := uint32(da[node].tok)
	return v.walk(s, i+1, end, start, node, da[node].base, best, 1)
}

// walk continues longest's walk at s[i] from the node in slot node (its
// base given), with the longest token so far best of length n.
func (v *vocab) walk(s string, i, end, start int, node, base, best uint32, n int) (uint32, int) {
	da := v.da
	for ; i < end; i++ {
		c := base + uint32(s[i])
		d := &da[c]
		if d.check != node+1 {
			break
		}
		node, base = c, d.base
		if d.tok >= 0 {
			best, n = uint32(d.tok), i+1-start
		}
	}
	return best, n
}

// pair returns the token made by merging a and b, if BPE makes one that
// way.
func (v *vocab) pair(a, b uint32) (uint32, bool) {
	key := uint64(a)<<32 | uint64(b) + 1
	h := pairHash(key)
	if bit := h >> pairShift; v.pairBits[bit>>6]&(1<<(bit&63)) == 0 {
		return 0, false
	}
	for i := (h >> 32) & v.pairMask; ; i = (i + 1) & v.pairMask {
		k := v.pairKeys[i]
		if k == 0 {
			return 0, false
		}
		if k == key {
			return v.pairVals[i], true
		}
	}
}

// compatible reports whether BPE of the bytes of a followed by the bytes of
// b is exactly [a, b]: whether a and b can be neighbours in a BPE output.
//
// It undoes the merges of a and b in reverse order (the later merge, the
// higher rank, first) down to the boundary between them, and at each step
// asks whether the two parts touching the boundary would have merged into a
// token of lower rank than the merges still to undo: if so, BPE would have
// merged across the boundary and never produced a next to b. This is the
// test of GitHub's rust-gems bpe crate (crates/bpe, "is_valid_token_pair").
func (v *vocab) compatible(a, b uint32) bool {
	key := (uint64(a)<<24 | uint64(b)) + 1
	set := v.seen[seenSet(key):][:2]
	if w := set[0].Load(); w>>1 == key {
		return w&1 == 1
	}
	if w := set[1].Load(); w>>1 == key {
		return w&1 == 1
	}
	ok := v.compatibleUncached(a, b)
	w := key << 1
	if ok {
		w |= 1
	}
	set[1].Store(set[0].Load())
	set[0].Store(w)
	return ok
}

// compatibleUncached is compatible without the cache.
func (v *vocab) compatibleUncached(a, b uint32) bool {
	limit := uint32(math.MaxUint32)
	for {
		if m, ok := v.pair(a, b); ok && m < limit {
			return false
		}
		if a > b {
			limit = a
			if a = v.right[a]; a == limit { // a is a byte: undo b
				limit = b + 1
				if b = v.left[b]; b+1 == limit {
					return true
				}
			}
		} else {
			limit = b + 1
			if b = v.left[b]; b+1 == limit { // b is a byte: undo a
				limit = a
				if a = v.right[a]; a == limit {
					return true
				}
			}
		}
	}
}

// tableSize returns a power of two of at least twice n.
func tableSize(n int) int {
	size := 1
	for size < 2*n {
		size <<= 1
	}
	return size
}

// newVocab builds the tables from tiktoken's rank file. It requires what
// tiktoken's encodings guarantee and the counter relies on: ranks 0..n-1
// each used once, and every one of the 256 bytes a token.
func newVocab(ranks map[string]int) (*vocab, error) {
	n := len(ranks)
	if n == 0 || n >= 1<<24 {
		return nil, fmt.Errorf("%d tokens", n)
	}
	byRank := make([]string, n)
	for tok, r := range ranks {
		if r < 0 || r >= n || byRank[r] != "" || tok == "" {
			return nil, fmt.Errorf("ranks are not 0..%d, each once (rank %d of %q)", n-1, r, tok)
		}
		byRank[r] = tok
	}
	v := &vocab{starts: make([]uint32, n+1)}
	var sb strings.Builder
	for r, tok := range byRank {
		sb.WriteString(tok)
		v.starts[r+1] = uint32(sb.Len())
		v.maxLen = max(v.maxLen, len(tok))
	}
	v.blob = sb.String()
	if v.maxLen > 255 {
		return nil, fmt.Errorf("a token of %d bytes (the lookup table holds lengths up to 255)", v.maxLen)
	}

	// The lookup table.
	size := tableSize(n)
	v.slots, v.slotMask = make([]slot, size), uint64(size-1)
	for r, tok := range byRank {
		k0, k1 := key16(tok)
		i := hash16(k0, k1, len(tok)) & v.slotMask
		for v.slots[i].meta != 0 {
			i = (i + 1) & v.slotMask
		}
		v.slots[i] = slot{k0, uint64(uint32(k1))<<32 | uint64(len(tok))<<24 | uint64(r)}
	}

	// The trie, built from the sorted tokens: each token adds the nodes
	// past its common prefix with the previous one, and all its prefixes
	// come before it, so its longest proper prefix that is a token is on
	// its path already.
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(i)
	}
	slices.SortFunc(ids, func(a, b uint32) int { return strings.Compare(byRank[a], byRank[b]) })
	lcp := func(a, b string) int {
		i := 0
		for i < len(a) && i < len(b) && a[i] == b[i] {
			i++
		}
		return i
	}
	tokOf := []int32{-1} // the token of each node, or -1
	parent := []uint32{0}
	byteOf := []byte{0}
	v.prefix = make([]int32, n)
	path, prev := []uint32{0}, ""
	for _, id := range ids {
		tok := byRank[id]
		l := lcp(tok, prev)
		path = path[:l+1]
		for i := l; i < len(tok); i++ {
			path = append(path, uint32(len(tokOf)))
			tokOf = append(tokOf, -1)
			parent = append(parent, path[i])
			byteOf = append(byteOf, tok[i])
		}
		if len(tokOf) >= 1<<31 {
			return nil, fmt.Errorf("trie of %d nodes", len(tokOf))
		}
		tokOf[path[len(tok)]] = int32(id)
		v.prefix[id] = -1
		for i := len(tok) - 1; i > 0; i-- {
			if t := tokOf[path[i]]; t >= 0 {
				v.prefix[id] = t
				break
			}
		}
		prev = tok
	}
	v.da = buildDA(parent, byteOf, tokOf)
	v.chars = buildChars(v.da)
	for b := uint32(0); b < 256; b++ {
		if c := v.da[0].base + b; v.da[c].check != 1 || v.da[c].tok < 0 {
			return nil, fmt.Errorf("byte %#x is not a token", b)
		}
	}

	v.digits = true
	for d := 0; d < 1110; d++ { // "0".."9", "00".."99", "000".."999"
		var s string
		switch {
		case d < 10:
			s = fmt.Sprintf("%d", d)
		case d < 110:
			s = fmt.Sprintf("%02d", d-10)
		default:
			s = fmt.Sprintf("%03d", d-110)
		}
		v.digits = v.digits && v.rank(s) >= 0
	}

	// The merge tree: in rank order, t's last merge is the first split of
	// t (longest left part first) into two tokens of lower rank that are
	// compatible, given the merges of all lower ranks.
	v.left, v.right = make([]uint32, n), make([]uint32, n)
	size = tableSize(n)
	v.pairKeys, v.pairVals, v.pairMask = make([]uint64, size), make([]uint32, size), uint64(size-1)
	v.pairBits = make([]uint64, (1<<(64-pairShift))/64)
	v.seen = make([]atomic.Uint64, 1<<seenBits)
	v.pieces = newPieceCache(pieceCacheBits)
	for r, tok := range byRank {
		t := uint32(r)
		v.left[t], v.right[t] = t, t
		for a := v.prefix[r]; a >= 0; a = v.prefix[a] {
			b := v.rank(tok[v.tokenLen(uint32(a)):])
			if int(a) >= r || b < 0 || b >= r || !v.compatibleUncached(uint32(a), uint32(b)) {
				continue
			}
			v.left[t], v.right[t] = uint32(a), uint32(b)
			key := uint64(a)<<32 | uint64(b) + 1
			h := pairHash(key)
			v.pairBits[h>>pairShift>>6] |= 1 << (h >> pairShift & 63)
			j := (h >> 32) & v.pairMask
			for v.pairKeys[j] != 0 {
				j = (j + 1) & v.pairMask
			}
			v.pairKeys[j], v.pairVals[j] = key, t
			break
		}
	}
	return v, nil
}
