// Gemini's embeddings (models/{model}:embedContent and
// :batchEmbedContents, on AI Studio's paths and Vertex AI's): input-only
// requests, estimated as OpenAI's embeddings are, their text counted as
// every Gemini text is (GeminiSafetyFactorMilli).

package estimator

import "fmt"

// Google's embedding models (December 2026): each takes up to 2048 input
// tokens per content and truncates a longer one (Vertex AI's autoTruncate
// is on by default; AI Studio truncates), so a content is charged at most
// the window, never refused for its length. gemini-embedding-001 is the
// current family; text-embedding-004 and -005 are its predecessors.
var geminiEmbeddingModels = []Model{
	{Name: "gemini-embedding-001"},
	{Name: "text-embedding-005"},
	{Name: "text-embedding-004"},
}

// geminiEmbeddingWindow is the input limit of Google's embedding models.
const geminiEmbeddingWindow = 2048

// ParseGeminiEmbed decodes and validates the body of a Gemini embedding
// call for model, which the call names in its URL's path: an embedContent
// body (content, and the optional title, taskType and
// outputDimensionality), or with batch a batchEmbedContents body
// (requests, each one such body and an optional model). Each content's
// text parts, with its title, are one input; its other parts cost
// nothing (the text-only embedding models take none). Every failure is an
// *[InvalidError] naming the offending field.
//
// Its [Estimator.Estimate] counts each input as a Gemini text, capped at
// the model's window (Google truncates a longer one), and reserves no
// output; it is approximate.
func ParseGeminiEmbed(model string, body []byte, batch bool) (*Request, error) {
	if err := geminiModel(model); err != nil {
		return nil, err
	}
	obj, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	r := &Request{model: model, n: 1, source: "content", embeddings: true, gemini: true, approximate: true, endUser: endUserFieldsOf(obj)}
	if !batch {
		text, err := geminiEmbedInput(obj, "")
		if err != nil {
			return nil, err
		}
		r.prompts = []promptEntry{{text: text}}
		return r, nil
	}
	reqs, ok := obj["requests"].([]any)
	switch {
	case obj["requests"] == nil:
		return nil, invalid("requests", "is required")
	case !ok:
		return nil, invalid("requests", "must be an array")
	case len(reqs) == 0:
		return nil, invalid("requests", "must not be empty")
	case len(reqs) > MaxMessages:
		return nil, invalid("requests", fmt.Sprintf("must have at most %d entries", MaxMessages))
	}
	r.source, r.batch = "requests", true
	r.prompts = make([]promptEntry, len(reqs))
	for i, v := range reqs {
		path := index("requests", i)
		req, ok := v.(map[string]any)
		if !ok {
			return nil, invalid(path, "must be an object")
		}
		switch req["model"].(type) {
		case nil, string:
		default:
			return nil, invalid(path+".model", "must be a string")
		}
		text, err := geminiEmbedInput(req, path+".")
		if err != nil {
			return nil, err
		}
		r.prompts[i].text = text
	}
	return r, nil
}

// geminiEmbedInput is the text of one EmbedContentRequest: its title and
// its content's text parts, joined.
func geminiEmbedInput(req map[string]any, prefix string) (string, error) {
	for _, f := range [...][2]string{{"title", "title"}, {"taskType", "task_type"}} {
		v, name := geminiField(req, f[0], f[1])
		if _, ok := v.(string); v != nil && !ok {
			return "", invalid(prefix+name, "must be a string")
		}
	}
	_, name := geminiField(req, "outputDimensionality", "output_dimensionality")
	if _, _, err := intField(req, name, 1, maxTokenField); err != nil {
		err.Field = prefix + err.Field
		return "", err
	}
	title, _ := geminiField(req, "title", "title")
	text, _ := title.(string)
	content, ok := req["content"].(map[string]any)
	switch {
	case req["content"] == nil:
		return "", invalid(prefix+"content", "is required")
	case !ok:
		return "", invalid(prefix+"content", "must be an object")
	}
	parts, ok := content["parts"].([]any)
	if !ok || len(parts) == 0 {
		return "", invalid(prefix+"content.parts", "must be a non-empty array")
	}
	for i, p := range parts {
		path := index(prefix+"content.parts", i)
		part, ok := p.(map[string]any)
		if !ok {
			return "", invalid(path, "must be an object")
		}
		switch t := part["text"].(type) {
		case nil:
		case string:
			text += t
		default:
			return "", invalid(path+".text", "must be a string")
		}
	}
	return text, nil
}

// geminiEmbeddingCount is an input of a Gemini embedding request as
// charged: its o200k_base count times the factor, at most the window
// (Google truncates what is over it). Counting stops once the input is
// past the window.
func geminiEmbeddingCount(enc *encoder, text string, m Model, factorMilli int64) int64 {
	c, fits := countWithin(enc, text, m.ContextWindow)
	if !fits {
		return m.ContextWindow
	}
	return min(scaleCount(c, factorMilli), m.ContextWindow)
}
