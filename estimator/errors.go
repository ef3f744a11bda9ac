package estimator

import "errors"

// ErrInvalid is matched (with errors.Is) by every [InvalidError]: the request
// is malformed or cannot be served by the model, and retrying it unchanged
// cannot succeed.
var ErrInvalid = errors.New("invalid request")

// InvalidError says which part of a request is wrong and why.
type InvalidError struct {
	// Field is the JSON path of the offending value, such as
	// "messages[3].content[1].text", "max_tokens", "model", or "body" for
	// the body as a whole.
	Field string
	// Reason says what is wrong, e.g. "must be an integer".
	Reason string
}

// Error returns "invalid request: FIELD: REASON".
func (e *InvalidError) Error() string {
	return "invalid request: " + e.Field + ": " + e.Reason
}

// Is reports whether target is [ErrInvalid].
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(field, reason string) *InvalidError {
	return &InvalidError{Field: field, Reason: reason}
}
