package rule

import "fmt"

// MaxIdempotencyKey bounds an idempotency key's length in bytes.
const MaxIdempotencyKey = 255

// IdempotencyKeyProblem says why k cannot be an idempotency key, or "" if
// it can: 1 to MaxIdempotencyKey printable ASCII characters, no spaces.
// Every face's key goes through this one rule (the admission layer checks
// it), so that a key the HTTP API refuses is not silently dropped, or
// stored, by another face.
func IdempotencyKeyProblem(k string) string {
	if k == "" || len(k) > MaxIdempotencyKey {
		return fmt.Sprintf("must be 1 to %d characters", MaxIdempotencyKey)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return "must be printable ASCII without spaces or control characters"
		}
	}
	return ""
}

// InvalidError is a request the domain refuses as the caller's mistake
// before deciding anything: Field names what is wrong, Reason says why.
// Each face answers it as its own invalid-request error (HTTP 400, gRPC
// INVALID_ARGUMENT) naming the field.
type InvalidError struct {
	Field, Reason string
}

func (e *InvalidError) Error() string { return "budget: " + e.Field + ": " + e.Reason }
