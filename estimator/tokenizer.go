package estimator

import (
	"fmt"
	"math"
	"sync"
	"unicode"
	"unicode/utf8"

	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// Encoding names accepted by [CountText] and by [Model.Encoding].
const (
	EncodingO200K  = "o200k_base"
	EncodingCL100K = "cl100k_base"
)

// encoder counts tokens for one tiktoken encoding. It is immutable once
// loaded and safe for concurrent use.
//
// It does not call tiktoken-go's Encode: that implementation splits text with
// a backtracking regexp engine (about 1 ms for 2 KB of prose) and merges each
// piece with a quadratic loop (2 s for one 40 KB word, hours for a 4 MB one),
// which is not acceptable on the admission path. Instead it uses the same
// ranks (tiktoken-go-loader's embedded files), a hand-written linear scanner
// equivalent to the encoding's split pattern, and an O(n log n) merge for
// long pieces (180 ms for a 1 MB word). The tests check it token for token against tiktoken-go.
type encoder struct {
	name  string
	ranks map[string]int
	o200k bool // which split pattern: o200k_base or cl100k_base

	maxTokenLen int // longest token, in bytes
}

type lazyEncoder struct {
	once sync.Once
	enc  *encoder
	err  error
}

var (
	encO200K  lazyEncoder
	encCL100K lazyEncoder
)

// getEncoder returns the process-wide encoder for name, loading it on first
// use. Loading o200k_base takes a few hundred milliseconds and happens once.
func getEncoder(name string) (*encoder, error) {
	var l *lazyEncoder
	switch name {
	case EncodingO200K:
		l = &encO200K
	case EncodingCL100K:
		l = &encCL100K
	default:
		return nil, fmt.Errorf("estimator: unknown encoding %q", name)
	}
	l.once.Do(func() {
		initClasses()
		ranks, err := tiktoken_loader.NewOfflineLoader().LoadTiktokenBpe(name + ".tiktoken")
		if err != nil {
			l.err = fmt.Errorf("estimator: load %s ranks: %w", name, err)
			return
		}
		if len(ranks) == 0 {
			l.err = fmt.Errorf("estimator: load %s ranks: empty", name)
			return
		}
		enc := &encoder{name: name, ranks: ranks, o200k: name == EncodingO200K}
		for tok, r := range ranks {
			if r < 0 || r > math.MaxInt32 {
				l.err = fmt.Errorf("estimator: load %s ranks: rank %d out of range", name, r)
				return
			}
			enc.maxTokenLen = max(enc.maxTokenLen, len(tok))
		}
		l.enc = enc
	})
	return l.enc, l.err
}

// CountText returns the exact tiktoken token count of s in the named encoding
// ("o200k_base" or "cl100k_base"). Special tokens such as "<|endoftext|>" are
// counted as ordinary text (tiktoken's encode_ordinary), so no input can make
// it fail. Invalid UTF-8 is counted as tiktoken-go counts it: each invalid
// byte as U+FFFD.
func CountText(encoding, s string) (int, error) {
	enc, err := getEncoder(encoding)
	if err != nil {
		return 0, err
	}
	return enc.count(s), nil
}

// count returns the number of tokens of s.
func (e *encoder) count(s string) int {
	if s == "" {
		return 0
	}
	if !utf8.ValidString(s) {
		// tiktoken-go converts the text to runes, which turns every invalid
		// byte into U+FFFD; do the same so the counts agree.
		s = string([]rune(s))
	}
	n := 0
	for i := 0; i < len(s); {
		var j int
		if e.o200k {
			j = nextO200K(s, i)
		} else {
			j = nextCL100K(s, i)
		}
		if j <= i { // cannot happen; guarantees progress whatever the input
			_, sz := utf8.DecodeRuneInString(s[i:])
			j = i + sz
		}
		n += e.pieceTokens(s[i:j])
		i = j
	}
	return n
}

// pieces splits s as the encoding's pattern does; for tests.
func (e *encoder) pieces(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		var j int
		if e.o200k {
			j = nextO200K(s, i)
		} else {
			j = nextCL100K(s, i)
		}
		if j <= i {
			_, sz := utf8.DecodeRuneInString(s[i:])
			j = i + sz
		}
		out = append(out, s[i:j])
		i = j
	}
	return out
}

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

// Character classes used by the split patterns. They come from the same Go
// unicode tables that regexp2 (tiktoken-go's regexp engine) consults for
// \p{..} and \s.
const (
	cLu uint16 = 1 << iota
	cLl
	cLt
	cLm
	cLo
	cL // \p{L}
	cM // \p{M}
	cN // \p{N}
	cS // \s (unicode.IsSpace)

	// o200k_base's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}]
	cUpper = cLu | cLt | cLm | cLo | cM
	cLower = cLl | cLm | cLo | cM
)

var (
	classesOnce sync.Once
	bmpClasses  []uint16 // classes of U+0000..U+FFFF
)

func initClasses() {
	classesOnce.Do(func() {
		t := make([]uint16, 0x10000)
		for r := range t {
			t[r] = computeClass(rune(r))
		}
		bmpClasses = t
	})
}

// classTables are the Unicode categories the split patterns test, with
// their bits.
var classTables = []struct {
	table *unicode.RangeTable
	bit   uint16
}{
	{unicode.Lu, cLu}, {unicode.Ll, cLl}, {unicode.Lt, cLt}, {unicode.Lm, cLm},
	{unicode.Lo, cLo}, {unicode.L, cL}, {unicode.M, cM}, {unicode.N, cN},
}

func computeClass(r rune) uint16 {
	var c uint16
	for _, t := range classTables {
		if unicode.Is(t.table, r) {
			c |= t.bit
		}
	}
	if unicode.IsSpace(r) {
		c |= cS
	}
	return c
}

// at decodes the rune at byte offset i of s and returns it, its size (0 at
// the end of s) and its classes.
func at(s string, i int) (rune, int, uint16) {
	if i >= len(s) {
		return -1, 0, 0
	}
	if b := s[i]; b < utf8.RuneSelf {
		return rune(b), 1, bmpClasses[b]
	}
	r, sz := utf8.DecodeRuneInString(s[i:])
	if r < 0x10000 {
		return r, sz, bmpClasses[r]
	}
	return r, sz, computeClass(r)
}

// isP reports membership of [^\r\n\p{L}\p{N}].
func isP(r rune, c uint16) bool {
	return r != '\r' && r != '\n' && c&(cL|cN) == 0
}

// isQ reports membership of [^\s\p{L}\p{N}].
func isQ(c uint16) bool { return c&(cS|cL|cN) == 0 }

// runEnd returns the end of the run of runes starting at i whose classes
// intersect mask.
func runEnd(s string, i int, mask uint16) int {
	for i < len(s) {
		_, sz, c := at(s, i)
		if c&mask == 0 {
			break
		}
		i += sz
	}
	return i
}

// contraction matches (?i:'s|'t|'re|'ve|'m|'ll|'d) at i and returns its end,
// or i when there is none. Case folding is unicode.ToLower, as in regexp2.
func contraction(s string, i int) int {
	if i >= len(s) || s[i] != '\'' {
		return i
	}
	r1, sz1, _ := at(s, i+1)
	if sz1 == 0 {
		return i
	}
	switch unicode.ToLower(r1) {
	case 's', 't', 'm', 'd':
		return i + 1 + sz1
	case 'r', 'v':
		if r2, sz2, _ := at(s, i+1+sz1); sz2 > 0 && unicode.ToLower(r2) == 'e' {
			return i + 1 + sz1 + sz2
		}
	case 'l':
		if r2, sz2, _ := at(s, i+1+sz1); sz2 > 0 && unicode.ToLower(r2) == 'l' {
			return i + 1 + sz1 + sz2
		}
	}
	return i
}

// o200kLowerWord matches [U]*[L]+('s...)? at i (U and L are o200k's upper
// and lower classes) with the backtracking order of a regexp engine, and
// returns the end, or -1.
func o200kLowerWord(s string, i int) int {
	k, lastLower := i, -1
	for k < len(s) {
		_, sz, c := at(s, k)
		if c&cUpper == 0 {
			break
		}
		if c&cLower != 0 {
			lastLower = k
		}
		k += sz
	}
	// The greedy U* ends at k; L+ must start where U* stops, so U* gives
	// back runes until one that is also in L is next.
	st := -1
	if _, sz, c := at(s, k); sz > 0 && c&cLower != 0 {
		st = k
	} else if lastLower >= 0 {
		st = lastLower
	}
	if st < 0 {
		return -1
	}
	return contraction(s, runEnd(s, st, cLower))
}

// o200kUpperWord matches [U]+[L]*('s...)? at i and returns the end, or -1.
func o200kUpperWord(s string, i int) int {
	k := runEnd(s, i, cUpper)
	if k == i {
		return -1
	}
	return contraction(s, runEnd(s, k, cLower))
}

// nextO200K returns the end of the piece starting at i under o200k_base's
// split pattern:
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// Alternatives are tried in order and each is backtracked fully before the
// next, as a backtracking engine does.
func nextO200K(s string, i int) int {
	r0, sz0, c0 := at(s, i)
	p := isP(r0, c0)
	if p {
		if e := o200kLowerWord(s, i+sz0); e >= 0 {
			return e
		}
	}
	if e := o200kLowerWord(s, i); e >= 0 {
		return e
	}
	if p {
		if e := o200kUpperWord(s, i+sz0); e >= 0 {
			return e
		}
	}
	if e := o200kUpperWord(s, i); e >= 0 {
		return e
	}
	return nextCommon(s, i, r0, sz0, c0, true)
}

// nextCL100K returns the end of the piece starting at i under cl100k_base's
// split pattern:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
//	| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func nextCL100K(s string, i int) int {
	if e := contraction(s, i); e > i {
		return e
	}
	r0, sz0, c0 := at(s, i)
	if isP(r0, c0) {
		if _, sz1, c1 := at(s, i+sz0); sz1 > 0 && c1&cL != 0 {
			return runEnd(s, i+sz0, cL)
		}
	}
	if c0&cL != 0 {
		return runEnd(s, i, cL)
	}
	return nextCommon(s, i, r0, sz0, c0, false)
}

// nextCommon handles the alternatives both patterns share after their word
// alternatives: numbers, punctuation and whitespace.
func nextCommon(s string, i int, r0 rune, sz0 int, c0 uint16, slash bool) int {
	// \p{N}{1,3}
	if c0&cN != 0 {
		j := i + sz0
		for k := 0; k < 2; k++ {
			_, sz, c := at(s, j)
			if c&cN == 0 {
				break
			}
			j += sz
		}
		return j
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*  (o200k: [\r\n/]*)
	q := -1
	if r0 == ' ' {
		if _, sz1, c1 := at(s, i+1); sz1 > 0 && isQ(c1) {
			q = i + 1
		}
	}
	if q < 0 && isQ(c0) {
		q = i
	}
	if q >= 0 {
		j := q
		for j < len(s) {
			_, sz, c := at(s, j)
			if !isQ(c) {
				break
			}
			j += sz
		}
		for j < len(s) && (s[j] == '\r' || s[j] == '\n' || (slash && s[j] == '/')) {
			j++
		}
		return j
	}
	// \s*[\r\n]+ | \s+(?!\S) | \s+
	if c0&cS != 0 {
		j, lastNL, lastStart, runes := i, -1, i, 0
		for j < len(s) {
			r, sz, c := at(s, j)
			if c&cS == 0 {
				break
			}
			if r == '\r' || r == '\n' {
				lastNL = j + sz
			}
			lastStart = j
			runes++
			j += sz
		}
		switch {
		case lastNL >= 0:
			return lastNL
		case j == len(s):
			return j
		case runes >= 2:
			return lastStart
		default:
			return j
		}
	}
	// Unreachable: every rune is a letter, a number, whitespace or in
	// [^\s\p{L}\p{N}]. Take one rune so the caller always advances.
	return i + sz0
}
