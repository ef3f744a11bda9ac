package proxy_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// embedInputs returns an embeddings body's inputs as OpenAI counts them:
// each string with cl100k_base (every embedding model's encoding), each
// token array by its length.
func embedInputs(t *testing.T, input any) []int64 {
	t.Helper()
	text := func(s string) int64 {
		n, err := estimator.CountText(estimator.EncodingCL100K, s)
		if err != nil {
			t.Error(err)
		}
		return int64(n)
	}
	switch in := input.(type) {
	case string:
		return []int64{text(in)}
	case []any:
		if _, ids := in[0].(float64); ids {
			return []int64{int64(len(in))}
		}
		var out []int64
		for _, e := range in {
			switch it := e.(type) {
			case string:
				out = append(out, text(it))
			case []any:
				out = append(out, int64(len(it)))
			}
		}
		return out
	}
	t.Errorf("input %v", input)
	return nil
}

// answerEmbeddings answers as OpenAI's embeddings endpoint does: one
// vector per input, of the dimensions asked (3 by default), as floats or
// base64 little-endian float32s, and usage.prompt_tokens (the inputs'
// count plus skew, for an upstream that counts its own way).
func answerEmbeddings(t *testing.T, w http.ResponseWriter, body map[string]any, skew int64) {
	counts := embedInputs(t, body["input"])
	dims := 3
	if d, ok := body["dimensions"].(float64); ok {
		dims = int(d)
	}
	var data []string
	var total int64
	for i, c := range counts {
		total += c
		vec := make([]float32, dims)
		for j := range vec {
			vec[j] = float32(i+1) / float32(j+2)
		}
		var emb []byte
		if body["encoding_format"] == "base64" {
			raw := make([]byte, 4*dims)
			for j, f := range vec {
				binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(f))
			}
			emb, _ = json.Marshal(base64.StdEncoding.EncodeToString(raw))
		} else {
			emb, _ = json.Marshal(vec)
		}
		data = append(data, fmt.Sprintf(`{"object":"embedding","index":%d,"embedding":%s}`, i, emb))
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"object":"list","data":[%s],"model":%q,"usage":{"prompt_tokens":%d,"total_tokens":%d}}`,
		strings.Join(data, ","), body["model"], total+skew, total+skew)
}

// postTo sends a raw call to the proxy's path with the tenant's key.
func (b *bundle) postTo(t *testing.T, path, body string, headers ...string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+b.key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(raw)
}

func tokenIDs(n int) []int64 {
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(100 + i)
	}
	return ids
}

// TestEmbeddingsSettleFromUsage: the SDK's embeddings calls, in each of
// the four input shapes, are estimated at exactly their input (counted
// with cl100k_base, token ids one each) and no output, forwarded with
// dimensions, encoding_format and user as they were and the upstream's
// key, and settled from usage.prompt_tokens: the ledger and the balance
// hold exactly the usage, also when the upstream counts otherwise than
// the estimate.
func TestEmbeddingsSettleFromUsage(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1}) // refills one token in 11 days: the balance is exact
	var skew atomic.Int64
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		if r.URL.Path != "/v1/embeddings" {
			t.Errorf("the upstream was called at %s", r.URL.Path)
		}
		answerEmbeddings(t, w, body, skew.Load())
	}
	strs := []string{"The food was delicious and the waiter...", "お誕生日おめでとう", "tokengate admits requests by their cost."}
	cases := []struct {
		name   string
		params openai.EmbeddingNewParams
		inputs int
		skew   int64
	}{
		{"string", openai.EmbeddingNewParams{Model: openai.EmbeddingModelTextEmbedding3Small,
			Input:      openai.EmbeddingNewParamsInputUnion{OfString: openai.String(strs[0])},
			Dimensions: openai.Int(8), EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat, User: openai.String("user-42")}, 1, 0},
		{"strings", openai.EmbeddingNewParams{Model: openai.EmbeddingModelTextEmbedding3Large,
			Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: strs},
			EncodingFormat: openai.EmbeddingNewParamsEncodingFormatBase64}, 3, 0},
		{"token ids", openai.EmbeddingNewParams{Model: openai.EmbeddingModelTextEmbeddingAda002,
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfTokens: tokenIDs(57)}}, 1, 0},
		{"token arrays", openai.EmbeddingNewParams{Model: openai.EmbeddingModelTextEmbedding3Small,
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfTokenArrays: [][]int64{tokenIDs(5), tokenIDs(1), tokenIDs(300)}}}, 3, 0},
		{"an upstream that counts 4 fewer", openai.EmbeddingNewParams{Model: openai.EmbeddingModelTextEmbedding3Small,
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: strs}}, 3, -4},
	}
	var spent int64
	for i, c := range cases {
		skew.Store(c.skew)
		resp, err := b.client.Embeddings.New(ctx, c.params)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		sent, auth := b.up.last()
		want := int64(0)
		for _, n := range embedInputs(t, sent["input"]) {
			want += n
		}
		dims := 3
		if c.params.Dimensions.Valid() {
			dims = int(c.params.Dimensions.Value)
		}
		if len(resp.Data) != c.inputs || len(resp.Data[c.inputs-1].Embedding) != dims || resp.Usage.PromptTokens != want+c.skew {
			t.Fatalf("%s: answer %d vectors of %d, usage %d; want %d of %d, usage %d", c.name,
				len(resp.Data), len(resp.Data[0].Embedding), resp.Usage.PromptTokens, c.inputs, dims, want+c.skew)
		}
		if auth != "Bearer sk-upstream" {
			t.Fatalf("%s: the upstream got %q", c.name, auth)
		}
		if i == 0 && (sent["dimensions"] != float64(8) || sent["encoding_format"] != "float" || sent["user"] != "user-42") {
			t.Fatalf("%s: the upstream got %v", c.name, sent)
		}
		if _, asked := sent["stream_options"]; asked {
			t.Fatalf("%s: the body was changed: %v", c.name, sent)
		}
		as := b.admissions(t)
		a := as[len(as)-1]
		got := want + c.skew
		if a.State != account.StateSettled || a.Estimate.InputTokens != want || a.Estimate.OutputTokens != 0 || a.Estimate.Cost != want ||
			a.Estimate.Approximate || a.Family != string(c.params.Model) ||
			*a.ActualInput != got || *a.ActualOutput != 0 || *a.ActualCost != got {
			t.Fatalf("%s: admission %+v (estimate %+v, actual %d/%d/%d); want %d estimated, %d settled",
				c.name, a, a.Estimate, *a.ActualInput, *a.ActualOutput, *a.ActualCost, want, got)
		}
		spent += got
		if bal := b.balance(t); bal != 100_000-spent {
			t.Fatalf("%s: balance %d, want %d", c.name, bal, 100_000-spent)
		}
	}
	settles, _, err := ledger.EntryQuery(ctx, b.pool, ledger.Filter{TenantID: "acme", Kind: ledger.KindSettle, Oldest: true, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var ledgered int64
	for _, e := range settles {
		ledgered += *e.Actual
	}
	if len(settles) != len(cases) || ledgered != spent {
		t.Fatalf("%d settle entries for %d in the ledger; want %d for %d", len(settles), ledgered, len(cases), spent)
	}
	b.verify(t)
}

// TestEmbeddingsRefusedOrInvalidChargeNothing: over the allowance an
// embeddings call is OpenAI's 429; one that can never fit is 422; bad
// input (a bad shape, an input over the model's 8191-token window) is a
// 400 naming the field. None of them debits, writes the ledger or reaches
// the upstream; and a retry under an admitted Idempotency-Key is a 409
// that does not call the upstream twice.
func TestEmbeddingsRefusedOrInvalidChargeNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1})
	var calls atomic.Int32
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		calls.Add(1)
		answerEmbeddings(t, w, body, 0)
	}
	embed := func(n int) openai.EmbeddingNewParams {
		return openai.EmbeddingNewParams{Model: openai.EmbeddingModelTextEmbedding3Small,
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfTokens: tokenIDs(n)}}
	}
	if _, err := b.client.Embeddings.New(ctx, embed(900)); err != nil {
		t.Fatal(err)
	}
	// 100 left: 200 tokens are refused, as OpenAI refuses, with its headers.
	_, err := b.client.Embeddings.New(ctx, embed(200))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "rate_limit_exceeded" ||
		apiErr.Type != "rate_limit_exceeded" || apiErr.Response.Header.Get("Retry-After-Ms") == "" ||
		apiErr.Response.Header.Get("X-Ratelimit-Remaining-Tokens") == "" {
		t.Fatalf("over the allowance: %v", err)
	}
	// Beyond the capacity: it can never fit.
	_, err = b.client.Embeddings.New(ctx, embed(2000))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnprocessableEntity || apiErr.Code != "request_too_large" {
		t.Fatalf("beyond the capacity: %v", err)
	}
	// Beyond the model's window, through the SDK.
	_, err = b.client.Embeddings.New(ctx, embed(8192))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "input" ||
		!strings.Contains(apiErr.Message, "context window of 8191") {
		t.Fatalf("over the window: %v", err)
	}
	over := strings.Repeat("a ", 8191) // 8192 tokens
	for _, bad := range []struct{ body, param string }{
		{`{"model":"text-embedding-3-small","input":""}`, `"param":"input"`},
		{`{"model":"text-embedding-3-small","input":["a",""]}`, `"param":"input[1]"`},
		{`{"model":"text-embedding-3-small","input":[1,"a"]}`, `"param":"input[1]"`},
		{`{"model":"text-embedding-3-small","input":[[1],[]]}`, `"param":"input[1]"`},
		{`{"model":"text-embedding-3-small","input":[{"role":"user","content":"hi"}]}`, `"param":"input[0]"`},
		{`{"model":"text-embedding-3-small","input":"hi","dimensions":"8"}`, `"param":"dimensions"`},
		{`{"model":"text-embedding-3-small","input":"hi","encoding_format":7}`, `"param":"encoding_format"`},
		{`{"model":"text-embedding-3-small","input":"hi","user":["u"]}`, `"param":"user"`},
		{`{"model":"text-embedding-3-small","messages":[{"role":"user","content":"hi"}]}`, `"param":"input"`},
		{`{"input":"hi"}`, `"param":"model"`},
		{`{"model":"text-embedding-3-large","input":["ok","` + over + `"]}`, `"param":"input[1]"`},
		{`not json`, `"invalid_request_error"`},
	} {
		status, _, raw := b.postTo(t, "/v1/embeddings", bad.body)
		if status != http.StatusBadRequest || !strings.Contains(raw, bad.param) || !strings.Contains(raw, `"type":"invalid_request_error"`) {
			t.Fatalf("%.80s: %d %s, want 400 with %s", bad.body, status, raw, bad.param)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the upstream was called %d times, want once", n)
	}
	if bal := b.balance(t); bal != 100 {
		t.Fatalf("balance %d after refusals, want 100", bal)
	}
	// Idempotency: an admitted key's retry is a 409, not a second call.
	good := `{"model":"text-embedding-3-small","input":"hello world"}`
	if status, _, raw := b.postTo(t, "/v1/embeddings", good, "Idempotency-Key", "embed-1"); status != http.StatusOK {
		t.Fatalf("first call: %d %s", status, raw)
	}
	if status, _, raw := b.postTo(t, "/v1/embeddings", good, "Idempotency-Key", "embed-1"); status != http.StatusConflict || !strings.Contains(raw, "Idempotency-Key") {
		t.Fatalf("retry under the same key: %d %s, want 409", status, raw)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("the upstream was called %d times, want twice", n)
	}
	as := b.admissions(t)
	if len(as) != 2 || *as[0].ActualCost != 900 || *as[1].ActualCost != 2 { // "hello world" is 2 tokens
		t.Fatalf("admissions: %+v", as)
	}
	if bal := b.balance(t); bal != 98 {
		t.Fatalf("balance %d, want 98", bal)
	}
	b.verify(t)
}

// TestEmbeddingsUpstreamFailureReleases: an upstream that answers an error
// (relayed as it is) or drops the connection before answering ran
// nothing: the reservation is released and the balance is whole.
func TestEmbeddingsUpstreamFailureReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		if body["user"] == "drop" {
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"message":"This model does not support specifying dimensions.","type":"invalid_request_error","param":"dimensions","code":null}}`)
	}
	params := openai.EmbeddingNewParams{Model: openai.EmbeddingModelTextEmbeddingAda002, Dimensions: openai.Int(8),
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("Say hello to the platform team.")}}
	_, err := b.client.Embeddings.New(ctx, params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "dimensions" {
		t.Fatalf("the upstream's refusal: %v", err)
	}
	params.User = openai.String("drop")
	_, err = b.client.Embeddings.New(ctx, params)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway {
		t.Fatalf("the upstream dropped the call: %v", err)
	}
	as := b.admissions(t)
	if len(as) != 2 || as[0].State != account.StateReleased || as[1].State != account.StateReleased {
		t.Fatalf("admissions: %+v", as)
	}
	if bal := b.balance(t); bal != 100_000 {
		t.Fatalf("balance %d: a failed call was charged", bal)
	}
	b.verify(t)
}

// TestEmbeddingsModelInputLimit: a tenant's per-model input limit holds
// embeddings as it holds the other routes: within the tenant's allowance,
// an embedding model's input bucket refuses what it cannot pay (429) or
// can never hold (422), and another model is not held by it.
func TestEmbeddingsModelInputLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	if _, err := b.store.SetModelLimits(ctx, account.SetModelLimitsParams{TenantID: "acme",
		Limits: rule.ModelLimits{Model: "text-embedding-3-small", InputCapacity: 1000, InputRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		calls.Add(1)
		answerEmbeddings(t, w, body, 0)
	}
	embed := func(model string, n int) error {
		_, err := b.client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: model,
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfTokenArrays: [][]int64{tokenIDs(n)}}})
		return err
	}
	if err := embed("text-embedding-3-small-2024-01-25", 900); err != nil { // a dated variant: the same family's bucket
		t.Fatal(err)
	}
	var apiErr *openai.Error
	if err := embed("text-embedding-3-small", 200); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests ||
		!strings.Contains(apiErr.Message, "input_tokens") {
		t.Fatalf("over the model's input bucket: %v", err)
	}
	if err := embed("text-embedding-3-small", 1001); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("beyond the model's input capacity: %v", err)
	}
	if err := embed("text-embedding-3-large", 200); err != nil {
		t.Fatalf("another model: %v", err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("the upstream was called %d times, want twice", n)
	}
	if bal := b.balance(t); bal != 100_000-900-200 {
		t.Fatalf("balance %d, want %d", bal, 100_000-1100)
	}
	b.verify(t)
}
