package estimator_test

import (
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/estimator"
)

// TestEstimateStopsCountingPastTheWindow: once the texts counted so far
// prove a request over its model's window, the texts after them are not
// counted at all. The second text here, one word of 2 MB, costs tens of
// megabytes to count; the request is refused for its first text alone, so
// the estimate must allocate about what counting the first text costs.
func TestEstimateStopsCountingPastTheWindow(t *testing.T) {
	first := strings.Repeat("hello ", 140_000) // 140,001 tokens: over gpt-4o's 128k window
	second := strings.Repeat("a", 2<<20)
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + first + `"},{"role":"user","content":"` + second + `"}]}`
	r, err := estimator.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	est := estimator.New(nil)
	if _, err := estimator.CountText(estimator.EncodingO200K, "warm up"); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = est.Estimate(r)
	runtime.ReadMemStats(&after)
	assertInvalid(t, err, "messages", "the model's context window of 128000 tokens")
	if !strings.Contains(err.Error(), "at least") {
		t.Errorf("error %q: want the lower bound counting stopped at (\"at least\")", err)
	}
	// Counting the first text allocates a few MB; counting the second
	// (today's tokenizer) 40 MB or more.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
		t.Errorf("the estimate allocated %d MB: it counted past the text that put it over the window", alloc>>20)
	}
}

// TestEstimateWindowBoundIsExact: stopping early never changes a
// decision. An input that leaves exactly its cap in the window fits, one
// more output token does not, on the OpenAI shape, the Messages shape
// (whose count is scaled before it is held to the window), a completions
// prompt and an embeddings input.
func TestEstimateWindowBoundIsExact(t *testing.T) {
	est := estimator.New(nil)
	text := strings.Repeat("hello world, ", 39_000) // 117,000 tokens
	cases := []struct {
		name, model string
		window      int64
		body        func(max int64) string
		parse       func([]byte) (*estimator.Request, error)
	}{
		{"chat", "gpt-4o", 128_000, func(max int64) string {
			return `{"model":"gpt-4o","max_tokens":` + strconv.FormatInt(max, 10) + `,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + text + `"}]}`
		}, estimator.Parse},
		{"messages", "claude-sonnet-4-5", 200_000, func(max int64) string {
			return `{"model":"claude-sonnet-4-5","max_tokens":` + strconv.FormatInt(max, 10) + `,"system":"be brief","messages":[{"role":"user","content":"` + text + `"}]}`
		}, estimator.ParseMessages},
		{"prompt", "gpt-4", 8_192, func(max int64) string {
			return `{"model":"gpt-4","max_tokens":` + strconv.FormatInt(max, 10) + `,"prompt":"` + text[:8000] + `"}`
		}, estimator.Parse},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The exact input, from a call that fits whatever its size.
			r, err := c.parse([]byte(c.body(1)))
			if err != nil {
				t.Fatal(err)
			}
			e, err := est.Estimate(r)
			if err != nil {
				t.Fatalf("with an output of 1: %v", err)
			}
			room := c.window - e.InputTokens
			if room < 1 {
				t.Fatalf("input %d leaves no room in %d: make the text shorter", e.InputTokens, c.window)
			}
			r, _ = c.parse([]byte(c.body(room)))
			if got, err := est.Estimate(r); err != nil || got.InputTokens != e.InputTokens {
				t.Errorf("an output of exactly the room left (%d): %+v, %v; want it to fit with input %d", room, got, err, e.InputTokens)
			}
			r, _ = c.parse([]byte(c.body(room + 1)))
			if _, err := est.Estimate(r); err == nil {
				t.Errorf("an output of one more than the room left (%d) was accepted", room+1)
			} else {
				assertInvalid(t, err, r.Source(), "exceeds the model's context window")
			}
		})
	}
	t.Run("embeddings", func(t *testing.T) {
		r, err := estimator.ParseEmbeddings([]byte(`{"model":"text-embedding-3-small","input":["ok","` + text[:40000] + `"]}`))
		if err != nil {
			t.Fatal(err)
		}
		_, err = est.Estimate(r)
		assertInvalid(t, err, "input[1]", "exceeds the model's context window of 8191 tokens")
	})
}

// assertInvalid checks that err is an *InvalidError of field whose reason
// says want.
func assertInvalid(t *testing.T, err error, field, want string) {
	t.Helper()
	var ie *estimator.InvalidError
	if !errors.As(err, &ie) {
		t.Fatalf("error %v (%T): want an *InvalidError of %s", err, err, field)
	}
	if ie.Field != field || !strings.Contains(ie.Reason, want) {
		t.Errorf("error %s: %s; want %s: ...%s...", ie.Field, ie.Reason, field, want)
	}
}

// TestInlinedImagesAreNotCountedAsText (issue 36, P3): an image inlined as
// a base64 data URL where no image block carries it (an OpenAI-style
// image_url block on Anthropic's wire, a Responses input_image item) is a
// part, not megabytes of base64 counted as text: counting it as text took
// seconds of CPU a call and refused it for millions of tokens.
func TestInlinedImagesAreNotCountedAsText(t *testing.T) {
	data := strings.Repeat("QUJDRA+/", 400_000) // 3.2 MB of base64, not an image we can read
	est := estimator.New(nil)
	for _, c := range []struct {
		name  string
		parse func([]byte) (*estimator.Request, error)
		body  string
		most  int64
	}{
		{"anthropic image_url block", estimator.ParseCountTokens,
			`{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + data + `"}}]}]}`, 2000},
		{"responses input_image", estimator.Parse,
			`{"model":"gpt-4o","max_output_tokens":10,"input":[{"role":"user","content":"what is this?"},{"type":"input_image","image_url":"data:image/png;base64,` + data + `"}]}`, 1000},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := c.parse([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			e, err := est.Estimate(r)
			if err != nil {
				t.Fatalf("%v; want the image counted as a part", err)
			}
			if e.InputTokens > c.most || !e.Approximate {
				t.Errorf("input %d tokens (approximate %v); want at most %d, approximate: the image as a part", e.InputTokens, e.Approximate, c.most)
			}
		})
	}
}
