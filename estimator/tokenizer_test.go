package estimator

import (
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// The split patterns exactly as tiktoken-go v0.1.8 compiles them.
const (
	o200kPattern = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|` +
		`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|` +
		`\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	cl100kPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

var (
	refOnce  sync.Once
	refEnc   map[string]*tiktoken.Tiktoken
	refRegex map[string]*regexp2.Regexp
)

// reference returns tiktoken-go's encoder and its split regexp for name: the
// oracle this package's counter is checked against.
func reference(t testing.TB, name string) (*tiktoken.Tiktoken, *regexp2.Regexp) {
	t.Helper()
	refOnce.Do(func() {
		tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader())
		refEnc = map[string]*tiktoken.Tiktoken{}
		for _, n := range []string{EncodingO200K, EncodingCL100K} {
			e, err := tiktoken.GetEncoding(n)
			if err != nil {
				panic(err)
			}
			refEnc[n] = e
		}
		refRegex = map[string]*regexp2.Regexp{
			EncodingO200K:  regexp2.MustCompile(o200kPattern, regexp2.None),
			EncodingCL100K: regexp2.MustCompile(cl100kPattern, regexp2.None),
		}
	})
	return refEnc[name], refRegex[name]
}

func refPieces(re *regexp2.Regexp, s string) []string {
	var out []string
	runes := []rune(s)
	m, _ := re.FindStringMatch(s)
	for m != nil {
		out = append(out, string(runes[m.Index:m.Index+m.Length]))
		m, _ = re.FindNextMatch(m)
	}
	return out
}

func mustEncoder(t testing.TB, name string) *encoder {
	t.Helper()
	e, err := getEncoder(name)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// checkAgainstReference compares the split and the count of s with
// tiktoken-go's.
func checkAgainstReference(t testing.TB, name, s string) {
	t.Helper()
	enc := mustEncoder(t, name)
	ref, re := reference(t, name)
	valid := s
	if !utf8.ValidString(s) {
		valid = string([]rune(s))
	}
	if got, want := enc.pieces(valid), refPieces(re, valid); !slices.Equal(got, want) {
		t.Fatalf("%s split of %q:\n got %q\nwant %q", name, s, got, want)
	}
	if got, want := enc.count(s), len(ref.EncodeOrdinary(s)); got != want {
		t.Fatalf("%s count of %q = %d, tiktoken-go says %d", name, s, got, want)
	}
}

// representatives holds one rune for each combination of the character
// classes the patterns distinguish, plus the runes they name literally.
func representatives() []rune {
	initClasses()
	seen := map[uint16]bool{}
	reps := []rune{'\r', '\n', ' ', '/', '\'', 's', 'S', 't', 'T', 'r', 'R', 'e', 'E', 'v', 'V', 'm', 'M', 'l', 'L', 'd', 'D', '\t', 0x85, 0xA0, 0x3000, '!', '1'}
	for r := rune(0); r <= 0x10FFFF; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		var c uint16
		if r < 0x10000 {
			c = runeClasses[r]
		} else {
			c = computeClass(r)
		}
		if !seen[c] {
			seen[c] = true
			reps = append(reps, r)
		}
	}
	return reps
}

func TestSplitExhaustiveShortStrings(t *testing.T) {
	t.Parallel()
	reps := representatives()
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		enc := mustEncoder(t, name)
		_, re := reference(t, name)
		n := 0
		var buf []rune
		var rec func(depth int)
		rec = func(depth int) {
			if depth > 0 {
				s := string(buf)
				if got, want := enc.pieces(s), refPieces(re, s); !slices.Equal(got, want) {
					t.Fatalf("%s split of %q (%U):\n got %q\nwant %q", name, s, buf, got, want)
				}
				n++
			}
			if depth == 3 {
				return
			}
			for _, r := range reps {
				buf = append(buf, r)
				rec(depth + 1)
				buf = buf[:len(buf)-1]
			}
		}
		rec(0)
		t.Logf("%s: %d strings over %d representative runes agree", name, n, len(reps))
	}
}

func TestCountMatchesTiktokenGo(t *testing.T) {
	t.Parallel()
	cases := []string{
		"", "hello world", "Hello, World!", "antidisestablishmentarianism", "2 + 2 = 4",
		"お誕生日おめでとう", "  leading", "trailing  ", "a\r\n\r\nb", " \n \n x", "\t\tTabs",
		"I'm he's we'RE they'Ve I'LL you'd It'S", "don't'", "''''", "HTTPServer's", "ÀÉÎõü",
		"emoji 😀🎉 test", "x/y//z\n/", "1234567890", "٣٤٥ numbers", "<|endoftext|> <|fim_prefix|>",
		strings.Repeat("a", 200), strings.Repeat("ab", 300), strings.Repeat("🎉", 50),
		strings.Repeat(" ", 100) + "x", strings.Repeat("\n", 70), "NBSP\u00a0here\u3000there",
		"combining e\u0301 and \u0301\u0301x", "Ǆǅǆ titlecase", "a\x80b\xffc",
		"func main() {\n\tfmt.Println(\"hi\")\n}\n", "https://example.com/a/b?c=d&e=f",
	}
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		for _, s := range cases {
			checkAgainstReference(t, name, s)
		}
	}
}

func TestCountRandomAgainstTiktokenGo(t *testing.T) {
	t.Parallel()
	reps := representatives()
	alphabet := append([]rune("aAbB zZ'sStT\n\r\t.,!?/-_0123456789é\u0301ÉßƑǅ中文カタ😀 "), reps...)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		for i := 0; i < 3000; i++ {
			n := rng.IntN(40)
			b := make([]rune, n)
			for j := range b {
				b[j] = alphabet[rng.IntN(len(alphabet))]
			}
			checkAgainstReference(t, name, string(b))
		}
	}
}

func TestBPELongMatchesSmall(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		enc := mustEncoder(t, name)
		for i := 0; i < 3000; i++ {
			n := 2 + rng.IntN(smallPiece-1)
			b := make([]byte, n)
			for j := range b {
				b[j] = "aabbcdeéx \xe4\xb8\xad"[rng.IntN(14)]
			}
			s := string(b)
			if got, want := bpeLong(s, enc.v), bpeSmall(s, enc.v); got != want {
				t.Fatalf("%s: bpeLong(%q)=%d, bpeSmall=%d", name, s, got, want)
			}
		}
	}
}

func TestLongPieces(t *testing.T) {
	t.Parallel()
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		// Long single pieces go through bpeLong; compare with tiktoken-go
		// at sizes where its quadratic merge is still quick.
		for _, s := range []string{
			strings.Repeat("a", 1000), strings.Repeat("abc", 700), strings.Repeat("Zq", 600),
			strings.Repeat("中", 500), strings.Repeat("!?", 400), strings.Repeat("x\u0301", 300),
		} {
			checkAgainstReference(t, name, s)
		}
		rng := rand.New(rand.NewPCG(5, 6))
		for i := 0; i < 200; i++ {
			b := make([]byte, 65+rng.IntN(400))
			for j := range b {
				b[j] = "etaoinshrdlucmfwypvbgkqjxzETAO"[rng.IntN(30)]
			}
			checkAgainstReference(t, name, string(b))
		}
	}
}

func FuzzCountText(f *testing.F) {
	for _, s := range []string{"hello world", "I'm", "a\u0301B", " \n\tx", "<|endoftext|>", "😀'S", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "中文中文中文中文中文中文中文中文中文"} {
		f.Add(s, uint8(3))
	}
	// Load the encoders and the reference before fuzzing: under the
	// fuzzer's instrumentation loading takes seconds, which the first
	// input would otherwise pay and be taken for a hang.
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		mustEncoder(f, name)
		reference(f, name)
	}
	f.Fuzz(func(t *testing.T, s string, reps uint8) {
		if len(s) > 2000 {
			return
		}
		for _, name := range []string{EncodingO200K, EncodingCL100K} {
			checkAgainstReference(t, name, s)
		}
		// The chunked count of long pieces against the whole-piece merge:
		// s repeated makes long pieces, and small chunks many cuts.
		long := strings.Repeat(s, 1+int(reps)%64)
		for _, name := range []string{EncodingO200K, EncodingCL100K} {
			e := *mustEncoder(t, name)
			want := refCount(&e, long)
			for _, sz := range []struct{ chunk, tail int }{{chunkBytes, chunkTail}, {200, 8}, {97, 0}} {
				e.chunk, e.tail = sz.chunk, sz.tail
				if got := e.count(long); got != want {
					t.Fatalf("%s: chunk %d tail %d: count of %q = %d, whole-piece merge says %d", name, sz.chunk, sz.tail, long, got, want)
				}
				checkLimits(t, &e, long, want)
			}
		}
	})
}

// bpeLong computes the same merge as bpeSmall in O(n log n) (the counter of
// long pieces before chunking, kept as the reference of countLong): a linked list
// of parts and a tournament tree over the parts' pair keys rank<<32|start,
// whose root is the lowest rank with ties to the leftmost pair, exactly as
// the linear scan chooses. Part i always starts at byte i (a merge keeps the
// left part). Updates stop climbing as soon as a subtree's minimum is
// unchanged, and neighbouring updates share their paths, which keeps this
// cache friendly on pieces of megabytes.
func bpeLong(piece string, v *vocab) int {
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
		if end-i > v.maxLen {
			return none
		}
		if r := v.rank(piece[i:end]); r >= 0 {
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

// TestEveryTokenEncodesToItself checks the premise of countLong's proof:
// every token of both vocabularies is its own BPE (tiktoken's merge gives
// one part), and the backtracking encoder finds it whole.
func TestEveryTokenEncodesToItself(t *testing.T) {
	t.Parallel()
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		v := mustEncoder(t, name).v
		if !v.digits {
			t.Errorf("%s: the strings of one to three digits are not all tokens", name)
		}
		st := new(btState)
		for id := range uint32(len(v.starts) - 1) {
			tok := v.token(id)
			n := 1
			if len(tok) > 1 {
				if len(tok) <= smallPiece {
					n = bpeSmall(tok, v)
				} else {
					n = bpeLong(tok, v)
				}
			}
			if n != 1 {
				t.Fatalf("%s: token %d %q merges into %d parts", name, id, tok, n)
			}
			if !v.encodeChunk(tok, -1, st) || len(st.tokens) != 1 || st.tokens[0] != id {
				t.Fatalf("%s: token %d %q: backtracking gives %v", name, id, tok, st.tokens)
			}
			if v.rank(tok) != int(id) {
				t.Fatalf("%s: rank(%q) = %d, want %d", name, tok, v.rank(tok), id)
			}
		}
	}
}

// longPieces are adversarial long pre-tokenizer pieces: one letter, letters
// of several scripts, CJK, emoji, punctuation, whitespace.
func longPieces(rng *rand.Rand, size int) []string {
	randomOf := func(alphabet []string) string {
		var sb strings.Builder
		for sb.Len() < size {
			sb.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return sb.String()
	}
	return []string{
		strings.Repeat("a", size),
		strings.Repeat("ab", size/2),
		strings.Repeat("中", size/3),
		strings.Repeat("😀", size/4),
		strings.Repeat("!", size),
		strings.Repeat(" ", size) + "x",
		strings.Repeat("\n", size),
		randomOf([]string{"a", "b", "e", "r", "s", "t", "th", "in", "é", "ß"}),
		randomOf([]string{"中", "文", "字", "お", "め", "で", "と", "う", "한", "국"}),
		randomOf([]string{"😀", "🎉", "👍", "🏽", "\u200d", "❤", "\ufe0f"}),
		randomOf([]string{"!", "?", ".", "-", "=", "*", "#", "(", ")", "{", "}", "«", "»", "—"}),
		randomOf([]string{"x", "y", "Ж", "я", "ع", "ب", "中", "\u0301"}),
		randomOf([]string{"a", "\xff", "\xe4\xb8", "b"}),
	}
}

// refCount counts s as countLong did before chunking: the scanner's pieces,
// each merged whole by bpeLong (itself checked against tiktoken-go).
func refCount(e *encoder, s string) int {
	if !utf8.ValidString(s) {
		s = string([]rune(s))
	}
	n := 0
	for _, p := range e.pieces(s) {
		switch {
		case len(p) <= 1:
			n += len(p)
		case len(p) <= smallPiece:
			n += bpeSmall(p, e.v)
		default:
			n += bpeLong(p, e.v)
		}
	}
	return n
}

// checkLimits checks countLimit's contract on s, whose count is want: the
// count and true at or over it, a lower bound over the limit and false
// under it.
func checkLimits(t *testing.T, e *encoder, s string, want int) {
	t.Helper()
	for _, limit := range []int{0, want / 3, want - 1, want, want + 1} {
		if limit < 0 { // no limit
			continue
		}
		n, ok := e.countLimit(s, limit)
		if limit >= want && (!ok || n != want) || limit < want && (ok || n <= limit || n > want) {
			t.Fatalf("%s: countLimit(%q..., %d) = %d, %v; the count is %d", e.name, s[:min(len(s), 12)], limit, n, ok, want)
		}
	}
}

// TestLongPiecesChunked compares the chunked count of long pieces (100 KB
// and more, several chunks each) with the whole-piece merge, at the real
// chunk size and at small ones that put many cuts in every piece.
func TestLongPiecesChunked(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(13, 14))
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		enc := mustEncoder(t, name)
		retries, fallbacks := chunkRetries.Load(), chunkFallbacks.Load()
		for _, s := range longPieces(rng, 100<<10) {
			want := refCount(enc, s)
			for _, sz := range []struct{ chunk, tail int }{{chunkBytes, chunkTail}, {4096, 64}, {300, 8}, {150, 0}} {
				e := *enc
				e.chunk, e.tail = sz.chunk, sz.tail
				if got := e.count(s); got != want {
					t.Fatalf("%s: chunk %d tail %d: count of %q... (%d bytes) = %d, whole-piece merge says %d",
						name, sz.chunk, sz.tail, s[:min(len(s), 12)], len(s), got, want)
				}
				checkLimits(t, &e, s, want)
			}
		}
		t.Logf("%s: cuts moved left %d times, pieces encoded whole %d times",
			name, chunkRetries.Load()-retries, chunkFallbacks.Load()-fallbacks)
	}
	// One of them against tiktoken-go itself, at a size its quadratic
	// merge still does in seconds.
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		enc := mustEncoder(t, name)
		e := *enc
		e.chunk, e.tail = 500, 16
		s := longPieces(rng, 6000)[7]
		ref, _ := reference(t, name)
		if got, want := e.count(s), len(ref.EncodeOrdinary(s)); got != want {
			t.Fatalf("%s: chunked count %d, tiktoken-go %d", name, got, want)
		}
	}
}

// TestCountAllocatesLessThanTheText asserts that counting allocates, per
// call, no more bytes than the text has, for every input class: memory is
// bounded by the request, not by the shape of its text.
func TestCountAllocatesLessThanTheText(t *testing.T) {
	// Not parallel: TotalAlloc counts every goroutine's allocations.
	for _, c := range TextClasses() {
		for _, name := range []string{EncodingO200K, EncodingCL100K} {
			enc := mustEncoder(t, name)
			enc.count(c.Text) // fill the pools
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			// Averaged over runs: a garbage collection empties the pools,
			// and the next count takes its working memory anew.
			const runs = 10
			for range runs {
				enc.count(c.Text)
			}
			runtime.ReadMemStats(&after)
			if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > uint64(len(c.Text))+poolLoss {
				t.Errorf("%s %s: counting %d bytes allocates %d bytes", c.Name, name, len(c.Text), per)
			}
		}
	}
}

// TestCountLimitStopsEarly asserts that countLimit stops once the count
// passes the limit: after the piece that passes it, or inside one long
// piece as soon as a lower bound passes it.
func TestCountLimitStopsEarly(t *testing.T) {
	for _, name := range []string{EncodingO200K, EncodingCL100K} {
		enc := mustEncoder(t, name)

		// Many pieces of one token each: it stops at the first piece over.
		words := strings.Repeat(" hello", 1<<20)
		if n, ok := enc.countLimit(words, 1000); ok || n != 1001 {
			t.Errorf("%s: countLimit(words, 1000) = %d, %v; want 1001, false", name, n, ok)
		}
		if n, ok := enc.countLimit(words, -1); !ok || n != 1<<20 {
			t.Errorf("%s: countLimit(words, -1) = %d, %v; want %d, true", name, n, ok, 1<<20)
		}

		// One piece of 4 MB: a lower bound passes 1000 tokens after the
		// first chunk, long before the end.
		word := strings.Repeat("a", 4<<20)
		full := enc.count(word)
		limit := 1000
		got, ok := enc.countLimit(word, limit)
		if ok || got <= limit || got > full {
			t.Errorf("%s: countLimit(4 MB word, %d) = %d, %v; want a bound in (%d, %d], false", name, limit, got, ok, limit, full)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		limited, whole := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
		for range 3 { // the fastest of three: the machine is shared
			start := time.Now()
			enc.countLimit(word, limit)
			limited = min(limited, time.Since(start))
		}
		runtime.ReadMemStats(&after)
		for range 3 {
			start := time.Now()
			enc.count(word)
			whole = min(whole, time.Since(start))
		}
		if alloc := (after.TotalAlloc - before.TotalAlloc) / 3; alloc > 64<<10 {
			t.Errorf("%s: countLimit(4 MB word, %d) allocates %d bytes", name, limit, alloc)
		}
		// The whole count encodes 512 chunks, the limited one a single one;
		// both scan the piece to find its end (about a tenth of the work; a third leaves room for a shared machine: it took a fifth once under -race with other packages).
		if limited*3 > whole {
			t.Errorf("%s: countLimit(4 MB word, %d) takes %v, the whole count %v", name, limit, limited, whole)
		}
		if n, ok := enc.countLimit(word, full); !ok || n != full {
			t.Errorf("%s: countLimit(word, %d) = %d, %v; want the count, true", name, full, n, ok)
		}
		if n, ok := enc.countLimit(word, full-1); ok || n < full-1 || n > full {
			t.Errorf("%s: countLimit(word, %d) = %d, %v; want a bound over the limit, false", name, full-1, n, ok)
		}
	}
}
