package estimator

import (
	"fmt"
	"math"
	"sync"
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

// countLimit counts the tokens of s, stopping as soon as the count exceeds
// limit: a caller that will refuse any text over limit tokens needs no more.
// It returns the count and true when the count is at most limit; otherwise a
// count above limit (a lower bound of the true count) and false. A negative
// limit means no limit.
func (e *encoder) countLimit(s string, limit int) (int, bool) {
	n := e.count(s)
	return n, limit < 0 || n <= limit
}
