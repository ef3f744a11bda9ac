// Base64 payloads outside the blocks that carry them by name.

package estimator

import "strings"

// base64DataURL returns the data of s when s is a base64 data URL
// ("data:image/png;base64,iVBOR..."): an image or a file inlined where a
// URL goes, as OpenAI's image_url and file_data carry them.
func base64DataURL(s string) (string, bool) {
	rest, ok := strings.CutPrefix(s, "data:")
	if !ok {
		return "", false
	}
	// The media type and its parameters come first, and are short.
	i := strings.Index(rest[:min(len(rest), 256)], ";base64,")
	if i < 0 {
		return "", false
	}
	return rest[i+len(";base64,"):], true
}

// dataURLParts blanks every base64 data URL in v (a decoded JSON value)
// and counts each as an image by Anthropic's rule when its header can be
// read, else as a non-text part at the model's part default.
// A block of a type this parser does not know is counted as its JSON
// (messageBlock), and an OpenAI-style image_url block sent on Anthropic's
// wire carries a whole image as text: counted by the tokenizer, its
// megabytes of base64 cost seconds of CPU (and refuse the call for
// millions of tokens the provider never counts).
func (p *parser) dataURLParts(v any) {
	count := func(s string) bool {
		data, ok := base64DataURL(s)
		if !ok {
			return false
		}
		if n, ok := imageTokens(data); ok {
			p.r.fixed += n
		} else {
			p.r.parts++
		}
		return true
	}
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok {
				if count(s) {
					x[k] = ""
				}
				continue
			}
			p.dataURLParts(e)
		}
	case []any:
		for i, e := range x {
			if s, ok := e.(string); ok {
				if count(s) {
					x[i] = ""
				}
				continue
			}
			p.dataURLParts(e)
		}
	}
}
