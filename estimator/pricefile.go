package estimator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// PriceFile is a price table as data: the default one embedded in the
// binary (DefaultPriceFile), or an admin's file for `tokengate prices
// import --file`. Prices are decimal strings in currency units per million
// tokens, as providers publish them.
type PriceFile struct {
	Version   string          `json:"version"`
	Currency  string          `json:"currency"`
	Providers []PriceProvider `json:"providers"`
}

// PriceProvider is one provider's prices, with where and when they were
// taken, so an auditor can check them against the published page.
type PriceProvider struct {
	Provider string `json:"provider"`
	Source   string `json:"source"`
	Taken    string `json:"taken"`
	// Note says how the prices were read, when not from the page itself.
	Note   string       `json:"note,omitempty"`
	Models []PriceEntry `json:"models"`
}

// PriceEntry is one model's prices in a PriceFile.
type PriceEntry struct {
	Model string `json:"model"`
	// ServiceTier is the tier the entry prices (absent: default); a model
	// may have one entry per tier.
	ServiceTier     string          `json:"service_tier,omitempty"`
	Input           string          `json:"input"`
	Output          string          `json:"output"`
	CachedInput     *string         `json:"cached_input,omitempty"`
	CacheWrite5m    *string         `json:"cache_write_5m,omitempty"`
	CacheWrite1h    *string         `json:"cache_write_1h,omitempty"`
	ReasoningOutput *string         `json:"reasoning_output,omitempty"`
	LongContext     *LongContextRaw `json:"long_context,omitempty"`
}

// LongContextRaw is a long-context tier in a PriceFile.
type LongContextRaw struct {
	Threshold int64  `json:"threshold"`
	Input     string `json:"input"`
	Output    string `json:"output"`
}

// DefaultPriceFile returns the price table embedded in this binary.
func DefaultPriceFile() (*PriceFile, error) {
	return ParsePriceFile(defaultPrices)
}

// ParsePriceFile decodes a price file strictly (an unknown field is an
// error, so a typo never drops a price) and checks every price in it.
func ParsePriceFile(b []byte) (*PriceFile, error) {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var f PriceFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("estimator: price file: %w", err)
	}
	if f.Version == "" {
		return nil, errors.New("estimator: price file: version is required")
	}
	if f.Currency == "" {
		f.Currency = DefaultCurrency
	}
	if _, err := f.Prices(); err != nil {
		return nil, err
	}
	return &f, nil
}

// Prices returns the file's rows, unstored (no effective_from), with
// Source naming the file's version and the provider's page.
func (f *PriceFile) Prices() ([]Price, error) {
	var out []Price
	seen := map[string]bool{}
	for _, pr := range f.Providers {
		for _, e := range pr.Models {
			key := e.Model + "\x00" + TierOr(e.ServiceTier)
			if seen[key] {
				return nil, fmt.Errorf("estimator: price file: %s (%s tier) is priced twice", e.Model, TierOr(e.ServiceTier))
			}
			seen[key] = true
			p, err := e.price(f.Currency)
			if err != nil {
				return nil, fmt.Errorf("estimator: price file: %s: %w", e.Model, err)
			}
			p.Source = "prices " + f.Version + " (" + pr.Source + ", " + pr.Taken + ")"
			out = append(out, p)
		}
	}
	return out, nil
}

func (e PriceEntry) price(currency string) (Price, error) {
	p := Price{Model: e.Model, ServiceTier: TierOr(e.ServiceTier), Currency: currency}
	var err error
	if p.InputMicro, err = ParsePrice(e.Input, "input"); err != nil {
		return p, err
	}
	if p.OutputMicro, err = ParsePrice(e.Output, "output"); err != nil {
		return p, err
	}
	for _, o := range []struct {
		s     *string
		field string
		dst   **int64
	}{
		{e.CachedInput, "cached_input", &p.CachedInputMicro}, {e.CacheWrite5m, "cache_write_5m", &p.CacheWrite5mMicro},
		{e.CacheWrite1h, "cache_write_1h", &p.CacheWrite1hMicro}, {e.ReasoningOutput, "reasoning_output", &p.ReasoningOutputMicro},
	} {
		if o.s == nil {
			continue
		}
		v, err := ParsePrice(*o.s, o.field)
		if err != nil {
			return p, err
		}
		*o.dst = &v
	}
	if lc := e.LongContext; lc != nil {
		in, err := ParsePrice(lc.Input, "long_context.input")
		if err != nil {
			return p, err
		}
		out, err := ParsePrice(lc.Output, "long_context.output")
		if err != nil {
			return p, err
		}
		th := lc.Threshold
		p.LongContextThreshold, p.LongInputMicro, p.LongOutputMicro = &th, &in, &out
	}
	return p, p.Validate()
}

// PriceImportResult counts what an import did.
type PriceImportResult struct {
	Inserted  []Price
	Unchanged int
}

// PriceImport applies a price file: each model gets a new row, effective
// now, only when its prices differ from the row in effect (or it has
// none), so importing the same file again changes nothing. Imports and
// inserts are serialized by a transaction-level advisory lock, so imports
// from several replicas at once add each change exactly once.
func PriceImport(ctx context.Context, db TxDB, f *PriceFile, actor string) (PriceImportResult, error) {
	prices, err := f.Prices()
	if err != nil {
		return PriceImportResult{}, err
	}
	var res PriceImportResult
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		res = PriceImportResult{}
		if _, err := tx.Exec(ctx, priceLockSQL); err != nil {
			return err
		}
		var now time.Time
		if err := tx.QueryRow(ctx, priceNowSQL).Scan(&now); err != nil {
			return err
		}
		for _, p := range prices {
			cur, err := PriceAtTier(ctx, tx, p.Model, p.ServiceTier, now)
			if err != nil && !errors.Is(err, ErrNoPrice) {
				return err
			}
			if err == nil && cur.SamePrices(&p) {
				res.Unchanged++
				continue
			}
			p.EffectiveFrom, p.CreatedBy = now, actor
			stored, err := priceInsert(ctx, tx, p)
			if err != nil {
				return fmt.Errorf("%s: %w", p.Model, err)
			}
			res.Inserted = append(res.Inserted, stored)
		}
		return nil
	})
	if err != nil {
		return PriceImportResult{}, fmt.Errorf("estimator: import prices: %w", err)
	}
	return res, nil
}
