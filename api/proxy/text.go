package proxy

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
)

// maxIdempotencyKey bounds the Idempotency-Key header, as the API does.
const maxIdempotencyKey = 255

// idempotencyKey is the call's Idempotency-Key: none, or 1 to 255
// printable ASCII characters without spaces (it is stored, and a control
// character or NUL cannot be). A bad key is the caller's 400: dropping it
// would silently lose the retry protection the caller asked for.
func idempotencyKey(r *http.Request) (string, string) {
	values := r.Header.Values("Idempotency-Key")
	switch {
	case len(values) == 0:
		return "", ""
	case len(values) > 1:
		return "", "send the header once"
	}
	k := strings.TrimSpace(values[0])
	if k == "" || len(k) > maxIdempotencyKey {
		return "", "must be 1 to 255 characters"
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return "", "must be printable ASCII without spaces or control characters"
		}
	}
	return k, ""
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
