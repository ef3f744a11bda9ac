package proxy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// messageBatches emulates Anthropic's Message Batches: it keeps each
// batch's custom_ids, and a test ends a batch with the result type it
// chooses per request.
type messageBatches struct {
	mu      sync.Mutex
	batches map[string]map[string]any
	ids     map[string][]string
	results map[string][]byte
	creates int
}

func (u *messageBatches) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if r.Header.Get("X-Api-Key") != "sk-ant-upstream" {
		http.Error(w, "wrong key", http.StatusUnauthorized)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	rest := strings.TrimPrefix(r.URL.Path, "/v1/messages/batches")
	id, tail, _ := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
	switch {
	case rest == "" && r.Method == http.MethodPost:
		var req struct {
			Requests []struct {
				CustomID string `json:"custom_id"`
			} `json:"requests"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		u.creates++
		id := fmt.Sprintf("msgbatch_%d", u.creates)
		for _, rq := range req.Requests {
			u.ids[id] = append(u.ids[id], rq.CustomID)
		}
		u.batches[id] = map[string]any{"id": id, "type": "message_batch", "processing_status": "in_progress",
			"request_counts": map[string]int{"processing": len(req.Requests)}, "created_at": "2026-01-01T00:00:00Z",
			"expires_at": "2026-01-02T00:00:00Z", "ended_at": nil, "archived_at": nil, "cancel_initiated_at": nil, "results_url": nil}
		_ = json.NewEncoder(w).Encode(u.batches[id])
	case tail == "" && r.Method == http.MethodGet:
		_ = json.NewEncoder(w).Encode(u.batches[id])
	case tail == "cancel":
		u.batches[id]["processing_status"] = "canceling"
		_ = json.NewEncoder(w).Encode(u.batches[id])
	case tail == "results":
		w.Header().Set("Content-Type", "application/x-jsonl")
		_, _ = w.Write(u.results[id])
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// end ends a batch: each request's result is types[custom_id], else
// succeeded with 10 input and 4 output tokens.
func (u *messageBatches) end(id string, types map[string]string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out bytes.Buffer
	for _, cid := range u.ids[id] {
		switch t := types[cid]; t {
		case "":
			fmt.Fprintf(&out, `{"custom_id":%q,"result":{"type":"succeeded","message":{"id":"m","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":10,"output_tokens":4,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}}}}`+"\n", cid, claudeModel)
		case "errored":
			fmt.Fprintf(&out, `{"custom_id":%q,"result":{"type":"errored","error":{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}}}`+"\n", cid)
		default:
			fmt.Fprintf(&out, `{"custom_id":%q,"result":{"type":%q}}`+"\n", cid, t)
		}
	}
	u.results[id] = out.Bytes()
	u.batches[id]["processing_status"] = "ended"
	u.batches[id]["ended_at"] = "2026-01-01T01:00:00Z"
	u.batches[id]["results_url"] = "https://example.invalid/results"
}

func setupMessageBatches(t *testing.T, capacity int64, models ...string) (*batchBundle, *messageBatches, *anthropic.Client) {
	t.Helper()
	b := setupBatches(t, capacity, models...)
	return b, b.anthro, b.anthropicClient(0)
}

func batchRequest(id, model string, maxTokens int64) anthropic.MessageBatchNewParamsRequest {
	return anthropic.MessageBatchNewParamsRequest{CustomID: id, Params: anthropic.MessageBatchNewParamsRequestParams{
		Model: anthropic.Model(model), MaxTokens: maxTokens,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Summarise ticket " + id + "."))}}}
}

// reservedOfRequest is what a request reserves as its single Messages call
// would be estimated, at batch prices.
func (b *batchBundle) reservedOfRequest(t *testing.T, rq anthropic.MessageBatchNewParamsRequest) int64 {
	t.Helper()
	raw, err := json.Marshal(rq.Params)
	if err != nil {
		t.Fatal(err)
	}
	q, err := estimator.ParseMessages(raw)
	if err != nil {
		t.Fatal(err)
	}
	est, err := b.est.Estimate(q)
	if err != nil {
		t.Fatal(err)
	}
	return batch.PriceMicro(est.InputTokens, est.OutputTokens, est.InputWeightMicro, est.OutputWeightMicro)
}

// A Message Batch through anthropic-sdk-go: reserved whole, nothing moves
// while it runs, and once ended its succeeded requests settle from their
// usage and exactly its errored and canceled ones are refunded, once.
func TestMessageBatchSettlesPerCustomID(t *testing.T) {
	t.Parallel()
	b, up, client := setupMessageBatches(t, 100_000)
	var reqs []anthropic.MessageBatchNewParamsRequest
	var total int64
	for i := range 5 {
		rq := batchRequest(fmt.Sprintf("m%d", i), claudeModel, int64(100+i))
		reqs = append(reqs, rq)
		total += b.reservedOfRequest(t, rq)
	}
	types := map[string]string{"m1": "errored", "m3": "canceled"}
	refund := b.reservedOfRequest(t, reqs[1]) + b.reservedOfRequest(t, reqs[3])
	mb, err := client.Messages.Batches.New(ctx, anthropic.MessageBatchNewParams{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	if b.enqueued(t) != total {
		t.Fatalf("enqueued %d, want %d", b.enqueued(t), total)
	}
	if _, err := client.Messages.Batches.Cancel(ctx, mb.ID, anthropic.MessageBatchCancelParams{}); err != nil || b.enqueued(t) != total {
		t.Fatalf("canceling: %v, enqueued %d", err, b.enqueued(t))
	}
	up.end(mb.ID, types)
	for range 2 {
		got, err := client.Messages.Batches.Get(ctx, mb.ID, anthropic.MessageBatchGetParams{})
		if err != nil || got.ProcessingStatus != "ended" {
			t.Fatalf("ended: %v %v", got, err)
		}
	}
	if b.enqueued(t) != 0 {
		t.Fatalf("enqueued after the end: %d", b.enqueued(t))
	}
	id, err := b.svc.Find(ctx, batch.Anthropic, mb.ID, "acme")
	if err != nil {
		t.Fatal(err)
	}
	es, _, err := ledger.EntryQuery(ctx, b.pool, ledger.Filter{TenantID: "acme", AdmissionID: id, Oldest: true, Limit: 10})
	if err != nil || len(es) != 3 || es[2].Kind != ledger.KindBatchRefund || *es[2].Estimate != (refund+rule.Micro-1)/rule.Micro {
		t.Fatalf("story %+v %v", es, err)
	}
	ls, _ := b.svc.Lines(ctx, id)
	want := map[string]string{"m0": batch.Succeeded, "m1": batch.Failed, "m2": batch.Succeeded, "m3": batch.Cancelled, "m4": batch.Succeeded}
	for _, l := range ls {
		if l.Outcome != want[l.CustomID] || (l.Outcome == batch.Succeeded && (l.ActualInput != 10 || l.ActualOutput != 4)) {
			t.Fatalf("line %+v", l)
		}
	}
	stream := client.Messages.Batches.ResultsStreaming(ctx, mb.ID, anthropic.MessageBatchResultsParams{})
	n := 0
	for stream.Next() {
		n++
	}
	if stream.Err() != nil || n != 5 {
		t.Fatalf("results: %d, %v", n, stream.Err())
	}
}

// A request over its model's window refuses the batch with a 400 naming
// the request, one naming a model the tenant may not use with a 403
// permission_error (model_not_allowed); the upstream never sees either.
func TestMessageBatchRefusesABadRequest(t *testing.T) {
	t.Parallel()
	_, up, client := setupMessageBatches(t, 100_000, claudeModel)
	for _, c := range []struct {
		reqs       []anthropic.MessageBatchNewParamsRequest
		name, says string
		status     int
	}{
		{[]anthropic.MessageBatchNewParamsRequest{batchRequest("a", claudeModel, 10), batchRequest("b", "claude-3-haiku-20240307", 10)}, "requests[1]", "model_not_allowed", http.StatusForbidden},
		{[]anthropic.MessageBatchNewParamsRequest{batchRequest("a", claudeModel, 10), batchRequest("b", claudeModel, 10), batchRequest("c", claudeModel, 5_000_000)}, "requests[2]", "max_tokens", http.StatusBadRequest},
	} {
		_, err := client.Messages.Batches.New(ctx, anthropic.MessageBatchNewParams{Requests: c.reqs})
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != c.status || !strings.Contains(apiErr.Error(), c.name) || !strings.Contains(apiErr.Error(), c.says) {
			t.Fatalf("want a %d naming %s (%s), got %v", c.status, c.name, c.says, err)
		}
	}
	if up.creates != 0 {
		t.Fatalf("the upstream got %d refused batches", up.creates)
	}
}
