// Parsing of the three input fields (messages, prompt, input): what each
// contributes to the counts, and the validation of its shape.

package estimator

import (
	"encoding/json"
	"fmt"
	"strings"
)

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
	// An input_image's image_url and an input_file's file_data may inline
	// the image or file: parts, not text (dataurl.go).
	for k, v := range it {
		if s, ok := v.(string); ok {
			if _, ok := base64DataURL(s); ok {
				it[k] = ""
				p.r.parts++
			}
		}
	}
	p.stringValues(it, false)
	return nil
}
