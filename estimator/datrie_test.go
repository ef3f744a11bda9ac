package estimator

import (
	"math/rand/v2"
	"testing"
)

// TestLongestIsTheLongestToken checks the double-array trie against the
// rank table: at every position of random text built from pieces of tokens
// (so that long matches and near misses are common), longest returns the
// longest prefix that is a token, and its length; and every token is found
// whole from its first byte.
func TestLongestIsTheLongestToken(t *testing.T) {
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		v := mustEncoder(t, name).v
		for r := range len(v.starts) - 1 {
			tok := v.token(uint32(r))
			if got, n := v.longest(tok, 0); got != uint32(r) || n != len(tok) {
				t.Fatalf("%s: longest(%q) = %d, %d; want %d, %d", name, tok, got, n, r, len(tok))
			}
		}
		rng := rand.New(rand.NewPCG(21, 22))
		var b []byte
		for range 5000 {
			tok := v.token(uint32(rng.IntN(len(v.starts) - 1)))
			b = append(b, tok[:1+rng.IntN(len(tok))]...)
		}
		s := string(b)
		for i := range s {
			want, wantLen := -1, 0
			for l := 1; l <= v.maxLen && i+l <= len(s); l++ {
				if r := v.rank(s[i : i+l]); r >= 0 {
					want, wantLen = r, l
				}
			}
			if got, n := v.longest(s, i); int(got) != want || n != wantLen {
				t.Fatalf("%s: longest at %d of %q = %d, %d; want %d, %d", name, i, s[i:min(len(s), i+v.maxLen)], got, n, want, wantLen)
			}
		}
	}
}
