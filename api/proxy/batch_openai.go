package proxy

// OpenAI's Batch API: POST /v1/files (purpose=batch), GET /v1/files/{id}
// and /v1/files/{id}/content (the tenant's own files only), POST
// /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/estimator"
)

// openAIBatchRoute is r's handler if r is a route of OpenAI's Batch API
// (handled), with the file or batch id it names; nil when it answered r
// itself.
func (p *Proxy) openAIBatchRoute(w http.ResponseWriter, r *http.Request) (serve batchHandler, id string, handled bool) {
	d := openAI{}
	path := r.URL.Path
	switch {
	case path == "/v1/files" && r.Method == http.MethodPost:
		serve = p.openAIFileUpload
	case strings.HasPrefix(path, "/v1/files/") && r.Method == http.MethodGet:
		id = strings.TrimPrefix(path, "/v1/files/")
		serve = p.openAIFileRead
	case path == "/v1/batches" && r.Method == http.MethodPost:
		serve = p.openAIBatchCreate
	case strings.HasPrefix(path, "/v1/batches/") && strings.HasSuffix(path, "/cancel") && r.Method == http.MethodPost:
		id = strings.TrimSuffix(strings.TrimPrefix(path, "/v1/batches/"), "/cancel")
		serve = p.openAIBatchCancel
	case strings.HasPrefix(path, "/v1/batches/") && r.Method == http.MethodGet:
		id = strings.TrimPrefix(path, "/v1/batches/")
		serve = p.openAIBatchGet
	case path == "/v1/files" || path == "/v1/batches" || strings.HasPrefix(path, "/v1/files/") || strings.HasPrefix(path, "/v1/batches/"):
		// Listings and deletions would reach every tenant's files on the
		// upstream's one account.
		notFound(w, d, "tokengate serves POST /v1/files (purpose=batch), GET /v1/files/{id}[/content], POST /v1/batches, GET /v1/batches/{id} and POST /v1/batches/{id}/cancel")
		return nil, "", true
	default:
		return nil, "", false
	}
	if id != "" && strings.Contains(strings.TrimSuffix(id, "/content"), "/") || id == "" && path != "/v1/files" && path != "/v1/batches" {
		notFound(w, d, "no such route")
		return nil, "", true
	}
	return serve, id, true
}

func (p *Proxy) openAIHeaders(h http.Header) {
	if p.cfg.UpstreamKey != "" {
		h.Set("Authorization", "Bearer "+p.cfg.UpstreamKey)
	}
}

// openAIFileUpload reads a batch input file, estimates and checks every
// line, and forwards the file as it came only if every line may run; the
// upstream's file id then names the estimate.
func (p *Proxy) openAIFileUpload(w http.ResponseWriter, r *http.Request, principal credential.Principal, _ string) {
	d := openAI{}
	var endpoint string
	body, plan, ok := p.planBatch(w, r, principal, d, openAILine, func(body []byte) ([]batch.Line, error) {
		content, bad := multipartFile(r.Header.Get("Content-Type"), body)
		if bad != "" {
			return nil, &estimator.InvalidError{Field: "file", Reason: bad}
		}
		var lines []batch.Line
		var err error
		endpoint, lines, err = parseOpenAIBatchFile(content, p.cfg.BodyLimit)
		return lines, err
	})
	if !ok {
		return
	}
	status, h, out, err := p.upstreamCall(r.Context(), http.MethodPost, p.cfg.Upstream.JoinPath("/v1/files").String(), r.Header.Get("Content-Type"), body, p.openAIHeaders, 1<<20)
	if err != nil {
		fail(w, d, problem{code: codeUpstream, message: "the upstream did not answer"})
		return
	}
	if status < 300 {
		var f struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(out, &f) != nil || f.ID == "" {
			fail(w, d, problem{code: codeUpstream, message: "the upstream's answer names no file id"})
			return
		}
		if err := p.batches.FileRecord(r.Context(), batch.FileParams{Provider: batch.OpenAI, FileID: f.ID, TenantID: principal.TenantID, Endpoint: endpoint, Plan: plan}); err != nil {
			p.logger.Error("proxy: batch file not recorded", "file", f.ID, "error", err.Error())
			writeDomainError(w, d, err)
			return
		}
	}
	relayAnswer(w, status, h, out)
}

// multipartFile is the file part of a multipart upload whose purpose is
// batch, or what is wrong with it.
func multipartFile(contentType string, body []byte) ([]byte, string) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return nil, "the upload must be multipart/form-data with a purpose and a file"
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	var purpose string
	var file []byte
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, "the multipart body could not be read"
		}
		v, err := io.ReadAll(part)
		if err != nil {
			return nil, "the multipart body could not be read"
		}
		switch part.FormName() {
		case "purpose":
			purpose = string(v)
		case "file":
			file = v
		}
	}
	switch {
	case purpose != "batch":
		return nil, `tokengate accepts files of purpose "batch" only`
	case file == nil:
		return nil, "the upload has no file"
	}
	return file, ""
}

// openAILine names a line of an input file: "line 3".
func openAILine(n int) string { return "line " + strconv.Itoa(n) }

// openAIBatchLine is one line of an OpenAI batch input file.
type openAIBatchLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// parseOpenAIBatchFile reads a batch input file's lines (JSONL) into the
// requests their single calls would be, parsed by those calls' own
// parsers. Every line calls one endpoint; a *batch.LineError names the
// first line refused.
func parseOpenAIBatchFile(content []byte, lineLimit int64) (string, []batch.Line, error) {
	var lines []batch.Line
	endpoint := ""
	n := 0
	for raw := range bytes.Lines(content) {
		n++
		raw = bytes.TrimSpace(raw)
		if len(raw) == 0 {
			continue
		}
		if int64(len(raw)) > lineLimit {
			return "", nil, &batch.LineError{Line: n, Field: "body", Reason: "is larger than the proxy accepts of one request"}
		}
		var l openAIBatchLine
		if err := json.Unmarshal(raw, &l); err != nil {
			return "", nil, &batch.LineError{Line: n, Field: "line", Reason: "is not a JSON object"}
		}
		rt, ok := openAIRoutes[l.URL]
		switch {
		case l.Method != http.MethodPost:
			return "", nil, &batch.LineError{Line: n, CustomID: l.CustomID, Field: "method", Reason: "must be POST"}
		case !ok:
			return "", nil, &batch.LineError{Line: n, CustomID: l.CustomID, Field: "url", Reason: "must be /v1/chat/completions, /v1/responses, /v1/completions or /v1/embeddings"}
		case endpoint != "" && l.URL != endpoint:
			return "", nil, &batch.LineError{Line: n, CustomID: l.CustomID, Field: "url", Reason: "must be the same on every line (" + endpoint + ")"}
		}
		endpoint = l.URL
		req, err := parse(rt.api, l.Body)
		if err != nil {
			var inv *estimator.InvalidError
			if errors.As(err, &inv) {
				return "", nil, &batch.LineError{Line: n, CustomID: l.CustomID, Field: "body." + inv.Field, Reason: inv.Reason}
			}
			return "", nil, &batch.LineError{Line: n, CustomID: l.CustomID, Field: "body", Reason: "could not be read"}
		}
		lines = append(lines, batch.Line{CustomID: l.CustomID, Request: req})
		if len(lines) > batch.MaxLines {
			return "", nil, &batch.LineError{Line: n, Field: "file", Reason: fmt.Sprintf("holds more than %d requests", batch.MaxLines)}
		}
	}
	if len(lines) == 0 {
		return "", nil, &batch.LineError{Line: 1, Field: "file", Reason: "holds no requests"}
	}
	return endpoint, lines, nil
}

// openAIFileRead forwards a read of a file the tenant owns.
func (p *Proxy) openAIFileRead(w http.ResponseWriter, r *http.Request, principal credential.Principal, id string) {
	fileID := strings.TrimSuffix(id, "/content")
	ok, err := p.batches.FileOwned(r.Context(), batch.OpenAI, fileID, principal.TenantID)
	if err != nil {
		writeDomainError(w, openAI{}, err)
		return
	}
	if !ok {
		notFound(w, openAI{}, "no file of this tenant has that id")
		return
	}
	// Streamed as it comes: an output file may hold gigabytes.
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, p.cfg.Upstream.JoinPath(r.URL.Path).String(), nil)
	if err != nil {
		fail(w, openAI{}, problem{code: codeUpstream, message: "the upstream request could not be built"})
		return
	}
	if a := r.Header.Get("Accept"); a != "" {
		req.Header.Set("Accept", a)
	}
	p.openAIHeaders(req.Header)
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		fail(w, openAI{}, problem{code: codeUpstream, message: "the upstream did not answer"})
		return
	}
	defer resp.Body.Close()
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// openAIBatchCreate reserves a batch of a recorded file and forwards its
// creation; an upstream that does not accept it has its reservation
// refunded at once.
func (p *Proxy) openAIBatchCreate(w http.ResponseWriter, r *http.Request, principal credential.Principal, _ string) {
	d := openAI{}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		fail(w, d, bodyProblem(w.Header(), err))
		return
	}
	var req struct {
		InputFileID      string `json:"input_file_id"`
		Endpoint         string `json:"endpoint"`
		CompletionWindow string `json:"completion_window"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		d.writeError(w, http.StatusBadRequest, "invalid_request_error", "", "the body is not a JSON object")
		return
	}
	f, err := p.batches.FileOf(r.Context(), batch.OpenAI, req.InputFileID, principal.TenantID)
	switch {
	case errors.Is(err, batch.ErrFileNotFound):
		d.writeError(w, http.StatusBadRequest, "invalid_request_error", "input_file_id", "no batch input file of this tenant was uploaded through tokengate with that id")
		return
	case err != nil:
		writeDomainError(w, d, err)
		return
	case req.Endpoint != f.Endpoint:
		d.writeError(w, http.StatusBadRequest, "invalid_request_error", "endpoint", "must be the endpoint every line of the file calls ("+f.Endpoint+")")
		return
	case req.CompletionWindow != "24h":
		d.writeError(w, http.StatusBadRequest, "invalid_request_error", "completion_window", `must be "24h"`)
		return
	}
	p.submitBatch(w, r, d, batch.ReserveParams{TenantID: principal.TenantID, KeyID: principal.KeyID, Provider: batch.OpenAI, FileID: req.InputFileID,
		Actor: "proxy:key:" + principal.KeyID}, p.cfg.Upstream.JoinPath("/v1/batches").String(), p.openAIHeaders, body, openAILine)
}

// openAIBatchGet forwards a batch's retrieval and, when the upstream
// reports it ended, settles it from its output and error files.
func (p *Proxy) openAIBatchGet(w http.ResponseWriter, r *http.Request, principal credential.Principal, id string) {
	p.openAIBatchCall(w, r, principal, id, http.MethodGet, "/v1/batches/"+id)
}

// openAIBatchCancel forwards a cancellation; the lines that never ran are
// refunded once the upstream reports the batch cancelled.
func (p *Proxy) openAIBatchCancel(w http.ResponseWriter, r *http.Request, principal credential.Principal, id string) {
	p.openAIBatchCall(w, r, principal, id, http.MethodPost, "/v1/batches/"+id+"/cancel")
}

func (p *Proxy) openAIBatchCall(w http.ResponseWriter, r *http.Request, principal credential.Principal, id, method, path string) {
	p.batchCall(w, r, openAI{}, batch.OpenAI, principal.TenantID, id, method, p.cfg.Upstream.JoinPath(path).String(), p.openAIHeaders, openAILine,
		func(ctx context.Context, batchID string, answer []byte) {
			p.settleOpenAIBatch(ctx, principal, batchID, answer)
		})
}

// openAIEnded are the statuses of a batch that ended.
var openAIEnded = map[string]bool{"completed": true, "failed": true, "expired": true, "cancelled": true}

// settleOpenAIBatch settles a batch the upstream reports ended, per
// custom_id, from its output and error files. A file that cannot be read
// leaves the batch open, for the next retrieval (or its expiry).
func (p *Proxy) settleOpenAIBatch(ctx context.Context, principal credential.Principal, batchID string, answer []byte) {
	var b struct {
		Status       string  `json:"status"`
		Endpoint     string  `json:"endpoint"`
		OutputFileID *string `json:"output_file_id"`
		ErrorFileID  *string `json:"error_file_id"`
	}
	if json.Unmarshal(answer, &b) != nil || !openAIEnded[b.Status] {
		return
	}
	rt := openAIRoutes[b.Endpoint]
	var results []batch.Result
	var files []string
	for _, f := range []*string{b.OutputFileID, b.ErrorFileID} {
		if f == nil || *f == "" {
			continue
		}
		rs, err := p.openAIResults(ctx, *f, rt)
		if err != nil {
			p.logger.Error("proxy: batch results not read; settled on a later retrieval", "batch", batchID, "file", *f, "error", err.Error())
			return
		}
		results = append(results, rs...)
		files = append(files, *f)
	}
	if _, err := p.batches.End(ctx, batch.EndParams{TenantID: principal.TenantID, BatchID: batchID, Status: b.Status, Results: results, Files: files,
		Actor: "proxy:key:" + principal.KeyID}); err != nil {
		p.logger.Error("proxy: batch not settled; settled on a later retrieval", "batch", batchID, "error", err.Error())
	}
}

// openAIResults reads a results file line by line: a line whose response
// is a 200 succeeded (at its estimate if it states no usage, as a single
// call is settled); any other failed.
func (p *Proxy) openAIResults(ctx context.Context, fileID string, rt route) ([]batch.Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.cfg.Upstream.JoinPath("/v1/files", fileID, "content").String(), nil)
	if err != nil {
		return nil, err
	}
	p.openAIHeaders(req.Header)
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return nil, fmt.Errorf("the upstream answered %d", resp.StatusCode)
	}
	var out []batch.Result
	rd := bufio.NewReader(io.LimitReader(resp.Body, maxBatchResults))
	for {
		line, err := rd.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var l struct {
				CustomID string `json:"custom_id"`
				Response *struct {
					StatusCode int             `json:"status_code"`
					Body       json.RawMessage `json:"body"`
				} `json:"response"`
			}
			if json.Unmarshal(line, &l) == nil && l.CustomID != "" {
				res := batch.Result{CustomID: l.CustomID}
				if l.Response != nil && l.Response.StatusCode == http.StatusOK {
					res.Succeeded = true
					u, ok := (openAI{}).usage(rt, l.Response.Body)
					res.Input, res.Output, res.AtEstimate = u.Input, u.Output, !ok
					res.CacheRead, res.CacheWrite5m, res.CacheWrite1h = u.CacheRead, u.CacheWrite5m, u.CacheWrite1h
				}
				out = append(out, res)
			}
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
