package estimator

import (
	"testing"
	"unicode"
	"unicode/utf8"
)

// TestIdeographsAreLo checks what cjkEnd assumes: every code point of
// U+4E00..U+9FFF is \p{Lo} (and so in \p{L} and in both of o200k's letter
// classes), and nothing else is skipped as one.
func TestIdeographsAreLo(t *testing.T) {
	for r := rune(0x4E00); r <= 0x9FFF; r++ {
		if !unicode.Is(unicode.Lo, r) || computeClass(r) != cLo|cL {
			t.Fatalf("U+%04X: classes %#x, not \\p{Lo} alone", r, computeClass(r))
		}
	}
}

// TestMultibyteDecoding compares the scanner's and longest's decoding of
// every sequence of two and three bytes (valid, overlong, surrogate,
// truncated) with the standard library's, and cjkEnd with the ideograph
// range.
func TestMultibyteDecoding(t *testing.T) {
	initClasses()
	var b [3]byte
	for b0 := 0xC0; b0 < 0xF0; b0++ {
		for b1 := 0; b1 < 256; b1++ {
			for b2 := 0; b2 < 256; b2++ {
				if b0 < 0xE0 && b2 > 0 {
					break
				}
				b = [3]byte{byte(b0), byte(b1), byte(b2)}
				for _, s := range []string{string(b[:]), string(b[:2])} {
					r, sz, c := atSlow(s, 0)
					wr, wsz := utf8.DecodeRuneInString(s)
					if r != wr || sz != wsz || c != runeClasses[wr] {
						t.Fatalf("atSlow(% x) = %U, %d, %#x; want %U, %d, %#x", s, r, sz, c, wr, wsz, runeClasses[wr])
					}
					e := cjkEnd(s, 0)
					if want := 0x4E00 <= wr && wr <= 0x9FFF && wsz == 3; (e == 3) != want || (e != 3 && e != 0) {
						t.Fatalf("cjkEnd(% x) = %d for %U", s, e, wr)
					}
				}
			}
		}
	}
}
