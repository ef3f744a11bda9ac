// A double-array trie of the vocabulary, for the longest token at a
// position.

package estimator

import "math/bits"

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
