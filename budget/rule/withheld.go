package rule

import "errors"

// ErrWithheld is wrapped by *WithheldError: a reserve of a group
// (account.Item.Group) that its own limits would have admitted, not admitted
// because another reserve of its group was refused.
var ErrWithheld = errors.New("budget: withheld: another request of its group was refused")

// WithheldError is a reserve withheld with its group (ErrWithheld): nothing
// was debited for it, and Snapshot is its tenant's balances as the batch
// left them.
type WithheldError struct {
	Snapshot Snapshot
}

func (e *WithheldError) Error() string { return ErrWithheld.Error() }

// Unwrap makes errors.Is(err, ErrWithheld) hold.
func (e *WithheldError) Unwrap() error { return ErrWithheld }
