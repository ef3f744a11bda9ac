package batch

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/allowance_lock.sql
	allowanceLockSQL string
	//go:embed sql/allowance_get.sql
	allowanceGetSQL string
	//go:embed sql/allowance_put.sql
	allowancePutSQL string
	//go:embed sql/allowance_enqueue.sql
	allowanceEnqueueSQL string
)

// Allowance is a tenant's enqueued-tokens allowance.
type Allowance struct {
	// Capacity is how many tokens (at batch prices) its open batches may
	// hold at once.
	Capacity int64
	// EnqueuedMicro is what its open batches hold now, in micro-units.
	EnqueuedMicro int64
}

// The models a batch line may name are not the allowance's: a line
// follows the key's and the tenant's model scopes as the same request
// sent alone does (rule.CheckModelScopes, in Plan), so that no model is
// allowed for a call and refused for a batch line, or the reverse.

// SetAllowanceParams sets a tenant's batch allowance.
type SetAllowanceParams struct {
	TenantID string
	// Capacity in tokens at batch prices: 0 refuses every new batch (open
	// ones run to their end).
	Capacity int64
	Actor    string
}

// allowanceDetail is how an allowance appears in a limits entry.
type allowanceDetail struct {
	Capacity int64 `json:"capacity"`
}

// SetAllowance sets a tenant's allowance under its row lock, with a limits
// entry holding the allowance before and after. A capacity below what is
// enqueued refuses new batches until enough lines end; nothing open is
// cut. It returns a *rule.LimitError or rule.ErrTenantNotFound.
func (s *Service) SetAllowance(ctx context.Context, p SetAllowanceParams) (Allowance, error) {
	if p.Capacity < 0 || p.Capacity > rule.MaxAmount {
		return Allowance{}, &rule.LimitError{Field: "batch_tokens_capacity", Reason: fmt.Sprintf("must be between 0 and %d", int64(rule.MaxAmount))}
	}
	actor := p.Actor
	if actor == "" {
		actor = "admin"
	}
	var out Allowance
	err := s.store.Locked(ctx, p.TenantID, func(ctx context.Context, q account.LockedQuerier, now time.Time) ([]account.LockedEntry, error) {
		before, found, err := lockAllowance(ctx, q, p.TenantID)
		if err != nil {
			return nil, err
		}
		if _, err := q.Exec(ctx, allowancePutSQL, p.TenantID, p.Capacity*rule.Micro, now); err != nil {
			return nil, fmt.Errorf("batch: set allowance: %w", err)
		}
		out = Allowance{Capacity: p.Capacity, EnqueuedMicro: before.EnqueuedMicro}
		var b *allowanceDetail
		if found {
			b = &allowanceDetail{before.Capacity}
		}
		detail, err := json.Marshal(map[string]any{"batch_allowance": map[string]any{"before": b, "after": allowanceDetail{p.Capacity}}})
		if err != nil {
			return nil, fmt.Errorf("batch: encode allowance: %w", err)
		}
		return []account.LockedEntry{{Kind: ledger.KindLimits, Actor: actor, Detail: string(detail)}}, nil
	})
	return out, err
}

// Allowance reads a tenant's allowance. It returns ErrNoAllowance.
func (s *Service) Allowance(ctx context.Context, tenantID string) (Allowance, error) {
	a, found, err := scanAllowance(s.store.Pool().QueryRow(ctx, allowanceGetSQL, tenantID))
	if err == nil && !found {
		err = ErrNoAllowance
	}
	return a, err
}

// lockAllowance reads a tenant's allowance FOR UPDATE (its tenant row is
// locked already).
func lockAllowance(ctx context.Context, q account.LockedQuerier, tenantID string) (Allowance, bool, error) {
	return scanAllowance(q.QueryRow(ctx, allowanceLockSQL, tenantID))
}

func scanAllowance(row pgx.Row) (Allowance, bool, error) {
	var a Allowance
	var capMicro int64
	err := row.Scan(&capMicro, &a.EnqueuedMicro)
	if errors.Is(err, pgx.ErrNoRows) {
		return Allowance{}, false, nil
	}
	if err != nil {
		return Allowance{}, false, fmt.Errorf("batch: read allowance: %w", err)
	}
	a.Capacity = capMicro / rule.Micro
	return a, true, nil
}
