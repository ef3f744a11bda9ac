package estimator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits on request fields.
const (
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
	p := &parser{r: &Request{n: 1}}
	if err := p.request(obj); err != nil {
		return nil, err
	}
	return p.r, nil
}

type parser struct {
	r *Request
}

func (p *parser) request(obj map[string]any) error {
	r := p.r
	// model
	switch m := obj["model"].(type) {
	case nil:
		return invalid("model", "is required")
	case string:
		if m == "" {
			return invalid("model", "must not be empty")
		}
		if len(m) > MaxModelNameBytes {
			return invalid("model", fmt.Sprintf("must be at most %d bytes", MaxModelNameBytes))
		}
		r.model = m
	default:
		return invalid("model", "must be a string")
	}

	var err *InvalidError
	if r.maxWaitMS, _, err = intField(obj, "max_wait_ms", 0, MaxWaitMS); err != nil {
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

// messageList parses a chat messages array.
func (p *parser) messageList(path string, v any) error {
	arr, ok := v.([]any)
	if !ok {
		return invalid(path, "must be an array")
	}
	if len(arr) == 0 {
		return invalid(path, "must not be empty")
	}
	if len(arr) > MaxMessages {
		return invalid(path, fmt.Sprintf("must have at most %d entries", MaxMessages))
	}
	p.r.priming = true
	for i, m := range arr {
		if err := p.message(index(path, i), m); err != nil {
			return err
		}
	}
	return nil
}

// message parses one chat message: tokens_per_message, every string value
// (tokens_per_name for "name"), content parts, and the function names and
// arguments of tool calls.
func (p *parser) message(path string, v any) error {
	m, ok := v.(map[string]any)
	if !ok {
		return invalid(path, "must be an object")
	}
	switch role := m["role"].(type) {
	case nil:
		return invalid(path+".role", "is required")
	case string:
		if !chatRoles[role] {
			return invalid(path+".role", "must be one of "+rolesList)
		}
	default:
		return invalid(path+".role", "must be a string")
	}
	if err := p.content(path+".content", m["content"]); err != nil {
		return err
	}
	for _, k := range [...]string{"name", "tool_call_id"} {
		switch m[k].(type) {
		case nil, string:
		default:
			return invalid(path+"."+k, "must be a string")
		}
	}
	if tc := m["tool_calls"]; tc != nil {
		calls, ok := tc.([]any)
		if !ok {
			return invalid(path+".tool_calls", "must be an array")
		}
		for i, c := range calls {
			cp := index(path+".tool_calls", i)
			call, ok := c.(map[string]any)
			if !ok {
				return invalid(cp, "must be an object")
			}
			if err := p.functionCall(cp+".function", call["function"]); err != nil {
				return err
			}
		}
	}
	if err := p.functionCall(path+".function_call", m["function_call"]); err != nil {
		return err
	}
	p.r.messages++
	p.stringValues(m, true)
	return nil
}

// stringValues adds every top-level string value of m (content included
// when it is a string), counting "name" keys when names is set.
func (p *parser) stringValues(m map[string]any, names bool) {
	for k, v := range m {
		if s, ok := v.(string); ok {
			p.r.texts = append(p.r.texts, s)
			if names && k == "name" {
				p.r.names++
			}
		}
	}
}

// functionCall adds the name and arguments of a tool call's function (or a
// legacy function_call); v may be absent.
func (p *parser) functionCall(path string, v any) error {
	if v == nil {
		return nil
	}
	f, ok := v.(map[string]any)
	if !ok {
		return invalid(path, "must be an object")
	}
	for _, k := range [...]string{"name", "arguments"} {
		switch s := f[k].(type) {
		case nil:
		case string:
			p.r.texts = append(p.r.texts, s)
		default:
			return invalid(path+"."+k, "must be a string")
		}
	}
	return nil
}

// content checks a message's content: a string (counted with the message's
// other string values), null, or an array of parts.
func (p *parser) content(path string, v any) error {
	switch c := v.(type) {
	case nil, string:
		return nil
	case []any:
		for i, part := range c {
			if err := p.part(index(path, i), part); err != nil {
				return err
			}
		}
		return nil
	default:
		return invalid(path, "must be a string, an array of content parts or null")
	}
}

// part parses one content part: text parts by their text, any other type
// as one non-text part.
func (p *parser) part(path string, v any) error {
	m, ok := v.(map[string]any)
	if !ok {
		return invalid(path, "must be an object")
	}
	t, err := requiredString(m, path, "type")
	if err != nil {
		return err
	}
	if !textPartTypes[t] {
		p.r.parts++
		return nil
	}
	text, err := requiredString(m, path, "text")
	if err != nil {
		return err
	}
	p.r.texts = append(p.r.texts, text)
	return nil
}

// prompt parses a completions prompt: a string, an array of strings, an
// array of token ids, or an array of arrays of token ids. Arrays of strings
// and of token arrays are batches: one completion set per prompt.
func (p *parser) prompt(v any) error {
	r := p.r
	switch pr := v.(type) {
	case string:
		r.prompts = []promptEntry{{text: pr}}
		return nil
	case []any:
		if len(pr) == 0 {
			return invalid("prompt", "must not be empty")
		}
		switch pr[0].(type) {
		case string:
			r.prompts = make([]promptEntry, len(pr))
			for i, e := range pr {
				s, ok := e.(string)
				if !ok {
					return invalid(index("prompt", i), "must be a string")
				}
				r.prompts[i].text = s
			}
			return nil
		case json.Number:
			if err := tokenIDs("prompt", pr); err != nil {
				return err
			}
			r.prompts = []promptEntry{{tokens: int64(len(pr))}}
			return nil
		case []any:
			r.prompts = make([]promptEntry, len(pr))
			for i, e := range pr {
				ep := index("prompt", i)
				ids, ok := e.([]any)
				if !ok {
					return invalid(ep, "must be an array of token ids")
				}
				if len(ids) == 0 {
					return invalid(ep, "must not be empty")
				}
				if err := tokenIDs(ep, ids); err != nil {
					return err
				}
				r.prompts[i].tokens = int64(len(ids))
			}
			return nil
		default:
			return invalid("prompt[0]", "must be a string, a token id or an array of token ids")
		}
	default:
		return invalid("prompt", "must be a string or an array")
	}
}

// tokenIDs checks that every element of ids is a token id.
func tokenIDs(path string, ids []any) error {
	for i, e := range ids {
		n, ok := e.(json.Number)
		if !ok {
			return invalid(index(path, i), "must be a token id (an integer)")
		}
		if _, isInt, big := parseInteger(string(n)); !isInt || big || strings.HasPrefix(string(n), "-") {
			return invalid(index(path, i), "must be a token id (a non-negative integer)")
		}
	}
	return nil
}

// input parses a responses or embeddings input: a string, an array of
// strings and items (messages with role or type "message", counted as chat
// messages; other typed items by all their string values), or token ids.
func (p *parser) input(v any) error {
	r := p.r
	switch in := v.(type) {
	case string:
		r.texts = append(r.texts, in)
		return nil
	case []any:
		if len(in) == 0 {
			return invalid("input", "must not be empty")
		}
		switch in[0].(type) {
		case json.Number:
			if err := tokenIDs("input", in); err != nil {
				return err
			}
			r.fixed += int64(len(in))
			return nil
		case []any:
			for i, e := range in {
				ep := index("input", i)
				ids, ok := e.([]any)
				if !ok {
					return invalid(ep, "must be an array of token ids")
				}
				if err := tokenIDs(ep, ids); err != nil {
					return err
				}
				r.fixed += int64(len(ids))
			}
			return nil
		}
		if len(in) > MaxMessages {
			return invalid("input", fmt.Sprintf("must have at most %d entries", MaxMessages))
		}
		for i, e := range in {
			ep := index("input", i)
			switch it := e.(type) {
			case string:
				r.texts = append(r.texts, it)
			case map[string]any:
				if err := p.inputItem(ep, it); err != nil {
					return err
				}
			default:
				return invalid(ep, "must be a string or an object")
			}
		}
		return nil
	default:
		return invalid("input", "must be a string or an array")
	}
}

// inputItem parses one responses input item.
func (p *parser) inputItem(path string, it map[string]any) error {
	t, hasType := it["type"].(string)
	if it["type"] != nil && !hasType {
		return invalid(path+".type", "must be a string")
	}
	p.r.priming = true
	if it["role"] != nil || t == "message" {
		return p.message(path, it)
	}
	if !hasType {
		return invalid(path, "must have a role or a type")
	}
	// Other items (function_call, function_call_output, reasoning, ...):
	// tokens_per_message plus every string value, and content-like arrays
	// by the part rules, so nothing is dropped.
	for _, k := range [...]string{"content", "output"} {
		if arr, ok := it[k].([]any); ok {
			if err := p.content(path+"."+k, arr); err != nil {
				return err
			}
		}
	}
	p.r.messages++
	p.stringValues(it, false)
	return nil
}

// toolList parses tools or legacy functions; v may be absent.
func (p *parser) toolList(field string, v any) error {
	if v == nil {
		return nil
	}
	arr, ok := v.([]any)
	if !ok {
		return invalid(field, "must be an array")
	}
	for i, e := range arr {
		tp := index(field, i)
		t, ok := e.(map[string]any)
		if !ok {
			return invalid(tp, "must be an object")
		}
		def, dp := t, tp
		if field == "tools" {
			if ty, ok := t["type"].(string); t["type"] != nil && !ok {
				return invalid(tp+".type", "must be a string")
			} else if f, present := t["function"]; present && f != nil {
				fm, ok := f.(map[string]any)
				if !ok {
					return invalid(tp+".function", "must be an object")
				}
				def, dp = fm, tp+".function"
			} else if ty != "function" {
				// A hosted tool (web_search, file_search, ...) has no
				// definition to count by the cookbook rules.
				p.r.approximate = true
				continue
			}
		}
		if err := p.function(dp, def); err != nil {
			return err
		}
	}
	return nil
}

// function counts one function definition with the cookbook's
// num_tokens_for_tools rules.
func (p *parser) function(path string, f map[string]any) error {
	r := p.r
	name, err := requiredString(f, path, "name")
	if err != nil {
		return err
	}
	desc := ""
	switch d := f["description"].(type) {
	case nil:
	case string:
		desc = d
	default:
		return invalid(path+".description", "must be a string")
	}
	r.tools.any = true
	r.tools.funcs++
	r.texts = append(r.texts, name+":"+strings.TrimSuffix(desc, "."))
	switch params := f["parameters"].(type) {
	case nil:
	case map[string]any:
		p.schemaChildren(params)
	default:
		return invalid(path+".parameters", "must be an object")
	}
	return nil
}

// schemaChildren counts what a schema contains below itself: its enum,
// its properties (prop_init, then each property), and the schemas of its
// items and anyOf/oneOf/allOf members, recursively.
func (p *parser) schemaChildren(s map[string]any) {
	r := p.r
	if items, ok := s["enum"].([]any); ok {
		r.tools.enums++
		for _, it := range items {
			r.tools.enumItems++
			r.texts = append(r.texts, schemaText(it))
		}
	}
	if props, ok := s["properties"].(map[string]any); ok && len(props) > 0 {
		r.tools.propBlocks++
		for name, ps := range props {
			r.tools.props++
			sub, _ := ps.(map[string]any)
			desc := ""
			if d, ok := sub["description"]; ok {
				desc = strings.TrimSuffix(schemaText(d), ".")
			}
			r.texts = append(r.texts, name+":"+schemaText(sub["type"])+":"+desc)
			if sub != nil {
				p.schemaChildren(sub)
			}
		}
	}
	if items, ok := s["items"].(map[string]any); ok {
		p.schemaChildren(items)
	}
	for _, k := range [...]string{"anyOf", "oneOf", "allOf"} {
		if list, ok := s[k].([]any); ok {
			for _, e := range list {
				if sub, ok := e.(map[string]any); ok {
					p.schemaChildren(sub)
				}
			}
		}
	}
}

// schemaText renders a schema value as counted text: strings as they are,
// a list of types as "a | b", anything else as compact JSON.
func schemaText(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case json.Number:
		return string(x)
	case []any:
		parts := make([]string, 0, len(x))
		for _, e := range x {
			parts = append(parts, schemaText(e))
		}
		return strings.Join(parts, " | ")
	default:
		b, err := json.Marshal(x)
		if err != nil {
			return ""
		}
		return string(b)
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

// parseInteger reads a JSON number exactly. isInt is false when the value
// has a fractional part (1.5, 1e-3); 2.0 and 1e3 are integers. big is set
// when the magnitude exceeds 10^18, in which case x only carries the sign.
func parseInteger(s string) (x int64, isInt, big bool) {
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	mant, exp := s, ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, exp = s[:i], s[i+1:]
	}
	intPart, frac := mant, ""
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		intPart, frac = mant[:i], mant[i+1:]
	}
	// The value is digits * 10^e10.
	digits := strings.TrimLeft(intPart+frac, "0")
	e10 := int64(0)
	if exp != "" {
		sign := int64(1)
		switch exp[0] {
		case '-':
			sign, exp = -1, exp[1:]
		case '+':
			exp = exp[1:]
		}
		for i := 0; i < len(exp); i++ {
			if e10 < 1_000_000 {
				e10 = e10*10 + int64(exp[i]-'0')
			}
		}
		e10 *= sign
	}
	e10 -= int64(len(frac))
	if digits == "" {
		return 0, true, false
	}
	for e10 < 0 && strings.HasSuffix(digits, "0") {
		digits = digits[:len(digits)-1]
		e10++
	}
	if e10 < 0 {
		return 0, false, false
	}
	sign := int64(1)
	if neg {
		sign = -1
	}
	if int64(len(digits))+e10 > 18 {
		return sign, true, true
	}
	v, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return sign, true, true
	}
	for ; e10 > 0; e10-- {
		v *= 10
	}
	return sign * v, true, false
}

func index(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	default:
		return "a " + fmt.Sprintf("%T", v)
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// syntaxError turns a decoding error into an InvalidError for "body".
func syntaxError(body []byte, err error) *InvalidError {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return invalid("body", fmt.Sprintf("invalid JSON at byte offset %d: %s", se.Offset, se.Error()))
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return invalid("body", fmt.Sprintf("invalid JSON at byte offset %d: unexpected end of input", len(body)))
	default:
		return invalid("body", "invalid JSON: "+err.Error())
	}
}

// invalidUTF8 locates the first invalid UTF-8 byte of body and names the
// JSON string holding it. encoding/json would silently replace it with
// U+FFFD, changing what is counted.
func invalidUTF8(body []byte) *InvalidError {
	bad := 0
	for bad < len(body) {
		r, sz := utf8.DecodeRune(body[bad:])
		if r == utf8.RuneError && sz <= 1 {
			break
		}
		bad += sz
	}
	if path := stringPathAt(body, bad); path != "" && len(path) <= maxPathBytes {
		return invalid(path, fmt.Sprintf("contains invalid UTF-8 (byte offset %d)", bad))
	}
	return invalid("body", fmt.Sprintf("invalid UTF-8 at byte offset %d", bad))
}

// maxPathBytes bounds the field path reported for invalid UTF-8; a longer
// path (deep nesting, long keys) is reported as "body".
const maxPathBytes = 256

// stringPathAt walks body's tokens and returns the JSON path of the string
// that contains byte offset off (for an object key, the path of its
// object), or "" when no string does.
func stringPathAt(body []byte, off int) string {
	type frame struct {
		obj     bool
		key     string
		idx     int
		wantKey bool
	}
	var stack []frame
	path := func(withKey bool) string {
		var b strings.Builder
		for i, f := range stack {
			if !f.obj {
				b.WriteString("[" + strconv.Itoa(f.idx) + "]")
				continue
			}
			if i == len(stack)-1 && !withKey {
				break
			}
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(f.key)
		}
		return b.String()
	}
	advance := func() {
		if len(stack) == 0 {
			return
		}
		top := &stack[len(stack)-1]
		if top.obj {
			top.wantKey = true
		} else {
			top.idx++
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	prev := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		cur := int(dec.InputOffset())
		inside := off >= prev && off < cur
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if len(stack) >= maxPathBytes/2 {
					return "" // too deep for a useful path
				}
				stack = append(stack, frame{obj: t == '{', wantKey: t == '{'})
			default:
				stack = stack[:len(stack)-1]
				advance()
			}
		case string:
			if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
				if inside {
					p := path(false)
					if p == "" {
						p = "body"
					}
					return p
				}
				stack[n-1].key = t
				stack[n-1].wantKey = false
				break
			}
			if inside {
				return path(true)
			}
			advance()
		default:
			advance()
		}
		prev = cur
	}
}
