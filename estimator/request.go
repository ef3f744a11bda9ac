package estimator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits on request fields.
const (
	// DefaultMaxRequestBytes is the largest request body a replica
	// accepts unless configured, on every face: an admission request
	// carries a prompt, and 4 MiB holds the largest context windows served
	// today as text.
	DefaultMaxRequestBytes = 4 << 20

	// MaxModelNameBytes is the longest accepted model name.
	MaxModelNameBytes = 256
	// MaxMessages is the most messages (or input items) a request may have.
	MaxMessages = 10_000
	// MaxWaitMS is the largest accepted max_wait_ms (one hour).
	MaxWaitMS = 3_600_000
	// MaxInputTokens is the largest accepted input_tokens.
	MaxInputTokens = 100_000_000
	// MaxChoices is the largest accepted n.
	MaxChoices = 128

	// maxTokenField bounds every integer token field (and model limits)
	// so that all arithmetic stays far from overflow.
	maxTokenField = 1_000_000_000
)

// chatRoles are the roles a message may have.
var chatRoles = map[string]bool{
	"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true,
}

const rolesList = "system, developer, user, assistant, tool, function"

// textPartTypes are the content part types counted by their text.
var textPartTypes = map[string]bool{"text": true, "input_text": true, "output_text": true}

// outputCapFields are the output caps in order of precedence.
var outputCapFields = [...]string{"max_completion_tokens", "max_tokens", "max_output_tokens"}

// Request is a parsed, validated estimate or admission body. Its counts are
// taken per model by [Estimator.Estimate]; a Request is immutable after
// [Parse] and may be estimated concurrently.
type Request struct {
	model     string
	maxWaitMS int64

	inputTokens    int64 // the caller's own count, when hasInputTokens
	hasInputTokens bool

	caps [len(outputCapFields)]int64 // 0 when absent
	n    int64

	source string // "messages", "prompt" or "input"

	texts    []string // every string counted with the model's encoding
	fixed    int64    // tokens given as token ids
	messages int64    // messages and input items (tokens_per_message each)
	names    int64    // "name" keys in messages (tokens_per_name each)
	priming  bool     // chat-style conversation: +3 reply priming
	parts    int64    // non-text content parts

	// prompts holds a completions batch (prompt as an array of strings or
	// of token arrays): one entry per prompt, each generating its own
	// completions. Nil otherwise.
	prompts []promptEntry

	tools       toolCounts
	approximate bool // something was counted by convention (unknown tool type)

	// embeddings marks an embeddings request ([ParseEmbeddings]): one
	// prompts entry per input, and no output. batch says its input was
	// an array of inputs, whose errors name input[i].
	embeddings, batch bool
	// messagesAPI is set for Anthropic's Messages shape: its texts are
	// counted with o200k_base times the family's safety factor
	// (MessagesSafetyFactorMilli), Claude's tokenizer being unpublished.
	messagesAPI bool
	// gemini is the Gemini API's shape (ParseGemini): its texts are counted
	// with o200k_base times GeminiSafetyFactorMilli, Gemini's tokenizer
	// having no offline copy; thinking is output reserved beside its
	// maxOutputTokens x candidateCount (thinkingModelLimit: the model's
	// output limit); capField names its output cap in errors.
	gemini   bool
	thinking int64
	capField string

	endUser EndUserFields // see EndUserFields

	context1M bool // estimated with the model's widest window (WithContext1M)

	serviceTier string // the price tier asked for (ReadServiceTier), "" for the default
}

type promptEntry struct {
	text   string
	tokens int64 // token ids given instead of text
}

// toolCounts are the structural counts of function definitions; their text
// lines are in Request.texts.
type toolCounts struct {
	funcs      int64 // func_init each
	propBlocks int64 // prop_init each
	props      int64 // prop_key each
	enums      int64 // enum_init each
	enumItems  int64 // enum_item each
	any        bool  // func_end once
}

// Model returns the model name exactly as the caller sent it.
func (r *Request) Model() string {
	if r == nil {
		return ""
	}
	return r.model
}

// MaxWaitMS returns the optional max_wait_ms, 0 when absent.
func (r *Request) MaxWaitMS() int64 {
	if r == nil {
		return 0
	}
	return r.maxWaitMS
}

// InputTokens returns the caller's own input_tokens and whether it was given.
func (r *Request) InputTokens() (int64, bool) {
	if r == nil {
		return 0, false
	}
	return r.inputTokens, r.hasInputTokens
}

// Source returns which input field the request uses: "messages", "prompt"
// or "input".
func (r *Request) Source() string {
	if r == nil {
		return ""
	}
	return r.source
}

// Parse decodes and validates a JSON request body: an OpenAI-style chat
// completions, completions, responses or embeddings body, plus tokengate's
// optional max_wait_ms and input_tokens. Unknown fields are ignored; a
// repeated key takes its last value, as in encoding/json. Every failure is
// an *[InvalidError] naming the offending field.
func Parse(body []byte) (*Request, error) {
	obj, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	p := &parser{r: &Request{n: 1, endUser: endUserFieldsOf(obj)}}
	if err := p.request(obj); err != nil {
		return nil, err
	}
	return p.r, nil
}

// decodeObject decodes a request body, which must be one JSON object, with
// its numbers kept as json.Number. Every failure is an *[InvalidError].
func decodeObject(body []byte) (map[string]any, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, invalid("body", "is empty")
	}
	if !utf8.Valid(body) {
		return nil, invalidUTF8(body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, syntaxError(body, err)
	}
	if off := skipSpace(body, int(dec.InputOffset())); off < len(body) {
		return nil, invalid("body", fmt.Sprintf("invalid JSON at byte offset %d: unexpected data after the top-level value", off))
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, invalid("body", "must be a JSON object, not "+kind(v))
	}
	return obj, nil
}

type parser struct {
	r *Request
}

func (p *parser) request(obj map[string]any) error {
	r := p.r
	var err *InvalidError
	if r.model, err = modelField(obj); err != nil {
		return err
	}
	if r.maxWaitMS, _, err = intField(obj, "max_wait_ms", 0, MaxWaitMS); err != nil {
		return err
	}
	if r.serviceTier, err = serviceTierField(obj); err != nil {
		return err
	}
	if r.inputTokens, r.hasInputTokens, err = intField(obj, "input_tokens", 0, MaxInputTokens); err != nil {
		return err
	}
	for i, f := range outputCapFields {
		if r.caps[i], _, err = intField(obj, f, 1, maxTokenField); err != nil {
			return err
		}
	}
	if n, ok, err := intField(obj, "n", 1, MaxChoices); err != nil {
		return err
	} else if ok {
		r.n = n
	}

	// Exactly one of messages, prompt, input.
	for _, f := range [...]string{"messages", "prompt", "input"} {
		if obj[f] == nil {
			continue
		}
		if r.source != "" {
			return invalid(f, "cannot be combined with "+r.source)
		}
		r.source = f
	}
	switch r.source {
	case "":
		return invalid("messages", "one of messages, prompt or input is required")
	case "messages":
		if err := p.messageList("messages", obj["messages"]); err != nil {
			return err
		}
	case "prompt":
		if err := p.prompt(obj["prompt"]); err != nil {
			return err
		}
	case "input":
		if err := p.input(obj["input"]); err != nil {
			return err
		}
	}

	switch ins := obj["instructions"].(type) {
	case nil:
	case string:
		r.texts = append(r.texts, ins)
	default:
		return invalid("instructions", "must be a string")
	}

	for _, f := range [...]string{"tools", "functions"} {
		if err := p.toolList(f, obj[f]); err != nil {
			return err
		}
	}
	return nil
}

// modelField returns the required model name of a request.
func modelField(obj map[string]any) (string, *InvalidError) {
	switch m := obj["model"].(type) {
	case nil:
		return "", invalid("model", "is required")
	case string:
		if m == "" {
			return "", invalid("model", "must not be empty")
		}
		if len(m) > MaxModelNameBytes {
			return "", invalid("model", fmt.Sprintf("must be at most %d bytes", MaxModelNameBytes))
		}
		if strings.IndexByte(m, 0) >= 0 {
			// The model name is stored with the admission, and Postgres
			// text cannot hold a NUL. Message content, only counted, may.
			return "", invalid("model", `must not contain a NUL character (\u0000)`)
		}
		return m, nil
	default:
		return "", invalid("model", "must be a string")
	}
}

// requiredString returns m[key], which must be a string.
func requiredString(m map[string]any, path, key string) (string, *InvalidError) {
	switch s := m[key].(type) {
	case nil:
		return "", invalid(path+"."+key, "is required")
	case string:
		return s, nil
	default:
		return "", invalid(path+"."+key, "must be a string")
	}
}

// intField returns the optional integer obj[key], which must lie in
// min..max. Absent and null are "not present".
func intField(obj map[string]any, key string, min, max int64) (int64, bool, *InvalidError) {
	v := obj[key]
	if v == nil {
		return 0, false, nil
	}
	num, ok := v.(json.Number)
	if !ok {
		return 0, false, invalid(key, "must be an integer")
	}
	x, isInt, big := parseInteger(string(num))
	switch {
	case !isInt:
		return 0, false, invalid(key, "must be an integer")
	case (big && x < 0) || x < min:
		return 0, false, invalid(key, fmt.Sprintf("must be at least %d", min))
	case big || x > max:
		return 0, false, invalid(key, fmt.Sprintf("must be at most %d", max))
	}
	return x, true, nil
}

// serviceTierField reads the optional service_tier of an OpenAI or
// Anthropic request as a price tier (ReadServiceTier): a word no tier
// prices ("auto", "standard_only", a value a provider adds later) is the
// default tier, for the upstream to accept or refuse; a value that is not
// a string is an *InvalidError.
func serviceTierField(obj map[string]any) (string, *InvalidError) {
	switch v := obj["service_tier"].(type) {
	case nil:
		return "", nil
	case string:
		if t := ReadServiceTier(v); t != TierDefault {
			return t, nil
		}
		return "", nil
	default:
		return "", invalid("service_tier", "must be a string, not "+kind(v))
	}
}
