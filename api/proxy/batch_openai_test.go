package proxy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokengate/tokengate/api/proxy"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// batchUpstream emulates OpenAI's Files and Batches APIs: it keeps the
// files uploaded and the batches created, and a test ends a batch with
// the lines it chooses failed or never run.
type batchUpstream struct {
	mu        sync.Mutex
	files     map[string][]byte
	batches   map[string]map[string]any
	uploads   int
	refuseNew bool
}

func (u *batchUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer sk-upstream" {
		http.Error(w, "wrong key", http.StatusUnauthorized)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	path := r.URL.Path
	switch {
	case path == "/v1/files" && r.Method == http.MethodPost:
		_, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		mr := multipart.NewReader(r.Body, params["boundary"])
		var content []byte
		for {
			part, err := mr.NextPart()
			if err != nil {
				break
			}
			if part.FormName() == "file" {
				content, _ = io.ReadAll(part)
			}
		}
		u.uploads++
		id := fmt.Sprintf("file-%d", len(u.files)+1)
		u.files[id] = content
		_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "object": "file", "bytes": len(content), "created_at": 1, "filename": "batch.jsonl", "purpose": "batch", "status": "processed"})
	case strings.HasPrefix(path, "/v1/files/") && strings.HasSuffix(path, "/content"):
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(u.files[strings.TrimSuffix(strings.TrimPrefix(path, "/v1/files/"), "/content")])
	case path == "/v1/batches" && r.Method == http.MethodPost:
		if u.refuseNew {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"error":{"message":"upstream down","type":"server_error","param":null,"code":null}}`))
			return
		}
		var req map[string]any
		_ = json.NewDecoder(r.Body).Decode(&req)
		id := fmt.Sprintf("batch_%d", len(u.batches)+1)
		b := map[string]any{"id": id, "object": "batch", "endpoint": req["endpoint"], "input_file_id": req["input_file_id"],
			"completion_window": "24h", "status": "validating", "created_at": 1}
		u.batches[id] = b
		_ = json.NewEncoder(w).Encode(b)
	case strings.HasPrefix(path, "/v1/batches/") && strings.HasSuffix(path, "/cancel"):
		b := u.batches[strings.TrimSuffix(strings.TrimPrefix(path, "/v1/batches/"), "/cancel")]
		b["status"] = "cancelling"
		_ = json.NewEncoder(w).Encode(b)
	case strings.HasPrefix(path, "/v1/batches/") && r.Method == http.MethodGet:
		b, ok := u.batches[strings.TrimPrefix(path, "/v1/batches/")]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"message":"no such batch","type":"invalid_request_error","param":null,"code":null}}`))
			return
		}
		_ = json.NewEncoder(w).Encode(b)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// end ends a batch as status: each line of its input file is answered
// with usage (5 in, 7 out), unless failed names it (an error line) or it
// is at or past ran (never run: in no file).
func (u *batchUpstream) end(id, status string, failed map[string]bool, ran int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	b := u.batches[id]
	var out, errs bytes.Buffer
	n := 0
	for line := range bytes.Lines(u.files[b["input_file_id"].(string)]) {
		var l struct {
			CustomID string `json:"custom_id"`
		}
		_ = json.Unmarshal(line, &l)
		switch {
		case n >= ran:
		case failed[l.CustomID]:
			fmt.Fprintf(&errs, `{"id":"r","custom_id":%q,"response":{"status_code":400,"body":{"error":{"message":"bad"}}},"error":null}`+"\n", l.CustomID)
		default:
			fmt.Fprintf(&out, `{"id":"r","custom_id":%q,"response":{"status_code":200,"request_id":"q","body":{"id":"c","object":"chat.completion","model":"gpt-4o","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":3}}}},"error":null}`+"\n", l.CustomID)
		}
		n++
	}
	b["status"] = status
	if out.Len() > 0 {
		u.files["file-out-"+id] = out.Bytes()
		b["output_file_id"] = "file-out-" + id
	}
	if errs.Len() > 0 {
		u.files["file-err-"+id] = errs.Bytes()
		b["error_file_id"] = "file-err-" + id
	}
}

type batchBundle struct {
	*bundle
	up     *batchUpstream
	anthro *messageBatches
	svc    *batch.Service
}

// setupBatches runs the proxy in front of the emulated Batch API, with a
// tenant whose allowance is capacity tokens and whose model scope is models
// (none: any).
func setupBatches(t testing.TB, capacity int64, models ...string) *batchBundle {
	t.Helper()
	up := &batchUpstream{files: map[string][]byte{}, batches: map[string]map[string]any{}}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	anthro := &messageBatches{batches: map[string]map[string]any{}, ids: map[string][]string{}, results: map[string][]byte{}}
	asrv := httptest.NewServer(anthro)
	t.Cleanup(asrv.Close)
	b := setupWith(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}, func(c *proxy.Config) {
		c.Upstream, _ = url.Parse(srv.URL)
		c.AnthropicUpstream, _ = url.Parse(asrv.URL)
	})
	svc, err := batch.New(batch.Config{Store: b.store, Estimator: b.est})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: capacity}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.SetModels(ctx, account.SetModelsParams{TenantID: "acme", Models: models}); err != nil {
		t.Fatal(err)
	}
	return &batchBundle{bundle: b, up: up, anthro: anthro, svc: svc}
}

// chatLine is a batch line of a chat completion.
func chatLine(id, model string, maxTokens int) string {
	return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":"/v1/chat/completions","body":{"model":%q,"messages":[{"role":"user","content":"Summarise ticket %s for the platform team."}],"max_tokens":%d}}`,
		id, model, id, maxTokens)
}

// reservedOf is what a chat line reserves, as its single request would be
// estimated, at batch prices.
func (b *batchBundle) reservedOf(t *testing.T, line string) int64 {
	t.Helper()
	var l struct {
		Body json.RawMessage `json:"body"`
	}
	if err := json.Unmarshal([]byte(line), &l); err != nil {
		t.Fatal(err)
	}
	req, err := estimator.Parse(l.Body)
	if err != nil {
		t.Fatal(err)
	}
	est, err := b.est.Estimate(req)
	if err != nil {
		t.Fatal(err)
	}
	return batch.PriceMicro(est.InputTokens, est.OutputTokens, est.InputWeightMicro, est.OutputWeightMicro)
}

func (b *batchBundle) upload(t *testing.T, lines ...string) (*openai.FileObject, error) {
	t.Helper()
	return b.client.Files.New(ctx, openai.FileNewParams{Purpose: openai.FilePurposeBatch,
		File: openai.File(strings.NewReader(strings.Join(lines, "\n")+"\n"), "batch.jsonl", "application/jsonl")})
}

func (b *batchBundle) create(t *testing.T, fileID string) (*openai.Batch, error) {
	t.Helper()
	return b.client.Batches.New(ctx, openai.BatchNewParams{InputFileID: fileID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
}

func (b *batchBundle) enqueued(t testing.TB) int64 {
	t.Helper()
	a, err := b.svc.Allowance(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	return a.EnqueuedMicro
}

// story is the ledger entries of a batch, oldest first, by the id the
// proxy reported in X-Tokengate-Batch (the upstream's id finds it too).
func (b *batchBundle) story(t *testing.T, upstreamID string) []ledger.Entry {
	t.Helper()
	id, err := b.svc.Find(ctx, batch.OpenAI, upstreamID, "acme")
	if err != nil {
		t.Fatal(err)
	}
	es, _, err := ledger.EntryQuery(ctx, b.pool, ledger.Filter{TenantID: "acme", AdmissionID: id, Oldest: true, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return es
}

func lineError(t *testing.T, err error, status int, param string) {
	t.Helper()
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != status || apiErr.Param != param {
		t.Fatalf("want a %d naming %q, got %v", status, param, err)
	}
}

// A batch of N lines with k failed, through the SDK: the upload is
// estimated line by line, the batch reserved whole, nothing moves while
// it runs, and when the upstream reports it completed the N-k lines are
// settled from their usage and exactly the k refunded; a second retrieval
// settles nothing more. The tenant reads its output file; another tenant
// cannot.
func TestBatchPartialFailureRefundsExactlyTheFailedLines(t *testing.T) {
	t.Parallel()
	b := setupBatches(t, 100_000)
	const n = 6
	failed := map[string]bool{"t1": true, "t4": true}
	var lines []string
	var total, refund int64
	for i := range n {
		l := chatLine(fmt.Sprintf("t%d", i), "gpt-4o", 50+i)
		lines = append(lines, l)
		total += b.reservedOf(t, l)
		if failed[fmt.Sprintf("t%d", i)] {
			refund += b.reservedOf(t, l)
		}
	}
	f, err := b.upload(t, lines...)
	if err != nil {
		t.Fatal(err)
	}
	bt, err := b.create(t, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.enqueued(t) != total {
		t.Fatalf("enqueued %d, want the whole batch %d", b.enqueued(t), total)
	}
	if got, err := b.client.Batches.Get(ctx, bt.ID); err != nil || got.Status != "validating" || b.enqueued(t) != total {
		t.Fatalf("running batch: %v %v, enqueued %d", got, err, b.enqueued(t))
	}
	b.up.end(bt.ID, "completed", failed, n)
	for range 2 {
		got, err := b.client.Batches.Get(ctx, bt.ID)
		if err != nil || got.Status != "completed" {
			t.Fatalf("completed batch: %v %v", got, err)
		}
	}
	if b.enqueued(t) != 0 {
		t.Fatalf("enqueued after the end: %d", b.enqueued(t))
	}
	es := b.story(t, bt.ID)
	if len(es) != 3 || es[0].Kind != ledger.KindBatchReserve || es[1].Kind != ledger.KindBatchSettle || es[2].Kind != ledger.KindBatchRefund {
		t.Fatalf("story %+v", es)
	}
	var refunded struct {
		Lines         int   `json:"lines"`
		ReservedMicro int64 `json:"reserved_micro"`
	}
	if err := json.Unmarshal([]byte(es[2].Detail), &refunded); err != nil || refunded.Lines != len(failed) || refunded.ReservedMicro != refund {
		t.Fatalf("refund %s, want %d lines of %d", es[2].Detail, len(failed), refund)
	}
	id, _ := b.svc.Find(ctx, batch.OpenAI, bt.ID, "acme")
	ls, err := b.svc.Lines(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if (l.State == "refunded") != failed[l.CustomID] || (l.State == "settled" && (l.ActualInput != 5 || l.ActualOutput != 7)) {
			t.Fatalf("line %+v", l)
		}
	}

	resp, err := b.client.Files.Content(ctx, "file-out-"+bt.ID)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if bytes.Count(out, []byte("\n")) != n-len(failed) {
		t.Fatalf("output file %q", out)
	}
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "umbrella", Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}}); err != nil {
		t.Fatal(err)
	}
	_, stranger, err := credential.KeyCreate(ctx, b.pool, "umbrella")
	if err != nil {
		t.Fatal(err)
	}
	theirs := openai.NewClient(option.WithBaseURL(b.base+"/v1/"), option.WithAPIKey(stranger), option.WithMaxRetries(0))
	if _, err := theirs.Files.Content(ctx, "file-out-"+bt.ID); err == nil {
		t.Fatal("another tenant read the output file")
	}
	if _, err := theirs.Batches.Get(ctx, bt.ID); err == nil {
		t.Fatal("another tenant read the batch")
	}
	if _, err := ledger.Verify(ctx, b.pool, "acme"); err != nil {
		t.Fatal(err)
	}
}

// A line over its model's window, or naming a model the tenant's batches
// may not use, refuses the whole upload with a 400 naming the line; the
// upstream never sees the file.
func TestBatchUploadRefusesABadLine(t *testing.T) {
	t.Parallel()
	b := setupBatches(t, 100_000, "gpt-4o")
	cases := []struct {
		name   string
		lines  []string
		param  string
		status int
	}{
		{"over the window", []string{chatLine("a", "gpt-4o", 10), chatLine("b", "gpt-4o", 10), chatLine("c", "gpt-4o", 200_000)}, "line 3", http.StatusBadRequest},
		{"forbidden model", []string{chatLine("a", "gpt-4o", 10), chatLine("b", "gpt-4o-mini", 10)}, "line 2", http.StatusForbidden},
		{"two endpoints", []string{chatLine("a", "gpt-4o", 10), `{"custom_id":"b","method":"POST","url":"/v1/embeddings","body":{"model":"gpt-4o","input":"x"}}`}, "line 2", http.StatusBadRequest},
		{"not JSON", []string{chatLine("a", "gpt-4o", 10), `{"custom_id":`}, "line 2", http.StatusBadRequest},
	}
	for _, c := range cases {
		_, err := b.upload(t, c.lines...)
		lineError(t, err, c.status, c.param)
		var apiErr *openai.Error
		if errors.As(err, &apiErr) && !strings.Contains(apiErr.Message, c.param) {
			t.Errorf("%s: message %q names no line", c.name, apiErr.Message)
		}
	}
	if b.up.uploads != 0 {
		t.Fatalf("the upstream got %d refused files", b.up.uploads)
	}
	_, err := b.client.Files.New(ctx, openai.FileNewParams{Purpose: openai.FilePurposeAssistants,
		File: openai.File(strings.NewReader(chatLine("a", "gpt-4o", 10)), "x.jsonl", "application/jsonl")})
	lineError(t, err, http.StatusBadRequest, "file")
}

// A cancelled batch: the lines that ran before the cancel settle, the
// others are refunded as cancelled. An expired one likewise, as expired.
func TestBatchCancelAndExpiryRefundTheLinesNeverRun(t *testing.T) {
	t.Parallel()
	b := setupBatches(t, 100_000)
	for _, status := range []string{"cancelled", "expired"} {
		lines := []string{chatLine("a", "gpt-4o", 10), chatLine("b", "gpt-4o", 20), chatLine("c", "gpt-4o", 30), chatLine("d", "gpt-4o", 40)}
		f, err := b.upload(t, lines...)
		if err != nil {
			t.Fatal(err)
		}
		bt, err := b.create(t, f.ID)
		if err != nil {
			t.Fatal(err)
		}
		if status == "cancelled" {
			got, err := b.client.Batches.Cancel(ctx, bt.ID)
			if err != nil || got.Status != "cancelling" || b.enqueued(t) == 0 {
				t.Fatalf("cancelling: %v %v, enqueued %d", got, err, b.enqueued(t))
			}
		}
		b.up.end(bt.ID, status, nil, 2)
		if _, err := b.client.Batches.Get(ctx, bt.ID); err != nil {
			t.Fatal(err)
		}
		if b.enqueued(t) != 0 {
			t.Fatalf("%s: enqueued %d", status, b.enqueued(t))
		}
		id, _ := b.svc.Find(ctx, batch.OpenAI, bt.ID, "acme")
		ls, _ := b.svc.Lines(ctx, id)
		want := map[string]string{"a": batch.Succeeded, "b": batch.Succeeded, "c": status, "d": status}
		for _, l := range ls {
			if l.Outcome != want[l.CustomID] {
				t.Fatalf("%s: line %+v", status, l)
			}
		}
		if es := b.story(t, bt.ID); len(es) != 3 || *es[2].Estimate != (b.reservedOf(t, lines[2])+b.reservedOf(t, lines[3])+rule.Micro-1)/rule.Micro {
			t.Fatalf("%s: story %+v", status, es)
		}
	}
}

// A batch past the allowance is refused with a 429 the SDK does not
// retry; one the upstream refuses is refunded at once.
func TestBatchRefusals(t *testing.T) {
	t.Parallel()
	b := setupBatches(t, 100_000)
	line := chatLine("a", "gpt-4o", 100)
	per := b.reservedOf(t, line)
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: (per + per/2) / rule.Micro}); err != nil {
		t.Fatal(err)
	}
	f, err := b.upload(t, line)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.create(t, f.ID); err != nil {
		t.Fatal(err)
	}
	_, err = b.create(t, f.ID)
	lineError(t, err, http.StatusTooManyRequests, "")
	if b.enqueued(t) != per {
		t.Fatalf("enqueued %d, want %d", b.enqueued(t), per)
	}
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: 100_000}); err != nil {
		t.Fatal(err)
	}
	b.up.mu.Lock()
	b.up.refuseNew = true
	b.up.mu.Unlock()
	_, err = b.create(t, f.ID)
	lineError(t, err, http.StatusInternalServerError, "")
	if b.enqueued(t) != per {
		t.Fatalf("a batch the upstream refused stayed enqueued: %d", b.enqueued(t))
	}
	_, err = b.client.Batches.New(ctx, openai.BatchNewParams{InputFileID: "file-nope", Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	lineError(t, err, http.StatusBadRequest, "input_file_id")
	_, err = b.client.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1Embeddings,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	lineError(t, err, http.StatusBadRequest, "endpoint")
}

// Many batches created at once through the SDK on one tenant's
// allowance: exactly as many as fit are created upstream, the others get
// 429s, and what is enqueued is exactly theirs.
func TestBatchConcurrentCreatesNeverExceedTheAllowance(t *testing.T) {
	t.Parallel()
	b := setupBatches(t, 100_000)
	line := chatLine("a", "gpt-4o", 100)
	per := b.reservedOf(t, line)
	f, err := b.upload(t, line)
	if err != nil {
		t.Fatal(err)
	}
	const fit, tries = 4, 16
	if _, err := b.svc.SetAllowance(ctx, batch.SetAllowanceParams{TenantID: "acme", Capacity: (fit*per + per/2) / rule.Micro}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	created, refused := 0, 0
	start := make(chan struct{})
	for range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := b.create(t, f.ID)
			var apiErr *openai.Error
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				created++
			case errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusTooManyRequests:
				refused++
			default:
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	b.up.mu.Lock()
	upstream := len(b.up.batches)
	b.up.mu.Unlock()
	if created != fit || refused != tries-fit || upstream != fit || b.enqueued(t) != fit*per {
		t.Fatalf("created %d, refused %d, upstream %d, enqueued %d (want %d, %d, %d, %d)", created, refused, upstream, b.enqueued(t), fit, tries-fit, fit, fit*per)
	}
}

// A tenant without an allowance has its batches refused with a 403.
func TestBatchWithoutAllowanceIsRefused(t *testing.T) {
	t.Parallel()
	b := setupBatches(t, 100_000)
	if _, err := b.pool.Exec(ctx, `DELETE FROM batch_allowances`); err != nil {
		t.Fatal(err)
	}
	_, err := b.upload(t, chatLine("a", "gpt-4o", 10))
	lineError(t, err, http.StatusForbidden, "")
}
