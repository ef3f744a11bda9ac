package proxy

import (
	"encoding/json"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// parse reads a call's body as its route's API: an embeddings body has
// the shape of a Responses one (model and input) but is charged for its
// input alone, so the route, not the body, decides how it is estimated.
func parse(api int, body []byte) (*estimator.Request, error) {
	if api == embeddings {
		return estimator.ParseEmbeddings(body)
	}
	return estimator.Parse(body)
}

// readEmbeddingsUsage reads an embeddings answer's usage: prompt_tokens
// (total_tokens is the same figure: an embedding writes no output).
func readEmbeddingsUsage(body []byte) (rule.Usage, bool) {
	var v struct {
		Usage *wireUsage `json:"usage"`
	}
	if json.Unmarshal(body, &v) != nil || v.Usage == nil {
		return rule.Usage{}, false
	}
	none := int64(0)
	v.Usage.CompletionTokens = &none
	return v.Usage.usage()
}
