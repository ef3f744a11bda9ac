package estimator

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"slices"
	"time"
)

//go:embed sql/price_book.sql
var priceBookSQL string

// ErrMoneyOverflow: a cost in money does not fit an int64 of micro-units
// (more than 9.2 trillion currency units), so it cannot be charged exactly.
// Price.Cost wraps it.
var ErrMoneyOverflow = errors.New("estimator: money overflows int64 micro-units")

// microPerUnit is the number of tokens prices are quoted for: a price is
// micro-units per million tokens, so tokens times price divided by it is
// micro-units.
const microPerUnit = 1_000_000

// MoneyUsage is what a call used, split the way providers price it. Input
// counts every input token, including the parts read from (CachedRead)
// and written to (CacheWrite5m, CacheWrite1h) the provider's prompt
// cache; Output counts every output token, including Reasoning. The parts
// are inside their totals, as OpenAI's usage reports them (Anthropic's
// usage reports them beside input_tokens: its face adds them up).
type MoneyUsage struct {
	Input, CachedRead, CacheWrite5m, CacheWrite1h, Output, Reasoning int64
}

// validate returns an *InvalidError naming the first field of u that is
// negative or larger than what is left of its total.
func (u MoneyUsage) validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"input", u.Input}, {"cached_read", u.CachedRead}, {"cache_write_5m", u.CacheWrite5m},
		{"cache_write_1h", u.CacheWrite1h}, {"output", u.Output}, {"reasoning", u.Reasoning},
	} {
		if f.v < 0 {
			return invalid(f.name, "must not be negative")
		}
	}
	left := u.Input
	for _, f := range []struct {
		name string
		v    int64
	}{{"cached_read", u.CachedRead}, {"cache_write_5m", u.CacheWrite5m}, {"cache_write_1h", u.CacheWrite1h}} {
		if f.v > left {
			return invalid(f.name, "cache reads and writes together must not exceed the input tokens")
		}
		left -= f.v
	}
	if u.Reasoning > u.Output {
		return invalid("reasoning", "must not exceed the output tokens")
	}
	return nil
}

// Long reports whether a call of u is priced at p's long-context tier:
// its input, cached and cache-written parts included (as Anthropic and
// Google count it), exceeds the threshold. A row with only part of the
// tier set has none (the table's check refuses such rows).
func (p *Price) Long(u MoneyUsage) bool {
	return p.LongContextThreshold != nil && p.LongInputMicro != nil && p.LongOutputMicro != nil &&
		u.Input > *p.LongContextThreshold
}

// Cost returns what a call of usage u costs at p, in micro-units of
// p.Currency, rounded up to a whole micro-unit: a call is never charged
// less than it cost, and it is charged at most one micro-unit more.
//
// Each part is priced at its own price, a nil price falling back as its
// field says: uncached input (Input less the cache parts) at InputMicro,
// CachedRead at CachedInputMicro, CacheWrite5m at CacheWrite5mMicro,
// CacheWrite1h at CacheWrite1hMicro, non-reasoning output at OutputMicro
// and Reasoning at ReasoningOutputMicro. The products are summed exactly
// (128-bit) and divided by a million once, so no part is rounded alone.
//
// The long-context tier (Long) prices the whole call, not only the tokens
// above the threshold, as Anthropic's 1M-context and Google's >200k
// tiers do: every input-side price is multiplied by
// LongInputMicro/InputMicro and every output-side price by
// LongOutputMicro/OutputMicro. So uncached input costs LongInputMicro,
// output LongOutputMicro, and a cache read or write keeps its ratio to
// an input token (Anthropic's long cache read is 0.1 of its long input,
// as at the standard rate); the scaled prices are exact fractions,
// rounded only with the total. When InputMicro (or OutputMicro) is 0 the
// ratio does not exist: then the parts priced as input (as output) take
// the long price and parts with a price of their own keep it.
//
// Negative usage, cache parts larger than Input or Reasoning larger than
// Output, and negative prices are an *InvalidError naming the field (not
// ErrMoneyOverflow); a cost above math.MaxInt64 micro-units wraps
// ErrMoneyOverflow. Cost never panics and does not allocate outside the
// long-context tier.
func (p *Price) Cost(u MoneyUsage) (int64, error) {
	if err := u.validate(); err != nil {
		return 0, err
	}
	pr, err := p.partPrices()
	if err != nil {
		return 0, err
	}
	if p.Long(u) {
		return p.longCost(u, pr)
	}
	uncached := u.Input - u.CachedRead - u.CacheWrite5m - u.CacheWrite1h
	var acc uint128
	acc.addMul(uncached, pr.in)
	acc.addMul(u.CachedRead, pr.read)
	acc.addMul(u.CacheWrite5m, pr.w5)
	acc.addMul(u.CacheWrite1h, pr.w1)
	acc.addMul(u.Output-u.Reasoning, pr.out)
	acc.addMul(u.Reasoning, pr.reason)
	// The input parts partition Input and the output parts Output, each
	// below 2^63, at prices below 2^63: each side is below 2^126, the sum
	// below 2^127, so acc never wraps. A quotient of 2^64 or more needs
	// hi >= 10^6.
	if acc.hi >= microPerUnit {
		return 0, p.overflow()
	}
	q, r := bits.Div64(acc.hi, acc.lo, microPerUnit)
	if q > math.MaxInt64 || (r != 0 && q == math.MaxInt64) {
		return 0, p.overflow()
	}
	if r != 0 {
		q++
	}
	return int64(q), nil
}

func (p *Price) overflow() error {
	return fmt.Errorf("estimator: cost at the price of %s: %w", p.Model, ErrMoneyOverflow)
}

// partPrices are a Price's prices per part with the nil fallbacks applied;
// the *Own flags say which parts have a price of their own (not the input's
// or the output's), for the long tier's zero-price case.
type partPrices struct {
	in, read, w5, w1, out, reason    int64
	readOwn, w5Own, w1Own, reasonOwn bool
}

func (p *Price) partPrices() (partPrices, error) {
	pr := partPrices{in: p.InputMicro, out: p.OutputMicro}
	pick := func(v *int64, fallback int64, fallbackOwn bool) (int64, bool) {
		if v == nil {
			return fallback, fallbackOwn
		}
		return *v, true
	}
	pr.read, pr.readOwn = pick(p.CachedInputMicro, pr.in, false)
	pr.w5, pr.w5Own = pick(p.CacheWrite5mMicro, pr.in, false)
	pr.w1, pr.w1Own = pick(p.CacheWrite1hMicro, pr.w5, pr.w5Own)
	pr.reason, pr.reasonOwn = pick(p.ReasoningOutputMicro, pr.out, false)
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"input", pr.in}, {"cached_input", pr.read}, {"cache_write_5m", pr.w5}, {"cache_write_1h", pr.w1},
		{"output", pr.out}, {"reasoning_output", pr.reason},
	} {
		if f.v < 0 {
			return pr, invalid(f.name, "price must not be negative")
		}
	}
	if (p.LongInputMicro != nil && *p.LongInputMicro < 0) || (p.LongOutputMicro != nil && *p.LongOutputMicro < 0) {
		return pr, invalid("long_context", "prices must not be negative")
	}
	return pr, nil
}

// longCost is Cost in the long-context tier, exactly in big integers: the
// input side is (sum of tokens times standard price) * LongInput / Input,
// the output side likewise, added over a common denominator and rounded
// up once.
func (p *Price) longCost(u MoneyUsage, pr partPrices) (int64, error) {
	in, out := big.NewInt(0), big.NewInt(0)
	inDen, outDen := big.NewInt(1), big.NewInt(1)
	term := func(acc *big.Int, tokens, price int64) {
		acc.Add(acc, new(big.Int).Mul(big.NewInt(tokens), big.NewInt(price)))
	}
	longIn, longOut := *p.LongInputMicro, *p.LongOutputMicro
	uncached := u.Input - u.CachedRead - u.CacheWrite5m - u.CacheWrite1h
	if pr.in > 0 {
		// Every input-side price times LongInput/Input.
		term(in, uncached, pr.in)
		term(in, u.CachedRead, pr.read)
		term(in, u.CacheWrite5m, pr.w5)
		term(in, u.CacheWrite1h, pr.w1)
		in.Mul(in, big.NewInt(longIn))
		inDen.SetInt64(pr.in)
	} else {
		own := func(price int64, ok bool) int64 {
			if ok {
				return price
			}
			return longIn
		}
		term(in, uncached, longIn)
		term(in, u.CachedRead, own(pr.read, pr.readOwn))
		term(in, u.CacheWrite5m, own(pr.w5, pr.w5Own))
		term(in, u.CacheWrite1h, own(pr.w1, pr.w1Own))
	}
	if pr.out > 0 {
		term(out, u.Output-u.Reasoning, pr.out)
		term(out, u.Reasoning, pr.reason)
		out.Mul(out, big.NewInt(longOut))
		outDen.SetInt64(pr.out)
	} else {
		reason := longOut
		if pr.reasonOwn {
			reason = pr.reason
		}
		term(out, u.Output-u.Reasoning, longOut)
		term(out, u.Reasoning, reason)
	}
	// ceil((in/inDen + out/outDen) / 10^6)
	num := new(big.Int).Mul(in, outDen)
	num.Add(num, new(big.Int).Mul(out, inDen))
	den := new(big.Int).Mul(inDen, outDen)
	den.Mul(den, big.NewInt(microPerUnit))
	q, r := new(big.Int).QuoRem(num, den, new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return 0, p.overflow()
	}
	return q.Int64(), nil
}

// uint128 is an unsigned 128-bit accumulator: tokens (up to 2^63) times a
// price (up to 2^63) overflows int64 long before it overflows this.
type uint128 struct{ hi, lo uint64 }

// addMul adds a*b; a and b are not negative (Cost checked them).
func (x *uint128) addMul(a, b int64) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	var carry uint64
	x.lo, carry = bits.Add64(x.lo, lo, 0)
	x.hi, _ = bits.Add64(x.hi, hi, carry)
}

// PriceBook is every row of model_prices, every model's whole history, in
// memory, so that an admission prices its call without a query. Rows are
// immutable in the table, so a book is only ever stale by missing rows
// added since it was loaded: Version says which, to compare with the
// table's latest created_at and reload when it moved. A PriceBook is
// immutable and safe for concurrent use.
type PriceBook struct {
	// names maps every name a request's model can resolve to onto the
	// history it is priced by: a priced model's own, an alias's family's,
	// and none (nil) for the families of the default model table that
	// have no price, so that resolution stops at them (see At). One map
	// lookup per name tried.
	names map[string]*tierHistory
	// history holds each priced model's rows, by service tier, oldest
	// effective_from first.
	history map[string]*tierHistory
	version time.Time
}

// tierHistory is one model's rows, one history per service tier, in the
// order of ServiceTiers (the default tier's first).
type tierHistory [4][]Price

// NewPriceBook builds a book from rows of model_prices (PriceBookLoad's,
// or a test's), in any order; rows is not changed. Rows are the table's,
// so (Model, EffectiveFrom) is unique; of duplicates, At and Exact answer
// with the one created last.
func NewPriceBook(rows []Price) *PriceBook {
	b := &PriceBook{names: map[string]*tierHistory{}, history: map[string]*tierHistory{}}
	for _, r := range rows {
		i := tierIndex(TierOr(r.ServiceTier))
		if i < 0 {
			continue // the table's check admits none
		}
		th := b.history[r.Model]
		if th == nil {
			th = &tierHistory{}
			b.history[r.Model] = th
		}
		th[i] = append(th[i], r)
		if r.CreatedAt.After(b.version) {
			b.version = r.CreatedAt
		}
	}
	for _, th := range b.history {
		for _, h := range th {
			slices.SortStableFunc(h, func(a, c Price) int {
				if n := a.EffectiveFrom.Compare(c.EffectiveFrom); n != 0 {
					return n
				}
				return a.CreatedAt.Compare(c.CreatedAt)
			})
		}
	}
	// The seeded families and aliases, priced or not: without them a
	// family with no price would borrow the price of a shorter name by
	// the prefix rule (gpt-4.1-nano would be charged as gpt-4.1,
	// claude-opus-5-5 as claude-opus-5).
	for _, m := range defaultModels {
		b.names[m.Name] = b.history[m.Name]
	}
	for _, m := range claudeFamilies {
		b.names[m.Name] = b.history[m.Name]
	}
	for alias, fam := range defaultAliases {
		b.names[alias] = b.history[fam]
	}
	for model, h := range b.history {
		b.names[model] = h
	}
	return b
}

// PriceBookLoad reads every row of model_prices, in one query, into a
// PriceBook.
func PriceBookLoad(ctx context.Context, db DB) (*PriceBook, error) {
	ps, err := collectPrices(db.Query(ctx, priceBookSQL))
	if err != nil {
		return nil, fmt.Errorf("estimator: load prices: %w", err)
	}
	return NewPriceBook(ps), nil
}

// At returns the default tier's price in effect at t for a request's
// model name (AtTier with TierDefault): the row
// with the latest EffectiveFrom not after t, of the model the name
// resolves to by the model table's naming rule (resolveName: the exact
// name, then the name without its version suffixes, then its longest
// known prefix cut at a '-'). So "gpt-4o-2024-08-06" is priced as gpt-4o,
// "claude-sonnet-4-5-20250929" as claude-sonnet-4-5, and "gpt-4o-mini" as
// gpt-4o-mini, never gpt-4o. A name that resolves to a seeded family
// without a price (gpt-4.1-nano, o3) has none: it is not priced as a
// shorter name that has one. The returned row's Model is the key it is
// stored under, which with EffectiveFrom is what Exact takes back.
// ok is false when there is no price. At does not allocate.
func (b *PriceBook) At(model string, t time.Time) (Price, bool) {
	return b.AtTier(model, TierDefault, t)
}

// AtTier is At for a service tier ("" is TierDefault): the row of tier in
// effect at t, or, when the model has none of that tier in effect at t,
// its default tier's row (so a tier no admin priced is charged as the
// default tier, as before tiers existed). The returned row's ServiceTier
// says which tier it is; with Model and EffectiveFrom it is what
// ExactTier takes back. An unknown tier is priced as the default tier.
// AtTier does not allocate.
func (b *PriceBook) AtTier(model, tier string, t time.Time) (Price, bool) {
	if b == nil {
		return Price{}, false
	}
	th, ok := resolveName(model, b.lookup)
	if !ok || th == nil {
		return Price{}, false
	}
	if i := tierIndex(TierOr(tier)); i > 0 {
		if p, ok := inEffect(th[i], t); ok {
			return p, true
		}
	}
	return inEffect(th[0], t)
}

// inEffect is the row of h (oldest first) in effect at t.
func inEffect(h []Price, t time.Time) (Price, bool) {
	// The first row taking effect after t; the one before it is in
	// effect.
	lo, hi := 0, len(h)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if h[mid].EffectiveFrom.After(t) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if lo == 0 {
		return Price{}, false
	}
	return h[lo-1], true
}

func (b *PriceBook) lookup(name string) (*tierHistory, bool) {
	h, ok := b.names[name]
	return h, ok
}

// Exact returns the default tier's row of model (its key, as At returned
// it, not a request's name) that takes effect at from: the price an
// admission recorded when it reserved, so its settle charges at the same
// price whatever rows were added since.
func (b *PriceBook) Exact(model string, from time.Time) (Price, bool) {
	return b.ExactTier(model, TierDefault, from)
}

// ExactTier is Exact for the rows of one tier ("" is TierDefault): no
// fallback, the row named is the row answered.
func (b *PriceBook) ExactTier(model, tier string, from time.Time) (Price, bool) {
	if b == nil {
		return Price{}, false
	}
	i := tierIndex(TierOr(tier))
	th := b.history[model]
	if i < 0 || th == nil {
		return Price{}, false
	}
	h := th[i]
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].EffectiveFrom.Equal(from) {
			return h[i], true
		}
	}
	return Price{}, false
}

// Version is the latest CreatedAt of the book's rows, zero for an empty
// book. Rows are added under price_lock.sql's advisory lock, each with
// clock_timestamp() taken after the lock, so created_at increases in
// commit order: a book whose Version equals the table's max(created_at)
// holds every row.
func (b *PriceBook) Version() time.Time {
	if b == nil {
		return time.Time{}
	}
	return b.version
}
