package proxy

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
)

// framing splits a streamed answer into its events, as the wire frames
// them: next reads one event from rd and gives its raw bytes (relayed to
// the client exactly as they came) and its data (shown to the wire's
// streamReader; nil for bytes between events). raw is nil when nothing
// whole was read; err (io.EOF, or the break) ends the stream. A dialect
// says which framing an answer takes (dialect.framing), so that every
// wire's stream is relayed by the one loop below as each event completes.
type framing interface {
	next(rd *bufio.Reader) (raw, data []byte, err error)
	// closed says whether the stream read so far ends as its framing
	// must (a JSON array its "]"; an SSE stream at any event's end): a
	// stream whose usage was final but that broke off before it closed is
	// broken off to the client too, so that it never reads a short body
	// as whole.
	closed() bool
}

// sseFraming is a stream of server-sent events when h says so (every
// wire's streamed form but Gemini's JSON array), else nil: a whole answer.
func sseFraming(h http.Header) framing {
	if strings.HasPrefix(h.Get("Content-Type"), "text/event-stream") {
		return &sseEvents{}
	}
	return nil
}

// sseEvents frames server-sent events: an event ends at a blank line, and
// its data is its data: lines joined. An event the stream broke off in
// the middle of is never relayed. Its buffers are reused from one event
// to the next (what next returns is read before it is called again), so a
// stream of many events allocates for its largest, not for each.
type sseEvents struct{ rawBuf, dataBuf bytes.Buffer }

func (*sseEvents) closed() bool { return true }

func (e *sseEvents) next(rd *bufio.Reader) (raw, data []byte, err error) {
	rawBuf, dataBuf := &e.rawBuf, &e.dataBuf
	rawBuf.Reset()
	dataBuf.Reset()
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 0 {
			rawBuf.Write(line)
			trimmed := bytes.TrimRight(line, "\r\n")
			if d, ok := bytes.CutPrefix(trimmed, []byte("data:")); ok {
				dataBuf.Write(bytes.TrimPrefix(d, []byte(" ")))
			}
			if len(trimmed) == 0 { // the event is complete
				return rawBuf.Bytes(), dataBuf.Bytes(), nil
			}
		}
		if err != nil {
			return nil, nil, err
		}
	}
}

// jsonArray frames a stream sent as one JSON array (Gemini's
// streamGenerateContent without alt=sse): each element is an event, its
// raw bytes the separators before it and the element, sent on as soon as
// its closing brace arrives (the comma after it comes with the next one).
// The bytes after the last element ("]") are relayed with no data. An
// element the stream broke off in the middle of is never relayed, so a
// client sees a broken array, never a truncated element.
type jsonArray struct {
	depth int // 0 before the array opens and after it closes, else 1 between elements
	done  bool
	buf   bytes.Buffer // reused from one element to the next, as sseEvents' are
}

func (a *jsonArray) closed() bool { return a.done }

func (a *jsonArray) next(rd *bufio.Reader) (raw, data []byte, err error) {
	buf := &a.buf
	buf.Reset()
	start := -1 // where the element began in buf
	inString, escaped := false, false
	for {
		c, err := rd.ReadByte()
		if err != nil {
			if start < 0 && buf.Len() > 0 {
				return buf.Bytes(), nil, err // what closes the array
			}
			return nil, nil, err
		}
		buf.WriteByte(c)
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			a.depth++
			if a.depth == 2 && start < 0 {
				start = buf.Len() - 1
			}
		case c == '}' || c == ']':
			a.depth--
			if a.depth == 1 && start >= 0 {
				return buf.Bytes(), buf.Bytes()[start:], nil
			}
			if a.depth <= 0 {
				a.depth, a.done = 0, true
				return buf.Bytes(), nil, nil // the array closed
			}
		}
	}
}

// relayEvents relays a streamed answer to the client event by event, as
// fr frames it and each event completes, after the upstream's status and
// headers. Each event's data is shown to event first, which says whether
// the event goes on to the client; the caller settles from what event saw.
// It stops reading when the stream ends, whole or broken, or when the
// client is gone (the request's context then cancels the upstream call),
// and reports whether the client went away.
func relayEvents(w http.ResponseWriter, resp *http.Response, fr framing, event func(data []byte) (forward bool)) (clientGone bool) {
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		raw, data, err := fr.next(rd)
		if raw != nil && event(data) {
			if _, werr := w.Write(raw); werr != nil {
				return true
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if err != nil {
			return false
		}
	}
}
