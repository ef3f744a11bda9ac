package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/genai"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// heldStream is an emulated streamGenerateContent that sends its first
// chunk, then holds the rest back until the test closes hold: in the form
// the call asked for (alt=sse, else the JSON array).
func heldStream(t *testing.T, hold <-chan struct{}, n int) func(http.ResponseWriter, *http.Request, map[string]any) {
	return func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		sse := r.URL.Query().Get("alt") == "sse"
		if sse {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, "[")
		}
		for i := 1; i <= n; i++ {
			finish := ""
			if i == n {
				finish = "STOP"
			}
			chunk := geminiAnswer(fmt.Sprintf("part %d ", i), finish, streamUsage(i))
			switch {
			case sse:
				fmt.Fprintf(w, "data: %s\r\n\r\n", chunk)
			case i > 1:
				fmt.Fprint(w, ",\r\n"+chunk)
			default:
				fmt.Fprint(w, chunk)
			}
			w.(http.Flusher).Flush()
			if i == 1 {
				select {
				case <-hold:
				case <-r.Context().Done():
					t.Error("the client left before it read the first chunk")
					return
				case <-time.After(5 * time.Second):
					t.Error("the client did not read the first chunk while the upstream held the rest back")
				}
			}
		}
		if !sse {
			fmt.Fprint(w, "]")
		}
	}
}

// TestGeminiStreamRelayedAsItComes: in both stream forms (the SDK's
// alt=sse on AI Studio's path and Vertex AI's, and the JSON array of a raw
// call) the client reads the first chunk while the upstream still holds
// the rest back, the admission still reserved; once the upstream finishes
// it is settled once, at the last usage.
func TestGeminiStreamRelayedAsItComes(t *testing.T) {
	t.Parallel()
	const n = 4
	settledOnce := func(t *testing.T, b *bundle) {
		t.Helper()
		b.eventually(t, func(a *account.Admission) bool { return a.State == account.StateSettled })
		a := b.admissions(t)[0]
		if *a.ActualInput != 30 || *a.ActualOutput != 7*n || len(b.spy.settled()) != 1 {
			t.Fatalf("admission %+v, %d settles; want one settle at 30 in, %d out", a, len(b.spy.settled()), 7*n)
		}
		b.verify(t)
	}
	reserved := func(t *testing.T, b *bundle) {
		t.Helper()
		if as := b.admissions(t); len(as) != 1 || as[0].State != account.StateReserved {
			t.Fatalf("admissions %+v: want one, still reserved, while the upstream holds its last chunks", as)
		}
	}
	for _, vertex := range []bool{false, true} {
		t.Run(fmt.Sprintf("sdk sse vertex=%v", vertex), func(t *testing.T) {
			t.Parallel()
			b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
			hold := make(chan struct{})
			b.up.behave = heldStream(t, hold, n)
			var text strings.Builder
			chunks := 0
			for resp, err := range b.geminiClient(t, vertex, 0).Models.GenerateContentStream(ctx, geminiModel, genai.Text("Count."),
				&genai.GenerateContentConfig{MaxOutputTokens: 100}) {
				if err != nil {
					t.Fatal(err)
				}
				chunks++
				text.WriteString(resp.Text())
				if chunks == 1 {
					reserved(t, b)
					close(hold)
				}
			}
			if chunks != n || text.String() != "part 1 part 2 part 3 part 4 " {
				t.Fatalf("%d chunks: %q", chunks, text.String())
			}
			settledOnce(t, b)
		})
	}
	t.Run("raw json array", func(t *testing.T) {
		t.Parallel()
		b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
		hold := make(chan struct{})
		b.up.behave = heldStream(t, hold, n)
		req, _ := http.NewRequest(http.MethodPost, b.base+"/v1beta/models/"+geminiModel+":streamGenerateContent",
			strings.NewReader(`{"contents":[{"parts":[{"text":"Count."}]}],"generationConfig":{"maxOutputTokens":100}}`))
		req.Header.Set("X-Goog-Api-Key", b.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		dec := json.NewDecoder(resp.Body)
		if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
			t.Fatalf("the array's start: %v %v", tok, err)
		}
		var c struct {
			Candidates []struct {
				Content struct {
					Parts []struct{ Text string } `json:"parts"`
				} `json:"content"`
			} `json:"candidates"`
		}
		if err := dec.Decode(&c); err != nil || c.Candidates[0].Content.Parts[0].Text != "part 1 " {
			t.Fatalf("the first element: %+v %v", c, err)
		}
		reserved(t, b)
		close(hold)
		elements := 1
		for dec.More() {
			if err := dec.Decode(&c); err != nil {
				t.Fatal(err)
			}
			elements++
		}
		if tok, err := dec.Token(); err != nil || tok != json.Delim(']') || elements != n {
			t.Fatalf("%d elements, then %v %v", elements, tok, err)
		}
		settledOnce(t, b)
	})
}

// TestGeminiArrayStreamBroken: a JSON array stream the upstream breaks
// off in the middle of an element reaches the client as a broken array
// (the elements whole so far, never the torn one, then the connection
// broken), and is settled at its last usage raised to the text streamed,
// as the SSE form is.
func TestGeminiArrayStreamBroken(t *testing.T) {
	t.Parallel()
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	chunks := []string{"The gateway admits ", "requests only when ", "the tenant's bucket allows them."}
	var whole []string
	for i, c := range chunks {
		whole = append(whole, geminiAnswer(c, "", fmt.Sprintf(`{"promptTokenCount":30,"candidatesTokenCount":%d,"totalTokenCount":%d}`, i+1, 31+i)))
	}
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, "["+strings.Join(whole, ",\r\n")+",\r\n"+whole[0][:40])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection drops mid-element
	}
	req, _ := http.NewRequest(http.MethodPost, b.base+"/v1/projects/p/locations/us-central1/publishers/google/models/"+geminiModel+":streamGenerateContent",
		strings.NewReader(`{"contents":[{"role":"user","parts":[{"text":"Explain."}]}],"generationConfig":{"maxOutputTokens":1000}}`))
	req.Header.Set("Authorization", "Bearer "+b.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err == nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%d, read error %v: want the connection broken", resp.StatusCode, err)
	}
	if want := "[" + strings.Join(whole, ",\r\n"); string(got) != want {
		t.Fatalf("relayed %q\nwant the whole elements only %q", got, want)
	}
	b.settledAtStreamed(t, chunks)
	b.verify(t)
}

// TestGeminiArrayStreamUnclosed: a JSON array stream whose last element
// finished every candidate with its usage, but which the upstream broke
// off before its "]", is settled once at that usage, and broken off to the
// client too: it never reads a body without its "]" as a whole answer.
func TestGeminiArrayStreamUnclosed(t *testing.T) {
	t.Parallel()
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	elems := "[" + geminiAnswer("part 1 ", "", streamUsage(1)) + ",\r\n" + geminiAnswer("part 2", "STOP", streamUsage(2))
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, elems)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // no "]"
	}
	req, _ := http.NewRequest(http.MethodPost, b.base+"/v1beta/models/"+geminiModel+":streamGenerateContent?key="+b.key,
		strings.NewReader(`{"contents":[{"parts":[{"text":"Count."}]}],"generationConfig":{"maxOutputTokens":100}}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err == nil || string(got) != elems {
		t.Fatalf("read %q, %v; want the elements, then the connection broken", got, err)
	}
	b.eventually(t, func(a *account.Admission) bool { return a.State == account.StateSettled })
	if a := b.admissions(t)[0]; *a.ActualInput != 30 || *a.ActualOutput != 14 || len(b.spy.settled()) != 1 {
		t.Fatalf("admission %+v, %d settles; want one, at the last usage (30 in, 14 out)", a, len(b.spy.settled()))
	}
	b.verify(t)
}

// settledAtStreamed checks a broken stream of chunks, each stating a
// usage of 30 in and up to 3 out: settled once, at the last usage's input
// and the streamed text counted as the estimate counts (above the 3), and
// the balance moved by exactly its cost.
func (b *bundle) settledAtStreamed(t *testing.T, chunks []string) {
	t.Helper()
	b.eventually(t, func(a *account.Admission) bool { return a.State == account.StateSettled })
	n, err := estimator.CountText(estimator.EncodingO200K, strings.Join(chunks, ""))
	if err != nil {
		t.Fatal(err)
	}
	a := b.admissions(t)[0]
	if want := estimator.ScaleGeminiCount(int64(n)); *a.ActualInput != 30 || *a.ActualOutput != want || want <= 3 {
		t.Fatalf("settled %d in / %d out; want 30 / %d (the streamed text, above the last usage's 3)", *a.ActualInput, *a.ActualOutput, want)
	}
	if len(b.spy.settled()) != 1 || b.balance(t) != 100_000-*a.ActualCost {
		t.Fatalf("%d settles, balance %d; want one, %d", len(b.spy.settled()), b.balance(t), 100_000-*a.ActualCost)
	}
}

// TestGeminiArrayStreamWholeWithoutUsage: a JSON array stream that closes
// with every candidate finished but states no usageMetadata is a whole
// answer that states none: relayed whole to the client (never broken
// off), and settled once at its estimate, as a whole answer without usage
// is. (The soak found it broken off and settled at the streamed text.)
func TestGeminiArrayStreamWholeWithoutUsage(t *testing.T) {
	t.Parallel()
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	body := "[" + geminiAnswer("part 1 ", "", "") + ",\r\n" + geminiAnswer("part 2", "STOP", "") + "]"
	b.up.behave = func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, body)
	}
	req, _ := http.NewRequest(http.MethodPost, b.base+"/v1beta/models/"+geminiModel+":streamGenerateContent?key="+b.key,
		strings.NewReader(`{"contents":[{"parts":[{"text":"Count."}]}],"generationConfig":{"maxOutputTokens":100}}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || string(got) != body {
		t.Fatalf("%d, read %q, %v; want the whole array", resp.StatusCode, got, err)
	}
	b.eventually(t, func(a *account.Admission) bool { return a.State == account.StateSettled })
	a := b.admissions(t)[0]
	if *a.ActualInput != a.Estimate.InputTokens || *a.ActualOutput != a.Estimate.OutputTokens || len(b.spy.settled()) != 1 {
		t.Fatalf("settled %d in / %d out (%d settles); want the estimate %d / %d, once", *a.ActualInput, *a.ActualOutput,
			len(b.spy.settled()), a.Estimate.InputTokens, a.Estimate.OutputTokens)
	}
	b.verify(t)
}
