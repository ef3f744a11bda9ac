// Tool and function definitions, counted with the cookbook's
// num_tokens_for_tools rules.

package estimator

import (
	"encoding/json"
	"strings"
)

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
