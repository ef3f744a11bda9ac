package proxy

import (
	"errors"
	"io"
	"net/http"
	"os"
)

// idempotencyKey is the Idempotency-Key header, sent at most once (else
// the reason it is refused). Its form is the domain's rule, which the
// admission layer applies to every face.
func idempotencyKey(r *http.Request) (string, string) {
	values := r.Header.Values("Idempotency-Key")
	if len(values) > 1 {
		return "", "send the header once"
	}
	if len(values) == 0 {
		return "", ""
	}
	return values[0], ""
}

// readBody reads a call's body within limit. Its failure is answered: 413
// past the limit (a chunked body as one with a Content-Length), 408 past
// the server's body read deadline (the connection is then closed), 400
// for a body that broke off.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.cfg.BodyLimit))
	if err == nil {
		return body, true
	}
	p.calls.WithLabelValues("invalid").Inc()
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &mb):
		writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "", "the request body is larger than the proxy accepts")
	case errors.Is(err, os.ErrDeadlineExceeded):
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusRequestTimeout, "invalid_request_error", "", "the request body did not arrive within the proxy's body read timeout")
	default:
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "the request body could not be read")
	}
	return nil, false
}
