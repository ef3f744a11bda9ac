// Anthropic's Messages shape (POST /v1/messages and its count_tokens):
// what each part contributes to the counts, and the validation of its
// shape.

package estimator

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	_ "image/gif"  // image.DecodeConfig reads a GIF's size
	_ "image/jpeg" // and a JPEG's
	_ "image/png"  // and a PNG's
	"io"
	"strings"

	_ "golang.org/x/image/webp" // and a WebP's: the four formats Claude takes
)

// Anthropic's framing, approximated: a few tokens per message and for the
// reply's start, and the system prompt Anthropic adds when tools are
// given (346 tokens for Claude 4 models with tool_choice auto or none,
// which is the largest of its published figures).
const (
	messageFraming   = 3
	replyFraming     = 3
	toolSystemPrompt = 346
)

// Anthropic's image rule: an image larger than 1568 px on its long edge,
// or than about 1.15 megapixels (1600 tokens), is scaled down first,
// keeping its aspect ratio; it then costs about w*h/750 tokens.
const (
	imageMaxEdge       = 1568
	imagePixelsPerTok  = 750
	imageMaxTokens     = 1600
	maxImageHeaderRead = 1 << 20 // bytes of an image read to find its size
)

// ParseMessages decodes and validates an Anthropic Messages body: model,
// max_tokens (required), system (a string or text blocks), messages
// (user, assistant and system turns whose content is a string or blocks: text,
// image, document, tool_use, tool_result, thinking and others), tools,
// and a thinking budget. Every failure is an *[InvalidError] naming the
// offending field. Its estimate is always approximate.
func ParseMessages(body []byte) (*Request, error) { return parseMessages(body, true) }

// ParseCountTokens is ParseMessages for a count_tokens body, which names
// no max_tokens.
func ParseCountTokens(body []byte) (*Request, error) { return parseMessages(body, false) }

func parseMessages(body []byte, needMax bool) (*Request, error) {
	obj, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	r := &Request{n: 1, source: "messages", approximate: true, messagesAPI: true, fixed: replyFraming, endUser: endUserFieldsOf(obj)}
	p := &parser{r: r}
	if err := p.messagesRequest(obj, needMax); err != nil {
		return nil, err
	}
	return r, nil
}

func (p *parser) messagesRequest(obj map[string]any, needMax bool) error {
	r := p.r
	m, err := modelField(obj)
	if err != nil {
		return err
	}
	r.model = m
	if r.serviceTier, err = serviceTierField(obj); err != nil {
		return err
	}
	maxTokens, ok, err := intField(obj, "max_tokens", 1, maxTokenField)
	if err != nil {
		return err
	}
	if !ok && needMax {
		return invalid("max_tokens", "is required")
	}
	switch s := obj["stream"].(type) {
	case nil, bool:
	default:
		return invalid("stream", "must be a boolean, not "+kind(s))
	}
	// Thinking tokens are output, within max_tokens; with interleaved
	// thinking the budget may exceed max_tokens, and then bounds the turn.
	if t := obj["thinking"]; t != nil {
		tm, ok := t.(map[string]any)
		if !ok {
			return invalid("thinking", "must be an object")
		}
		budget, _, err := intField(tm, "budget_tokens", 1, maxTokenField)
		if err != nil {
			err.Field = "thinking." + err.Field
			return err
		}
		maxTokens = max(maxTokens, budget)
	}
	r.caps[1] = maxTokens // max_tokens

	switch s := obj["system"].(type) {
	case nil:
	case string:
		r.texts = append(r.texts, s)
	case []any:
		for i, b := range s {
			if err := p.messageBlock(index("system", i), b); err != nil {
				return err
			}
		}
	default:
		return invalid("system", "must be a string or an array of text blocks")
	}

	msgs, ok := obj["messages"].([]any)
	switch {
	case obj["messages"] == nil:
		return invalid("messages", "is required")
	case !ok:
		return invalid("messages", "must be an array")
	case len(msgs) == 0:
		return invalid("messages", "must not be empty")
	case len(msgs) > MaxMessages:
		return invalid("messages", fmt.Sprintf("must have at most %d entries", MaxMessages))
	}
	for i, mv := range msgs {
		path := index("messages", i)
		msg, ok := mv.(map[string]any)
		if !ok {
			return invalid(path, "must be an object")
		}
		role, err := requiredString(msg, path, "role")
		if err != nil {
			return err
		}
		if role != "user" && role != "assistant" && role != "system" {
			return invalid(path+".role", "must be user, assistant or system")
		}
		if err := p.blockContent(path+".content", msg["content"], true); err != nil {
			return err
		}
		r.fixed += messageFraming
	}
	return p.anthropicTools(obj["tools"])
}

// blockContent parses content that is a string or an array of blocks
// (null too, unless required).
func (p *parser) blockContent(path string, v any, required bool) error {
	switch c := v.(type) {
	case nil:
		if required {
			return invalid(path, "is required")
		}
	case string:
		p.r.texts = append(p.r.texts, c)
	case []any:
		for i, b := range c {
			if err := p.messageBlock(index(path, i), b); err != nil {
				return err
			}
		}
	default:
		return invalid(path, "must be a string or an array of content blocks")
	}
	return nil
}

// optionalStrings adds m's values of keys that are strings; any other
// non-null value is refused.
func (p *parser) optionalStrings(path string, m map[string]any, keys ...string) error {
	for _, k := range keys {
		switch s := m[k].(type) {
		case nil:
		case string:
			p.r.texts = append(p.r.texts, s)
		default:
			return invalid(path+"."+k, "must be a string")
		}
	}
	return nil
}

// messageBlock parses one content block.
func (p *parser) messageBlock(path string, v any) error {
	r := p.r
	b, ok := v.(map[string]any)
	if !ok {
		return invalid(path, "must be an object")
	}
	t, err := requiredString(b, path, "type")
	if err != nil {
		return err
	}
	switch t {
	case "text":
		text, err := requiredString(b, path, "text")
		if err != nil {
			return err
		}
		r.texts = append(r.texts, text)
	case "thinking":
		text, err := requiredString(b, path, "thinking")
		if err != nil {
			return err
		}
		r.texts = append(r.texts, text)
	case "tool_use", "server_tool_use":
		if err := p.optionalStrings(path, b, "name"); err != nil {
			return err
		}
		if in := b["input"]; in != nil {
			r.texts = append(r.texts, schemaText(in))
		}
	case "tool_result":
		if err := p.blockContent(path+".content", b["content"], false); err != nil {
			return err
		}
	case "image":
		return p.imageSource(path+".source", b["source"])
	case "document", "search_result":
		if err := p.optionalStrings(path, b, "title", "context"); err != nil {
			return err
		}
		if t == "search_result" {
			if err := p.optionalStrings(path, b, "source"); err != nil {
				return err
			}
			return p.blockContent(path+".content", b["content"], false)
		}
		return p.documentSource(path+".source", b["source"])
	default:
		// redacted thinking, server tools' results and blocks newer than
		// this parser: their JSON is counted, by convention, but for the
		// images and files they inline (dataurl.go).
		p.dataURLParts(b)
		raw, err := json.Marshal(b)
		if err != nil {
			return invalid(path, "cannot be read")
		}
		r.texts = append(r.texts, string(raw))
	}
	return nil
}

// source returns a block's source object and its type.
func source(path string, v any) (map[string]any, string, *InvalidError) {
	s, ok := v.(map[string]any)
	if !ok {
		return nil, "", invalid(path, "is required, an object")
	}
	t, err := requiredString(s, path, "type")
	return s, t, err
}

// imageSource counts an image: a base64 image by its size read from its
// header, any other (a URL, a file) as one part at the model's default.
func (p *parser) imageSource(path string, v any) error {
	s, t, err := source(path, v)
	if err != nil {
		return err
	}
	if t != "base64" {
		p.r.parts++
		return nil
	}
	data, err := requiredString(s, path, "data")
	if err != nil {
		return err
	}
	n, ok := imageTokens(data)
	if !ok {
		p.r.parts++ // not an image we can read: the default, and the upstream judges it
		return nil
	}
	p.r.fixed += n
	return nil
}

// documentSource counts a document: text by its text, content blocks by
// theirs, a base64 PDF as two parts a page at the model's default, any
// other (a URL, a file, a PDF whose pages cannot be counted) as one part.
func (p *parser) documentSource(path string, v any) error {
	s, t, err := source(path, v)
	if err != nil {
		return err
	}
	switch t {
	case "text":
		data, err := requiredString(s, path, "data")
		if err != nil {
			return err
		}
		p.r.texts = append(p.r.texts, data)
	case "content":
		return p.blockContent(path+".content", s["content"], true)
	case "base64":
		data, err := requiredString(s, path, "data")
		if err != nil {
			return err
		}
		// Anthropic reads each page of a PDF as its text and as an
		// image: two parts a page, when the page count can be read.
		if pages := pdfPages(data); pages > 0 {
			p.r.parts += 2 * pages
			return nil
		}
		p.r.parts++
	default:
		p.r.parts++
	}
	return nil
}

// pdfPages counts the page objects ("/Type /Page", not "/Pages") of a
// base64 PDF; 0 when the data is not base64 or its pages are out of
// sight (in compressed object streams), and the document then counts as
// one part.
func pdfPages(data string) int64 {
	raw, err := base64.StdEncoding.DecodeString(data)
	if err != nil || !bytes.HasPrefix(raw, []byte("%PDF")) {
		return 0
	}
	var n int64
	for _, marker := range [][]byte{[]byte("/Type /Page"), []byte("/Type/Page")} {
		for rest := raw; ; {
			i := bytes.Index(rest, marker)
			if i < 0 {
				break
			}
			rest = rest[i+len(marker):]
			if len(rest) == 0 || !isNameChar(rest[0]) {
				n++
			}
		}
	}
	return n
}

// isNameChar says whether c continues a PDF name ("/Pages" after
// "/Page").
func isNameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// imageTokens is what a base64 image costs under Anthropic's rule, from
// the width and height in its header; ok is false when the data is not a
// PNG, JPEG, GIF or WebP image whose header can be read.
func imageTokens(data string) (int64, bool) {
	rd := base64.NewDecoder(base64.StdEncoding, strings.NewReader(data))
	cfg, _, err := image.DecodeConfig(&limitedReader{r: rd, n: maxImageHeaderRead})
	if err != nil || cfg.Width <= 0 || cfg.Height <= 0 {
		return 0, false
	}
	return ImageTokens(int64(cfg.Width), int64(cfg.Height)), true
}

// ImageTokens is Anthropic's published cost of a w x h image: scaled
// down, keeping its aspect ratio, to 1568 px on its long edge, then
// w*h/750 tokens rounded up, at most 1600 (the ~1.15 megapixel cap).
func ImageTokens(w, h int64) int64 {
	if w <= 0 || h <= 0 {
		return 0
	}
	if long := max(w, h); long > imageMaxEdge {
		w = max(1, w*imageMaxEdge/long)
		h = max(1, h*imageMaxEdge/long)
	}
	return min((w*h+imagePixelsPerTok-1)/imagePixelsPerTok, imageMaxTokens)
}

// limitedReader stops after n bytes, so that a header that never ends
// costs no more than n bytes of decoding.
type limitedReader struct {
	r io.Reader
	n int64
}

func (l *limitedReader) Read(b []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeaderTooLong
	}
	if int64(len(b)) > l.n {
		b = b[:l.n]
	}
	n, err := l.r.Read(b)
	l.n -= int64(n)
	return n, err
}

var errHeaderTooLong = fmt.Errorf("estimator: the image's header is longer than %d bytes", maxImageHeaderRead)

// anthropicTools counts tools: a client tool by its name, description and
// input_schema as JSON; a server tool (web search, code execution: no
// input_schema) by its JSON. Anthropic's tool-use system prompt is added
// once.
func (p *parser) anthropicTools(v any) error {
	if v == nil {
		return nil
	}
	arr, ok := v.([]any)
	if !ok {
		return invalid("tools", "must be an array")
	}
	for i, e := range arr {
		tp := index("tools", i)
		t, ok := e.(map[string]any)
		if !ok {
			return invalid(tp, "must be an object")
		}
		schema, has := t["input_schema"]
		if !has || schema == nil {
			raw, err := json.Marshal(t)
			if err != nil {
				return invalid(tp, "cannot be read")
			}
			p.r.texts = append(p.r.texts, string(raw))
			continue
		}
		if _, ok := schema.(map[string]any); !ok {
			return invalid(tp+".input_schema", "must be an object")
		}
		if _, err := requiredString(t, tp, "name"); err != nil {
			return err
		}
		if err := p.optionalStrings(tp, t, "name", "description"); err != nil {
			return err
		}
		p.r.texts = append(p.r.texts, schemaText(schema))
	}
	if len(arr) > 0 {
		p.r.fixed += toolSystemPrompt
	}
	return nil
}
