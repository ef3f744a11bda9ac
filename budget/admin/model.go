package admin

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/estimator"
)

// ModelList returns the stored models (those an admin saved), by name.
func (s *Service) ModelList(ctx context.Context) ([]estimator.StoredModel, error) {
	return estimator.ModelList(ctx, s.db)
}

// ModelTable returns the model table as stored now: the seeded models with
// the stored ones applied.
func (s *Service) ModelTable(ctx context.Context) (*estimator.Table, error) {
	return estimator.LoadTable(ctx, s.db)
}

// Models returns the models this replica estimates with now, by name: its
// live table, which a save applies at once (the stored table may be ahead
// of it until the next reload, ModelTable). The faces show and edit them
// through here and never hold the table themselves.
func (s *Service) Models() []estimator.Model { return s.table().Models() }

// Model returns the model of the name in this replica's live table (Models)
// and whether it holds one.
func (s *Service) Model(name string) (estimator.Model, bool) { return s.table().Get(name) }

func (s *Service) table() *estimator.Table {
	if s.est == nil {
		return estimator.DefaultTable()
	}
	return s.est.Table()
}

// ModelCreate stores a new model and applies the table to this replica at
// once. It returns estimator.ErrModelExists when the name is stored already
// (the database's uniqueness decides, so of two admins creating one name
// at once exactly one succeeds) or an *estimator.InvalidError.
func (s *Service) ModelCreate(ctx context.Context, m estimator.Model, actor string) error {
	return s.saveModel(ctx, estimator.ModelInsert, m, actor)
}

// ModelSave stores a model, new or over a seeded or stored one, and applies
// the table to this replica at once. It returns an *estimator.InvalidError.
func (s *Service) ModelSave(ctx context.Context, m estimator.Model, actor string) error {
	return s.saveModel(ctx, estimator.ModelUpsert, m, actor)
}

// saveModel writes m and reads the table back in one transaction, so the
// table this replica applies holds m whatever another admin saves at once.
func (s *Service) saveModel(ctx context.Context, save func(context.Context, estimator.DB, estimator.Model, string) error, m estimator.Model, actor string) error {
	var table *estimator.Table
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if err := save(ctx, tx, m, actor); err != nil {
			return err
		}
		var err error
		table, err = estimator.LoadTable(ctx, tx)
		return err
	})
	if err != nil {
		return err
	}
	if s.est != nil {
		s.est.SetTable(table)
	}
	return nil
}

// PriceCurrency returns the deployment's currency: its stored prices', or
// estimator.DefaultCurrency before any is stored.
func (s *Service) PriceCurrency(ctx context.Context) (string, error) {
	return estimator.PriceCurrency(ctx, s.db)
}

// PriceList returns the price of every model and service tier in effect
// at t (only model's when model is not empty, only tier's when tier is not
// empty). A tier not in estimator.ServiceTiers is an
// *estimator.InvalidError naming service_tier.
func (s *Service) PriceList(ctx context.Context, model, tier string, t time.Time) ([]estimator.Price, error) {
	if err := estimator.CheckTier(tier, "service_tier"); err != nil {
		return nil, err
	}
	return estimator.PriceList(ctx, s.db, model, tier, t)
}

// PriceHistory returns every price row of a model, oldest first.
func (s *Service) PriceHistory(ctx context.Context, model string) ([]estimator.Price, error) {
	return estimator.PriceHistory(ctx, s.db, model)
}

// PriceAdd stores a new price row (a price is never edited), in the
// deployment's currency when p names none, for p's service tier (the
// default tier when p names none), and returns the row stored. The
// currency is read in the insert's transaction. It returns an
// *estimator.InvalidError naming the field (a time in the past, another
// currency, a tier not in estimator.ServiceTiers, a row of that model,
// tier and time stored already: of two admins
// adding one model's price for one time at once, exactly one succeeds).
func (s *Service) PriceAdd(ctx context.Context, p estimator.Price) (estimator.Price, error) {
	var out estimator.Price
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if p.Currency == "" {
			cur, err := estimator.PriceCurrency(ctx, tx)
			if err != nil {
				return err
			}
			p.Currency = cur
		}
		var err error
		out, err = estimator.PriceInsert(ctx, tx, p)
		return err
	})
	if err != nil {
		return estimator.Price{}, err
	}
	return out, nil
}

// PriceImport applies a price file: a new row for each model whose prices
// changed, in one transaction.
func (s *Service) PriceImport(ctx context.Context, f *estimator.PriceFile, actor string) (estimator.PriceImportResult, error) {
	return estimator.PriceImport(ctx, s.db, f, actor)
}
