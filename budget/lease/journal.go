package lease

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

var (
	//go:embed sql/lease_use.sql
	leaseUseSQL string
	//go:embed sql/lease_keys.sql
	leaseKeysSQL string
	//go:embed sql/lease_gateways.sql
	leaseGatewaysSQL string
	//go:embed sql/lease_unuse.sql
	leaseUnuseSQL string
)

// Admission is one admission made from a lease, as the journal records it:
// everything its admissions row (and its Idempotency-Key row) will hold
// once its lease is booked, so that it is settled, released, expired and
// replayed like an admission of exact mode. The admission use case fills
// it from the account.ReserveParams and the estimate it would have reserved
// with.
type Admission struct {
	// Admission is its admissions row: ID, TenantID, Estimate (tokens,
	// weights, cost), Family, Face, the price (PriceModel, PriceFrom,
	// PriceTier) and MoneyEstimate. CreatedAt is set from the journal's
	// time (the store's clock) when booked; a zero ExpiresAt becomes that
	// plus the tenant's reservation TTL. State is reserved, and
	// DebitedMicro stays nil: the lease debited its whole estimate at
	// every level.
	account.Admission
	// CostMicro is what it takes from the lease: its estimate's cost in
	// micro-tokens.
	CostMicro int64
	// KeyID and Actor are the tenant key the request came with ("" for
	// none) and who asked; the actor is its reserve entry's when booked.
	// The group refuses the admission if the key is revoked or not the
	// lease's tenant's (rule.ErrKeyRevoked) or the model is outside its
	// scope (*rule.ModelNotAllowedError), as a decision does.
	KeyID, Actor string
	// GatewayID is the gateway credential the request came through ("" for
	// none). The group refuses the admission if the gateway is revoked or
	// unknown (rule.ErrGatewayRevoked) or its scope leaves out the lease's
	// tenant (rule.ErrOutOfScope), as a decision does.
	GatewayID string
	// IdempotencyKey is the key as its face sent it ("" for none): it is
	// journaled in the face's namespace (Face.StoredKey), unique per tenant
	// across the journal and idempotency_keys, so a second admission with
	// it is answered as a replay (*ReplayError), never admitted twice.
	// RequestHash and Response are as account.ReserveParams keeps them
	// (Response: EncodeReservation of the answer, empty for ReplayNow).
	IdempotencyKey string
	RequestHash    []byte
	Response       []byte
	// ReservationTTL is the tenant's reservation TTL as the caller last
	// read it (its lease's snapshot, which its answer's expiry is computed
	// from): a zero ExpiresAt is the group's time plus it. Zero: the store
	// reads the tenant's as the group commits.
	ReservationTTL time.Duration
	// Grouped asks the journal to give the admission its id as it forms
	// the admission's group (rule.GroupedAdmissionID): ID is then the
	// caller's placeholder, an admission id whose instant the new one
	// keeps, and every occurrence of it in Response (the kept answer,
	// encoded before the group exists) is replaced by the new id, of the
	// same length. AppendID returns the id. Why: an id that names its
	// group lets the compact journal (docs/leasing.md) find a leased
	// admission's group row with no index entry per admission.
	Grouped bool
}

// storedKey is a's key as idempotency_keys holds it.
func (a *Admission) storedKey() string { return a.Face.StoredKey(a.IdempotencyKey) }

// ErrDuplicate: the admission's id is journaled already; this admission
// was not made (the others of its group were journaled regardless).
var ErrDuplicate = errors.New("lease: the admission id is journaled already")

// ErrNotGrouped: the journal writes the groups shape, and the admission's
// id is no admission id (rule.GroupedAdmissionID could not make a grouped
// one of it); it was not journaled.
var ErrNotGrouped = errors.New("lease: the admission id cannot be grouped")

// ErrReplayed is wrapped by *ReplayError.
var ErrReplayed = errors.New("lease: the Idempotency-Key names an earlier admission")

// ReplayError: the admission's Idempotency-Key already names an admission
// of its tenant, journaled (booked or not) or decided exactly; nothing was
// journaled and nothing taken from the lease. The caller answers the
// original: Response as kept (EncodeReservation), or, when empty (kept
// with ReplayNow), the admission's id and the balances as they are. A key
// reused with another request is rule.ErrIdempotencyMismatch instead.
type ReplayError struct {
	AdmissionID string
	Response    []byte
	hash        []byte // the original's request hash
}

func (e *ReplayError) Error() string {
	return "lease: the Idempotency-Key names admission " + e.AdmissionID
}

// Unwrap makes errors.Is(e, ErrReplayed) true.
func (e *ReplayError) Unwrap() error { return ErrReplayed }

// replayOf answers a request whose key names an earlier admission.
func replayOf(id string, hash, response []byte, a *Admission) error {
	if !bytes.Equal(hash, a.RequestHash) {
		return rule.ErrIdempotencyMismatch
	}
	return &ReplayError{AdmissionID: id, Response: response, hash: hash}
}

// maxGroup caps the admissions of one group commit.
const maxGroup = 512

type appendReq struct {
	leaseID string
	a       Admission
	done    chan error
	// end, when set, makes the request the end of an admission of the
	// lease (Journal.End): a carries its id, tenant and credentials, and
	// its refund as a negative CostMicro.
	end *End
	// ungrouped: the groups shape could not give it a grouped id.
	ungrouped bool
	// group is the groups shape's group the request was named in (name).
	group groupKey
}

// Journal makes admissions from leases durable before they are answered,
// many per transaction (group commit): up to inFlight groups commit at
// once, and the next gathers meanwhile. A group takes no tenant row lock: per lease, one statement adds
// the group's cost to the lease's used amount (refused unless the lease is
// live, unexpired by the store's clock and keeps the sum within its
// slice), and one inserts its rows. The lease row's lock orders the group
// against the lease's renew, return or expiry, which lock it after the
// tenant rows: an admission is either journaled before the lease ends, and
// reconciled by its end, or refused.
type Journal struct {
	s       *Store
	reqs    chan *appendReq
	stopped chan struct{} // closed when Run returns
	creds   creds         // the credentials as last read (journal_once.go)
	rounds  rounds
	// holder and count name the last group that gave ids (name); only
	// Run's goroutine touches them.
	holder uint64
	count  uint32
}

// ErrStopped: the journal's Run has returned; nothing more is journaled.
var ErrStopped = errors.New("lease: the journal is stopped")

// NewJournal returns a journal of s's leases; Run commits its groups.
func NewJournal(s *Store) *Journal {
	return &Journal{s: s, reqs: make(chan *appendReq, maxGroup), stopped: make(chan struct{})}
}

// Append journals a, made from leaseID, and returns once its group has
// committed: nil means durable. ErrOver: the lease ended, expired or is
// short (the admission was not made). An error of ctx leaves the outcome
// unknown; the caller must not answer the admission as made (if it was
// journaled, its cost stays charged, never spent twice). ErrStopped: Run
// returned before the admission's group committed.
func (j *Journal) Append(ctx context.Context, leaseID string, a Admission) error {
	_, err := j.AppendID(ctx, leaseID, a)
	return err
}

// AppendID is Append, and returns the admission's id: a.ID, or the one
// its group gave it when a.Grouped ("" when the outcome is unknown: an
// error of ctx, or ErrStopped).
func (j *Journal) AppendID(ctx context.Context, leaseID string, a Admission) (string, error) {
	r := &appendReq{leaseID: leaseID, a: a, done: make(chan error, 1)}
	answered, err := j.send(ctx, r)
	if !answered {
		return "", err
	}
	// Run named r before its group's commit answered it (r.done).
	return r.a.ID, err
}

// send queues r for the next group and waits for its outcome (Append);
// answered false when it stopped waiting first (ctx, or Run returned).
func (j *Journal) send(ctx context.Context, r *appendReq) (answered bool, err error) {
	select {
	case j.reqs <- r:
	case <-ctx.Done():
		return false, ctx.Err()
	case <-j.stopped:
		return false, ErrStopped
	}
	select {
	case err := <-r.done:
		return true, err
	case <-ctx.Done():
		return false, ctx.Err()
	case <-j.stopped:
		// A group that committed as Run stopped has answered already.
		select {
		case err := <-r.done:
			return true, err
		default:
			return false, ErrStopped
		}
	}
}

// inFlight is how many groups a journal commits at once. Two in flight
// (the next group gathered and sent while one waits for its flush) was
// measured slower on the two-core bench machine, side by side: one in
// flight made 1.46x the admissions with four replicas on one tenant,
// 1.18x with 64 tenants and 1.26x through the rate limit service, at
// less CPU each (BENCHMARKS.md, "Quota leasing, second step"): the
// machine is CPU-bound, and two groups split the callers into smaller
// groups, with a transaction's fixed cost per group, that also wait on
// the same lease row. Groups of one lease are ordered by its row's lock,
// and groups with one Idempotency-Key by its advisory lock (both taken in
// a fixed order), so more in flight never wait on each other in a cycle.
const inFlight = 1

// Run commits groups until ctx ends; the groups in flight then still
// commit and are answered. Run must be called once.
func (j *Journal) Run(ctx context.Context) {
	slots := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		close(j.stopped)
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case slots <- struct{}{}:
		}
		var group []*appendReq
		select {
		case <-ctx.Done():
			return
		case r := <-j.reqs:
			group = append(group, r)
		}
	gather:
		for len(group) < maxGroup {
			select {
			case r := <-j.reqs:
				group = append(group, r)
			default:
				break gather
			}
		}
		j.name(group)
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			j.commit(context.WithoutCancel(ctx), group)
			if j.s.groups {
				// Before the next group starts (inFlight is 1): hints.go.
				j.s.hints.record(group[0].group, groupLeases(group))
			}
		}()
	}
}

// name gives the group's Grouped admissions their ids: the journal's
// holder number, the group's count, and their place in the group's order
// (rule.GroupedAdmissionID). A group that names none takes no count. The
// holder number is drawn again when the count would wrap, so an id is
// never given twice by one journal. Two journals draw the same number with
// a chance of 2^-40 a pair (a thousand journal starts: about one in two
// million), and even then give the same id only for the same count and
// place in the same millisecond; an id journaled twice is refused
// (ErrDuplicate), never merged.
func (j *Journal) name(group []*appendReq) {
	place := 0
	if j.s.groups && len(group) > 0 {
		// Every group of the groups shape takes a count, ends alone too:
		// its row is found by it (hints.go).
		if j.holder == 0 || j.count == rule.MaxGroupCount {
			j.holder, j.count = drawHolder(), 0
		}
		j.count++
		place = -1 // the count is taken
		for _, r := range group {
			r.group = groupKey{holder: j.holder, count: j.count}
		}
	}
	for _, r := range group {
		if r.end != nil || !(r.a.Grouped || j.s.groups) {
			continue
		}
		if place == -1 {
			place = 0
		} else if place == 0 {
			if j.holder == 0 || j.count == rule.MaxGroupCount {
				j.holder, j.count = drawHolder(), 0
			}
			j.count++
		}
		id, ok := rule.GroupedAdmissionID(r.a.ID, rule.AdmissionGroup{Holder: j.holder, Count: j.count, Place: place})
		if !ok {
			// A placeholder that is no admission id keeps its id; the
			// groups shape refuses it (commit), since no reader could find
			// it by its id.
			r.ungrouped = j.s.groups
			continue
		}
		replaceSameLength(r.a.Response, r.a.ID, id)
		r.a.ID = id
		place++
	}
}

// groupLeases are the leases a group's requests name, each once.
func groupLeases(group []*appendReq) []string {
	var ids []string
	for _, r := range group {
		if !slices.Contains(ids, r.leaseID) {
			ids = append(ids, r.leaseID)
		}
	}
	return ids
}

// drawHolder is a journal's holder number: random, never zero (zero is
// "none drawn yet").
func drawHolder() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[3:])
		if h := binary.BigEndian.Uint64(b[:]) & rule.MaxGroupHolder; h != 0 {
			return h
		}
	}
}

// replaceSameLength writes to in place of every occurrence of from in b;
// from and to are of the same length.
func replaceSameLength(b []byte, from, to string) {
	for i := 0; i <= len(b)-len(from); {
		k := bytes.Index(b[i:], []byte(from))
		if k < 0 {
			return
		}
		copy(b[i+k:], to)
		i += k + len(to)
	}
}

// commit writes one group and answers each request. Of the admissions of
// the group with the same key, the first is written; each later one is
// answered as its replay once it is journaled (or replayed), or tried again
// on its own when it is not (refused).
func (j *Journal) commit(ctx context.Context, group []*appendReq) {
	var lead []*appendReq
	later := map[[2]string][]*appendReq{}
	for _, r := range group {
		if r.ungrouped {
			r.done <- fmt.Errorf("lease: journal %s: %w", r.a.ID, ErrNotGrouped)
			continue
		}
		if k := r.a.storedKey(); k != "" {
			pair := [2]string{r.a.TenantID, k}
			if _, ok := later[pair]; ok {
				later[pair] = append(later[pair], r)
				continue
			}
			later[pair] = nil
		}
		lead = append(lead, r)
	}
	if len(lead) == 0 {
		return // every one refused (ungrouped): nothing to write
	}
	errs := j.writeOrSplit(ctx, lead)
	var again []*appendReq
	for i, r := range lead {
		r.done <- errs[i]
		k := r.a.storedKey()
		if k == "" {
			continue
		}
		var re *ReplayError
		for _, f := range later[[2]string{r.a.TenantID, k}] {
			switch {
			case errs[i] == nil:
				f.done <- replayOf(r.a.ID, r.a.RequestHash, r.a.Response, &f.a)
			case errors.As(errs[i], &re):
				f.done <- replayOf(re.AdmissionID, re.hash, re.Response, &f.a)
			default:
				again = append(again, f)
			}
		}
	}
	if len(again) > 0 {
		j.commit(ctx, again)
	}
}

// writeOrSplit writes reqs in one transaction and returns each one's
// outcome. A statement error fails a transaction as a whole, so a group
// that fails on one (a duplicate admission id) is split in halves, each
// written on its own, until the row at fault fails alone (ErrDuplicate for
// a duplicate id): one bad row costs its group a few transactions, never
// its admissions.
func (j *Journal) writeOrSplit(ctx context.Context, reqs []*appendReq) []error {
	errs, err := j.write(ctx, reqs)
	if err == nil {
		return errs
	}
	var pgErr *pgconn.PgError
	if len(reqs) > 1 && errors.As(err, &pgErr) {
		h := len(reqs) / 2
		return append(j.writeOrSplit(ctx, reqs[:h]), j.writeOrSplit(ctx, reqs[h:])...)
	}
	if account.DuplicateAdmission(err) {
		err = fmt.Errorf("lease: journal %s: %w", reqs[0].a.ID, ErrDuplicate)
	}
	errs = make([]error, len(reqs))
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// original is the admission a key already names.
type original struct {
	id             string
	hash, response []byte
}

// write is one transaction over reqs; it returns each one's outcome (nil:
// journaled), or an error of the transaction as a whole. It is sent in one
// round trip when it can be (writeOnce, journal_once.go), else the careful
// way, in two. The first begins, takes the advisory locks of the group's
// keys (the ones a decision takes: account.QueueKeyLock), reads the live
// ones in idempotency_keys and deletes the forgotten ones there (older than
// 24 h: the insert is a plain one, account.QueueLeased), uses each lease
// (the statements that may refuse) and reads the group's credentials. A key found is a
// replay: not journaled, and its cost, counted in its lease's use, is cut
// back with the admissions the credentials refuse. The second cuts,
// inserts the rows of the leases that accepted and commits.
func (j *Journal) write(ctx context.Context, reqs []*appendReq) ([]error, error) {
	conn, err := j.s.acct.Pool().Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease: journal: acquire: %w", err)
	}
	defer conn.Release()
	clock := j.s.frozen()
	errs := make([]error, len(reqs))
	var tenants, keys []string
	for _, r := range reqs {
		if k := r.a.storedKey(); k != "" {
			tenants, keys = append(tenants, r.a.TenantID), append(keys, k)
		}
	}
	order, byLease, byReq := leaseOrder(reqs)
	sums := make([]int64, len(order))
	for k, id := range order {
		for _, r := range byReq[id] {
			sums[k] += r.a.CostMicro
		}
	}
	keyIDs, gwIDs := groupKeys(order, byReq)
	g := &group{order: order, byReq: byReq, sums: sums, tenants: tenants, keys: keys,
		keyIDs: keyIDs, gwIDs: gwIDs, clock: clock, n: len(reqs), key: reqs[0].group}
	switch ok, err := j.writeOnce(ctx, conn, g); {
	case err != nil:
		return nil, err
	case ok:
		return errs, nil
	}
	j.rounds.careful.Add(1)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	account.QueueGenericPlans(b)
	if len(keys) > 0 {
		account.QueueKeyLock(b, tenants, keys)
		account.QueueKeysGet(b, tenants, keys, clock)
		account.QueueKeysForget(b, tenants, keys, clock)
	}
	b.Queue(leaseUseSQL, order, sums, clock, make([]string, len(order)), false)
	if len(keyIDs) > 0 {
		b.Queue(leaseKeysSQL, keyIDs)
	}
	if len(gwIDs) > 0 {
		b.Queue(leaseGatewaysSQL, gwIDs)
	}
	verdict := make(map[string]string, len(order))
	var found map[[2]string]original
	var apiKeys map[string]key
	var gws map[string]gateway
	err = func() error {
		br := conn.SendBatch(ctx, b)
		defer br.Close()
		for range 2 { // BEGIN, SET LOCAL
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if len(keys) > 0 {
			var err error
			if found, err = scanKeys(br); err != nil {
				return fmt.Errorf("keys: %w", err)
			}
			if _, err := br.Exec(); err != nil { // the forgotten keys
				return fmt.Errorf("keys: forget: %w", err)
			}
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		var id, tenant string
		if _, err := pgx.ForEachRow(rows, []any{&id, &tenant}, func() error { verdict[id] = tenant; return nil }); err != nil {
			return err
		}
		if len(keyIDs) > 0 {
			var err error
			if apiKeys, err = readKeys(br); err != nil {
				return err
			}
		}
		if len(gwIDs) > 0 {
			var err error
			if gws, err = readGateways(br); err != nil {
				return err
			}
		}
		return br.Close()
	}()
	if err != nil {
		_, _ = conn.Exec(ctx, "ROLLBACK")
		return nil, fmt.Errorf("lease: journal: use: %w", err)
	}
	j.creds.remember(keyIDs, apiKeys, gwIDs, gws, verdict)
	for i, r := range reqs {
		if o, ok := found[[2]string{r.a.TenantID, r.a.storedKey()}]; ok {
			errs[i] = replayOf(o.id, o.hash, o.response, &r.a)
		}
	}
	refused := refuseByKey(order, byReq, verdict, apiKeys, gws)
	var cutIDs []string
	var cuts []int64
	var rows account.Leased
	rows.Grow(len(reqs))
	var ends account.LeasedEnds
	for _, id := range order {
		is := byLease[id]
		if verdict[id] == "" {
			for _, i := range is {
				if errs[i] == nil {
					errs[i] = ErrOver
				}
			}
			continue
		}
		// A replay, or a credential's refusal, is its admission's alone:
		// the others commit, and the lease's use is cut back by its cost.
		var cut int64
		for _, i := range is {
			if errs[i] == nil {
				errs[i] = refused[reqs[i]]
			}
			a := &reqs[i].a
			if errs[i] == nil && a.TenantID != verdict[id] {
				if a.TenantID != "" {
					errs[i] = fmt.Errorf("lease: journal %s: an admission of tenant %s on a lease of %s", a.ID, a.TenantID, verdict[id])
				} else {
					a.TenantID = verdict[id]
				}
			}
			if errs[i] != nil {
				cut += a.CostMicro
				continue
			}
			if e := reqs[i].end; e != nil {
				ends.Add(e.AdmissionID, id, e.InputTokens, e.OutputTokens, e.ActualCost, e.MoneyActual, e.RefundMicro)
				continue
			}
			rows.Add(id, a.Actor, &a.Admission, a.storedKey(), a.RequestHash, a.Response, a.ReservationTTL)
		}
		if cut > 0 {
			cutIDs, cuts = append(cutIDs, id), append(cuts, cut)
		}
	}
	b = &pgx.Batch{}
	if len(cutIDs) > 0 {
		b.Queue(leaseUnuseSQL, cutIDs, cuts)
	}
	grouped := j.s.groups && rows.Len()+ends.Len() > 0
	switch {
	case grouped:
		account.QueueLeasedGroup(b, j.s.holder, reqs[0].group.holder, reqs[0].group.count, &rows, &ends, clock, false)
	default:
		if rows.Len() > 0 {
			account.QueueLeased(b, &rows, clock)
		}
		if ends.Len() > 0 {
			account.QueueLeasedEnds(b, &ends, clock, false)
		}
	}
	b.Queue("COMMIT")
	var ended map[string]bool
	err = func() error {
		br := conn.SendBatch(ctx, b)
		defer br.Close()
		for range boolInt(len(cutIDs) > 0) + boolInt(rows.Len() > 0 && !grouped) {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if ends.Len() > 0 || grouped {
			var err error
			if ended, err = account.ScanLeasedEnds(br); err != nil {
				return err
			}
		}
		return br.Close()
	}()
	if err != nil {
		_, _ = conn.Exec(ctx, "ROLLBACK")
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("lease: journal: insert: %w (%s)", err, pe.Detail)
		}
		return nil, fmt.Errorf("lease: journal: insert: %w", err)
	}
	for i, r := range reqs {
		if r.end != nil && errs[i] == nil && !ended[r.end.AdmissionID] {
			errs[i] = ErrNotOpen
		}
	}
	return errs, nil
}

// scanKeys reads what write queued for the group's keys: the advisory
// locks, then the admissions those keys already name (idempotency_keys
// holds every key, leased or decided: the group commit writes its keys'
// rows with its admissions).
func scanKeys(br pgx.BatchResults) (map[[2]string]original, error) {
	if _, err := br.Exec(); err != nil { // the locks
		return nil, err
	}
	found := map[[2]string]original{}
	hits, err := account.ScanKeysGet(br)
	if err != nil {
		return nil, err
	}
	for _, h := range hits {
		found[[2]string{h.TenantID, h.Key}] = original{id: h.AdmissionID, hash: h.RequestHash, response: h.Response}
	}
	return found, nil
}

// leaseOrder is reqs by lease: the leases in the order a group locks them
// (by id, as an admin change locks a tree's, EndLocked, so that the two
// never wait for each other in a cycle), and each lease's requests, by
// index and as requests, in the group's order.
func leaseOrder(reqs []*appendReq) (order []string, byLease map[string][]int, byReq map[string][]*appendReq) {
	byLease = map[string][]int{}
	for i, r := range reqs {
		if _, ok := byLease[r.leaseID]; !ok {
			order = append(order, r.leaseID)
		}
		byLease[r.leaseID] = append(byLease[r.leaseID], i)
	}
	slices.Sort(order)
	byReq = make(map[string][]*appendReq, len(order))
	for _, id := range order {
		for _, i := range byLease[id] {
			byReq[id] = append(byReq[id], reqs[i])
		}
	}
	return order, byLease, byReq
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
