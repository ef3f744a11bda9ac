package proxy

// Anthropic's Message Batches: POST /v1/messages/batches, GET
// /v1/messages/batches/{id} and its /results, POST
// /v1/messages/batches/{id}/cancel. A batch's requests come in its body,
// each estimated as its single Messages call would be.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/estimator"
)

const messageBatchesPath = "/v1/messages/batches"

// anthropicBatchRoute is r's handler if r is a route of Message Batches
// (handled), with the batch id it names; nil when it answered r itself.
func (p *Proxy) anthropicBatchRoute(w http.ResponseWriter, r *http.Request) (serve batchHandler, id string, handled bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, messageBatchesPath)
	if !ok || rest != "" && rest[0] != '/' {
		return nil, "", false
	}
	id, tail, _ := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
	switch {
	case rest == "" && r.Method == http.MethodPost:
		serve = p.anthropicBatchCreate
	case id != "" && tail == "" && r.Method == http.MethodGet:
		serve = p.anthropicBatchGet
	case id != "" && tail == "results" && r.Method == http.MethodGet:
		serve = p.anthropicBatchResults
	case id != "" && tail == "cancel" && r.Method == http.MethodPost:
		serve = p.anthropicBatchCancel
	default:
		// Listings and deletions would reach every tenant's batches on the
		// upstream's one organisation.
		notFound(w, anthropic{}, "tokengate serves POST /v1/messages/batches, GET /v1/messages/batches/{id} and /results, and POST /v1/messages/batches/{id}/cancel")
		return nil, "", true
	}
	return serve, id, true
}

// anthropicLine names a request of a batch: "requests[2]".
func anthropicLine(n int) string { return fmt.Sprintf("requests[%d]", n-1) }

// anthropicBatchCreate reads a batch's requests, estimates and checks each,
// reserves the whole batch and forwards it; an upstream that does not
// accept it has its reservation refunded at once.
func (p *Proxy) anthropicBatchCreate(w http.ResponseWriter, r *http.Request, principal credential.Principal, _ string) {
	d := anthropic{}
	body, plan, ok := p.planBatch(w, r, principal, d, anthropicLine, func(body []byte) ([]batch.Line, error) {
		return parseMessageBatch(body, r)
	})
	if !ok {
		return
	}
	p.submitBatch(w, r, d, batch.ReserveParams{TenantID: principal.TenantID, KeyID: principal.KeyID, Provider: batch.Anthropic, Plan: plan,
		Actor: "proxy:key:" + principal.KeyID}, p.cfg.AnthropicUpstream.JoinPath(messageBatchesPath).String(),
		func(h http.Header) { anthropicHeaders(&p.cfg, r, h) }, body, anthropicLine)
}

// parseMessageBatch reads a Message Batches body into the requests their
// single Messages calls would be (with the call's 1M-context beta, when
// r carries it).
func parseMessageBatch(body []byte, r *http.Request) ([]batch.Line, error) {
	var v struct {
		Requests []struct {
			CustomID string          `json:"custom_id"`
			Params   json.RawMessage `json:"params"`
		} `json:"requests"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, &estimator.InvalidError{Field: "requests", Reason: "the body must be a JSON object with a list of requests"}
	}
	if len(v.Requests) > batch.MaxLines {
		return nil, &batch.LineError{Line: batch.MaxLines + 1, Field: "requests", Reason: fmt.Sprintf("holds more than %d requests", batch.MaxLines)}
	}
	lines := make([]batch.Line, 0, len(v.Requests))
	for i, rq := range v.Requests {
		q, err := estimator.ParseMessages(rq.Params)
		if err != nil {
			var inv *estimator.InvalidError
			if errors.As(err, &inv) {
				return nil, &batch.LineError{Line: i + 1, CustomID: rq.CustomID, Field: "params." + inv.Field, Reason: inv.Reason}
			}
			return nil, &batch.LineError{Line: i + 1, CustomID: rq.CustomID, Field: "params", Reason: "could not be read"}
		}
		lines = append(lines, batch.Line{CustomID: rq.CustomID, Request: withContext1M(q, r)})
	}
	return lines, nil
}

func (p *Proxy) anthropicBatchGet(w http.ResponseWriter, r *http.Request, principal credential.Principal, id string) {
	p.anthropicBatchCall(w, r, principal, id, http.MethodGet, messageBatchesPath+"/"+id)
}

// anthropicBatchCancel forwards a cancellation; the requests that never
// ran are refunded once the upstream reports the batch ended.
func (p *Proxy) anthropicBatchCancel(w http.ResponseWriter, r *http.Request, principal credential.Principal, id string) {
	p.anthropicBatchCall(w, r, principal, id, http.MethodPost, messageBatchesPath+"/"+id+"/cancel")
}

// anthropicBatchCall forwards a call about a tenant's batch and, when the
// upstream reports it ended, settles it from its results.
func (p *Proxy) anthropicBatchCall(w http.ResponseWriter, r *http.Request, principal credential.Principal, id, method, path string) {
	headers := func(h http.Header) { anthropicHeaders(&p.cfg, r, h) }
	p.batchCall(w, r, anthropic{}, batch.Anthropic, principal.TenantID, id, method, p.cfg.AnthropicUpstream.JoinPath(path).String(), headers, anthropicLine,
		func(ctx context.Context, batchID string, answer []byte) {
			var b struct {
				ID               string `json:"id"`
				ProcessingStatus string `json:"processing_status"`
			}
			if json.Unmarshal(answer, &b) == nil && b.ProcessingStatus == "ended" {
				p.settleMessageBatch(ctx, principal, batchID, b.ID, headers)
			}
		})
}

// anthropicBatchResults relays a tenant's batch results as they stream.
func (p *Proxy) anthropicBatchResults(w http.ResponseWriter, r *http.Request, principal credential.Principal, id string) {
	d := anthropic{}
	if _, err := p.batches.Find(r.Context(), batch.Anthropic, id, principal.TenantID); err != nil {
		batchFail(w, d, err, anthropicLine)
		return
	}
	resp, err := p.messageBatchResults(r.Context(), id, func(h http.Header) { anthropicHeaders(&p.cfg, r, h) })
	if err != nil {
		fail(w, d, problem{code: codeUpstream, message: "the upstream did not answer"})
		return
	}
	defer resp.Body.Close()
	dropUpstreamRateHeaders(resp.Header)
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func (p *Proxy) messageBatchResults(ctx context.Context, upstreamID string, headers func(http.Header)) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.cfg.AnthropicUpstream.JoinPath(messageBatchesPath, upstreamID, "results").String(), nil)
	if err != nil {
		return nil, err
	}
	headers(req.Header)
	req.Header.Del("Content-Type")
	return p.cfg.Client.Do(req)
}

// messageOutcomes are the Message Batches result types a line is
// refunded for, as the domain names them.
var messageOutcomes = map[string]string{"errored": batch.Failed, "canceled": batch.Cancelled, "expired": batch.Expired}

// settleMessageBatch settles an ended batch per custom_id from its
// results (a succeeded request that states no usage at its estimate, as
// a single call is); results that cannot be read leave it open for the next
// retrieval (or its expiry).
func (p *Proxy) settleMessageBatch(ctx context.Context, principal credential.Principal, batchID, upstreamID string, headers func(http.Header)) {
	resp, err := p.messageBatchResults(ctx, upstreamID, headers)
	if err != nil {
		p.logger.Error("proxy: batch results not read; settled on a later retrieval", "batch", batchID, "error", err.Error())
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		p.logger.Error("proxy: batch results not read; settled on a later retrieval", "batch", batchID, "status", resp.StatusCode)
		return
	}
	var results []batch.Result
	rd := bufio.NewReader(io.LimitReader(resp.Body, maxBatchResults))
	for {
		line, err := rd.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var l struct {
				CustomID string `json:"custom_id"`
				Result   struct {
					Type    string          `json:"type"`
					Message json.RawMessage `json:"message"`
				} `json:"result"`
			}
			if json.Unmarshal(line, &l) == nil && l.CustomID != "" {
				res := batch.Result{CustomID: l.CustomID, Outcome: messageOutcomes[l.Result.Type]}
				if l.Result.Type == "succeeded" {
					res.Succeeded = true
					u, ok := (anthropic{}).usage(route{api: messagesAPI}, l.Result.Message)
					res.Input, res.Output, res.AtEstimate = u.Input, u.Output, !ok
					res.CacheRead, res.CacheWrite5m, res.CacheWrite1h = u.CacheRead, u.CacheWrite5m, u.CacheWrite1h
				}
				results = append(results, res)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			p.logger.Error("proxy: batch results broke off; settled on a later retrieval", "batch", batchID, "error", err.Error())
			return
		}
	}
	if _, err := p.batches.End(ctx, batch.EndParams{TenantID: principal.TenantID, BatchID: batchID, Status: "ended", Results: results,
		Actor: "proxy:key:" + principal.KeyID}); err != nil {
		p.logger.Error("proxy: batch not settled; settled on a later retrieval", "batch", batchID, "error", err.Error())
	}
}
