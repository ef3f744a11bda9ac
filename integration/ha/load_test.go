//go:build ha

package ha_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

var client = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

// shot is one HTTP call of the load: when it was sent and answered, and
// what it got.
type shot struct {
	start, end time.Time
	code       int    // 0: no HTTP answer (the error is in typ)
	typ        string // the error's type
	id         string // the admission's id, on 201
	retryAfter time.Duration
}

func admit(url, key, idemKey string) shot {
	s := shot{start: time.Now()}
	body := `{"model":"gpt-4o-mini","prompt":"hello","max_tokens":10}`
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/admissions", bytes.NewBufferString(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Idempotency-Key", idemKey)
	resp, err := client.Do(req)
	if err != nil {
		s.end, s.typ = time.Now(), err.Error()
		return s
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	s.end, s.code = time.Now(), resp.StatusCode
	var v struct {
		ID    string `json:"id"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &v)
	s.id, s.typ = v.ID, v.Error.Type
	if s.code >= 500 && s.typ != "store_unavailable" && s.typ != "store_outcome_unknown" && s.typ != "store_busy" {
		s.typ = fmt.Sprintf("%s (%s)", v.Error.Type, v.Error.Message) // kept whole for the report
		if v.Error.Type == "" {
			s.typ = strings.TrimSpace(string(raw))
		}
	}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		s.retryAfter = time.Duration(secs) * time.Second
	}
	return s
}

// load is callers admitting through the replicas, each with a new
// Idempotency-Key per admission. A caller that is not answered 201 retries
// the same key, on the other replica, after the answer's Retry-After (250 ms
// after an error without one), until it is admitted: as a client that must
// not lose its request, nor pay for it twice, would.
type load struct {
	t     *testing.T
	mu    sync.Mutex
	shots []shot
	final map[string]string // Idempotency-Key -> the admission it got
	stop  chan struct{}
	wg    sync.WaitGroup
}

// keyDeadline bounds how long a caller retries one key: far beyond any
// failover the tests cause.
const keyDeadline = 90 * time.Second

// startLoad starts callers (see load), plus one more, the probe, which
// retries every 50 ms instead of after the Retry-After (1 s for
// store_unavailable): it times the recovery to within 50 ms rather than to
// within the callers' backoff.
func startLoad(t *testing.T, replicas []*replica, key, prefix string, callers int) *load {
	l := &load{t: t, final: map[string]string{}, stop: make(chan struct{})}
	for w := range callers + 1 {
		probe := w == callers
		l.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				idem := fmt.Sprintf("%s-%d-%d", prefix, w, i)
				began := time.Now()
				for attempt := 0; ; attempt++ {
					s := admit(replicas[(w+i+attempt)%len(replicas)].url, key, idem)
					l.mu.Lock()
					l.shots = append(l.shots, s)
					if s.code == http.StatusCreated {
						if prev, ok := l.final[idem]; ok && prev != s.id {
							t.Errorf("key %s admitted as %s and as %s", idem, prev, s.id)
						}
						l.final[idem] = s.id
					}
					l.mu.Unlock()
					if s.code == http.StatusCreated {
						break
					}
					if time.Since(began) > keyDeadline {
						t.Errorf("key %s not admitted after %s; last answer %d %s", idem, keyDeadline, s.code, s.typ)
						return
					}
					wait := s.retryAfter
					if probe {
						wait = 50 * time.Millisecond
					} else if wait == 0 {
						wait = 250 * time.Millisecond
					}
					time.Sleep(wait) // real time: a client's pause before its retry (Retry-After), as a client's
				}
			}
		})
	}
	return l
}

// finish stops new keys and waits for every caller to have its last key
// admitted.
func (l *load) finish() {
	close(l.stop)
	l.wg.Wait()
}

// snapshot copies the shots so far.
func (l *load) snapshot() []shot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]shot(nil), l.shots...)
}

// firstCreatedAfter is the first 201 answered to a call sent after t0.
func (l *load) firstCreatedAfter(t0 time.Time) (time.Time, bool) {
	var first time.Time
	for _, s := range l.snapshot() {
		if s.code == http.StatusCreated && s.start.After(t0) && (first.IsZero() || s.end.Before(first)) {
			first = s.end
		}
	}
	return first, !first.IsZero()
}

// createdSince counts the 201s answered after t0.
func (l *load) createdSince(t0 time.Time) int {
	n := 0
	for _, s := range l.snapshot() {
		if s.code == http.StatusCreated && s.end.After(t0) {
			n++
		}
	}
	return n
}

// tally counts the answers by status and type. expected holds those a
// failover may give: 201, and the 503s of the failure policy (reject):
// store_unavailable (nothing decided), store_outcome_unknown (the
// connection died after COMMIT was sent; the retry with the same key
// settles it) and store_busy (a request's turn did not come in time while
// the pool reconnected). Everything else, a 500 above all, is unexpected.
type tally struct {
	expected, unexpected map[string]int
	lastRefusal          time.Time // the last 503 answered
	firstRefusal         time.Time
	total                int
}

func (l *load) tally() tally {
	tl := tally{expected: map[string]int{}, unexpected: map[string]int{}}
	for _, s := range l.snapshot() {
		tl.total++
		k := fmt.Sprintf("%d %s", s.code, s.typ)
		switch {
		case s.code == http.StatusCreated:
			tl.expected["201"]++
		case s.code == http.StatusServiceUnavailable &&
			(s.typ == "store_unavailable" || s.typ == "store_outcome_unknown" || s.typ == "store_busy"):
			tl.expected[k]++
			if s.end.After(tl.lastRefusal) {
				tl.lastRefusal = s.end
			}
			if tl.firstRefusal.IsZero() || s.end.Before(tl.firstRefusal) {
				tl.firstRefusal = s.end
			}
		default:
			tl.unexpected[k]++
		}
	}
	return tl
}

// checkLedger asserts, on the node pool reaches (the primary), that every
// key admitted is charged exactly once: one admission per key in
// idempotency_keys, the admission the client was answered, and one reserve
// entry in the ledger for it; and that nothing else was charged.
func checkLedger(t *testing.T, pool *pgxpool.Pool, tenant string, final map[string]string) {
	t.Helper()
	keys := map[string]string{}
	rows, err := pool.Query(ctx, `SELECT key, admission_id FROM idempotency_keys WHERE tenant_id = $1`, tenant)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k, id string
		if err := rows.Scan(&k, &id); err != nil {
			t.Fatal(err)
		}
		keys[k] = id
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	reserves := map[string]int{}
	rows, err = pool.Query(ctx, `SELECT admission_id, count(*) FROM ledger_entries WHERE tenant_id = $1 AND kind = 'reserve' GROUP BY 1`, tenant)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		reserves[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var admissions int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM admissions WHERE tenant_id = $1`, tenant).Scan(&admissions); err != nil {
		t.Fatal(err)
	}
	var lost, twice []string
	for idem, id := range final {
		if keys[idem] != id {
			lost = append(lost, fmt.Sprintf("%s: answered %s, stored %q", idem, id, keys[idem]))
		}
		if reserves[id] != 1 {
			twice = append(twice, fmt.Sprintf("%s (%s): %d reserves", idem, id, reserves[id]))
		}
	}
	sort.Strings(lost)
	sort.Strings(twice)
	if len(lost) > 0 {
		t.Errorf("%d admissions answered 201 are not in the ledger as answered, e.g. %v", len(lost), lost[:min(5, len(lost))])
	}
	if len(twice) > 0 {
		t.Errorf("%d admissions are not reserved exactly once, e.g. %v", len(twice), twice[:min(5, len(twice))])
	}
	if len(keys) != len(final) || len(reserves) != len(final) || admissions != len(final) {
		t.Errorf("%d keys admitted, but the primary holds %d idempotency keys, %d admissions and %d reserve entries",
			len(final), len(keys), admissions, len(reserves))
	}
}
