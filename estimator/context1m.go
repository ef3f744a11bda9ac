package estimator

// Context1MWindow is the context window of Anthropic's 1M-context beta: a
// Messages call that carries `anthropic-beta: context-1m-...` for a model
// that offers it is served up to 1,000,000 tokens, input plus output,
// where the model's standard window is 200,000.
const Context1MWindow = 1_000_000

// context1MFamilies are the families whose 1M window is the beta's
// (Anthropic's context windows page: Claude Sonnet 4 and Sonnet 4.5); the
// later models serve 1M without it, as their table rows say.
var context1MFamilies = map[string]bool{"claude-sonnet-4": true, "claude-sonnet-4-5": true}

// WidestContextWindow is the largest window m may serve a request: its
// ContextWindow, or the 1M-context beta's for a family that offers it. It
// bounds the usage a settle may report (account.SettleBounds), which does
// not know whether the call carried the beta.
func (m Model) WidestContextWindow() int64 {
	if context1MFamilies[m.Name] {
		return max(m.ContextWindow, Context1MWindow)
	}
	return m.ContextWindow
}

// WithContext1M returns a copy of r estimated with its model's widest
// window (WidestContextWindow): the Messages face's for a call that
// carries the 1M-context beta. r itself is unchanged.
func (r *Request) WithContext1M() *Request {
	if r == nil {
		return nil
	}
	c := *r
	c.context1M = true
	return &c
}
