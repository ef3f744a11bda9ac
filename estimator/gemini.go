// The Gemini API's shape (generateContent, streamGenerateContent and
// countTokens, on AI Studio's paths and Vertex AI's): its model families,
// what each part of a body contributes to the counts, and the validation
// of its shape.

package estimator

import (
	"encoding/json"
	"fmt"
	"strings"
)

// GeminiSafetyFactorMilli scales the o200k_base count of a Gemini
// request's text, in thousandths. There is no offline Gemini tokenizer:
// Google publishes none for Gemini (its countTokens is an API call, which
// would cost every admission a round trip and fail with the upstream), so
// the estimate counts with o200k_base, whose vocabulary (about 200k
// pieces) is of the size of Gemini's (Gemma's 256k SentencePiece
// vocabulary, which Google's Gemma report says it shares with Gemini):
// English prose counts about the same in both, code and runs of
// whitespace and digits somewhat more in Gemini's, which splits digits
// one by one. 1.25 leans toward reserving more than a call uses, which
// the settle refunds from Gemini's own usageMetadata; it was not measured
// on a corpus here. The drift report per model shows an operator the
// estimate's bias (estimated input tokens above the actual ones: the
// factor is high for their traffic), and every Gemini estimate is
// approximate.
const GeminiSafetyFactorMilli = 1250

// ScaleGeminiCount is an o200k_base count of n tokens of Gemini text times
// GeminiSafetyFactorMilli, rounded up: how a stream's output is counted
// when the stream breaks before its usage is final.
func ScaleGeminiCount(n int64) int64 { return scaleCount(n, GeminiSafetyFactorMilli) }

// scaleCount is n times factor thousandths, rounded up.
func scaleCount(n, factorMilli int64) int64 {
	return (max(n, 0)*factorMilli + 999) / 1000
}

// textFactorMilli is the factor, in thousandths, r's o200k_base counts
// are scaled by for the model family: 0 for a wire whose tokenizer is the
// encoding's own.
func (r *Request) textFactorMilli(family string) int64 {
	switch {
	case r.messagesAPI:
		return MessagesSafetyFactorMilli(family)
	case r.gemini:
		return GeminiSafetyFactorMilli
	}
	return 0
}

// Google's framing is unpublished: a few tokens per content turn, as for
// the other wires.
const geminiTurnFraming = 3

// thinkingModelLimit is Request.thinking for a call that asks for
// thinking with no budget (a thinkingLevel, or a budget of -1: dynamic):
// the model's output limit is reserved for its thoughts.
const thinkingModelLimit = -1

// Google's model pages (December 2026): every current family takes
// 1,048,576 input tokens; Gemini 2.5 and 3.x write up to 65,536, 2.0 up
// to 8,192. Gemini's input limit does not include its output, so the
// window a call may fill is their sum. A media part (an image, a file, an
// inline blob) whose size tokengate does not read costs the part default:
// 1120 tokens, Gemini 3's cost of an image at its default (high) media
// resolution, which is above Gemini 2.x's 258 tokens per 768 px tile for
// images up to about 1536 x 1152; a video or long audio costs more (263
// and 32 tokens a second), which the settle charges. A preview name
// ("gemini-3-pro-preview") finds its family by the table's suffix rule, a
// variant ("gemini-2.0-flash-001") by its prefix rule.
const (
	geminiInputLimit = 1_048_576
	geminiPartTokens = 1120
)

var geminiFamilies = []Model{
	{Name: "gemini-3.1-pro", DefaultOutputTokens: 65536},
	{Name: "gemini-3-pro", DefaultOutputTokens: 65536},
	{Name: "gemini-3-flash", DefaultOutputTokens: 65536},
	{Name: "gemini-2.5-pro", DefaultOutputTokens: 65536},
	{Name: "gemini-2.5-flash", DefaultOutputTokens: 65536},
	{Name: "gemini-2.5-flash-lite", DefaultOutputTokens: 65536},
	{Name: "gemini-2.0-flash", DefaultOutputTokens: 8192},
	{Name: "gemini-2.0-flash-lite", DefaultOutputTokens: 8192},
}

// geminiModels returns geminiFamilies with the encoding, the window, the
// part default and Google's weights: input and output 1.0 (the budget is
// counted in tokens, as for every seeded family), cached content 0.1 of an
// input token (Google's context-caching price for Gemini 2.5 and 3), 0.25
// for Gemini 2.0. Gemini bills no cache writes apart from storage, which
// no call's usage states. Google's embedding models (gemini_embed.go)
// follow, input only, their window the limit per content.
func geminiModels() []Model {
	ms := make([]Model, len(geminiFamilies), len(geminiFamilies)+len(geminiEmbeddingModels))
	for i, m := range geminiFamilies {
		m.Encoding = EncodingO200K
		m.ContextWindow = geminiInputLimit + m.DefaultOutputTokens
		m.PartTokens = geminiPartTokens
		m.InputWeightMicro, m.OutputWeightMicro = WeightOne, WeightOne
		m.CachedInputWeightMicro = WeightOne / 10
		if strings.HasPrefix(m.Name, "gemini-2.0-") {
			m.CachedInputWeightMicro = WeightOne / 4
		}
		ms[i] = m
	}
	for _, m := range geminiEmbeddingModels {
		m.Encoding, m.ContextWindow, m.DefaultOutputTokens, m.PartTokens = EncodingO200K, geminiEmbeddingWindow, 1, 1
		m.InputWeightMicro, m.OutputWeightMicro, m.InputOnly = WeightOne, WeightOne, true
		ms = append(ms, m)
	}
	return ms
}

// ParseGemini decodes and validates a Gemini generateContent (or
// streamGenerateContent) body for model, which the call names in its URL's
// path: contents (text, inlineData, fileData, functionCall,
// functionResponse, executableCode and codeExecutionResult parts),
// systemInstruction, tools and generationConfig. Its output is reserved as
// maxOutputTokens x candidateCount plus the thinking budget
// (thinkingConfig.thinkingBudget, or the model's output limit for a
// thinkingLevel or a dynamic budget of -1); without maxOutputTokens, the
// model's output limit per candidate, which bounds its thoughts too.
// Field names are Google's JSON names; their snake_case forms, which
// Google's REST API also takes, are read too. Every failure is an
// *[InvalidError] naming the offending field. Its estimate is always
// approximate (GeminiSafetyFactorMilli).
func ParseGemini(model string, body []byte) (*Request, error) {
	obj, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	return parseGemini(model, obj, "")
}

// ParseGeminiCount is ParseGemini for a countTokens body: its contents
// (with Vertex's systemInstruction, tools and generationConfig), or a
// whole generateContentRequest.
func ParseGeminiCount(model string, body []byte) (*Request, error) {
	obj, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	if v, name := geminiField(obj, "generateContentRequest", "generate_content_request"); v != nil {
		inner, ok := v.(map[string]any)
		if !ok {
			return nil, invalid(name, "must be an object")
		}
		return parseGemini(model, inner, name+".")
	}
	return parseGemini(model, obj, "")
}

func parseGemini(model string, obj map[string]any, prefix string) (*Request, error) {
	if err := geminiModel(model); err != nil {
		return nil, err
	}
	r := &Request{model: model, n: 1, source: prefix + "contents", approximate: true, gemini: true, endUser: endUserFieldsOf(obj)}
	g := &geminiParser{p: parser{r: r}, prefix: prefix}
	if err := g.request(obj); err != nil {
		return nil, err
	}
	return r, nil
}

// geminiModel checks the model named in the path, which the admission
// stores.
func geminiModel(model string) *InvalidError {
	switch {
	case model == "":
		return invalid("model", "is required, in the URL's path (models/{model}:generateContent)")
	case len(model) > MaxModelNameBytes:
		return invalid("model", fmt.Sprintf("must be at most %d bytes", MaxModelNameBytes))
	case strings.IndexByte(model, 0) >= 0:
		return invalid("model", `must not contain a NUL character (\u0000)`)
	}
	return nil
}

// geminiField is m's value of a field by its JSON name or its snake_case
// name, and the name it came by.
func geminiField(m map[string]any, camel, snake string) (any, string) {
	if v, ok := m[camel]; ok && v != nil {
		return v, camel
	}
	if v, ok := m[snake]; ok && v != nil {
		return v, snake
	}
	return nil, camel
}

type geminiParser struct {
	p      parser
	prefix string // "generateContentRequest." for a count's inner request
}

func (g *geminiParser) request(obj map[string]any) error {
	r := g.p.r
	if err := g.generationConfig(obj); err != nil {
		return err
	}
	contents, ok := obj["contents"].([]any)
	switch {
	case obj["contents"] == nil:
		return invalid(g.prefix+"contents", "is required")
	case !ok:
		return invalid(g.prefix+"contents", "must be an array of contents")
	case len(contents) == 0:
		return invalid(g.prefix+"contents", "must not be empty")
	case len(contents) > MaxMessages:
		return invalid(g.prefix+"contents", fmt.Sprintf("must have at most %d entries", MaxMessages))
	}
	for i, c := range contents {
		if err := g.content(index(g.prefix+"contents", i), c, true); err != nil {
			return err
		}
	}
	if v, name := geminiField(obj, "systemInstruction", "system_instruction"); v != nil {
		if err := g.content(g.prefix+name, v, false); err != nil {
			return err
		}
	}
	if obj["tools"] != nil {
		if err := g.tools(obj["tools"]); err != nil {
			return err
		}
	}
	r.fixed += geminiTurnFraming // the reply's turn
	return nil
}

// generationConfig reads the output cap, the candidates and the thinking
// budget.
func (g *geminiParser) generationConfig(obj map[string]any) error {
	v, name := geminiField(obj, "generationConfig", "generation_config")
	if v == nil {
		return nil
	}
	path := g.prefix + name
	cfg, ok := v.(map[string]any)
	if !ok {
		return invalid(path, "must be an object")
	}
	r := g.p.r
	maxOut, field, err := geminiInt(cfg, path, "maxOutputTokens", "max_output_tokens", 1, maxTokenField)
	if err != nil {
		return err
	}
	r.caps[2], r.capField = maxOut, field
	n, _, err := geminiInt(cfg, path, "candidateCount", "candidate_count", 1, MaxChoices)
	if err != nil {
		return err
	}
	r.n = max(n, 1)
	tv, tname := geminiField(cfg, "thinkingConfig", "thinking_config")
	if tv == nil {
		return nil
	}
	tpath := path + "." + tname
	tc, ok := tv.(map[string]any)
	if !ok {
		return invalid(tpath, "must be an object")
	}
	budget, budgetField, err := geminiInt(tc, tpath, "thinkingBudget", "thinking_budget", -1, maxTokenField)
	if err != nil {
		return err
	}
	level, lname := geminiField(tc, "thinkingLevel", "thinking_level")
	if _, ok := level.(string); level != nil && !ok {
		return invalid(tpath+"."+lname, "must be a string")
	}
	if maxOut == 0 {
		return nil // the model's output limit per candidate bounds its thoughts too
	}
	switch {
	case budgetField != "" && budget == -1:
		r.thinking = thinkingModelLimit
	case budgetField != "":
		r.thinking = budget // 0: thinking off
	case level != nil:
		r.thinking = thinkingModelLimit
	}
	return nil
}

// geminiInt reads an optional integer field of m by either of its names:
// its value and the path it was named by ("" when absent).
func geminiInt(m map[string]any, path, camel, snake string, lo, hi int64) (int64, string, *InvalidError) {
	_, name := geminiField(m, camel, snake)
	x, ok, err := intField(m, name, lo, hi)
	if err != nil {
		err.Field = path + "." + err.Field
		return 0, "", err
	}
	if !ok {
		return 0, "", nil
	}
	return x, path + "." + name, nil
}

// content reads one Content: its role and its parts.
func (g *geminiParser) content(path string, v any, turn bool) error {
	c, ok := v.(map[string]any)
	if !ok {
		return invalid(path, "must be an object with parts")
	}
	switch role := c["role"].(type) {
	case nil:
	case string:
		if role != "" && role != "user" && role != "model" && role != "function" && role != "tool" && role != "system" {
			return invalid(path+".role", "must be user or model")
		}
	default:
		return invalid(path+".role", "must be a string")
	}
	parts, ok := c["parts"].([]any)
	switch {
	case c["parts"] == nil && turn:
		return invalid(path+".parts", "is required")
	case c["parts"] == nil:
	case !ok:
		return invalid(path+".parts", "must be an array of parts")
	}
	for i, pv := range parts {
		if err := g.part(index(path+".parts", i), pv); err != nil {
			return err
		}
	}
	if turn {
		g.p.r.fixed += geminiTurnFraming
	}
	return nil
}

// part reads one Part by the data it carries: text by its text, a
// function call or response by its name and JSON, code and its result by
// their text, and an inline blob or a file as one media part at the
// model's part default (its base64 is never counted as text). A part of a
// kind this parser does not know is counted as its JSON, but for the
// base64 data URLs it inlines.
func (g *geminiParser) part(path string, v any) error {
	r := g.p.r
	pt, ok := v.(map[string]any)
	if !ok {
		return invalid(path, "must be an object")
	}
	if t, has := pt["text"]; has && t != nil {
		s, ok := t.(string)
		if !ok {
			return invalid(path+".text", "must be a string")
		}
		r.texts = append(r.texts, s)
		return nil
	}
	if bv, name := geminiField(pt, "inlineData", "inline_data"); bv != nil {
		b, ok := bv.(map[string]any)
		if !ok {
			return invalid(path+"."+name, "must be an object")
		}
		if _, err := requiredString(b, path+"."+name, "data"); err != nil {
			return err
		}
		r.parts++
		return nil
	}
	if fv, name := geminiField(pt, "fileData", "file_data"); fv != nil {
		f, ok := fv.(map[string]any)
		if !ok {
			return invalid(path+"."+name, "must be an object")
		}
		uri, uname := geminiField(f, "fileUri", "file_uri")
		if _, ok := uri.(string); !ok {
			return invalid(path+"."+name+"."+uname, "is required, a string")
		}
		r.parts++
		return nil
	}
	for _, k := range [...][2]string{{"functionCall", "function_call"}, {"functionResponse", "function_response"}} {
		fv, name := geminiField(pt, k[0], k[1])
		if fv == nil {
			continue
		}
		f, ok := fv.(map[string]any)
		if !ok {
			return invalid(path+"."+name, "must be an object")
		}
		if _, err := requiredString(f, path+"."+name, "name"); err != nil {
			return err
		}
		g.p.dataURLParts(f)
		r.texts = append(r.texts, f["name"].(string))
		for _, arg := range [...]string{"args", "response"} {
			if a := f[arg]; a != nil {
				r.texts = append(r.texts, schemaText(a))
			}
		}
		return nil
	}
	for _, k := range [...][3]string{{"executableCode", "executable_code", "code"}, {"codeExecutionResult", "code_execution_result", "output"}} {
		cv, name := geminiField(pt, k[0], k[1])
		if cv == nil {
			continue
		}
		c, ok := cv.(map[string]any)
		if !ok {
			return invalid(path+"."+name, "must be an object")
		}
		return g.p.optionalStrings(path+"."+name, c, k[2])
	}
	// Metadata alone (a thought signature) or a kind newer than this
	// parser: counted as its JSON, by convention, without its signature.
	rest := make(map[string]any, len(pt))
	for k, e := range pt {
		if k != "thoughtSignature" && k != "thought_signature" && k != "thought" {
			rest[k] = e
		}
	}
	if len(rest) == 0 {
		return nil
	}
	g.p.dataURLParts(rest)
	raw, err := json.Marshal(rest)
	if err != nil {
		return invalid(path, "cannot be read")
	}
	r.texts = append(r.texts, string(raw))
	return nil
}

// tools reads Tool objects: each function declaration by its name,
// description and parameters (or parametersJsonSchema) as JSON; a built-in
// tool (googleSearch, codeExecution, urlContext and others) by its JSON.
func (g *geminiParser) tools(v any) error {
	r := g.p.r
	arr, ok := v.([]any)
	if !ok {
		return invalid(g.prefix+"tools", "must be an array")
	}
	for i, e := range arr {
		tp := index(g.prefix+"tools", i)
		t, ok := e.(map[string]any)
		if !ok {
			return invalid(tp, "must be an object")
		}
		for k, tv := range t {
			if k != "functionDeclarations" && k != "function_declarations" {
				r.texts = append(r.texts, k+" "+schemaText(tv))
				continue
			}
			decls, ok := tv.([]any)
			if !ok && tv != nil {
				return invalid(tp+"."+k, "must be an array")
			}
			for j, d := range decls {
				dp := index(tp+"."+k, j)
				fd, ok := d.(map[string]any)
				if !ok {
					return invalid(dp, "must be an object")
				}
				if _, err := requiredString(fd, dp, "name"); err != nil {
					return err
				}
				if err := g.p.optionalStrings(dp, fd, "name", "description"); err != nil {
					return err
				}
				for _, s := range [...]string{"parameters", "parametersJsonSchema", "parameters_json_schema", "response", "responseJsonSchema"} {
					if sv := fd[s]; sv != nil {
						if _, ok := sv.(map[string]any); !ok {
							return invalid(dp+"."+s, "must be an object")
						}
						r.texts = append(r.texts, schemaText(sv))
					}
				}
			}
		}
	}
	return nil
}
