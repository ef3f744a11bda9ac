package rule

import (
	"errors"
	"fmt"
)

var (
	// ErrUnavailable: the store could not be reached, and the decision was
	// certainly not made (nothing was committed). A failure policy may
	// decide instead.
	ErrUnavailable = errors.New("budget: store unavailable")
	// ErrOutcomeUnknown wraps ErrUnavailable when the connection failed
	// after COMMIT was sent: the decision may or may not have been made. It
	// must not be decided again elsewhere (that could debit twice); the
	// caller retries with an Idempotency-Key instead.
	ErrOutcomeUnknown = fmt.Errorf("%w: the outcome of the commit is unknown", ErrUnavailable)
	// ErrBusy: no database connection became free before the request's
	// deadline. The store is up but saturated.
	ErrBusy = errors.New("budget: store busy")
)
