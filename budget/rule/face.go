package rule

import (
	"errors"
	"fmt"
)

// Face is the front door an admission came through: the HTTP API, the
// OpenAI and Anthropic proxy wires, or the rate limit service. An admission
// remembers the face that made it, and only that face may end it
// (settle, release) or answer a retry of its Idempotency-Key.
//
// Why: the proxy and the gateway end their admissions themselves, from the
// upstream's usage; the tenant never does. Yet the proxy sends the
// admission id to the tenant (x-tokengate-admission), and a gateway's ids
// are in the tenant's ledger: without an owner, the tenant released a
// proxy stream mid-way with its own key, the proxy's settle then failed as
// a conflict, and the call cost nothing (issue 36, P1).
type Face string

// The faces. The zero Face is FaceAPI: what every admission was before
// faces were told apart, and what a caller of the store that names none
// (a tool, a test) acts as.
const (
	FaceAPI   Face = "api"
	FaceProxy Face = "proxy" // both wires: one proxy ends every call it admits
	FaceRLS   Face = "rls"
)

// Or is f, or FaceAPI for none.
func (f Face) Or() Face {
	if f == "" {
		return FaceAPI
	}
	return f
}

// StoredKey is an Idempotency-Key as the store keeps it, in f's namespace:
// the same key string sent through two faces never meets (an API key
// "rls:<id>" named a gateway's request, and the gateway's stream end
// settled it). The API's keys are kept as they come, as every key was
// before faces were told apart, so its live keys stay valid; another
// face's are prefixed "<face> ". A key holds no space
// (IdempotencyKeyProblem, which the decision applies), so a prefixed key
// can equal no key of the API, nor of another face. "" stays "".
func (f Face) StoredKey(key string) string {
	if key == "" || f.Or() == FaceAPI {
		return key
	}
	return string(f) + " " + key
}

// ErrOtherFace is wrapped by *OtherFaceError: a settle or release named an
// admission of its tenant that another face made, and only that face may
// end it. Nothing moved.
var ErrOtherFace = errors.New("budget: the admission belongs to another face")

// OtherFaceError names the admission a face may not end, and the face that
// made it (the admission is the caller's own tenant's: a tenant's faces
// are its own business, and another tenant's admission is never found).
type OtherFaceError struct {
	AdmissionID string
	Face        Face // the face that made it
}

func (e *OtherFaceError) Error() string {
	return fmt.Sprintf("budget: admission %s was made through the %s face; only that face may settle or release it", e.AdmissionID, e.Face)
}

// Unwrap makes errors.Is(err, ErrOtherFace) true.
func (e *OtherFaceError) Unwrap() error { return ErrOtherFace }
