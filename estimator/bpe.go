// Counting the tokens of one pre-split piece.

package estimator

import (
	"math"
	"unicode/utf8"
)

// pieceCount returns the number of BPE tokens of one pre-split piece: 1 for
// a token (most pieces of prose), tiktoken's merge for a few bytes, the
// piece cache or the backtracking encoder up to 16 bytes, the encoder up to
// a chunk, countLong past it. With a budget that
// is not negative, a long piece stops as soon as a lower bound of its count
// exceeds the budget, and returns that bound and false. st is countLimit's
// working memory (nil when the piece is at most mergePiece bytes).
func (e *encoder) pieceCount(piece string, budget int, st *[2]btState) (int, bool) {
	n := 1
	switch {
	case len(piece) <= 1:
		n = len(piece)
	case len(piece) <= 3 && e.v.digits && isDigits(piece):
	case (len(piece) <= mergePiece || piece[0] < utf8.RuneSelf) && e.v.rank(piece) >= 0:
		// A piece of more than a few bytes that starts with a multibyte
		// character is rarely a token (CJK runs up to the next full stop):
		// encodeChunk finds it whole if it is one, without this lookup's
		// cache miss.
	case len(piece) <= mergePiece:
		n = bpeSmall(piece, e.v)
	case len(piece) <= pieceCacheMax:
		var ok bool
		if n, ok = e.v.pieces.get(piece); !ok {
			e.v.encodeChunk(piece, -1, &st[0])
			n = len(st[0].tokens)
			e.v.pieces.put(piece, n)
		}
	case len(piece) <= e.chunk:
		e.v.encodeChunk(piece, -1, &st[0])
		n = len(st[0].tokens)
	default:
		return e.countLong(piece, budget, st)
	}
	return n, budget < 0 || n <= budget
}

// smallPiece is the longest piece bpeSmall can merge (its buffer is on the
// stack); pieceCount gives it pieces of at most mergePiece bytes, the tests
// up to smallPiece.
const smallPiece = 64

// bpeSmall is tiktoken's byte_pair_merge, counting the resulting parts.
// Ties between equal ranks go to the leftmost pair, as in tiktoken.
func bpeSmall(piece string, v *vocab) int {
	type part struct{ start, rank int }
	var buf [smallPiece + 1]part
	parts := buf[:len(piece)+1]
	for i := range parts {
		parts[i] = part{i, math.MaxInt}
	}
	rank := func(i, skip int) int {
		if i+skip+2 < len(parts) {
			if r := v.rank(piece[parts[i].start:parts[i+skip+2].start]); r >= 0 {
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

// mergePiece is the longest piece counted with bpeSmall; longer ones go to
// the backtracking encoder, whose cost grows with the tokens, not with the
// square of the bytes (measured: from about 8 bytes it is faster).
const mergePiece = 4

// isDigits reports whether s is made of ASCII digits only.
func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
