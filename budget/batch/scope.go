package batch

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

//go:embed sql/file_line_models.sql
var fileLineModelsSQL string

// checkScopes checks, under the tenant's lock, every line's model against
// the scopes of the key that creates the batch and of its tenant
// (rule.CheckModelScopes, the rule of a single request). Plan checked them
// at the upload, without a lock; a file uploaded with one key may be
// batched with another of the tenant's, and a scope may narrow between the
// two: neither lets a line through that a single request would not pass.
// It returns a *LineError wrapping a *rule.ModelNotAllowedError.
func checkScopes(ctx context.Context, q account.LockedQuerier, p ReserveParams) error {
	levels, key, err := account.ModelScopesIn(ctx, q, p.TenantID, p.KeyID)
	if err != nil {
		return err
	}
	scoped := len(key) > 0
	for _, lv := range levels {
		scoped = scoped || len(lv.Models) > 0
	}
	if !scoped {
		return nil
	}
	check := func(n int, customID, model string) error {
		if err := rule.CheckModelScopes(model, "body.model", levels, key); err != nil {
			return &LineError{Line: n, CustomID: customID, Field: "body.model", Reason: err.(*rule.ModelNotAllowedError).Message(), Err: err}
		}
		return nil
	}
	if p.Plan != nil {
		for i, l := range p.Plan.Lines {
			if err := check(i+1, l.CustomID, l.Model); err != nil {
				return err
			}
		}
		return nil
	}
	rows, err := q.Query(ctx, fileLineModelsSQL, p.Provider, p.FileID)
	if err != nil {
		return fmt.Errorf("batch: read file lines: %w", err)
	}
	var n int32
	var customID, model string
	_, err = pgx.ForEachRow(rows, []any{&n, &customID, &model}, func() error { return check(int(n), customID, model) })
	if le := (*LineError)(nil); errors.As(err, &le) {
		return le
	}
	if err != nil {
		return fmt.Errorf("batch: read file lines: %w", err)
	}
	return nil
}
