package rule

import (
	"errors"
	"fmt"
	"strings"
)

// ErrBadAdjustment: an adjustment needs a non-zero amount and a reason.
var ErrBadAdjustment = errors.New("budget: an adjustment needs a non-zero amount and a reason")

// MaxAdjustmentReason is the longest reason of an adjustment, in bytes
// (after trimming): it is written into the ledger.
const MaxAdjustmentReason = 500

// CheckAdjustment checks an admin's credit (tokens > 0) or debit (< 0) of
// a tenant's token balance, and returns its reason trimmed. It returns
// ErrBadAdjustment (no amount, or no reason or one past
// MaxAdjustmentReason) or an *OverflowError (ErrOverflow: the amount is
// beyond ±MaxAmount tokens).
func CheckAdjustment(tokens int64, reason string) (string, error) {
	reason = strings.TrimSpace(reason)
	if tokens == 0 || reason == "" || len(reason) > MaxAdjustmentReason {
		return "", ErrBadAdjustment
	}
	if tokens > MaxAmount || tokens < -MaxAmount {
		return "", &OverflowError{Field: "tokens", Op: fmt.Sprintf("an adjustment of %d tokens (at most %d either way)", tokens, int64(MaxAmount))}
	}
	return reason, nil
}

// Adjust credits (tokens > 0) or debits (< 0) the balance by an admin's
// decision, and returns the change in micro-units. A credit is not capped
// at capacity (the admin means it; refill simply pauses until the balance
// is below capacity again); a debit may drive the balance negative, but
// not below the debt floor (Floor): ErrDebtFloor. tokens must be checked
// (CheckAdjustment). A refused adjustment changes nothing: an
// *OverflowError when the balance would leave int64.
func (b *Bucket) Adjust(tokens int64) (int64, error) {
	delta := tokens * Micro // |tokens| <= MaxAmount: fits
	next, err := AddMicro("tokens", b.BalanceMicro, delta)
	switch {
	case err != nil:
		return 0, err
	case delta < 0 && next < b.Floor():
		return 0, ErrDebtFloor
	}
	b.BalanceMicro = next
	return delta, nil
}
