// The pre-tokenizer: a linear, regexp-free scanner equivalent to the
// o200k_base and cl100k_base split patterns.

package estimator

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

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

// tableRunes is the number of runes whose classes are in runeClasses; the
// others are computed from the unicode tables each time.
const tableRunes = 0x30000

var (
	classesOnce sync.Once
	runeClasses []uint16 // classes of U+0000..U+2FFFF (BMP, emoji and CJK planes; 384 KB)

	// asciiClasses are the classes of U+0000..U+007F, in an array the
	// compiler indexes without a bounds check (the scanner's fast path).
	asciiClasses = func() (t [128]uint16) {
		for r := range t {
			t[r] = computeClass(rune(r))
		}
		return t
	}()
)

func initClasses() {
	classesOnce.Do(func() {
		t := make([]uint16, tableRunes)
		for r := range t {
			t[r] = computeClass(rune(r))
		}
		runeClasses = t
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
	if i < len(s) && s[i] < utf8.RuneSelf {
		b := s[i]
		return rune(b), 1, asciiClasses[b&0x7f]
	}
	return atSlow(s, i)
}

// atSlow is at for a multibyte rune or the end of s.
func atSlow(s string, i int) (rune, int, uint16) {
	if i >= len(s) {
		return -1, 0, 0
	}
	// Two and three bytes (Cyrillic, Arabic, CJK) decoded here: the
	// library's decoder is a call per rune.
	if b0 := s[i]; b0 >= 0xC2 && b0 < 0xF0 {
		if b0 < 0xE0 {
			if i+1 < len(s) && s[i+1]&0xC0 == 0x80 {
				r := rune(b0&0x1F)<<6 | rune(s[i+1]&0x3F)
				return r, 2, runeClasses[r]
			}
		} else if i+2 < len(s) && s[i+1]&0xC0 == 0x80 && s[i+2]&0xC0 == 0x80 {
			r := rune(b0&0x0F)<<12 | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F)
			if r >= 0x800 && (r < 0xD800 || r >= 0xE000) {
				return r, 3, runeClasses[uint16(r)]
			}
		}
	}
	r, sz := utf8.DecodeRuneInString(s[i:])
	if r < tableRunes {
		return r, sz, runeClasses[r]
	}
	return r, sz, computeClass(r)
}

// isP reports membership of [^\r\n\p{L}\p{N}].
func isP(r rune, c uint16) bool {
	return r != '\r' && r != '\n' && c&(cL|cN) == 0
}

// isQ reports membership of [^\s\p{L}\p{N}].
func isQ(c uint16) bool { return c&(cS|cL|cN) == 0 }

// cjkEnd returns the end of the run of CJK Unified Ideographs
// (U+4E00..U+9FFF, all \p{Lo}: TestIdeographsAreLo) starting at i, read
// without decoding or a table: most of Chinese text.
func cjkEnd(s string, i int) int {
	for i+2 < len(s) {
		b0, b1 := s[i], s[i+1]
		if b0 < 0xE4 || b0 > 0xE9 || (b0 == 0xE4 && b1 < 0xB8) || b1&0xC0 != 0x80 || s[i+2]&0xC0 != 0x80 {
			break
		}
		i += 3
	}
	return i
}

// runEnd returns the end of the run of runes starting at i whose classes
// intersect mask.
func runEnd(s string, i int, mask uint16) int {
	cjk := mask&(cLo|cL) != 0
	for i < len(s) {
		if cjk {
			i = cjkEnd(s, i)
			if i >= len(s) {
				break
			}
		}
		if b := s[i]; b < utf8.RuneSelf {
			if asciiClasses[b&0x7f]&mask == 0 {
				break
			}
			i++
			continue
		}
		_, sz, c := atSlow(s, i)
		if c&mask == 0 {
			break
		}
		i += sz
	}
	return i
}

// qEnd returns the end of the run of [^\s\p{L}\p{N}] starting at i, with
// a fast path for ASCII (runs of punctuation are a token every byte or two,
// so the scan is a good part of their cost).
func qEnd(s string, i int) int {
	for i < len(s) {
		if b := s[i]; b < utf8.RuneSelf {
			if !isQ(asciiClasses[b]) {
				break
			}
			i++
			continue
		}
		_, sz, c := atSlow(s, i)
		if !isQ(c) {
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
		if e := cjkEnd(s, k); e > k {
			k, lastLower = e, e-3
			continue
		}
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
	if e := asciiWord(s, i, true); e > 0 {
		return e
	}
	if e := asciiDigits(s, i); e > 0 {
		return e
	}
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

// asciiWord is the scanners' fast path for the commonest piece of prose: an
// optional ASCII character of [^\r\n\p{L}\p{N}] (not a quote) and ASCII
// letters, followed by an ASCII character that is neither a letter nor a
// quote, or by the end. For o200k (upper) the letters are [A-Z]*[a-z]*, the
// only ASCII letters both of its word alternatives accept in that order; for
// cl100k any [A-Za-z]+. On such text both patterns match exactly these
// bytes (the word alternative comes first, is greedy, and what follows can
// neither extend it nor start a contraction). It returns 0 when the general
// scanner must decide.
func asciiWord(s string, i int, upper bool) int {
	j := i
	if b := s[i]; b >= utf8.RuneSelf || b == '\'' {
		return 0
	} else if b != '\r' && b != '\n' && asciiClasses[b]&(cL|cN) == 0 {
		j++
	}
	k := j
	if upper {
		for k < len(s) && 'A' <= s[k] && s[k] <= 'Z' {
			k++
		}
		for k < len(s) && 'a' <= s[k] && s[k] <= 'z' {
			k++
		}
	} else {
		for k < len(s) && asciiClasses[s[k]&0x7f]&cL != 0 && s[k] < utf8.RuneSelf {
			k++
		}
	}
	if k == j {
		return 0
	}
	if k < len(s) {
		if b := s[k]; b >= utf8.RuneSelf || b == '\'' || asciiClasses[b]&cL != 0 {
			return 0
		}
	}
	return k
}

// asciiDigits is the fast path for \p{N}{1,3} on ASCII digits (both
// patterns): up to three of them, unless a non-ASCII rune, which may be a
// digit, comes before the third. It returns 0 when the general scanner must
// decide. The word alternatives cannot match at a digit (it is neither a
// letter nor in [^\r\n\p{L}\p{N}]).
func asciiDigits(s string, i int) int {
	j := i
	for j < len(s) && j < i+3 && '0' <= s[j] && s[j] <= '9' {
		j++
	}
	if j == i || (j < i+3 && j < len(s) && s[j] >= utf8.RuneSelf) {
		return 0
	}
	return j
}

// nextCL100K returns the end of the piece starting at i under cl100k_base's
// split pattern:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
//	| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func nextCL100K(s string, i int) int {
	if e := asciiWord(s, i, false); e > 0 {
		return e
	}
	if e := asciiDigits(s, i); e > 0 {
		return e
	}
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
		j := qEnd(s, q)
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
