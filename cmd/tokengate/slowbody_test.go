package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestSlowBodiesAreCut: many connections sending their bodies at one byte
// every 2 s, unauthenticated too, to the API, the dashboard's /login and
// the proxy, are all answered and closed soon after the body read timeout
// (--body-read-timeout, 1 s here), instead of being held for as long as the
// client keeps trickling.
func TestSlowBodiesAreCut(t *testing.T) {
	t.Parallel()
	addr, proxyAddr := freeAddr(t), freeAddr(t)
	startServe(t, []string{"proxy", "--database-url", pgtest.EmptyURL(t), "--migrate", "--addr", addr, "--proxy-addr", proxyAddr,
		"--upstream", "http://127.0.0.1:1", "--body-read-timeout", "1s", "--shutdown-timeout", "5s", "--max-conns", "4", "--log-level", "error"},
		"http://"+addr+"/readyz", "http://"+proxyAddr+"/v1/models")

	const perTarget = 30
	targets := []struct{ name, addr, request string }{
		{"API, authenticated route without a key", addr, "POST /v1/admissions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"},
		{"API, wrong key", addr, "POST /v1/admissions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tg_nosuchkey_0000\r\nContent-Type: application/json\r\n"},
		{"dashboard /login", addr, "POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"},
		{"proxy, wrong key", proxyAddr, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tg_nosuchkey_0000\r\nContent-Type: application/json\r\n"},
	}
	type result struct {
		name   string
		status int
		took   time.Duration
		err    error
	}
	stop := make(chan struct{})
	var writers sync.WaitGroup
	defer func() { close(stop); writers.Wait() }()
	results := make(chan result, perTarget*len(targets))
	start := time.Now()
	for _, tg := range targets {
		for range perTarget {
			conn, err := net.Dial("tcp", tg.addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			if _, err := io.WriteString(conn, tg.request+"Content-Length: 100\r\n\r\n{"); err != nil {
				t.Fatal(err)
			}
			writers.Add(1)
			go func() { // the slow client: one byte every 2 s
				defer writers.Done()
				tick := time.NewTicker(2 * time.Second)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := conn.Write([]byte(" ")); err != nil {
							return
						}
					}
				}
			}()
			go func() { // the answer, then the end of the connection
				_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
				br := bufio.NewReader(conn)
				r := result{name: tg.name}
				resp, err := http.ReadResponse(br, nil)
				if err == nil {
					r.status = resp.StatusCode
					_, _ = io.Copy(io.Discard, resp.Body)
					if _, err = br.ReadByte(); err == io.EOF || isReset(err) {
						err = nil // closed by the server
					} else if err == nil {
						err = errors.New("the connection carried more after the answer")
					}
				}
				r.took, r.err = time.Since(start), err
				results <- r
			}()
		}
	}
	statuses := map[string]map[int]int{}
	for range perTarget * len(targets) {
		r := <-results
		if r.err != nil {
			t.Fatalf("%s: %v after %s: the connection was not answered and closed", r.name, r.err, r.took)
		}
		if r.took > 8*time.Second {
			t.Fatalf("%s: held %s with a 1 s body read timeout", r.name, r.took)
		}
		if statuses[r.name] == nil {
			statuses[r.name] = map[int]int{}
		}
		statuses[r.name][r.status]++
	}
	t.Logf("answers: %v, all closed within %s", statuses, time.Since(start))
	// A wrong key is 401 until the address's failed-auth allowance is
	// spent, then 429; the form's body is read, and late: 408.
	for name, answers := range statuses {
		for status := range answers {
			ok := status == http.StatusUnauthorized || status == http.StatusTooManyRequests
			if name == "dashboard /login" {
				ok = status == http.StatusRequestTimeout
			}
			if !ok {
				t.Errorf("%s: answers %v", name, answers)
			}
		}
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}
