package proxy

import "net/http"

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
