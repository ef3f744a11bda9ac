package api_test

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/integration/memtest"
)

// hostileText is size bytes of JSON string content of one input class:
// one long word, digits, whitespace, CJK, emoji or mixed scripts.
func hostileText(class string, size int) string {
	unit := map[string]string{
		"word":       "a",
		"digits":     "0123456789",
		"whitespace": `    \n  `,
		"cjk":        "漢字と仮名の交じった文章",
		"emoji":      "😀👍🏽🇫🇷🧑‍💻",
		"mixed":      "Hello мир 世界 مرحبا שלום 123 ",
	}[class]
	return strings.Repeat(unit, size/len(unit))
}

// hostileBody is a chat body of about size bytes whose one message is
// text of the class, for model: over the model's window, answered 400.
func hostileBody(model, class string, size int) []byte {
	head := `{"model":"` + model + `","messages":[{"role":"user","content":"`
	tail := `"}]}`
	return []byte(head + hostileText(class, size-len(head)-len(tail)) + tail)
}

// post sends body to the server at base with key and returns the status
// and the answer.
func postRaw(client *http.Client, base, key, path string, body []byte) (int, http.Header, string, error) {
	req, err := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, "", err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(raw), err
}

// serve runs the bundle's server on a real listener until the test ends
// and returns its base URL.
func (b *apiBundle) serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- b.srv.Serve(sctx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	return "http://" + ln.Addr().String()
}

// The bound of TestHostileEstimateBodiesStayWithinMemoryBound. The gate
// lets gateBytes of bodies be estimated at once: one 3.9-4.1 MB body. The
// heap may grow by heapPerGateByte times the gate's bytes plus a fixed
// margin for the server and the bodies read and waiting their turn (not
// parsed). heapPerGateByte is what one body in flight may cost, GC
// included: the body, its parsed strings, and a collection that lets the
// heap double. The tokenizer's own memory is bounded per count (a few
// hundred bytes; estimator's TestCountAllocatesLessThanTheText), so a long
// word costs no more than prose. Measured under -race: +77 MiB for the
// eight long words, +101 MiB for the worst of the sixteen (+821 and
// +1151 MiB with no gate and the old tokenizer). The resident set follows
// the heap; under the race detector it also holds the detector's shadow of
// the heap, about three times the heap (memtest.RSSFactor).
const (
	gateBytes       = 4 << 20
	heapPerGateByte = 16
	heapMargin      = 64 << 20
)

// TestHostileEstimateBodiesStayWithinMemoryBound (issue 36, P3): eight
// concurrent /v1/estimate bodies of 3.9 MB, each one message of a single
// long word, then sixteen concurrent 4.1 MB bodies of every input class
// (long words, digits, whitespace, CJK, emoji, mixed scripts) from three
// tenants on /v1/estimate and /v1/admissions, sent to a real server: every
// one is answered 400 over the model's window, nothing is written (no
// admission, balances and ledgers as they were), and the heap and the
// resident set grow by less than the stated bound. Before the estimate
// gate, the eight bodies alone took the server from 30 MB to 872 MB.
// Not parallel: it measures the whole process.
func TestHostileEstimateBodiesStayWithinMemoryBound(t *testing.T) {
	b := setupAPI(t, func(c *testConfig) {
		c.EstimateBytes = gateBytes
		// Every body is served in the end: the test is of memory, not of
		// refusals (TestEstimateGateRefusesPastItsWait is).
		c.EstimateWait = 10 * time.Minute
		// Bodies of the callers waiting their turn are read while others
		// are counted: on a busy machine (under -race) that may take
		// longer than the default body read timeout.
		c.Timeouts.BodyRead = 10 * time.Minute
	})
	keys := map[string]string{}
	for _, id := range []string{"acme", "globex", "initech"} {
		keys[id] = b.tenant(t, id, lim(1_000_000_000, "1"))
	}
	before := map[string][2]int64{}
	for id := range keys {
		m, s := b.balance(t, id)
		before[id] = [2]int64{m, s}
	}
	base := b.serve(t)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	t.Cleanup(client.CloseIdleConnections)
	// Warm up: the encodings are loaded once per process (a few MB).
	for _, model := range []string{"gpt-4o", "gpt-4"} {
		warm := `{"model":"` + model + `","messages":[{"role":"user","content":"warm up"}],"max_tokens":10}`
		if code, _, body, err := postRaw(client, base, keys["acme"], "/v1/estimate", []byte(warm)); err != nil || code != http.StatusOK {
			t.Fatalf("warm-up %s: %d %s %v", model, code, body, err)
		}
	}

	type call struct {
		key, path string
		body      []byte
	}
	send := func(t *testing.T, calls []call) (heap, rss uint64) {
		t.Helper()
		mp := memtest.Start(t)
		var wg sync.WaitGroup
		for _, c := range calls {
			wg.Go(func() {
				code, _, body, err := postRaw(client, base, c.key, c.path, c.body)
				if err != nil {
					t.Error(err)
					return
				}
				if code != http.StatusBadRequest || !strings.Contains(body, `"field":"messages"`) || !strings.Contains(body, "context window") {
					t.Errorf("%s of %d bytes: %d %.300s; want 400 over the context window", c.path, len(c.body), code, body)
				}
			})
		}
		wg.Wait()
		return mp.End(t)
	}
	bound := uint64(heapPerGateByte*gateBytes + heapMargin)
	rssBound := bound * memtest.RSSFactor

	t.Run("eight long words", func(t *testing.T) {
		body := hostileBody("gpt-4o", "word", 3_900_000)
		calls := make([]call, 8)
		for i := range calls {
			calls[i] = call{keys["acme"], "/v1/estimate", body}
		}
		start := time.Now()
		heap, rss := send(t, calls)
		t.Logf("eight 3.9 MB long words: peak heap +%d MiB, peak RSS +%d MiB (bounds %d and %d MiB), %s", heap>>20, rss>>20, bound>>20, rssBound>>20, time.Since(start).Round(time.Millisecond))
		if heap > bound || rss > rssBound {
			t.Errorf("peak heap +%d MiB, RSS +%d MiB: over the bounds of %d and %d MiB", heap>>20, rss>>20, bound>>20, rssBound>>20)
		}
	})

	t.Run("sixteen of every class", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(36, 3))
		classes := []string{"word", "digits", "whitespace", "cjk", "emoji", "mixed"}
		ids := []string{"acme", "globex", "initech"}
		calls := make([]call, 16)
		for i := range calls {
			model := []string{"gpt-4o", "gpt-4"}[rng.IntN(2)]
			class := classes[i%len(classes)]
			if class == "whitespace" {
				model = "gpt-4" // runs of spaces count few tokens: held to the smaller window
			}
			path := []string{"/v1/estimate", "/v1/admissions"}[rng.IntN(2)]
			calls[i] = call{keys[ids[rng.IntN(len(ids))]], path, hostileBody(model, class, 4_100_000-rng.IntN(200_000))}
		}
		start := time.Now()
		heap, rss := send(t, calls)
		t.Logf("sixteen 3.9-4.1 MB bodies of every class: peak heap +%d MiB, peak RSS +%d MiB (bounds %d and %d MiB), %s", heap>>20, rss>>20, bound>>20, rssBound>>20, time.Since(start).Round(time.Millisecond))
		if heap > bound || rss > rssBound {
			t.Errorf("peak heap +%d MiB, RSS +%d MiB: over the bounds of %d and %d MiB", heap>>20, rss>>20, bound>>20, rssBound>>20)
		}
	})

	// Nothing written.
	for id := range keys {
		if m, s := b.balance(t, id); m != before[id][0] || s != before[id][1] {
			t.Errorf("%s: balance %d, ledger %d; was %d, %d", id, m, s, before[id][0], before[id][1])
		}
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM admissions`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d admissions written", n)
	}
}
