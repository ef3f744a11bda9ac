package estimator

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	//go:embed sql/price_at.sql
	priceAtSQL string
	//go:embed sql/price_list_at.sql
	priceListAtSQL string
	//go:embed sql/price_history.sql
	priceHistorySQL string
	//go:embed sql/price_insert.sql
	priceInsertSQL string
	//go:embed sql/price_lock.sql
	priceLockSQL string

	//go:embed sql/price_currency.sql
	priceCurrencySQL string
	//go:embed sql/price_now.sql
	priceNowSQL string

	//go:embed prices/default.json
	defaultPrices []byte
)

// DefaultCurrency is the currency of a deployment whose prices name none.
const DefaultCurrency = "USD"

// ErrNoPrice: no price of the model is in effect at the time asked.
var ErrNoPrice = errors.New("estimator: no price in effect for this model")

// Price is what a model costs in money from EffectiveFrom on, until the
// next row of the same model takes effect. Amounts are micro-units of
// Currency per million tokens (1.25 USD per million tokens is 1250000), so
// money stays in integers like the rest of tokengate. A nil optional price
// falls back as documented on its field; rows are never changed once
// stored (the table is append-only), so a past charge can always be
// explained by the row that was in effect.
type Price struct {
	Model string
	// ServiceTier is the tier the row prices (one of ServiceTiers; "" is
	// TierDefault when storing). A tier without a row of its own is priced
	// at the default tier's row (PriceBook.AtTier).
	ServiceTier   string
	EffectiveFrom time.Time
	Currency      string
	InputMicro    int64
	OutputMicro   int64
	// CachedInputMicro prices input read from the provider's prompt cache;
	// nil: as input.
	CachedInputMicro *int64
	// CacheWrite5mMicro prices input written to the prompt cache for
	// 5 minutes; nil: as input.
	CacheWrite5mMicro *int64
	// CacheWrite1hMicro prices input written for an hour; nil: as the
	// 5 minute write.
	CacheWrite1hMicro *int64
	// ReasoningOutputMicro prices reasoning tokens where a provider prices
	// them apart; nil: as output.
	ReasoningOutputMicro *int64
	// LongContextThreshold, when set, is the number of input tokens above
	// which a request is priced at LongInputMicro and LongOutputMicro.
	LongContextThreshold *int64
	LongInputMicro       *int64
	LongOutputMicro      *int64
	// Source says where the row came from: the default file's version, or
	// "api", "cli", "dashboard".
	Source    string
	CreatedAt time.Time
	CreatedBy string
}

// maxPriceMicro bounds a price (10^6 currency units per million tokens),
// so that any sum of prices times tokens stays far inside int64.
const maxPriceMicro = 1_000_000 * 1_000_000

// Validate returns an *InvalidError naming the first bad field (by its API
// name).
func (p *Price) Validate() error {
	switch {
	case p.Model == "" || len(p.Model) > 256 || strings.TrimSpace(p.Model) != p.Model || strings.IndexFunc(p.Model, unicode.IsControl) >= 0:
		return invalid("model", "must be 1 to 256 characters without surrounding spaces or control characters")
	case len(p.Currency) != 3 || strings.ToUpper(p.Currency) != p.Currency || strings.Trim(p.Currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "":
		return invalid("currency", "must be an ISO 4217 code such as USD")
	}
	if err := CheckTier(p.ServiceTier, "service_tier"); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{
		{"input", &p.InputMicro}, {"output", &p.OutputMicro}, {"cached_input", p.CachedInputMicro},
		{"cache_write_5m", p.CacheWrite5mMicro}, {"cache_write_1h", p.CacheWrite1hMicro},
		{"reasoning_output", p.ReasoningOutputMicro}, {"long_context.input", p.LongInputMicro},
		{"long_context.output", p.LongOutputMicro},
	} {
		if f.v != nil && (*f.v < 0 || *f.v > maxPriceMicro) {
			return invalid(f.name, "must be between 0 and 1000000 per million tokens")
		}
	}
	long := []bool{p.LongContextThreshold != nil, p.LongInputMicro != nil, p.LongOutputMicro != nil}
	if long[0] != long[1] || long[0] != long[2] {
		return invalid("long_context", "needs threshold, input and output together")
	}
	if p.LongContextThreshold != nil && (*p.LongContextThreshold < 1 || *p.LongContextThreshold > 1<<40) {
		return invalid("long_context.threshold", "must be a positive number of input tokens")
	}
	return nil
}

// SamePrices reports whether p and q charge the same: every price and the
// currency, whatever their times and provenance. An import adds a row only
// when they differ.
func (p *Price) SamePrices(q *Price) bool {
	eq := func(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	return p.Model == q.Model && TierOr(p.ServiceTier) == TierOr(q.ServiceTier) && p.Currency == q.Currency && p.InputMicro == q.InputMicro && p.OutputMicro == q.OutputMicro &&
		eq(p.CachedInputMicro, q.CachedInputMicro) && eq(p.CacheWrite5mMicro, q.CacheWrite5mMicro) &&
		eq(p.CacheWrite1hMicro, q.CacheWrite1hMicro) && eq(p.ReasoningOutputMicro, q.ReasoningOutputMicro) &&
		eq(p.LongContextThreshold, q.LongContextThreshold) && eq(p.LongInputMicro, q.LongInputMicro) &&
		eq(p.LongOutputMicro, q.LongOutputMicro)
}

// priceRow is a row of model_prices, scanned by column name. Every query
// of it names these columns (never SELECT *), so a column a later
// release adds is not read and this release survives its migration.
type priceRow struct {
	Model                string    `db:"model"`
	ServiceTier          string    `db:"service_tier"`
	EffectiveFrom        time.Time `db:"effective_from"`
	Currency             string    `db:"currency"`
	Input                int64     `db:"input_micro"`
	Output               int64     `db:"output_micro"`
	CachedInput          *int64    `db:"cached_input_micro"`
	CacheWrite5m         *int64    `db:"cache_write_5m_micro"`
	CacheWrite1h         *int64    `db:"cache_write_1h_micro"`
	ReasoningOutput      *int64    `db:"reasoning_output_micro"`
	LongContextThreshold *int64    `db:"long_context_threshold"`
	LongInput            *int64    `db:"long_input_micro"`
	LongOutput           *int64    `db:"long_output_micro"`
	Source               string    `db:"source"`
	CreatedAt            time.Time `db:"created_at"`
	CreatedBy            string    `db:"created_by"`
}

func (r priceRow) price() Price {
	return Price{Model: r.Model, ServiceTier: r.ServiceTier, EffectiveFrom: r.EffectiveFrom, Currency: r.Currency, InputMicro: r.Input, OutputMicro: r.Output,
		CachedInputMicro: r.CachedInput, CacheWrite5mMicro: r.CacheWrite5m, CacheWrite1hMicro: r.CacheWrite1h,
		ReasoningOutputMicro: r.ReasoningOutput, LongContextThreshold: r.LongContextThreshold, LongInputMicro: r.LongInput,
		LongOutputMicro: r.LongOutput, Source: r.Source, CreatedAt: r.CreatedAt, CreatedBy: r.CreatedBy}
}

func collectPrices(rows pgx.Rows, err error) ([]Price, error) {
	if err != nil {
		return nil, err
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToStructByName[priceRow])
	if err != nil {
		return nil, err
	}
	out := make([]Price, len(rs))
	for i, r := range rs {
		out[i] = r.price()
	}
	return out, nil
}

// PriceAt returns the default tier's price of model in effect at t: the
// row with the latest effective_from not after t. It returns ErrNoPrice
// when there is none.
func PriceAt(ctx context.Context, db DB, model string, t time.Time) (Price, error) {
	return PriceAtTier(ctx, db, model, TierDefault, t)
}

// PriceAtTier is PriceAt for the rows of one service tier only ("" is
// TierDefault), without the fallback to the default tier that pricing a
// call applies (PriceBook.AtTier): it answers what is stored.
func PriceAtTier(ctx context.Context, db DB, model, tier string, t time.Time) (Price, error) {
	ps, err := collectPrices(db.Query(ctx, priceAtSQL, model, t, TierOr(tier)))
	if err != nil {
		return Price{}, fmt.Errorf("estimator: price of %s: %w", model, err)
	}
	if len(ps) == 0 {
		return Price{}, ErrNoPrice
	}
	return ps[0], nil
}

// PriceList returns the price of every model and service tier in effect at
// t, by model then tier (only model's when model is not empty, only tier's
// when tier is not empty).
func PriceList(ctx context.Context, db DB, model, tier string, t time.Time) ([]Price, error) {
	ps, err := collectPrices(db.Query(ctx, priceListAtSQL, t, model, tier))
	if err != nil {
		return nil, fmt.Errorf("estimator: list prices: %w", err)
	}
	return ps, nil
}

// PriceCurrency returns the deployment's currency: the one its stored
// prices are in, or DefaultCurrency before any is stored.
func PriceCurrency(ctx context.Context, db DB) (string, error) {
	var cur string
	err := db.QueryRow(ctx, priceCurrencySQL).Scan(&cur)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return DefaultCurrency, nil
	case err != nil:
		return "", fmt.Errorf("estimator: price currency: %w", err)
	}
	return cur, nil
}

// PriceHistory returns every price row of model, oldest first, including
// those not in effect yet.
func PriceHistory(ctx context.Context, db DB, model string) ([]Price, error) {
	ps, err := collectPrices(db.Query(ctx, priceHistorySQL, model))
	if err != nil {
		return nil, fmt.Errorf("estimator: price history of %s: %w", model, err)
	}
	return ps, nil
}

// TxDB is a DB that can open a transaction: a pool, or a connection.
type TxDB interface {
	DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PriceInsert stores p as a new row, effective at p.EffectiveFrom, or at
// once when it is zero, and returns the row stored. An effective_from in
// the past, a currency other than the deployment's, or a row of the same
// model and time already stored is an *InvalidError naming the field;
// nothing is ever updated.
func PriceInsert(ctx context.Context, db TxDB, p Price) (Price, error) {
	if err := p.Validate(); err != nil {
		return Price{}, err
	}
	var out Price
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, priceLockSQL); err != nil {
			return err
		}
		var err error
		out, err = priceInsert(ctx, tx, p)
		return err
	})
	if err != nil {
		var inv *InvalidError
		if errors.As(err, &inv) {
			return Price{}, err
		}
		return Price{}, fmt.Errorf("estimator: store price of %s: %w", p.Model, err)
	}
	return out, nil
}

func priceInsert(ctx context.Context, tx pgx.Tx, p Price) (Price, error) {
	var eff *time.Time
	if !p.EffectiveFrom.IsZero() {
		eff = &p.EffectiveFrom
	}
	ps, err := collectPrices(tx.Query(ctx, priceInsertSQL, p.Model, TierOr(p.ServiceTier), eff, p.Currency, p.InputMicro, p.OutputMicro,
		p.CachedInputMicro, p.CacheWrite5mMicro, p.CacheWrite1hMicro, p.ReasoningOutputMicro, p.LongContextThreshold,
		p.LongInputMicro, p.LongOutputMicro, p.Source, p.CreatedBy))
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation:
		return Price{}, invalid("effective_from", "a price of this model and service tier takes effect at this time already")
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.CheckViolation && pgErr.ColumnName == "currency":
		return Price{}, invalid("currency", pgErr.Message)
	case err != nil:
		return Price{}, err
	case len(ps) == 0:
		return Price{}, invalid("effective_from", "must not be in the past: a price change never rewrites history")
	}
	return ps[0], nil
}

// ParsePrice reads a decimal price in currency units per million tokens
// ("1.25") as micro-units (1250000), exactly: at most 6 decimal places,
// never through a float. field names the value in the error.
func ParsePrice(s, field string) (int64, error) {
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" || len(frac) > 6 || strings.ContainsAny(whole, "+-") || strings.ContainsAny(frac, "+-") {
		return 0, invalid(field, "must be a decimal price per million tokens with at most 6 decimal places, such as 1.25")
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > maxPriceMicro/1_000_000 {
		return 0, invalid(field, "must be a decimal price per million tokens between 0 and 1000000")
	}
	var f int64
	if frac != "" {
		f, err = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
		if err != nil {
			return 0, invalid(field, "must be a decimal price per million tokens, such as 1.25")
		}
	}
	v := w*1_000_000 + f
	if v > maxPriceMicro {
		return 0, invalid(field, "must be a decimal price per million tokens between 0 and 1000000")
	}
	return v, nil
}

// FormatPrice writes micro-units as the shortest exact decimal ("1.25").
func FormatPrice(micro int64) string {
	s := strconv.FormatInt(micro/1_000_000, 10)
	if frac := micro % 1_000_000; frac != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%06d", frac), "0")
	}
	return s
}
