package proxy

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/tokengate/tokengate/estimator"
)

// messagesEvent is what the proxy reads of one Messages stream event.
type messagesEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Usage *anthropicUsage `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Thinking    string `json:"thinking"`
		PartialJSON string `json:"partial_json"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
}

// streamMessages relays a Messages stream event by event (message_start,
// content_block_*, message_delta, message_stop, ping, error) as they come,
// and settles from the usage of message_start (input and the cache's) and
// message_delta (output, and any total it restates). A stream that ends
// with message_stop is settled before message_stop is forwarded, so a
// client that saw its stream end sees the budget settled. A stream that
// breaks, or whose client leaves, is settled with what was streamed so
// far: message_start's input (else the estimate's) and the larger of the
// last output count and the streamed text, thinking and tool input,
// counted as the estimate counts (o200k_base times the family's safety
// factor). A stream the upstream broke off without an error event is
// broken off to the client too.
func (c *call) streamMessages(w http.ResponseWriter, resp *http.Response) {
	var streamed strings.Builder
	var u messagesUsage
	started, settled, sawError := false, false, false
	clientGone := relayEvents(w, resp, func(data []byte) bool {
		var ev messagesEvent
		if len(data) == 0 || json.Unmarshal(data, &ev) != nil {
			return true
		}
		switch ev.Type {
		case "message_start":
			if ev.Message != nil && ev.Message.Usage != nil {
				u.merge(ev.Message.Usage)
				started = true
			}
		case "content_block_delta":
			if ev.Delta != nil {
				streamed.WriteString(ev.Delta.Text)
				streamed.WriteString(ev.Delta.Thinking)
				streamed.WriteString(ev.Delta.PartialJSON)
			}
		case "message_delta":
			u.merge(ev.Usage)
		case "error":
			sawError = true
		case "message_stop":
			if !settled {
				c.settleStreamed(u, started, true, "")
				settled = true
			}
		}
		return true
	})
	if settled {
		return
	}
	c.settleStreamed(u, started, false, streamed.String())
	if !clientGone && !sawError {
		// The upstream broke off without saying so: break the client's
		// connection too, so that its SDK reports a broken stream instead
		// of a short answer.
		panic(http.ErrAbortHandler)
	}
}

// settleStreamed settles a stream from its usage: as reported when it
// finished, else with what it streamed so far counted as output.
func (c *call) settleStreamed(u messagesUsage, started, finished bool, streamed string) {
	if !started {
		// No message_start: nothing says what the input was; the
		// estimate's input stands, without any cache.
		u = messagesUsage{input: c.est.InputTokens, output: u.output}
	}
	if !finished && streamed != "" {
		if n, err := estimator.CountText(estimator.EncodingO200K, streamed); err == nil {
			u.output = max(u.output, estimator.ScaleMessagesCount(c.est.Family, int64(n)))
		}
	}
	c.settleMessages(u)
}
