package estimator

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
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
			c = bmpClasses[r]
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
			if got, want := bpeLong(s, enc.ranks, enc.maxTokenLen), bpeSmall(s, enc.ranks); got != want {
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
	for _, s := range []string{"hello world", "I'm", "a\u0301B", " \n\tx", "<|endoftext|>", "😀'S"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 2000 {
			return
		}
		for _, name := range []string{EncodingO200K, EncodingCL100K} {
			checkAgainstReference(t, name, s)
		}
	})
}
