package account

import (
	"context"
	"fmt"
	"time"

	"github.com/tokengate/tokengate/estimator"
)

// priceBook is a replica's copy of the price book and the version it was
// read at.
type priceBook struct {
	version int64
	book    *estimator.PriceBook
}

// priceBookFor is the price book as of tx's lock round trip, which read the
// committed version (price_book_version, bumped by every statement that
// adds prices): the replica's copy when it is that version, else one read
// now, in tx, after the version (so it holds at least every price of that
// version; a newer price read with it is read again at the next version).
// The reload costs one round trip, only after a price was added.
func (s *Store) priceBookFor(ctx context.Context, tx *lockedTx) (*estimator.PriceBook, error) {
	if pb := s.prices.Load(); pb != nil && pb.version == tx.priceVersion {
		return pb.book, nil
	}
	countTrip(ctx)
	book, err := estimator.PriceBookLoad(ctx, tx.conn)
	if err != nil {
		return nil, s.classify(ctx, fmt.Errorf("budget: price book: %w", err), false, false, tx.since)
	}
	s.prices.Store(&priceBook{version: tx.priceVersion, book: book})
	return book, nil
}

// PriceBook is the price book as committed now, for a use case beside the
// store that prices outside a decision (a batch's lines): the replica's
// copy when it is current, else one read now (one round trip for the
// version, one more after a price was added).
func (s *Store) PriceBook(ctx context.Context) (*estimator.PriceBook, error) {
	var version int64
	var now time.Time
	if err := s.pool.QueryRow(ctx, clockPricesSQL, s.clock()).Scan(&now, &version); err != nil {
		return nil, fmt.Errorf("budget: price book version: %w", err)
	}
	if pb := s.prices.Load(); pb != nil && pb.version == version {
		return pb.book, nil
	}
	book, err := estimator.PriceBookLoad(ctx, s.pool)
	if err != nil {
		return nil, fmt.Errorf("budget: price book: %w", err)
	}
	// Read after the version: it holds at least that version's rows.
	s.prices.Store(&priceBook{version: version, book: book})
	return book, nil
}
