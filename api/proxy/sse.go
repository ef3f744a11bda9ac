package proxy

import (
	"bufio"
	"bytes"
	"net/http"
)

// relayEvents relays an SSE answer to the client event by event, as each
// completes, after the upstream's status and headers. Each event's data
// (its data: lines joined) is shown to event first, which says whether the
// event goes on to the client; the caller settles from what event saw. It
// stops reading when the stream ends, whole or broken, or when the client
// is gone (the request's context then cancels the upstream call), and
// reports whether the client went away.
func relayEvents(w http.ResponseWriter, resp *http.Response, event func(data []byte) (forward bool)) (clientGone bool) {
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	var raw, data bytes.Buffer
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 0 {
			raw.Write(line)
			trimmed := bytes.TrimRight(line, "\r\n")
			if d, ok := bytes.CutPrefix(trimmed, []byte("data:")); ok {
				data.Write(bytes.TrimPrefix(d, []byte(" ")))
			}
			if len(trimmed) == 0 { // the event is complete
				if event(data.Bytes()) && !clientGone {
					if _, werr := w.Write(raw.Bytes()); werr != nil {
						clientGone = true
					} else if flusher != nil {
						flusher.Flush()
					}
				}
				raw.Reset()
				data.Reset()
				if clientGone {
					return true
				}
			}
		}
		if err != nil {
			return clientGone
		}
	}
}
