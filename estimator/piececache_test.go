package estimator

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// TestPieceCacheIsExact counts many short pieces through a cache of 16
// entries (so that they evict each other) from several goroutines at once
// and compares every count with the backtracking encoder's without the
// cache: a hit must never return another piece's count, even when a reader
// races a writer of the same entry.
func TestPieceCacheIsExact(t *testing.T) {
	t.Parallel()
	letters := []rune("абвгдежзийклмнопрстуфхцчшщыьэюяمرحباالعلكمنهوي世界人工智能éèàçôñ")
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		shared := mustEncoder(t, name)
		v := *shared.v
		v.pieces = newPieceCache(4)
		e := &encoder{name: name, v: &v, o200k: shared.o200k, chunk: shared.chunk, tail: shared.tail}
		rng := rand.New(rand.NewPCG(31, 32))
		pieces := make([]string, 1000)
		want := make([]int, len(pieces))
		var st btState
		for i := range pieces {
			var b []byte
			switch rng.IntN(3) {
			case 0:
				b = append(b, ' ')
			case 1: // the same first 8 bytes: only the rest tells them apart
				b = append(b, " абвг"...)
			}
			for len(b) <= mergePiece || rng.IntN(3) > 0 {
				r := letters[rng.IntN(len(letters))]
				if len(b)+len(string(r)) > pieceCacheMax {
					break
				}
				b = append(b, string(r)...)
			}
			if len(b) <= mergePiece {
				b = append(b, "ab"[:mergePiece+1-len(b)]...)
			}
			pieces[i] = string(b)
			e.v.encodeChunk(pieces[i], -1, &st)
			want[i] = len(st.tokens)
		}
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				st := new([2]btState)
				rng := rand.New(rand.NewPCG(uint64(g), 33))
				for range 20000 {
					i := rng.IntN(len(pieces))
					if got, _ := e.pieceCount(pieces[i], -1, st); got != want[i] {
						t.Errorf("%s: pieceCount(%q) = %d, want %d", name, pieces[i], got, want[i])
						return
					}
				}
			})
		}
		wg.Wait()
	}
}
