package estimator

import (
	"fmt"
	"sync"
	"unicode/utf8"
	"unsafe"

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
// ranks (tiktoken-go-loader's embedded files) in flat tables ([vocab]), a
// hand-written linear scanner equivalent to the encoding's split pattern, a
// lookup of the whole piece (most pieces of prose are one token), tiktoken's
// merge for other short pieces, and a linear backtracking encoder over
// bounded chunks for long ones ([encoder.countLong]), so that memory is
// bounded whatever the shape of the text. The tests check it token for token
// against tiktoken-go.
type encoder struct {
	name  string
	v     *vocab
	o200k bool // which split pattern: o200k_base or cl100k_base

	chunk, tail int // countLong's chunk and kept tail, in bytes (changed by tests)
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
		v, err := newVocab(ranks)
		if err != nil {
			l.err = fmt.Errorf("estimator: load %s ranks: %w", name, err)
			return
		}
		l.enc = &encoder{name: name, v: v, o200k: name == EncodingO200K, chunk: chunkBytes, tail: chunkTail}
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
	n, _ := e.countLimit(s, -1)
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
//
// It stops after the piece that passes the limit, or inside a long piece as
// soon as the tokens proved so far plus one per longest token's length of
// what remains pass it.
func (e *encoder) countLimit(s string, limit int) (int, bool) {
	// Invalid UTF-8: tiktoken-go converts the text to runes, which turns
	// every invalid byte into U+FFFD. The scanner already reads an invalid
	// byte as U+FFFD (same classes, so the same pieces); only the pieces
	// that hold one are rewritten, in a pooled buffer.
	valid := utf8.ValidString(s)
	var fix *[]byte
	if !valid {
		fix = fixPool.Get().(*[]byte)
		defer func() {
			if cap(*fix) <= 64<<10 {
				fixPool.Put(fix)
			}
		}()
	}
	var st *[2]btState // the backtracking encoder's memory, taken when needed
	defer func() {
		if st != nil {
			e.putState(st)
		}
	}()
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
		piece := s[i:j]
		if !valid && !utf8.ValidString(piece) {
			b := (*fix)[:0]
			for _, r := range piece {
				b = utf8.AppendRune(b, r)
			}
			*fix = b
			piece = unsafe.String(unsafe.SliceData(b), len(b))
		}
		if st == nil && len(piece) > mergePiece {
			st = btPool.Get().(*[2]btState)
		}
		budget := -1
		if limit >= 0 {
			budget = limit - n
		}
		c, ok := e.pieceCount(piece, budget, st)
		n += c
		if !ok {
			return n, false
		}
		i = j
	}
	return n, true
}

// fixPool holds the buffers of pieces rewritten from invalid UTF-8 (at most
// three times the piece: a byte becomes the three of U+FFFD); the string
// made over one is used only until the next piece.
var fixPool = sync.Pool{New: func() any { return new([]byte) }}
