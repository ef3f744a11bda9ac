// Embeddings (OpenAI's POST /v1/embeddings): an input-only request. Its
// body is told from a Responses body by the route it came on, not by its
// shape (both have model and input), hence its own entry point.

package estimator

import (
	"encoding/json"
	"fmt"
)

// ParseEmbeddings decodes and validates the body of an OpenAI embeddings
// call: model; input as a string, an array of strings, an array of token
// ids, or an array of arrays of token ids; the optional dimensions,
// encoding_format and user, checked for their type only (they are the
// upstream's to judge, and cost nothing); and tokengate's optional
// max_wait_ms. Unknown fields are ignored. Every failure is an
// *[InvalidError] naming the offending field.
//
// Its [Estimator.Estimate] counts each input exactly with the model's
// encoding, holds each to the model's context window on its own (the
// provider's limit is per input), and reserves no output: an embedding
// call is charged for its input alone.
func ParseEmbeddings(body []byte) (*Request, error) {
	obj, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	r := &Request{n: 1, source: "input", embeddings: true, endUser: endUserFieldsOf(obj)}
	var ierr *InvalidError
	if r.model, ierr = modelField(obj); ierr != nil {
		return nil, ierr
	}
	if r.maxWaitMS, _, ierr = intField(obj, "max_wait_ms", 0, MaxWaitMS); ierr != nil {
		return nil, ierr
	}
	if _, _, ierr = intField(obj, "dimensions", 1, maxTokenField); ierr != nil {
		return nil, ierr
	}
	for _, f := range [...]string{"encoding_format", "user"} {
		switch obj[f].(type) {
		case nil, string:
		default:
			return nil, invalid(f, "must be a string")
		}
	}
	if err := embeddingsInput(r, obj["input"]); err != nil {
		return nil, err
	}
	return r, nil
}

// embeddingsInput reads an embeddings input into r.prompts, one entry per
// input. An empty input, string or token array is refused, as the
// provider refuses it: it could only fail upstream.
func embeddingsInput(r *Request, v any) error {
	var in []any
	switch vv := v.(type) {
	case nil:
		return invalid("input", "is required")
	case string:
		if vv == "" {
			return invalid("input", "must not be an empty string")
		}
		r.prompts = []promptEntry{{text: vv}}
		return nil
	case []any:
		in = vv
	default:
		return invalid("input", "must be a string or an array")
	}
	if len(in) == 0 {
		return invalid("input", "must not be empty")
	}
	switch in[0].(type) {
	case json.Number: // one input as token ids
		if err := tokenIDs("input", in); err != nil {
			return err
		}
		r.prompts = []promptEntry{{tokens: int64(len(in))}}
		return nil
	case string, []any:
	default:
		return invalid("input[0]", "must be a string, a token id or an array of token ids")
	}
	if len(in) > MaxMessages {
		return invalid("input", fmt.Sprintf("must have at most %d entries", MaxMessages))
	}
	r.batch = true
	r.prompts = make([]promptEntry, len(in))
	_, strs := in[0].(string)
	for i, e := range in {
		ep := index("input", i)
		if strs {
			s, ok := e.(string)
			switch {
			case !ok:
				return invalid(ep, "must be a string")
			case s == "":
				return invalid(ep, "must not be an empty string")
			}
			r.prompts[i].text = s
			continue
		}
		ids, ok := e.([]any)
		switch {
		case !ok:
			return invalid(ep, "must be an array of token ids")
		case len(ids) == 0:
			return invalid(ep, "must not be empty")
		}
		if err := tokenIDs(ep, ids); err != nil {
			return err
		}
		r.prompts[i].tokens = int64(len(ids))
	}
	return nil
}

// embeddingsEstimate is [Estimator.Estimate] for an embeddings request:
// the exact count of every input, each within the model's context window,
// and no output; a Gemini input as its wire's texts count, at most the
// window (geminiEmbeddingCount).
func embeddingsEstimate(r *Request, m Model, known bool, enc *encoder) (Estimate, error) {
	var in int64
	factor := r.textFactorMilli(m.Name)
	for i, p := range r.prompts {
		if r.gemini {
			in = satAdd(in, geminiEmbeddingCount(enc, p.text, m, factor))
			continue
		}
		c, fits := p.tokens, true
		if p.tokens == 0 {
			// Counting stops once the input is proven over the window.
			c, fits = countWithin(enc, p.text, m.ContextWindow)
		}
		if !fits || c > m.ContextWindow {
			field := "input"
			if r.batch {
				field = index("input", i)
			}
			of := "input of "
			if !fits {
				of = "input of at least "
			}
			return Estimate{}, invalid(field, fmt.Sprintf("%s%d tokens exceeds the model's context window of %d tokens", of, c, m.ContextWindow))
		}
		in = satAdd(in, c)
	}
	return Estimate{
		Model:             r.model,
		Family:            m.Name,
		InputTokens:       in,
		Cost:              Cost(in, 0, m.InputWeightMicro, m.OutputWeightMicro),
		Approximate:       !known || r.approximate,
		TextFactorMilli:   factor,
		InputWeightMicro:  m.InputWeightMicro,
		OutputWeightMicro: m.OutputWeightMicro,
	}, nil
}

// ParseFor is Parse for a body whose route does not say what it is (the
// HTTP API's POST /v1/admissions and /v1/estimate): a body with input for
// an embedding model of e's table (Model.InputOnly) is an embeddings call
// (ParseEmbeddings): each input within the window on its own, no output.
// Read as a Responses body, a batch of inputs would be held to the window
// together and reserve output the model never writes.
func (e *Estimator) ParseFor(body []byte) (*Request, error) {
	r, err := Parse(body)
	if err != nil || r.source != "input" {
		return r, err
	}
	if m, known := e.Table().Lookup(r.model); known && m.InputOnly {
		return ParseEmbeddings(body)
	}
	return r, nil
}
