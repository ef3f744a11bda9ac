// Counting long pre-tokenizer pieces in bounded memory: a backtracking BPE
// encoder over chunks of the piece, joined where the result is provably
// tiktoken's.

package estimator

import (
	"sync"
	"sync/atomic"
)

// Why the chunked count is exact.
//
// Call tokens a and b compatible when BPE of the bytes of a followed by the
// bytes of b is [a, b] ([vocab.compatible]). For a vocabulary in which every
// token's own BPE is itself (checked for o200k_base and cl100k_base by
// TestEveryTokenEncodesToItself), two facts hold (proved for tiktoken's
// vocabularies in GitHub's rust-gems bpe crate, crates/bpe/README.md):
//
//  1. every pair of neighbours in BPE(text) is compatible;
//  2. BPE(text) is the only sequence of tokens spelling text in which every
//     pair of neighbours is compatible.
//
// encodeChunk finds, by depth-first search (longest token first, shorter
// prefixes on failure, dead positions remembered: the crate's backtracking
// encoder), a sequence spelling its text whose neighbours are all
// compatible, the first one also with a given previous token; without a
// previous token, by fact 2 that sequence is BPE(text), which is how
// pieceCount counts every piece of one chunk or less. countLong encodes a chunk of at most chunkBytes, keeps its
// tokens but a tail of at least chunkTail bytes, and encodes the next chunk
// from where the kept tokens end, with the last kept token as the previous
// one. The kept tokens of all chunks spell the piece, and each pair of
// neighbours is compatible (inside a chunk by the search, across a cut by
// the previous-token constraint), so by fact 2 they are exactly
// BPE(piece): the count is tiktoken's. When a chunk finds no sequence under
// its constraint, the cut was not a boundary of BPE(piece); it moves one
// token left and the chunk is encoded again (never past the previous
// chunk: then the piece is encoded whole, exact but with memory in
// proportion to the piece; no test or fuzz input has needed it). Memory is
// otherwise that of two chunks, whatever the length of the piece.
//
// The early stop: the tokens of every chunk but the last one kept are final
// (a retry only takes back tokens of the last), and what follows them needs
// at least one token per maxLen bytes; their sum is a lower bound of the
// count.
const (
	chunkBytes = 8 << 10
	chunkTail  = 256
)

// chunkRetries and chunkFallbacks count the cuts moved left and the pieces
// encoded whole because the cut could not move further (for the tests;
// neither has been seen on real text).
var chunkRetries, chunkFallbacks atomic.Int64

// btState is the working memory of one chunk: its token stack, and its
// dead positions (bit i: no compatible sequence spells the chunk from i).
type btState struct {
	tokens []uint32
	dead   []uint64
}

var btPool = sync.Pool{New: func() any { return new([2]btState) }}

// putState returns st to btPool unless a fallback made it grow past two
// chunks.
func (e *encoder) putState(st *[2]btState) {
	if cap(st[0].tokens) <= e.chunk && cap(st[1].tokens) <= e.chunk {
		btPool.Put(st)
	}
}

// encodeChunk sets st.tokens to a sequence of tokens spelling s whose
// neighbours are all compatible, the first one also with prev when prev is
// not negative, and reports whether there is one.
func (v *vocab) encodeChunk(s string, prev int64, st *btState) bool {
	st.tokens = st.tokens[:0]
	if len(s) == 0 {
		return true
	}
	words := len(s)/64 + 1
	if cap(st.dead) < words {
		st.dead = make([]uint64, words)
	} else {
		st.dead = st.dead[:words]
		clear(st.dead)
	}
	pos, next, nextLen := 0, uint32(0), 0
	next, nextLen = v.longest(s, 0)
	for {
		t, tl := next, nextLen
		last, hasLast := uint32(prev), prev >= 0
		if k := len(st.tokens); k > 0 {
			last, hasLast = st.tokens[k-1], true
		}
		for {
			end := pos + tl
			ok := st.dead[end>>6]&(1<<(end&63)) == 0
			if ok && hasLast {
				// v.compatible(last, t), its cache lookup inlined (a call
				// per token weighs on punctuation, a token a byte or two).
				key := (uint64(last)<<24 | uint64(t)) + 1
				set := seenSet(key)
				if w := v.seen[set].Load(); w>>1 == key {
					ok = w&1 == 1
				} else if w := v.seen[set+1].Load(); w>>1 == key {
					ok = w&1 == 1
				} else {
					ok = v.compatible(last, t)
				}
			}
			if ok {
				st.tokens = append(st.tokens, t)
				if pos = end; pos == len(s) {
					return true
				}
				next, nextLen = v.longest(s, pos)
				break
			}
			if p := v.prefix[t]; p >= 0 {
				t = uint32(p)
				tl = v.tokenLen(t)
				continue
			}
			// No token fits at pos: it is dead; take back the token
			// before it and try its shorter prefixes.
			st.dead[pos>>6] |= 1 << (pos & 63)
			k := len(st.tokens)
			if k == 0 {
				return false
			}
			next = st.tokens[k-1]
			nextLen = v.tokenLen(next)
			st.tokens = st.tokens[:k-1]
			pos -= nextLen
			break
		}
	}
}

// countLong counts the tokens of a piece in chunks of e.chunk bytes. With a
// budget that is not negative, it stops as soon as a lower bound of the
// count exceeds the budget, and returns that bound and false.
func (e *encoder) countLong(piece string, budget int, st *[2]btState) (int, bool) {
	v := e.v
	cur, kept := &st[0], &st[1]
	kept.tokens = kept.tokens[:0]
	// kept holds the tokens of the last chunk, from keptStart to pos: a
	// retry may take them back, so only those before keptStart count as
	// found in the lower bound.
	total, pos, prev, keptStart := 0, 0, int64(-1), 0
	for {
		start, end := pos, min(len(piece), pos+e.chunk)
		if !v.encodeChunk(piece[pos:end], prev, cur) {
			if len(kept.tokens) < 2 {
				// The cut cannot move into an earlier chunk: encode the
				// piece whole (memory in proportion to the piece).
				chunkFallbacks.Add(1)
				v.encodeChunk(piece, -1, cur)
				return len(cur.tokens), budget < 0 || len(cur.tokens) <= budget
			}
			chunkRetries.Add(1)
			k := len(kept.tokens) - 1
			total--
			pos -= v.tokenLen(kept.tokens[k])
			kept.tokens = kept.tokens[:k]
			prev = int64(kept.tokens[k-1])
			continue
		}
		if end == len(piece) {
			total += len(cur.tokens)
			return total, budget < 0 || total <= budget
		}
		k, dropped := len(cur.tokens), 0
		for k > 1 && dropped < e.tail {
			k--
			dropped += v.tokenLen(cur.tokens[k])
		}
		cur.tokens = cur.tokens[:k]
		total += k
		pos = end - dropped
		prev = int64(cur.tokens[k-1])
		cur, kept = kept, cur
		keptStart = start
		// The rest is at least one token per maxLen bytes.
		if lower := total - k + (len(piece)-keptStart+v.maxLen-1)/v.maxLen; budget >= 0 && lower > budget {
			return lower, false
		}
	}
}
