// A double-array trie of the vocabulary, for the longest token at a
// position.

package estimator

import (
	"math/bits"
	"unicode/utf8"
)

// daNode is one slot of the double array: the child of the node in slot s
// by byte b is in slot base+b when that slot's check is s+1. The slot holds
// the child's own base and token, so each step of a walk reads one 16-byte
// record (one cache line), where a hashed edge table reads the edge and
// then the child's record: two cache misses per byte on text whose tokens
// are not in cache (random CJK, punctuation).
type daNode struct {
	base  uint32
	check uint32 // the parent's slot + 1; 0 for a free slot and the root
	tok   int32  // the token the path to the node spells, or -1
	_     uint32 // pads the record to 16 bytes: records do not straddle lines
}

// buildDA builds the double array of a trie given as its nodes' parents
// and bytes (node 0 the root, parents before their children, children of a
// node in increasing byte order) and tokens (tokOf, -1 when none).
func buildDA(parent []uint32, byteOf []byte, tokOf []int32) []daNode {
	nodes := len(parent)
	// The children of each node, in increasing byte order.
	first := make([]uint32, nodes+1)
	for c := 1; c < nodes; c++ {
		first[parent[c]+1]++
	}
	for i := 1; i <= nodes; i++ {
		first[i] += first[i-1]
	}
	kids := make([]uint32, nodes)
	fill := make([]uint32, nodes)
	copy(fill, first[:nodes])
	for c := 1; c < nodes; c++ {
		p := parent[c]
		kids[fill[p]] = uint32(c)
		fill[p]++
	}

	da := make([]daNode, 256, nodes+nodes/4+512)
	var used []uint64
	isUsed := func(s int) bool { return s>>6 < len(used) && used[s>>6]&(1<<(s&63)) != 0 }
	use := func(s int) {
		for s>>6 >= len(used) {
			used = append(used, 0)
		}
		used[s>>6] |= 1 << (s & 63)
		for s+256 >= len(da) {
			da = append(da, daNode{})
		}
	}
	for i := range da {
		da[i].tok = -1
	}
	use(0)
	firstFree := 1
	// slot[node] is the node's slot; the root's is 0. Nodes are placed in
	// breadth-first order, a node's children all at once.
	slot := make([]uint32, nodes)
	queue := []uint32{0}
	for len(queue) > 0 {
		t := queue[0]
		queue = queue[1:]
		ks := kids[first[t]:first[t+1]]
		if len(ks) == 0 {
			continue
		}
		b0 := int(byteOf[ks[0]])
		base := 0
		for s := firstFree; ; s++ {
			// Skip used slots a word at a time.
			for s>>6 < len(used) {
				if w := ^used[s>>6] >> (s & 63); w != 0 {
					s += bits.TrailingZeros64(w)
					break
				}
				s = (s | 63) + 1
			}
			if base = s - b0; base < 1 {
				continue
			}
			ok := true
			for _, k := range ks[1:] {
				if isUsed(base + int(byteOf[k])) {
					ok = false
					break
				}
			}
			if ok {
				break
			}
		}
		da[slot[t]].base = uint32(base)
		for _, k := range ks {
			s := base + int(byteOf[k])
			use(s)
			da[s].check = slot[t] + 1
			da[s].tok = tokOf[k]
			slot[k] = uint32(s)
			queue = append(queue, k)
		}
		for isUsed(firstFree) {
			firstFree++
		}
	}
	return da
}

// charStep is the double array's walk over one whole UTF-8 character of two
// or three bytes from the root, read from one table instead of two or three
// dependent steps: a CJK character is three bytes, and random CJK text makes
// a token every one or two characters, so the first character of a token is
// most of the walk.
type charStep struct {
	node uint32 // the slot after the character's bytes, 0 when there is none
	base uint32 // that slot's base: the next step reads its child directly
	best uint32 // the longest token on the way, and its length: len<<24 | token
	_    uint32 // pads the record to 16 bytes: records do not straddle lines
}

// buildChars fills the charStep of every code point from U+0080 to U+FFFF
// (1 MB): index the table by the code point.
func buildChars(da []daNode) []charStep {
	chars := make([]charStep, 1<<16)
	var buf [4]byte
	for r := rune(0x80); r < 1<<16; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		b := buf[:utf8.EncodeRune(buf[:], r)]
		node := da[0].base + uint32(b[0])
		best := uint32(1)<<24 | uint32(da[node].tok)
		for i := 1; i < len(b); i++ {
			c := da[node].base + uint32(b[i])
			if da[c].check != node+1 {
				node = 0
				break
			}
			node = c
			if t := da[c].tok; t >= 0 {
				best = uint32(i+1)<<24 | uint32(t)
			}
		}
		chars[r] = charStep{node: node, best: best}
		if node != 0 {
			chars[r].base = da[node].base
		}
	}
	return chars
}
