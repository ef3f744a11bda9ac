package account

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

//go:embed sql/tenant_set_models.sql
var tenantSetModelsSQL string

// SetModelsParams sets a tenant's model scope.
type SetModelsParams struct {
	TenantID string
	// Models are exact model names or '*' globs (rule.ModelMatches); empty:
	// every model its ancestors allow.
	Models []string
	Actor  string
	// LevelsFunc, when set, runs after the change under the same locks and
	// in its transaction, its moves applied as LockedLevels applies them:
	// budget/admin ends the tenant's leases so (levelsIn).
	LevelsFunc LevelsFunc
}

// SetModels sets a tenant's model scope under its row lock, with a limits
// entry in the ledger (the lists before and after) in the same
// transaction: the decisions of every replica read the scope under that
// lock, so each is checked against the list in effect when it is decided.
// Setting the list it has changes nothing. It returns a *rule.LimitError
// (field "models") or ErrTenantNotFound.
func (s *Store) SetModels(ctx context.Context, p SetModelsParams) (rule.Snapshot, error) {
	models, err := rule.NormalizeModels(p.Models)
	if err != nil {
		return rule.Snapshot{}, err
	}
	tx, ts, t, now, err := s.lockTree(ctx, p.TenantID)
	if err != nil {
		return rule.Snapshot{}, err
	}
	t.advance(now)
	if slices.Equal(t.models, models) {
		tx.abort()
		return t.snapshot(now), nil
	}
	detail, err := json.Marshal(map[string]any{"models": map[string][]string{"before": nonNil(t.models), "after": models}})
	if err != nil {
		tx.abort()
		return rule.Snapshot{}, err
	}
	t.models = models
	e := t.entry(ledger.KindLimits, now, actorOr(p.Actor, "admin"))
	e.Reason = "models"
	e.Detail = string(detail)
	t.seal(e)
	w := &writes{}
	w.statement(1, tenantSetModelsSQL, t.id, models)
	w.entry(t, e)
	if err := levelsIn(ctx, tx, ts, t, now, p.LevelsFunc, w); err != nil {
		tx.abort()
		return rule.Snapshot{}, err
	}
	if err := tx.commit(ctx, w); err != nil {
		return rule.Snapshot{}, err
	}
	return t.snapshot(now), nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

//go:embed sql/model_scopes.sql
var modelScopesSQL string

// ModelScopes reads, without locks, the scopes a request of tenantID with
// keyID ("" for none) must pass: each tenant's of its budget tree, root
// first, and its key's, for rule.CheckModelScopes. A batch file's plan
// reads them so; a decision reads them under its tenant locks. It returns
// ErrTenantNotFound.
func (s *Store) ModelScopes(ctx context.Context, tenantID, keyID string) (levels []rule.ScopeLevel, key []string, err error) {
	return ModelScopesIn(ctx, s.pool, tenantID, keyID)
}

// ModelScopesIn is ModelScopes on q: in a Locked transaction, the lists in
// effect under the tenant's lock, which their changes take too (a batch's
// reserve checks its lines so).
func ModelScopesIn(ctx context.Context, q LockedQuerier, tenantID, keyID string) (levels []rule.ScopeLevel, key []string, err error) {
	rows, err := q.Query(ctx, modelScopesSQL, tenantID, keyID)
	if err != nil {
		return nil, nil, fmt.Errorf("budget: model scopes: %w", err)
	}
	var id string
	var models []string
	var level int
	_, err = pgx.ForEachRow(rows, []any{&id, &models, &level}, func() error {
		if level < 0 {
			key = slices.Clone(models)
		} else {
			levels = append(levels, rule.ScopeLevel{TenantID: id, Models: slices.Clone(models)})
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("budget: model scopes: %w", err)
	}
	if len(levels) == 0 {
		return nil, nil, rule.ErrTenantNotFound
	}
	return levels, key, nil
}
