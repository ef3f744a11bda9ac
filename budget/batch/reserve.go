package batch

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/batch_insert.sql
	batchInsertSQL string
	//go:embed sql/batch_lines_from_file.sql
	batchLinesFromFileSQL string
	//go:embed sql/batch_lines_insert.sql
	batchLinesInsertSQL string
	//go:embed sql/batch_bind.sql
	batchBindSQL string
	//go:embed sql/batch_find.sql
	batchFindSQL string
)

// ReserveParams reserves a batch: the lines of a recorded input file
// (FileID, OpenAI's), or the lines planned with it (Plan, Anthropic's).
type ReserveParams struct {
	TenantID, KeyID, Provider string
	FileID                    string
	Plan                      *Plan
	Actor                     string
}

// Batch is a batch reserved.
type Batch struct {
	ID            string
	Lines         int
	ReservedMicro int64
	// MoneyMicro is its priced lines' money at the batch price, counted
	// in the tenant's money windows.
	MoneyMicro int64
	ExpiresAt  time.Time
	// EnqueuedMicro and CapacityMicro are the allowance after the reserve.
	EnqueuedMicro, CapacityMicro int64
}

// Reserve takes a batch's whole estimate from the tenant's allowance,
// under its row lock, and records the batch and its lines, with a
// batch_reserve entry carrying its money, held for CompletionWindow; its
// money is taken from the money windows of the tenant and its ancestors
// in the same transaction. Nothing is taken from a batch refused. It
// returns ErrNoAllowance, ErrFileNotFound, an *AllowanceError, a *LineError
// wrapping a *rule.ModelNotAllowedError (the lines' models are checked
// again under the lock, against the key that creates the batch:
// scope.go), a *rule.BudgetExhaustedError naming the money window that
// cannot hold the batch's money (or a *rule.TooLargeError, or
// rule.RequirePrice's error for a line of a model without a price),
// rule.ErrTenantNotFound, rule.ErrTenantDisabled or rule.ErrKeyRevoked
// (the key is checked under the lock, as an admission's).
func (s *Service) Reserve(ctx context.Context, p ReserveParams) (Batch, error) {
	if (p.FileID == "") == (p.Plan == nil) {
		return Batch{}, errors.New("batch: a reserve names a file or a plan")
	}
	id, err := newID()
	if err != nil {
		return Batch{}, err
	}
	currency, err := estimator.PriceCurrency(ctx, s.store.Pool())
	if err != nil {
		return Batch{}, err
	}
	var b Batch
	err = s.store.LockedAdmit(ctx, p.TenantID, p.KeyID, func(ctx context.Context, q account.LockedQuerier, now time.Time) ([]account.LockedEntry, error) {
		a, found, err := lockAllowance(ctx, q, p.TenantID)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, ErrNoAllowance
		}
		lines, need, money, unpriced := 0, int64(0), int64(0), ""
		if p.Plan != nil {
			lines, need, money, unpriced = len(p.Plan.Lines), p.Plan.ReservedMicro, p.Plan.MoneyMicro, p.Plan.Unpriced
		} else {
			var endpoint string
			err := q.QueryRow(ctx, fileGetSQL, p.Provider, p.FileID, p.TenantID).Scan(&endpoint, &lines, &need, &money, &unpriced)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil, ErrFileNotFound
			}
			if err != nil {
				return nil, fmt.Errorf("batch: read file: %w", err)
			}
		}
		if err := checkScopes(ctx, q, p); err != nil {
			return nil, err
		}
		capMicro := a.Capacity * rule.Micro
		if need > capMicro || a.EnqueuedMicro+need > capMicro {
			return nil, &AllowanceError{NeedMicro: need, EnqueuedMicro: a.EnqueuedMicro, CapacityMicro: capMicro, Never: need > capMicro}
		}
		b = Batch{ID: id, Lines: lines, ReservedMicro: need, MoneyMicro: money, ExpiresAt: now.Add(CompletionWindow),
			EnqueuedMicro: a.EnqueuedMicro + need, CapacityMicro: capMicro}
		var file *string
		if p.FileID != "" {
			file = &p.FileID
		}
		if _, err := q.Exec(ctx, batchInsertSQL, id, p.Provider, p.TenantID, p.KeyID, file, lines, need, now, b.ExpiresAt, money); err != nil {
			return nil, fmt.Errorf("batch: insert: %w", err)
		}
		if err := insertLines(ctx, q, id, p); err != nil {
			return nil, err
		}
		if _, err := q.Exec(ctx, allowanceEnqueueSQL, p.TenantID, need); err != nil {
			return nil, fmt.Errorf("batch: enqueue: %w", err)
		}
		detail, err := json.Marshal(map[string]any{"event": "reserve", "provider": p.Provider, "file": p.FileID, "lines": lines,
			"reserved_micro": need, "enqueued_micro": b.EnqueuedMicro, "capacity_micro": capMicro, "expires_at": b.ExpiresAt,
			"money_micro": money, "currency": currency})
		if err != nil {
			return nil, fmt.Errorf("batch: encode: %w", err)
		}
		e := account.LockedEntry{Kind: ledger.KindBatchReserve, Ref: id, Estimate: units(need), Actor: p.Actor,
			Reason: fmt.Sprintf("batch of %d requests reserved at batch prices", lines), Detail: string(detail)}
		if money > 0 || unpriced != "" {
			e.MoneyMicro = &money
			e.Money = &account.LockedMoney{Reserve: money, Currency: currency, Unpriced: unpriced}
		}
		return []account.LockedEntry{e}, nil
	})
	s.stats.created(p.Provider, err)
	if err != nil {
		return Batch{}, err
	}
	return b, nil
}

func insertLines(ctx context.Context, q account.LockedQuerier, id string, p ReserveParams) error {
	if p.Plan == nil {
		if _, err := q.Exec(ctx, batchLinesFromFileSQL, id, p.Provider, p.FileID); err != nil {
			return fmt.Errorf("batch: insert lines: %w", err)
		}
		return nil
	}
	n := len(p.Plan.Lines)
	ids, models := make([]string, n), make([]string, n)
	in, out, win, wout, res := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	money := make([]*int64, n)
	for i, l := range p.Plan.Lines {
		ids[i], models[i] = l.CustomID, l.Model
		in[i], out[i], win[i], wout[i], res[i] = l.InputTokens, l.OutputTokens, l.InputWeightMicro, l.OutputWeightMicro, l.ReservedMicro
		money[i] = l.MoneyMicro
	}
	if _, err := q.Exec(ctx, batchLinesInsertSQL, id, ids, models, in, out, win, wout, res, money); err != nil {
		return fmt.Errorf("batch: insert lines: %w", err)
	}
	return nil
}

// newID is a batch's id in tokengate: what its ledger entries carry.
func newID() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("batch: id: %w", err)
	}
	return "tgbatch_" + hex.EncodeToString(b), nil
}

// Bind records the upstream's id of a reserved batch it accepted, so that
// its later reports find it. It returns ErrNotFound.
func (s *Service) Bind(ctx context.Context, tenantID, batchID, upstreamID string) error {
	return s.store.Locked(ctx, tenantID, func(ctx context.Context, q account.LockedQuerier, _ time.Time) ([]account.LockedEntry, error) {
		tag, err := q.Exec(ctx, batchBindSQL, batchID, upstreamID)
		if err != nil {
			return nil, fmt.Errorf("batch: bind: %w", err)
		}
		if tag.RowsAffected() != 1 {
			return nil, ErrNotFound
		}
		return nil, nil
	})
}

// Find is the id of a tenant's batch of provider by the upstream's id (or
// tokengate's). It returns ErrNotFound.
func (s *Service) Find(ctx context.Context, provider, id, tenantID string) (string, error) {
	var batchID, tenant string
	err := s.store.Pool().QueryRow(ctx, batchFindSQL, provider, id, tenantID).Scan(&batchID, &tenant)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("batch: find: %w", err)
	}
	return batchID, nil
}
