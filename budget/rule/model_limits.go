package rule

import (
	_ "embed"
	"errors"
	"fmt"
	"time"
)

// The limits of a tenant's per-model buckets.
const (
	LimitInputTokens  Limit = "input_tokens"
	LimitOutputTokens Limit = "output_tokens"
)

// ModelLimitNames are the limits a tenant's model can have.
var ModelLimitNames = []Limit{LimitInputTokens, LimitOutputTokens}

// ErrModelLimitsNotFound: the tenant has no limits for that model.
var ErrModelLimitsNotFound = errors.New("budget: the tenant has no limits for that model")

// ModelLimits are a tenant's own limits for one model (a model table entry,
// so dated variants share them): an input token bucket and an output token
// bucket, in raw tokens, as providers state ITPM and OTPM. Either may be
// unset (capacity 0). They combine with the tenant-wide limits, and with
// the same model's limits at every ancestor: all must allow.
type ModelLimits struct {
	Model           string
	InputCapacity   int64
	InputRateMicro  int64
	OutputCapacity  int64
	OutputRateMicro int64
	// Shadow are those of input_tokens and output_tokens that are
	// evaluated and counted but never refuse.
	Shadow LimitSet
}

// Validate returns a *LimitError naming the first invalid field.
func (m ModelLimits) Validate() error {
	rate := func(capacity, r int64, field string) error {
		if capacity < 0 || capacity > MaxAmount {
			return &LimitError{field + "_capacity", fmt.Sprintf("must be between 1 and %d, or 0 for none", int64(MaxAmount))}
		}
		if r < 0 || r > MaxAmount*Micro/1000 || (capacity == 0) != (r == 0) {
			return &LimitError{field + "_per_second", field + "_capacity and " + field + "_per_second are set together, and the rate is at most 1e9"}
		}
		return nil
	}
	switch {
	case m.Model == "" || len(m.Model) > 200:
		return &LimitError{"model", "must be 1 to 200 characters"}
	case m.InputCapacity == 0 && m.OutputCapacity == 0:
		return &LimitError{"input_tokens_capacity", "set an input or an output bucket (or both)"}
	}
	if err := rate(m.InputCapacity, m.InputRateMicro, "input_tokens"); err != nil {
		return err
	}
	if err := rate(m.OutputCapacity, m.OutputRateMicro, "output_tokens"); err != nil {
		return err
	}
	for _, l := range m.Shadow.Limits() {
		if l != LimitInputTokens && l != LimitOutputTokens {
			return &LimitError{"shadow", "a model's shadow limits are input_tokens and output_tokens"}
		}
	}
	if m.Shadow.Has(LimitInputTokens) && m.InputCapacity == 0 || m.Shadow.Has(LimitOutputTokens) && m.OutputCapacity == 0 {
		return &LimitError{"shadow", "a shadow limit must be configured"}
	}
	return nil
}

// ModelSnapshot is a tenant's model limits and their balances at one instant.
type ModelSnapshot struct {
	TenantID    string
	Limits      ModelLimits
	InputMicro  int64 // meaningful when Limits.InputCapacity > 0
	OutputMicro int64
	At          time.Time
}
