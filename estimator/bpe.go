// Byte pair merging of one pre-split piece, as tiktoken's byte_pair_merge.

package estimator

import (
	"math"
)

// pieceTokens returns the number of BPE tokens of one pre-split piece.
func (e *encoder) pieceTokens(piece string) int {
	if len(piece) <= 1 {
		return len(piece)
	}
	if len(piece) >= math.MaxInt32 {
		// Beyond bpeLong's int32 indexes (2 GiB in one piece): count the
		// halves, which can only overestimate.
		h := len(piece) / 2
		return e.pieceTokens(piece[:h]) + e.pieceTokens(piece[h:])
	}
	if _, ok := e.ranks[piece]; ok {
		return 1
	}
	if len(piece) <= smallPiece {
		return bpeSmall(piece, e.ranks)
	}
	return bpeLong(piece, e.ranks, e.maxTokenLen)
}

// smallPiece is the longest piece merged with the simple quadratic algorithm
// (allocation free); longer pieces use bpeLong, O(n log n).
const smallPiece = 64

// bpeSmall is tiktoken's byte_pair_merge, counting the resulting parts.
// Ties between equal ranks go to the leftmost pair, as in tiktoken.
func bpeSmall(piece string, ranks map[string]int) int {
	type part struct{ start, rank int }
	var buf [smallPiece + 1]part
	parts := buf[:len(piece)+1]
	for i := range parts {
		parts[i] = part{i, math.MaxInt}
	}
	rank := func(i, skip int) int {
		if i+skip+2 < len(parts) {
			if r, ok := ranks[piece[parts[i].start:parts[i+skip+2].start]]; ok {
				return r
			}
		}
		return math.MaxInt
	}
	for i := 0; i < len(parts)-2; i++ {
		parts[i].rank = rank(i, 0)
	}
	for len(parts) > 1 {
		minRank, minIdx := math.MaxInt, -1
		for i := 0; i < len(parts)-1; i++ {
			if parts[i].rank < minRank {
				minRank, minIdx = parts[i].rank, i
			}
		}
		if minIdx < 0 {
			break
		}
		i := minIdx
		parts[i].rank = rank(i, 1)
		if i > 0 {
			parts[i-1].rank = rank(i-1, 1)
		}
		parts = append(parts[:i+1], parts[i+2:]...)
	}
	return len(parts) - 1
}

// bpeLong computes the same merge as bpeSmall in O(n log n): a linked list
// of parts and a tournament tree over the parts' pair keys rank<<32|start,
// whose root is the lowest rank with ties to the leftmost pair, exactly as
// the linear scan chooses. Part i always starts at byte i (a merge keeps the
// left part). Updates stop climbing as soon as a subtree's minimum is
// unchanged, and neighbouring updates share their paths, which keeps this
// cache friendly on pieces of megabytes.
func bpeLong(piece string, ranks map[string]int, maxTokenLen int) int {
	n := len(piece)
	next := make([]int32, n) // start of the following part, n at the end
	prev := make([]int32, n) // start of the preceding part, -1 at the start
	size := 1
	for size < n {
		size <<= 1
	}
	const none = ^uint64(0)
	tree := make([]uint64, 2*size)
	for i := range tree {
		tree[i] = none
	}
	key := func(i int) uint64 {
		j := int(next[i])
		if j >= n {
			return none
		}
		end := int(next[j])
		if end-i > maxTokenLen {
			return none
		}
		if r, ok := ranks[piece[i:end]]; ok {
			return uint64(r)<<32 | uint64(i)
		}
		return none
	}
	set := func(i int, k uint64) {
		x := size + i
		tree[x] = k
		for x > 1 {
			x >>= 1
			m := min(tree[2*x], tree[2*x+1])
			if tree[x] == m {
				return
			}
			tree[x] = m
		}
	}
	for i := 0; i < n; i++ {
		next[i], prev[i] = int32(i+1), int32(i-1)
	}
	for i := 0; i < n; i++ {
		tree[size+i] = key(i)
	}
	for x := size - 1; x >= 1; x-- {
		tree[x] = min(tree[2*x], tree[2*x+1])
	}
	count := n
	for tree[1] != none {
		i := int(uint32(tree[1]))
		j := int(next[i])
		next[i] = next[j]
		if k := int(next[j]); k < n {
			prev[k] = int32(i)
		}
		count--
		set(j, none)
		set(i, key(i))
		if p := int(prev[i]); p >= 0 {
			set(p, key(p))
		}
	}
	return count
}
