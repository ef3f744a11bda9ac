package ledger

import (
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/entry_query_desc.sql
	entryQueryDescSQL string
	//go:embed sql/entry_query_asc.sql
	entryQueryAscSQL string
	//go:embed sql/kind_counts.sql
	kindCountsSQL string
)

// Filter selects ledger entries. Empty fields do not filter.
type Filter struct {
	TenantID    string
	Kind        Kind
	Model       string
	AdmissionID string
	// Lease is AdmissionID's lease, for an admission made from one: a
	// lease's bookings store its admissions' entries in records, found
	// through the lease, not by their admission (00038). Without it, only
	// the entries stored as rows of their own are found.
	Lease    string
	Actor    string
	From, To time.Time // created_at in [From, To)
	// After continues a listing after the last entry of the previous page.
	After *Cursor
	// Oldest lists oldest first; the default is newest first.
	Oldest bool
	Limit  int
}

// Cursor is a position in a listing: the (created_at, tenant, seq) of the
// last entry seen. Keyset paging is stable under concurrent inserts: new
// entries never shift the pages after a cursor.
type Cursor struct {
	CreatedAt time.Time `json:"t"`
	TenantID  string    `json:"k"`
	Seq       int64     `json:"s"`
}

// ErrBadCursor: the cursor string was not made by Cursor.String.
var ErrBadCursor = errors.New("ledger: malformed cursor")

// String encodes the cursor for a URL.
func (c Cursor) String() string {
	b, _ := json.Marshal(struct {
		T int64  `json:"t"`
		K string `json:"k"`
		S int64  `json:"s"`
	}{c.CreatedAt.UnixMicro(), c.TenantID, c.Seq})
	return base64.RawURLEncoding.EncodeToString(b)
}

// ParseCursor decodes Cursor.String. It returns ErrBadCursor.
func ParseCursor(s string) (*Cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(raw) > 512 {
		return nil, ErrBadCursor
	}
	var v struct {
		T int64  `json:"t"`
		K string `json:"k"`
		S int64  `json:"s"`
	}
	if err := json.Unmarshal(raw, &v); err != nil || v.S <= 0 {
		return nil, ErrBadCursor
	}
	return &Cursor{CreatedAt: time.UnixMicro(v.T).UTC(), TenantID: v.K, Seq: v.S}, nil
}

func (f Filter) args() []any {
	opt := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		return &t
	}
	var at *time.Time
	var tenant string
	var seq int64
	if f.After != nil {
		at, tenant, seq = &f.After.CreatedAt, f.After.TenantID, f.After.Seq
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	// QueryExecModeExec plans each query with its actual parameters: the
	// statement's optional filters ("$1 = '' OR tenant_id = $1") fold away,
	// so the tenant and time indexes are used. A cached generic plan could
	// not use them and would scan the whole ledger.
	return []any{pgx.QueryExecModeExec, f.TenantID, string(f.Kind), f.Model, f.AdmissionID, f.Actor, opt(f.From), opt(f.To), at, tenant, seq, limit, f.Lease}
}

// entryRow is a row of ledger_entries, as every query of it reads it
// (entry_*.sql name its columns, never SELECT *: a column a later release
// adds is not read, so this release survives that migration), scanned by
// column name.
type entryRow struct {
	TenantID     string     `db:"tenant_id"`
	Seq          int64      `db:"seq"`
	Kind         string     `db:"kind"`
	CreatedAt    time.Time  `db:"created_at"`
	AdmissionID  *string    `db:"admission_id"`
	Model        *string    `db:"model"`
	Estimate     *int64     `db:"estimate"`
	Actual       *int64     `db:"actual"`
	RefillMicro  int64      `db:"refill_micro"`
	DeltaMicro   int64      `db:"delta_micro"`
	BalanceMicro int64      `db:"balance_micro"`
	PeriodStart  *time.Time `db:"period_start"`
	PeriodUsed   int64      `db:"period_used"`
	Late         bool       `db:"late"`
	Actor        string     `db:"actor"`
	Reason       *string    `db:"reason"`
	Detail       *string    `db:"detail"`
	PrevHash     []byte     `db:"prev_hash"`
	Hash         []byte     `db:"hash"`
	MoneyMicro   *int64     `db:"money_micro"`
	Windows      *string    `db:"windows"`
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func scanEntry(row pgx.CollectableRow) (Entry, error) {
	r, err := pgx.RowToStructByName[entryRow](row)
	if err != nil {
		return Entry{}, err
	}
	return Entry{TenantID: r.TenantID, Seq: r.Seq, Kind: Kind(r.Kind), CreatedAt: r.CreatedAt, AdmissionID: str(r.AdmissionID),
		Model: str(r.Model), Estimate: r.Estimate, Actual: r.Actual, RefillMicro: r.RefillMicro, DeltaMicro: r.DeltaMicro,
		BalanceMicro: r.BalanceMicro, PeriodStart: r.PeriodStart, PeriodUsed: r.PeriodUsed, Late: r.Late, Actor: r.Actor,
		Reason: str(r.Reason), Detail: str(r.Detail), PrevHash: r.PrevHash, Hash: r.Hash, MoneyMicro: r.MoneyMicro,
		Windows: str(r.Windows)}, nil
}

func (f Filter) sql() string {
	if f.Oldest {
		return entryQueryAscSQL
	}
	return entryQueryDescSQL
}

// EntryQuery returns one page of entries matching f, and the cursor of the
// next page (nil on the last page).
func EntryQuery(ctx context.Context, q Querier, f Filter) ([]Entry, *Cursor, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	probe := f
	probe.Limit = f.Limit + 1 // one more tells whether a next page exists
	rows, err := q.Query(ctx, probe.sql(), probe.args()...)
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: query: %w", err)
	}
	entries, err := pgx.CollectRows(rows, scanEntry)
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: query: %w", err)
	}
	if len(entries) <= f.Limit {
		return entries, nil, nil
	}
	entries = entries[:f.Limit]
	last := entries[len(entries)-1]
	return entries, &Cursor{CreatedAt: last.CreatedAt, TenantID: last.TenantID, Seq: last.Seq}, nil
}

// EntryEach streams every entry matching f (ignoring Limit) to fn, page by
// page, so memory stays constant however many rows match.
func EntryEach(ctx context.Context, q Querier, f Filter, fn func(*Entry) error) error {
	x, err := OpenExport(ctx, q, f)
	if err != nil {
		return err
	}
	return x.Each(fn)
}

// exportPage is how many entries an export reads per query.
const exportPage = 5000

// Export is an export of every entry matching a filter whose first query
// has answered and whose first row is read: a store that cannot answer
// fails OpenExport, before its caller has written anything, so that the
// caller still answers an error instead of a 200 with a header and no
// rows. A failure after that (a later page) is Each's error, once rows
// have gone out: the caller must then break the response off so that the
// client sees it was cut (see the API's and the dashboard's exports).
type Export struct {
	ctx   context.Context
	q     Querier
	f     Filter
	rows  pgx.Rows // the current page
	first *Entry   // the first page's first entry, read by OpenExport; nil once given, or if none matched
}

// OpenExport runs the first page's query of an export of every entry
// matching f (ignoring Limit) and reads its first row. The caller calls
// Each, or Close.
func OpenExport(ctx context.Context, q Querier, f Filter) (*Export, error) {
	f.Limit = exportPage
	rows, err := q.Query(ctx, f.sql(), f.args()...)
	if err != nil {
		return nil, fmt.Errorf("ledger: export: %w", err)
	}
	x := &Export{ctx: ctx, q: q, f: f, rows: rows}
	if rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("ledger: export: %w", err)
		}
		x.first = &e
		return x, nil
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: export: %w", err)
	}
	return x, nil
}

// Close releases the current page's rows. Each closes them itself.
func (x *Export) Close() { x.rows.Close() }

// Each streams every entry to fn, page by page, so memory stays constant
// however many rows match.
func (x *Export) Each(fn func(*Entry) error) error {
	defer x.Close()
	for {
		n, last, err := x.page(fn)
		if err != nil {
			return err
		}
		if n < x.f.Limit {
			return nil
		}
		x.f.After = &Cursor{CreatedAt: last.CreatedAt, TenantID: last.TenantID, Seq: last.Seq}
		if x.rows, err = x.q.Query(x.ctx, x.f.sql(), x.f.args()...); err != nil {
			return fmt.Errorf("ledger: export: %w", err)
		}
	}
}

// page gives fn the current page's entries, and returns how many there
// were and the last.
func (x *Export) page(fn func(*Entry) error) (n int, last Entry, err error) {
	defer x.rows.Close()
	if e := x.first; e != nil {
		x.first = nil
		if err := fn(e); err != nil {
			return 0, last, err
		}
		last, n = *e, 1
	}
	for x.rows.Next() {
		e, err := scanEntry(x.rows)
		if err != nil {
			return 0, last, fmt.Errorf("ledger: export: %w", err)
		}
		if err := fn(&e); err != nil {
			return 0, last, err
		}
		last = e
		n++
	}
	x.rows.Close()
	if err := x.rows.Err(); err != nil {
		return 0, last, fmt.Errorf("ledger: export: %w", err)
	}
	return n, last, nil
}

// CSVHeader is the first line of a CSV export.
var CSVHeader = []string{"tenant_id", "seq", "kind", "created_at", "admission_id", "model", "estimate", "actual",
	"refill_tokens", "delta_tokens", "balance_tokens", "period_start", "period_used", "late", "actor", "reason",
	"detail", "prev_hash", "hash", "money", "windows"}

// Tokens renders micro-tokens as an exact decimal. Every int64 renders,
// math.MinInt64 too: the magnitude is taken in uint64, where negating the
// minimum cannot overflow.
func Tokens(micro int64) string {
	sign, mag := "", uint64(micro)
	if micro < 0 {
		sign, mag = "-", -mag
	}
	s := strconv.FormatUint(mag/1_000_000, 10)
	if frac := mag % 1_000_000; frac != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%06d", frac), "0")
	}
	return sign + s
}

// cell neutralises spreadsheet formulas in free text (a model name is
// whatever a caller sent): a cell starting with = + - @ tab or CR gets a
// leading apostrophe, as OWASP recommends, so opening an export in a
// spreadsheet never runs it. Numbers are written by us and left alone.
func cell(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

// CSVRecord renders an entry as a CSV record matching CSVHeader.
func CSVRecord(e *Entry) []string {
	opt := func(n *int64) string {
		if n == nil {
			return ""
		}
		return strconv.FormatInt(*n, 10)
	}
	money := ""
	if e.MoneyMicro != nil {
		money = Tokens(*e.MoneyMicro) // micro-units render as an exact decimal like micro-tokens
	}
	period := ""
	if e.PeriodStart != nil {
		period = e.PeriodStart.UTC().Format(time.RFC3339)
	}
	return []string{e.TenantID, strconv.FormatInt(e.Seq, 10), string(e.Kind), e.CreatedAt.UTC().Format(time.RFC3339Nano),
		cell(e.AdmissionID), cell(e.Model), opt(e.Estimate), opt(e.Actual), Tokens(e.RefillMicro), Tokens(e.DeltaMicro),
		Tokens(e.BalanceMicro), period, strconv.FormatInt(e.PeriodUsed, 10), strconv.FormatBool(e.Late), cell(e.Actor),
		cell(e.Reason), cell(e.Detail), hex.EncodeToString(e.PrevHash), hex.EncodeToString(e.Hash), money, e.Windows}
}

// WriteCSV streams every entry matching f to w as CSV, header first.
func WriteCSV(ctx context.Context, q Querier, f Filter, w io.Writer) error {
	x, err := OpenExport(ctx, q, f)
	if err != nil {
		return err
	}
	return x.WriteCSV(w)
}

// WriteCSV streams the export to w as CSV, header first.
func (x *Export) WriteCSV(w io.Writer) error {
	defer x.Close()
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	n := 0
	err := x.Each(func(e *Entry) error {
		if err := cw.Write(CSVRecord(e)); err != nil {
			return err
		}
		if n++; n%1000 == 0 {
			cw.Flush()
			return cw.Error()
		}
		return nil
	})
	cw.Flush()
	if err != nil {
		return err
	}
	return cw.Error()
}

// MinuteCount is the number of entries of one kind of one tenant in one
// minute.
type MinuteCount struct {
	TenantID string
	Minute   time.Time
	Count    int64
}

// KindCounts counts entries of kind per tenant and minute over the minutes
// overlapping the last window (the dashboard's admitted-per-minute).
func KindCounts(ctx context.Context, q Querier, kind Kind, window time.Duration) ([]MinuteCount, error) {
	rows, err := q.Query(ctx, kindCountsSQL, string(kind), window.Seconds())
	if err != nil {
		return nil, fmt.Errorf("ledger: counts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (MinuteCount, error) {
		var c MinuteCount
		err := r.Scan(&c.TenantID, &c.Minute, &c.Count)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: counts: %w", err)
	}
	return out, nil
}
