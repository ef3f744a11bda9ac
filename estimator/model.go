package estimator

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// WeightOne is the fixed-point unit of the weights: 1_000_000 micro units
// are a weight of 1.0, so 1_500_000 charges 1.5 budget units per token.
const WeightOne = 1_000_000

// maxWeightMicro bounds a weight (1000.0) so that [Cost] stays exact.
const maxWeightMicro = 1_000_000_000

// Model describes one model family: how its tokens are counted and what they
// cost.
type Model struct {
	// Name is the canonical family name, e.g. "gpt-4o".
	Name string
	// Encoding is the tiktoken encoding, "o200k_base" or "cl100k_base".
	Encoding string
	// InputWeightMicro is the cost of one input token in micro units
	// ([WeightOne] is 1.0).
	InputWeightMicro int64
	// OutputWeightMicro is the cost of one output token in micro units.
	// Reasoning tokens are output tokens (providers count them in the
	// completion's output).
	OutputWeightMicro int64
	// CachedInputWeightMicro is the cost of one input token served from the
	// provider's prompt cache, when the usage reports them (0: the same as
	// InputWeightMicro).
	CachedInputWeightMicro int64
	// CacheWriteWeightMicro is the cost of one input token the provider
	// wrote to its prompt cache (Anthropic's cache_creation_input_tokens,
	// its 5 minute writes when the usage splits them), when the usage
	// reports them (0: the same as InputWeightMicro). Anthropic bills a
	// write at 1.25 times an input token.
	CacheWriteWeightMicro int64
	// CacheWrite1hWeightMicro is the cost of one input token written to
	// the cache for an hour, when the usage splits the writes by lifetime
	// (0: CacheWriteWeightMicro). Anthropic bills it at twice an input
	// token.
	CacheWrite1hWeightMicro int64
	// DefaultOutputTokens is reserved when a request names no output cap
	// (clamped to the context left after the input), and is also the
	// largest output cap a request may name.
	DefaultOutputTokens int64
	// ContextWindow is the most tokens, input plus output, the model accepts.
	ContextWindow int64
	// PartTokens is the default count for one non-text content part (image,
	// audio, file) when the caller gives no input_tokens.
	PartTokens int64
	// OnStoreUnavailable is what a replica does with this model's
	// requests when the store is unreachable: "reject", "local", or ""
	// for the tenant's (or the server's) policy. A cheap model can keep
	// serving while a costly one stops.
	OnStoreUnavailable string
	// InputOnly marks an embedding model: it reads input and writes none,
	// so a request for it with an input field is an embeddings call
	// (ParseFor), charged for its input alone. Seeded, not stored: an
	// admin's override of the family keeps it (Table.With).
	InputOnly bool
}

// validate reports what is wrong with m, if anything.
func (m Model) validate() error {
	bad := func(field, format string, args ...any) error {
		return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case m.Name == "" || len(m.Name) > 256 || strings.TrimSpace(m.Name) != m.Name:
		return bad("name", "must be 1 to 256 bytes without surrounding spaces")
	case m.Encoding != EncodingO200K && m.Encoding != EncodingCL100K:
		return bad("encoding", "unknown encoding %q (want %q or %q)", m.Encoding, EncodingO200K, EncodingCL100K)
	case m.InputWeightMicro <= 0 || m.InputWeightMicro > maxWeightMicro:
		return bad("input_weight", "must be between 0.000001 and 1000")
	case m.OutputWeightMicro <= 0 || m.OutputWeightMicro > maxWeightMicro:
		return bad("output_weight", "must be between 0.000001 and 1000")
	case m.CachedInputWeightMicro < 0 || m.CachedInputWeightMicro > maxWeightMicro:
		return bad("cached_input_weight", "must be between 0.000001 and 1000 (or unset)")
	case m.CacheWriteWeightMicro < 0 || m.CacheWriteWeightMicro > maxWeightMicro:
		return bad("cache_write_weight", "must be between 0.000001 and 1000 (or unset)")
	case m.CacheWrite1hWeightMicro < 0 || m.CacheWrite1hWeightMicro > maxWeightMicro:
		return bad("cache_write_1h_weight", "must be between 0.000001 and 1000 (or unset)")
	case m.DefaultOutputTokens <= 0 || m.DefaultOutputTokens > maxTokenField:
		return bad("default_output_tokens", "must be between 1 and %d", maxTokenField)
	case m.ContextWindow <= 0 || m.ContextWindow > maxTokenField:
		return bad("context_window", "must be between 1 and %d", maxTokenField)
	case m.PartTokens <= 0 || m.PartTokens > maxTokenField:
		return bad("part_tokens", "must be between 1 and %d", maxTokenField)
	case m.OnStoreUnavailable != "" && m.OnStoreUnavailable != "reject" && m.OnStoreUnavailable != "local":
		return bad("on_store_unavailable", `must be "reject", "local" or unset`)
	}
	return nil
}

// UnknownFamily is the [Estimate.Family] of a request whose model is not in
// the table.
const UnknownFamily = "unknown"

// unknownModel is used for models the table does not know. o200k_base is
// the encoding of every current OpenAI family; weights are 1.0; 16384
// output tokens are reserved when the request names no cap; the context
// window of 1,000,000 tokens is the largest any seeded family has (rounded
// up), so no plausible request is refused for a model we cannot judge.
// Because a new model's output limit is unknown, an explicit output cap is
// accepted up to that context window instead of being held to 16384.
var unknownModel = Model{
	Name:                UnknownFamily,
	Encoding:            EncodingO200K,
	InputWeightMicro:    WeightOne,
	OutputWeightMicro:   WeightOne,
	DefaultOutputTokens: 16384,
	ContextWindow:       1_000_000,
	PartTokens:          1000,
}

// UnknownModel returns the model used for names the table does not know.
func UnknownModel() Model { return unknownModel }

// Table maps model names to families. It is immutable and safe for
// concurrent use.
type Table struct {
	models  map[string]Model
	aliases map[string]string // extra exact names -> family name
	sorted  []Model
}

// NewTable builds a table from models. Every model needs a non-empty unique
// name, a known encoding, weights in 1..1e9 micro units, and positive
// output cap, context window and part tokens.
func NewTable(models []Model) (*Table, error) {
	if len(models) == 0 {
		return nil, errors.New("estimator: empty model table")
	}
	t := &Table{models: make(map[string]Model, len(models))}
	for i, m := range models {
		if err := m.validate(); err != nil {
			return nil, fmt.Errorf("estimator: model %d (%q): %w", i, m.Name, err)
		}
		if _, dup := t.models[m.Name]; dup {
			return nil, fmt.Errorf("estimator: model %d: duplicate name %q", i, m.Name)
		}
		t.models[m.Name] = m
		t.sorted = append(t.sorted, m)
	}
	sort.Slice(t.sorted, func(i, j int) bool { return t.sorted[i].Name < t.sorted[j].Name })
	return t, nil
}

// defaultModels are today's OpenAI families. Weights are 1.0: the budget is
// counted in tokens. PartTokens is what one 1024x768 high-detail image costs
// under OpenAI's published image rules (85+170 per 512px tile for gpt-4o and
// gpt-4.1, 75+150 for o1/o3, 32px patches times the model's multiplier for
// gpt-4.1-mini/nano and o4-mini, and gpt-4o-mini's 2833+5667 per tile).
var defaultModels = []Model{
	{Name: "gpt-4o", Encoding: EncodingO200K, DefaultOutputTokens: 16384, ContextWindow: 128000, PartTokens: 765},
	{Name: "gpt-4o-mini", Encoding: EncodingO200K, DefaultOutputTokens: 16384, ContextWindow: 128000, PartTokens: 25501},
	{Name: "gpt-4.1", Encoding: EncodingO200K, DefaultOutputTokens: 32768, ContextWindow: 1047576, PartTokens: 765},
	{Name: "gpt-4.1-mini", Encoding: EncodingO200K, DefaultOutputTokens: 32768, ContextWindow: 1047576, PartTokens: 1245},
	{Name: "gpt-4.1-nano", Encoding: EncodingO200K, DefaultOutputTokens: 32768, ContextWindow: 1047576, PartTokens: 1890},
	{Name: "o1", Encoding: EncodingO200K, DefaultOutputTokens: 100000, ContextWindow: 200000, PartTokens: 675},
	{Name: "o3", Encoding: EncodingO200K, DefaultOutputTokens: 100000, ContextWindow: 200000, PartTokens: 675},
	{Name: "o4-mini", Encoding: EncodingO200K, DefaultOutputTokens: 100000, ContextWindow: 200000, PartTokens: 1321},
	{Name: "gpt-4-turbo", Encoding: EncodingCL100K, DefaultOutputTokens: 4096, ContextWindow: 128000, PartTokens: 765},
	{Name: "gpt-4", Encoding: EncodingCL100K, DefaultOutputTokens: 8192, ContextWindow: 8192, PartTokens: 765},
	{Name: "gpt-3.5-turbo", Encoding: EncodingCL100K, DefaultOutputTokens: 4096, ContextWindow: 16385, PartTokens: 765},
	// Embedding models read text and write none. Their context window is
	// the provider's limit per input (8191 tokens); an embeddings call
	// reserves no output, so their output cap and part count are the
	// least the table accepts (1), which only a misrouted chat call uses.
	{Name: "text-embedding-3-small", Encoding: EncodingCL100K, DefaultOutputTokens: 1, ContextWindow: 8191, PartTokens: 1, InputOnly: true},
	{Name: "text-embedding-3-large", Encoding: EncodingCL100K, DefaultOutputTokens: 1, ContextWindow: 8191, PartTokens: 1, InputOnly: true},
	{Name: "text-embedding-ada-002", Encoding: EncodingCL100K, DefaultOutputTokens: 1, ContextWindow: 8191, PartTokens: 1, InputOnly: true},
}

// defaultAliases name GPT-4 Turbo's preview snapshots, which the dated-suffix
// and prefix rules would otherwise send to gpt-4 and its 8192-token window.
var defaultAliases = map[string]string{
	"gpt-4-turbo-preview":       "gpt-4-turbo",
	"gpt-4-0125-preview":        "gpt-4-turbo",
	"gpt-4-1106-preview":        "gpt-4-turbo",
	"gpt-4-vision-preview":      "gpt-4-turbo",
	"gpt-4-1106-vision-preview": "gpt-4-turbo",
}

// DefaultTable returns the seeded table of OpenAI families (gpt-4o,
// gpt-4o-mini, gpt-4.1, gpt-4.1-mini, gpt-4.1-nano, o1, o3, o4-mini,
// gpt-4-turbo, gpt-4, gpt-3.5-turbo, and the embedding models
// text-embedding-3-small, text-embedding-3-large and
// text-embedding-ada-002) with weights 1.0, Anthropic's Claude families
// (claude.go) and Google's Gemini families (gemini.go), plus aliases for
// GPT-4 Turbo's preview snapshots.
func DefaultTable() *Table {
	ms := make([]Model, len(defaultModels))
	for i, m := range defaultModels {
		m.InputWeightMicro, m.OutputWeightMicro = WeightOne, WeightOne
		ms[i] = m
	}
	ms = append(ms, claudeModels()...)
	ms = append(ms, geminiModels()...)
	t, err := NewTable(ms)
	if err != nil {
		panic("estimator: invalid default table: " + err.Error())
	}
	t.aliases = defaultAliases
	return t
}

// EffectiveInput is the input tokens a usage of in tokens, cached of which
// came from the provider's prompt cache, amounts to at this model's input
// weight: the cached ones count at CachedInputWeightMicro, rounded up.
func (m Model) EffectiveInput(in, cached int64) int64 {
	return m.EffectiveCacheInput(in, CacheUsage{Read: cached})
}

// CacheUsage is the part of a call's input tokens that touched the
// provider's prompt cache: Read from it, and written to it for 5 minutes
// (Write5m, or every write when the usage does not split them) or for an
// hour (Write1h).
type CacheUsage struct {
	Read, Write5m, Write1h int64
}

// EffectiveCacheInput is the input tokens a usage of in tokens amounts to
// at this model's input weight when c of them touched the prompt cache:
// reads count at CachedInputWeightMicro, writes at CacheWriteWeightMicro
// (an hour's at CacheWrite1hWeightMicro), each unset weight being the
// input's, and the weighted sum is rounded up once. Each part is clamped
// to what is left of in, reads first, so the cache never counts more
// tokens than the call used.
func (m Model) EffectiveCacheInput(in int64, c CacheUsage) int64 {
	if m.InputWeightMicro <= 0 || in <= 0 {
		return in
	}
	left := in
	take := func(n int64) int64 {
		n = max(0, min(n, left))
		left -= n
		return n
	}
	read, w5, w1 := take(c.Read), take(c.Write5m), take(c.Write1h)
	if read == 0 && w5 == 0 && w1 == 0 {
		return in
	}
	weight := func(w, fallback int64) int64 {
		if w > 0 {
			return w
		}
		return fallback
	}
	readW := weight(m.CachedInputWeightMicro, m.InputWeightMicro)
	w5W := weight(m.CacheWriteWeightMicro, m.InputWeightMicro)
	w1W := weight(m.CacheWrite1hWeightMicro, w5W)
	// Weights are at most 1e9 micro and the faces' usage is within the
	// usage bounds (account.SettleBounds, at most 1e9 tokens): the sum fits
	// int64 (3e18 < 9.2e18).
	sum := read*readW + w5*w5W + w1*w1W
	return left + (sum+m.InputWeightMicro-1)/m.InputWeightMicro
}

// With returns a copy of t in which overrides replace the models of the same
// name and add new ones; t's aliases are kept. It validates like NewTable.
func (t *Table) With(overrides []Model) (*Table, error) {
	byName := map[string]Model{}
	for _, m := range t.sorted {
		byName[m.Name] = m
	}
	for _, m := range overrides {
		m.InputOnly = m.InputOnly || byName[m.Name].InputOnly
		byName[m.Name] = m
	}
	ms := make([]Model, 0, len(byName))
	for _, m := range byName {
		ms = append(ms, m)
	}
	n, err := NewTable(ms)
	if err != nil {
		return nil, err
	}
	n.aliases = t.aliases
	return n, nil
}

// Validate reports whether m could enter a table: a non-empty name of at
// most 256 bytes, a known encoding, weights in 1..1e9 micro units, and
// positive output cap, context window and part tokens.
func (m Model) Validate() error { return m.validate() }

// Get returns the model named exactly name, without the dated-variant and
// prefix rules of Lookup: the admin API edits entries, not requests.
func (t *Table) Get(name string) (Model, bool) {
	m, ok := t.models[name]
	return m, ok
}

// Models returns the table's models sorted by name.
func (t *Table) Models() []Model {
	if t == nil {
		return nil
	}
	return append([]Model(nil), t.sorted...)
}

// exact looks name up without any rewriting.
func (t *Table) exact(name string) (Model, bool) {
	if m, ok := t.models[name]; ok {
		return m, true
	}
	if fam, ok := t.aliases[name]; ok {
		m, ok := t.models[fam]
		return m, ok
	}
	return Model{}, false
}

// Lookup finds the family of a model name by [resolveName] over the
// table's names and aliases: the exact name first; then the name with
// version suffixes ("-YYYY-MM-DD", "-YYYYMMDD", "@YYYYMMDD", "-MMDD",
// "-preview", "-latest") stripped from its end, one at a time, retrying
// after each; then the longest table name N such that name starts with
// N + "-". So "gpt-4o-mini-2024-07-18" is gpt-4o-mini (never gpt-4o),
// "gpt-4-0613" is gpt-4. Names are case-sensitive. known is false, and m
// the zero Model, when nothing matches.
func (t *Table) Lookup(name string) (m Model, known bool) {
	if t == nil {
		return Model{}, false
	}
	return resolveName(name, t.exact)
}

// resolveName finds what a request's model name stands for, given find,
// which looks a name up exactly. It is the one naming rule of tokengate:
// the model table (Table.Lookup) and the price book (PriceBook.At) both
// use it, so a request's family and its price never disagree about which
// model a dated snapshot is. The rule: the exact name; then the name with
// one version suffix stripped (stripSuffix), retrying after each strip;
// then the longest prefix N of the name, cut at a '-', that find knows
// ("gpt-4o-mini-search" is gpt-4o-mini, never gpt-4o: the longest wins).
// Only substrings of name are looked up, so a resolution allocates
// nothing.
func resolveName[V any](name string, find func(string) (V, bool)) (V, bool) {
	var zero V
	if name == "" {
		return zero, false
	}
	if v, ok := find(name); ok {
		return v, true
	}
	for s := name; ; {
		stripped, ok := stripSuffix(s)
		if !ok {
			break
		}
		if v, ok := find(stripped); ok {
			return v, true
		}
		s = stripped
	}
	// Every known N with name = N + "-" + rest is name[:i] for some dash
	// at i > 0: trying the dashes from the right finds the longest first.
	for i := len(name) - 1; i > 0; i-- {
		if name[i] != '-' {
			continue
		}
		if v, ok := find(name[:i]); ok {
			return v, true
		}
	}
	return zero, false
}

// stripSuffix removes one trailing version suffix: "-preview", "-latest",
// a date "-YYYY-MM-DD" (OpenAI), "-YYYYMMDD" (Anthropic), "@YYYYMMDD"
// (Anthropic's models on Vertex AI), or "-MMDD" (OpenAI's older
// snapshots). It never strips a whole name.
func stripSuffix(s string) (string, bool) {
	for _, word := range []string{"-preview", "-latest"} {
		if base, ok := strings.CutSuffix(s, word); ok && base != "" {
			return base, true
		}
	}
	n := len(s)
	// -YYYY-MM-DD
	if n > 11 && s[n-11] == '-' && digits(s[n-10:n-6]) && s[n-6] == '-' && digits(s[n-5:n-3]) && s[n-3] == '-' && digits(s[n-2:]) {
		return s[:n-11], true
	}
	// -YYYYMMDD or @YYYYMMDD
	if n > 9 && (s[n-9] == '-' || s[n-9] == '@') && digits(s[n-8:]) {
		return s[:n-9], true
	}
	// -MMDD
	if n > 5 && s[n-5] == '-' && digits(s[n-4:]) {
		return s[:n-5], true
	}
	return s, false
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
