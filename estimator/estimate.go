package estimator

import (
	"fmt"
	"math"
	"math/bits"
	"sync/atomic"
)

// Estimate is the predicted token cost of one request.
type Estimate struct {
	// Model is the model name as requested.
	Model string
	// Family is the table entry used, or [UnknownFamily].
	Family string
	// InputTokens is the input count: exact tiktoken counts plus the
	// message/tool framing, raised to the caller's input_tokens if larger.
	InputTokens int64
	// OutputTokens is the output reserved: the output cap (or the model's
	// default) times n, times the number of prompts of a completions batch.
	OutputTokens int64
	// Cost is Cost(InputTokens, OutputTokens, InputWeightMicro,
	// OutputWeightMicro).
	Cost int64
	// Approximate is set when part of the count is a convention rather
	// than a tokenizer count: an unknown model, non-text parts counted
	// with the model's PartTokens default, or a hosted tool.
	Approximate bool
	// InputWeightMicro and OutputWeightMicro are the weights applied.
	InputWeightMicro  int64
	OutputWeightMicro int64
	// ServiceTier is the price tier the request asked for (its
	// service_tier, read by ReadServiceTier): "" for the default tier, as
	// for "auto", whose tier only the response names. Money is reserved
	// at this tier's price; the settle charges the tier the response
	// reports.
	ServiceTier string `json:",omitempty"`
	// TextFactorMilli is the factor, in thousandths, the request's texts
	// were counted at in o200k_base, for a wire whose tokenizer is not
	// offline (Anthropic's Messages API, Gemini's); 0 when they were
	// counted in the model's own encoding. Output streamed without a
	// stated usage is counted the same way (CountOutput), so a wire's
	// fallback needs no rule of its own.
	TextFactorMilli int64 `json:",omitempty"`
}

// Config configures an [Estimator].
type Config struct {
	// Table is the model table; nil means [DefaultTable].
	Table *Table
}

// Estimator turns parsed requests into estimates. It is safe for concurrent
// use.
type Estimator struct {
	table atomic.Pointer[Table]
}

// New returns an Estimator. A nil cfg or nil cfg.Table uses [DefaultTable].
func New(cfg *Config) *Estimator {
	t := (*Table)(nil)
	if cfg != nil {
		t = cfg.Table
	}
	if t == nil {
		t = DefaultTable()
	}
	e := &Estimator{}
	e.table.Store(t)
	return e
}

// Table returns the estimator's model table.
func (e *Estimator) Table() *Table { return e.table.Load() }

// SetTable replaces the model table; estimates already under way finish
// with the old one.
func (e *Estimator) SetTable(t *Table) { e.table.Store(t) }

// Framing constants of OpenAI's cookbook (num_tokens_from_messages and
// num_tokens_for_tools).
const (
	tokensPerMessage     = 3
	tokensPerName        = 1
	tokensPerMessage0301 = 4  // gpt-3.5-turbo-0301
	tokensPerName0301    = -1 // gpt-3.5-turbo-0301: the name replaces the role
	replyPriming         = 3  // <|start|>assistant<|message|>

	propInit    = 3
	propKey     = 3
	enumInit    = -3
	enumItem    = 3
	funcEnd     = 12
	funcInitO   = 7  // o200k_base models
	funcInitCL  = 10 // cl100k_base models
	model0301   = "gpt-3.5-turbo-0301"
	maxEstimate = math.MaxInt64
)

// Estimate counts r's input for its model and reserves its output. Errors
// are *[InvalidError]: an output cap above the model's limit, or input plus
// output beyond the context window. (A failure to load the embedded
// tokenizer ranks, which cannot happen with an intact binary, is returned as
// a plain error.)
func (e *Estimator) Estimate(r *Request) (Estimate, error) {
	if r == nil || r.source == "" {
		// Only Parse makes usable Requests.
		return Estimate{}, invalid("body", "is empty")
	}
	t := e.table.Load()
	if t == nil {
		t = DefaultTable()
	}
	m, known := t.Lookup(r.model)
	outLimit := m.DefaultOutputTokens
	if !known {
		m = unknownModel
		outLimit = m.ContextWindow
	}
	if r.context1M {
		m.ContextWindow = m.WidestContextWindow() // Anthropic's 1M-context beta
	}
	enc, err := getEncoder(m.Encoding)
	if err != nil {
		return Estimate{}, err
	}
	if r.embeddings {
		return embeddingsEstimate(r, m, known, enc)
	}

	tpm, tpn := int64(tokensPerMessage), int64(tokensPerName)
	if r.model == model0301 {
		tpm, tpn = tokensPerMessage0301, tokensPerName0301
	}
	// Everything known without counting first: the framing, the tools'
	// structure and the non-text parts. What the texts and prompts add is
	// never negative, so a partial count plus this is a lower bound of
	// the input, and counting may stop once it proves the request can
	// never fit.
	in := r.fixed + r.messages*tpm + r.names*tpn
	if r.priming {
		in += replyPriming
	}
	if r.tools.any {
		funcInit := int64(funcInitO)
		if m.Encoding == EncodingCL100K {
			funcInit = funcInitCL
		}
		tc := r.tools
		in += tc.funcs*funcInit + tc.propBlocks*propInit + tc.props*propKey +
			tc.enums*enumInit + tc.enumItems*enumItem + funcEnd
	}
	approx := !known || r.approximate
	if r.parts > 0 && !r.hasInputTokens {
		in = satAdd(in, satMul(r.parts, m.PartTokens))
		approx = true
	}

	// Output caps are checked before counting: they need no count, and an
	// input over the window is refused whatever its exact size.
	out, err := outputCap(r, outLimit)
	if err != nil {
		return Estimate{}, err
	}
	// bound is the most input the window can take with the output the
	// request needs (its cap, or at least one token).
	bound := m.ContextWindow - max(out, 1)
	batch := int64(1)
	if len(r.prompts) > 1 {
		batch = int64(len(r.prompts))
	}

	// A completions batch holds each prompt to the window on its own; its
	// other texts (instructions, tools) are not held to it.
	textLimit := unbounded
	if batch == 1 {
		textLimit = bound - in
		if f := r.textFactorMilli(m.Name); f > 0 && textLimit > 0 {
			// The largest raw count whose scaled count fits.
			textLimit = textLimit * 1000 / f
		}
	}
	textIn, fits := countTexts(enc, r.texts, textLimit)
	if f := r.textFactorMilli(m.Name); f > 0 {
		textIn = scaleCount(textIn, f)
	}
	in = satAdd(in, textIn)
	if !fits {
		return Estimate{}, overWindow(r.source, in, out, m.ContextWindow, true)
	}
	var largestPrompt int64
	for _, p := range r.prompts {
		c := p.tokens
		if p.tokens == 0 {
			limit := bound
			if batch == 1 {
				limit = bound - in
			}
			n, ok := countWithin(enc, p.text, limit)
			if c = n; !ok {
				if batch == 1 {
					c = satAdd(in, c)
				}
				return Estimate{}, overWindow(r.source, c, out, m.ContextWindow, true)
			}
		}
		in += c
		largestPrompt = max(largestPrompt, c)
	}
	if r.hasInputTokens && r.inputTokens > in {
		in = r.inputTokens
	}
	in = max(in, 0)

	ctxIn := in
	if batch > 1 {
		ctxIn = largestPrompt
	}
	if out == 0 {
		// No cap named: the model can write at most what the window leaves.
		out = min(m.DefaultOutputTokens, m.ContextWindow-ctxIn)
		if out < 1 {
			return Estimate{}, overWindow(r.source, ctxIn, 0, m.ContextWindow, false)
		}
	}
	if ctxIn+out > m.ContextWindow {
		return Estimate{}, overWindow(r.source, ctxIn, out, m.ContextWindow, false)
	}
	perCandidate := out
	out = satMul(satMul(out, max(r.n, 1)), batch)
	if t := r.thinking; t != 0 {
		// Gemini's thoughts, reserved once beside maxOutputTokens x
		// candidateCount, within what the window leaves.
		if t == thinkingModelLimit {
			t = m.DefaultOutputTokens
		}
		out = satAdd(out, min(t, max(m.ContextWindow-ctxIn-perCandidate, 0)))
	}

	return Estimate{
		Model:             r.model,
		Family:            m.Name,
		InputTokens:       in,
		OutputTokens:      out,
		Cost:              Cost(in, out, m.InputWeightMicro, m.OutputWeightMicro),
		Approximate:       approx,
		InputWeightMicro:  m.InputWeightMicro,
		OutputWeightMicro: m.OutputWeightMicro,
		ServiceTier:       r.serviceTier,
		TextFactorMilli:   r.textFactorMilli(m.Name),
	}, nil
}

// outputCap returns the first output cap the request names, by precedence
// (0 for none), once every cap named is within the model's limit.
func outputCap(r *Request, outLimit int64) (int64, error) {
	var out int64
	for i, c := range r.caps {
		if c == 0 {
			continue
		}
		if c > outLimit {
			field := outputCapFields[i]
			if r.capField != "" {
				field = r.capField
			}
			return 0, invalid(field, fmt.Sprintf("exceeds the model's output limit of %d", outLimit))
		}
		if out == 0 {
			out = c
		}
	}
	return out, nil
}

// overWindow is the refusal of an input of in tokens (at least in, when
// counting stopped early) that leaves no room for out output tokens (for
// no cap: for any output) in the model's window.
func overWindow(field string, in, out, window int64, atLeast bool) *InvalidError {
	of := "input of "
	if atLeast {
		of = "input of at least "
	}
	if out == 0 {
		return invalid(field, fmt.Sprintf("%s%d tokens leaves no room for output in the model's context window of %d tokens", of, in, window))
	}
	return invalid(field, fmt.Sprintf("%s%d tokens plus %d output tokens exceeds the model's context window of %d tokens", of, in, out, window))
}

// unbounded is the limit of a count that nothing holds.
const unbounded = int64(math.MaxInt64)

// countTexts sums the counts of texts, stopping as soon as the sum exceeds
// limit. fits is false when it stopped: the sum is then a lower bound
// above limit.
func countTexts(enc *encoder, texts []string, limit int64) (sum int64, fits bool) {
	for _, s := range texts {
		n, ok := countWithin(enc, s, limit-sum)
		sum = satAdd(sum, n)
		if !ok {
			return sum, false
		}
	}
	return sum, true
}

// countWithin counts s, stopping past limit tokens. A negative limit means
// the room is gone already: nothing is counted, and s does not fit.
func countWithin(enc *encoder, s string, limit int64) (int64, bool) {
	switch {
	case limit < 0:
		return 0, false
	case limit >= math.MaxInt32:
		// More than any body holds: count without a limit.
		n, _ := enc.countLimit(s, -1)
		return int64(n), true
	}
	n, ok := enc.countLimit(s, int(limit))
	return int64(n), ok
}

// Cost returns ceil((in*inWeightMicro + out*outWeightMicro) / 1e6) in exact
// 128-bit integer arithmetic: weights are fixed point with [WeightOne] as
// 1.0, and any fraction of a unit is charged as a whole unit. Negative
// arguments count as 0; a result beyond int64 saturates at math.MaxInt64.
func Cost(in, out, inWeightMicro, outWeightMicro int64) int64 {
	h1, l1 := bits.Mul64(uint64(max(in, 0)), uint64(max(inWeightMicro, 0)))
	h2, l2 := bits.Mul64(uint64(max(out, 0)), uint64(max(outWeightMicro, 0)))
	lo, c := bits.Add64(l1, l2, 0)
	hi, _ := bits.Add64(h1, h2, c) // < 2^127: no carry out
	lo, c = bits.Add64(lo, WeightOne-1, 0)
	hi += c
	if hi >= WeightOne { // quotient would not fit in 64 bits
		return maxEstimate
	}
	q, _ := bits.Div64(hi, lo, WeightOne)
	if q > maxEstimate {
		return maxEstimate
	}
	return int64(q)
}

func satAdd(a, b int64) int64 {
	if s := a + b; (s > a) == (b > 0) {
		return s
	}
	if b > 0 {
		return maxEstimate
	}
	return math.MinInt64
}

// satMul multiplies non-negative a and b, saturating at math.MaxInt64.
func satMul(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > maxEstimate {
		return maxEstimate
	}
	return int64(lo)
}
