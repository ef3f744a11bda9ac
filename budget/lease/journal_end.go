package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/tokengate/tokengate/budget/account"
)

// ErrNotOpen: the admission to end is not open in the lease named (it
// ended already, expired, or is not of that lease); nothing was ended, and
// the lease's use is as before. The caller settles it exactly.
var ErrNotOpen = errors.New("lease: the admission is not open in its lease")

// End is the end of an admission made from a lease, made in the lease's
// journal (docs/leasing.md, item 5): the admission settled at its actual
// usage, its refund given back to the lease (its tenants' balances do not
// move until the lease's return gives back what the lease holds unused),
// and its settle entries written by the lease's booking, in the lease's
// order after its reserve entries.
type End struct {
	AdmissionID, TenantID string
	// KeyID and GatewayID are the credentials the end came with, checked
	// as an admission's are (Admission.KeyID, GatewayID).
	KeyID, GatewayID string
	// InputTokens and OutputTokens are its actual usage as the admission
	// records it, ActualCost its cost in tokens, MoneyActual its money
	// (nil when the admission has no price).
	InputTokens, OutputTokens, ActualCost int64
	MoneyActual                           *int64
	// RefundMicro is what goes back into the lease: the admission's
	// estimated cost less ActualCost, in micro-tokens, at least zero (an
	// end past the estimate is settled exactly, where the excess is
	// charged).
	RefundMicro int64
}

// End ends an admission of leaseID in the journal's next group and returns
// once the group committed: nil means ended, durable, its refund back in
// the lease. ErrNotOpen: it was not open in the lease. ErrOver: the lease
// ended (nothing was ended). A credential's refusal is returned as
// Append's is. An error of ctx leaves the outcome unknown, as Append's.
func (j *Journal) End(ctx context.Context, leaseID string, e End) error {
	if e.RefundMicro < 0 || e.AdmissionID == "" {
		return fmt.Errorf("lease: end %q: a refund of %d: an end in the journal names its admission and gives back at least nothing", e.AdmissionID, e.RefundMicro)
	}
	a := Admission{Admission: account.Admission{ID: e.AdmissionID, TenantID: e.TenantID},
		CostMicro: -e.RefundMicro, KeyID: e.KeyID, GatewayID: e.GatewayID}
	_, err := j.send(ctx, &appendReq{leaseID: leaseID, a: a, done: make(chan error, 1), end: &e})
	return err
}
