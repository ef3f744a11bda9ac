package alert

import "errors"

// Sentinel errors; api maps each to one HTTP status.
var (
	// ErrNotFound: no endpoint, rule or event has that id.
	ErrNotFound = errors.New("alert: not found")
	// ErrInvalid is wrapped by *FieldError.
	ErrInvalid = errors.New("alert: invalid")
	// ErrNoKey: the server has no alert key (TOKENGATE_ALERT_KEY), so it
	// can neither give an endpoint its secret nor sign a delivery.
	ErrNoKey = errors.New("alert: no alert key configured (TOKENGATE_ALERT_KEY)")
)

// FieldError names the field of a request that is wrong, and why.
type FieldError struct {
	Field, Reason string
}

func (e *FieldError) Error() string { return "alert: " + e.Field + ": " + e.Reason }
func (e *FieldError) Unwrap() error { return ErrInvalid }

func invalid(field, reason string) error { return &FieldError{Field: field, Reason: reason} }
