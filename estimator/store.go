package estimator

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	//go:embed sql/model_list.sql
	modelListSQL string
	//go:embed sql/model_upsert.sql
	modelUpsertSQL string
	//go:embed sql/model_insert.sql
	modelInsertSQL string
	//go:embed sql/model_version.sql
	modelVersionSQL string
)

// DB is what the model store needs: a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// StoredModel is a model an admin created or changed, which overrides the
// seeded entry of the same name in every replica.
type StoredModel struct {
	Model
	UpdatedAt time.Time
	UpdatedBy string
}

// modelRow is a row of models, scanned by column name. model_list.sql
// names these columns (never SELECT *), so a column a later release adds
// is not read and this release survives its migration.
type modelRow struct {
	Name                string    `db:"name"`
	Encoding            string    `db:"encoding"`
	InputWeightMicro    int64     `db:"input_weight_micro"`
	OutputWeightMicro   int64     `db:"output_weight_micro"`
	DefaultOutputTokens int64     `db:"default_output_tokens"`
	ContextWindow       int64     `db:"context_window"`
	PartTokens          int64     `db:"part_tokens"`
	UpdatedAt           time.Time `db:"updated_at"`
	UpdatedBy           string    `db:"updated_by"`
	OnStoreUnavailable  *string   `db:"on_store_unavailable"`
	CachedInputWeight   *int64    `db:"cached_input_weight_micro"`
	CacheWriteWeight    *int64    `db:"cache_write_weight_micro"`
	CacheWrite1hWeight  *int64    `db:"cache_write_1h_weight_micro"`
}

func deref0(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// ModelList returns the stored models, by name.
func ModelList(ctx context.Context, db DB) ([]StoredModel, error) {
	rows, err := db.Query(ctx, modelListSQL)
	if err != nil {
		return nil, fmt.Errorf("estimator: list models: %w", err)
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToStructByName[modelRow])
	if err != nil {
		return nil, fmt.Errorf("estimator: list models: %w", err)
	}
	ms := make([]StoredModel, len(rs))
	for i, r := range rs {
		ms[i] = StoredModel{Model: Model{Name: r.Name, Encoding: r.Encoding, InputWeightMicro: r.InputWeightMicro,
			OutputWeightMicro: r.OutputWeightMicro, DefaultOutputTokens: r.DefaultOutputTokens, ContextWindow: r.ContextWindow,
			PartTokens: r.PartTokens, OnStoreUnavailable: deref(r.OnStoreUnavailable), CachedInputWeightMicro: deref0(r.CachedInputWeight),
			CacheWriteWeightMicro: deref0(r.CacheWriteWeight), CacheWrite1hWeightMicro: deref0(r.CacheWrite1hWeight)},
			UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy}
	}
	return ms, nil
}

// ModelUpsert stores a model (new, or overriding a seeded or stored one).
// It returns an *InvalidError naming the bad field.
func ModelUpsert(ctx context.Context, db DB, m Model, actor string) error {
	if err := m.Validate(); err != nil {
		return err
	}
	_, err := db.Exec(ctx, modelUpsertSQL, m.Name, m.Encoding, m.InputWeightMicro, m.OutputWeightMicro,
		m.DefaultOutputTokens, m.ContextWindow, m.PartTokens, actor, m.OnStoreUnavailable, nullWeight(m.CachedInputWeightMicro),
		nullWeight(m.CacheWriteWeightMicro), nullWeight(m.CacheWrite1hWeightMicro))
	if err != nil {
		return fmt.Errorf("estimator: store model %s: %w", m.Name, err)
	}
	return nil
}

// ErrModelExists: ModelInsert found the name taken in the database.
var ErrModelExists = errors.New("estimator: a model with this name is stored already")

// ModelInsert stores a new model. It returns ErrModelExists when a model of
// that name is stored already: the database's own uniqueness decides, so
// two replicas creating one name at once cannot both succeed (one would
// silently overwrite the other). It returns an *InvalidError naming the bad
// field.
func ModelInsert(ctx context.Context, db DB, m Model, actor string) error {
	if err := m.Validate(); err != nil {
		return err
	}
	_, err := db.Exec(ctx, modelInsertSQL, m.Name, m.Encoding, m.InputWeightMicro, m.OutputWeightMicro,
		m.DefaultOutputTokens, m.ContextWindow, m.PartTokens, actor, m.OnStoreUnavailable, nullWeight(m.CachedInputWeightMicro),
		nullWeight(m.CacheWriteWeightMicro), nullWeight(m.CacheWrite1hWeightMicro))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation {
		return ErrModelExists
	}
	if err != nil {
		return fmt.Errorf("estimator: store model %s: %w", m.Name, err)
	}
	return nil
}

func nullWeight(w int64) *int64 {
	if w == 0 {
		return nil
	}
	return &w
}

// LoadTable returns the seeded table with the stored models applied.
func LoadTable(ctx context.Context, db DB) (*Table, error) {
	stored, err := ModelList(ctx, db)
	if err != nil {
		return nil, err
	}
	ms := make([]Model, len(stored))
	for i, m := range stored {
		ms[i] = m.Model
	}
	return DefaultTable().With(ms)
}

// Refresh reloads the table from db when the stored models changed since
// the last load, so a model edit in one replica reaches the others within
// one refresh interval. It costs one small query when nothing changed.
type Refresh struct {
	Estimator *Estimator
	DB        DB

	count   int64
	updated time.Time
}

// Once checks and reloads if needed.
func (r *Refresh) Once(ctx context.Context) error {
	var count int64
	var updated time.Time
	if err := r.DB.QueryRow(ctx, modelVersionSQL).Scan(&count, &updated); err != nil {
		return fmt.Errorf("estimator: model version: %w", err)
	}
	if count == r.count && updated.Equal(r.updated) && !r.updated.IsZero() {
		return nil
	}
	t, err := LoadTable(ctx, r.DB)
	if err != nil {
		return err
	}
	r.Estimator.SetTable(t)
	r.count, r.updated = count, updated
	if r.updated.IsZero() {
		r.updated = time.Unix(0, 0)
	}
	return nil
}
