package batch

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

var (
	//go:embed sql/file_insert.sql
	fileInsertSQL string
	//go:embed sql/file_lines_insert.sql
	fileLinesInsertSQL string
	//go:embed sql/file_get.sql
	fileGetSQL string
)

// Line is one request of a batch as its face parsed it: the request its
// single call would be, so that it is estimated exactly as that call.
type Line struct {
	CustomID string
	Request  *estimator.Request
}

// PlannedLine is a line estimated and priced.
type PlannedLine struct {
	CustomID, Model                     string
	InputTokens, OutputTokens           int64
	InputWeightMicro, OutputWeightMicro int64
	// ReservedMicro is its estimate at batch prices (PriceMicro).
	ReservedMicro int64
	// MoneyMicro is its estimate's money at the batch price (Prices.Line);
	// nil: its model has no price.
	MoneyMicro *int64
}

// Plan is a batch's lines, estimated and checked.
type Plan struct {
	Lines         []PlannedLine
	ReservedMicro int64
	// MoneyMicro is its priced lines' money; Unpriced a model of a line
	// without a price ("" for none).
	MoneyMicro int64
	Unpriced   string
}

// MaxLines bounds a batch's lines: the most either provider takes
// (OpenAI 50 000, Anthropic 100 000).
const MaxLines = 100_000

// maxCustomID bounds a custom_id's length.
const maxCustomID = 512

// Plan estimates every line as its single request would be and checks it
// against what the tenant may enqueue: a model the key (keyID, "" for
// none) and the tenant may use (rule.CheckModelScopes, the rule of every
// single request), input and output within the
// model's window, a custom_id of its own. It holds no lock: the reserve
// checks the amounts again. It returns ErrNoAllowance or a *LineError
// naming the first line refused (wrapping a *rule.ModelNotAllowedError
// for a model outside a scope).
func (s *Service) Plan(ctx context.Context, tenantID, keyID string, lines []Line) (*Plan, error) {
	if _, err := s.Allowance(ctx, tenantID); err != nil {
		return nil, err
	}
	levels, keyModels, err := s.store.ModelScopes(ctx, tenantID, keyID)
	if err != nil {
		return nil, err
	}
	if len(lines) == 0 {
		return nil, &LineError{Line: 1, Field: "file", Reason: "holds no requests"}
	}
	if len(lines) > MaxLines {
		return nil, &LineError{Line: MaxLines + 1, Field: "file", Reason: fmt.Sprintf("holds more than %d requests", MaxLines)}
	}
	pr, err := s.prices(ctx)
	if err != nil {
		return nil, err
	}
	plan := &Plan{Lines: make([]PlannedLine, 0, len(lines))}
	seen := make(map[string]bool, len(lines))
	for i, l := range lines {
		n := i + 1
		switch {
		case l.CustomID == "" || len(l.CustomID) > maxCustomID:
			return nil, &LineError{Line: n, CustomID: l.CustomID, Field: "custom_id", Reason: fmt.Sprintf("must be 1 to %d characters", maxCustomID)}
		case seen[l.CustomID]:
			return nil, &LineError{Line: n, CustomID: l.CustomID, Field: "custom_id", Reason: "is not unique in the batch"}
		}
		seen[l.CustomID] = true
		est, err := s.est.Estimate(l.Request)
		if inv := (*estimator.InvalidError)(nil); errors.As(err, &inv) {
			return nil, &LineError{Line: n, CustomID: l.CustomID, Field: "body." + inv.Field, Reason: inv.Reason}
		}
		if err != nil {
			return nil, fmt.Errorf("batch: estimate line %d: %w", n, err)
		}
		if err := rule.CheckModelScopes(est.Model, "body.model", levels, keyModels); err != nil {
			return nil, &LineError{Line: n, CustomID: l.CustomID, Field: "body.model", Reason: err.(*rule.ModelNotAllowedError).Message(), Err: err}
		}
		pl := PlannedLine{CustomID: l.CustomID, Model: est.Model, InputTokens: est.InputTokens, OutputTokens: est.OutputTokens,
			InputWeightMicro: est.InputWeightMicro, OutputWeightMicro: est.OutputWeightMicro,
			ReservedMicro: PriceMicro(est.InputTokens, est.OutputTokens, est.InputWeightMicro, est.OutputWeightMicro)}
		if pl.MoneyMicro, err = pr.estimate(est); err != nil {
			return nil, &LineError{Line: n, CustomID: l.CustomID, Field: "file", Reason: err.Error()}
		}
		if pl.MoneyMicro == nil && plan.Unpriced == "" {
			plan.Unpriced = est.Model
		}
		if m := pl.MoneyMicro; m != nil && plan.MoneyMicro > math.MaxInt64-*m {
			return nil, &LineError{Line: n, CustomID: l.CustomID, Field: "file", Reason: "the batch's money is beyond any budget"}
		} else if m != nil {
			plan.MoneyMicro += *m
		}
		if plan.ReservedMicro > math.MaxInt64-pl.ReservedMicro {
			return nil, &LineError{Line: n, CustomID: l.CustomID, Field: "file", Reason: "the batch's estimate is beyond any allowance"}
		}
		plan.ReservedMicro += pl.ReservedMicro
		plan.Lines = append(plan.Lines, pl)
	}
	return plan, nil
}

// FileParams records an input file the upstream accepted.
type FileParams struct {
	Provider, FileID, TenantID string
	// Endpoint is the API every line calls (/v1/chat/completions, ...).
	Endpoint string
	Plan     *Plan
}

// FileRecord remembers an uploaded input file's estimate, line by line, so
// that a batch created from it reserves exactly those lines. A file is a
// fact, not a balance: it needs no tenant lock.
func (s *Service) FileRecord(ctx context.Context, p FileParams) error {
	n := len(p.Plan.Lines)
	idx, ids, models := make([]int32, n), make([]string, n), make([]string, n)
	in, out, win, wout, res := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	money := make([]*int64, n)
	for i, l := range p.Plan.Lines {
		idx[i], ids[i], models[i] = int32(i+1), l.CustomID, l.Model
		in[i], out[i], win[i], wout[i], res[i] = l.InputTokens, l.OutputTokens, l.InputWeightMicro, l.OutputWeightMicro, l.ReservedMicro
		money[i] = l.MoneyMicro
	}
	now, err := s.now(ctx)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, s.store.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fileInsertSQL, p.Provider, p.FileID, p.TenantID, p.Endpoint, n, now); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, fileLinesInsertSQL, p.Provider, p.FileID, idx, ids, models, in, out, win, wout, res, money)
		return err
	})
	if err != nil {
		return fmt.Errorf("batch: record file %s: %w", p.FileID, err)
	}
	return nil
}

// File is an input file as recorded.
type File struct {
	Endpoint      string
	Lines         int
	ReservedMicro int64
	// MoneyMicro is its priced lines' money; Unpriced a model of a line
	// without a price ("" for none).
	MoneyMicro int64
	Unpriced   string
}

// FileOf reads a tenant's input file. It returns ErrFileNotFound.
func (s *Service) FileOf(ctx context.Context, provider, fileID, tenantID string) (File, error) {
	var f File
	err := s.store.Pool().QueryRow(ctx, fileGetSQL, provider, fileID, tenantID).Scan(&f.Endpoint, &f.Lines, &f.ReservedMicro, &f.MoneyMicro, &f.Unpriced)
	if errors.Is(err, pgx.ErrNoRows) {
		return File{}, ErrFileNotFound
	}
	if err != nil {
		return File{}, fmt.Errorf("batch: read file: %w", err)
	}
	return f, nil
}
