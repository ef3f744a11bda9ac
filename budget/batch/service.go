package batch

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// Providers a batch is made through.
const (
	OpenAI    = "openai"
	Anthropic = "anthropic"
)

// CompletionWindow is how long a batch is held: both providers end a batch
// within 24 h.
const CompletionWindow = 24 * time.Hour

// PriceMicro is what a batch's tokens take from its allowance: in and
// out tokens at the weights given (estimator.Cost), at the providers'
// batch discount (estimator.BatchDiscountPercent, defined once), in micro
// cost units. The allowance counts tokens, not money: a batch's money is
// priced from the price table (money.go).
func PriceMicro(in, out, inWeightMicro, outWeightMicro int64) int64 {
	c := min(estimator.Cost(in, out, inWeightMicro, outWeightMicro), int64(rule.MaxAmount))
	return c * rule.Micro * estimator.BatchDiscountPercent / 100
}

// Config configures a Service. Store is required.
type Config struct {
	Store *account.Store
	// Estimator estimates lines and bounds settled usage. Nil: the seeded
	// table.
	Estimator *estimator.Estimator
}

// Service is the batch use case for every face. It is safe for concurrent
// use.
type Service struct {
	store *account.Store
	est   *estimator.Estimator
	stats *stats
}

// New returns a Service on cfg.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil {
		return nil, errors.New("batch: Config.Store is required")
	}
	if cfg.Estimator == nil {
		cfg.Estimator = estimator.New(nil)
	}
	return &Service{store: cfg.Store, est: cfg.Estimator, stats: &stats{}}, nil
}

// Errors of the batch use case.
var (
	// ErrNoAllowance: the tenant has no batch allowance, so it may not
	// enqueue batches at all.
	ErrNoAllowance = errors.New("batch: the tenant has no batch allowance")
	// ErrFileNotFound: no input file of the tenant has that id.
	ErrFileNotFound = errors.New("batch: no such input file")
	// ErrNotFound: no batch of the tenant has that id.
	ErrNotFound = errors.New("batch: no such batch")
)

// AllowanceError is a batch refused because the tenant's allowance cannot
// hold it now (Never: nor ever, it is larger than the capacity).
type AllowanceError struct {
	NeedMicro, EnqueuedMicro, CapacityMicro int64
	Never                                   bool
}

func (e *AllowanceError) Error() string {
	if e.Never {
		return fmt.Sprintf("batch: the batch needs %s tokens of enqueued allowance, more than its capacity of %s",
			tokens(e.NeedMicro), tokens(e.CapacityMicro))
	}
	return fmt.Sprintf("batch: the batch needs %s tokens of enqueued allowance; %s of %s are enqueued",
		tokens(e.NeedMicro), tokens(e.EnqueuedMicro), tokens(e.CapacityMicro))
}

// LineError is a line of a batch refused: its 1-based line number, its
// custom_id when it has one, and the field and reason.
type LineError struct {
	Line     int
	CustomID string
	Field    string
	Reason   string
	// Err is the rule that refused the line, when one did (a
	// *rule.ModelNotAllowedError).
	Err error
}

// Unwrap is the rule that refused the line, if any.
func (e *LineError) Unwrap() error { return e.Err }

func (e *LineError) Error() string {
	return fmt.Sprintf("line %d: %s %s", e.Line, e.Field, e.Reason)
}

// tokens formats micro-units as tokens, with the fraction when there is one.
func tokens(micro int64) string {
	if micro%rule.Micro == 0 {
		return fmt.Sprint(micro / rule.Micro)
	}
	return fmt.Sprintf("%.6g", float64(micro)/rule.Micro)
}

// units is micro-units rounded up to whole cost units, as a ledger entry's
// estimate and actual hold them (the detail holds the micro-units).
func units(micro int64) *int64 {
	u := (micro + rule.Micro - 1) / rule.Micro
	return &u
}

// now is the store's clock (the database's, or a test's frozen one).
func (s *Service) now(ctx context.Context) (time.Time, error) { return s.store.Now(ctx) }
