package rule_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

func newPool(capacity int64) *rule.Pool {
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	return &rule.Pool{ID: "gpu", Tokens: rule.Bucket{CapacityMicro: capacity * rule.Micro, RateMicro: rule.Micro, BalanceMicro: capacity * rule.Micro, At: at}}
}

// TestPoolServeAndCorrect: serving takes from the pool and counts the
// served tokens divided by the weight to the tenant's counter; a correction
// moves both to what was used, the refund capped at the capacity and the
// counter never below zero.
func TestPoolServeAndCorrect(t *testing.T) {
	t.Parallel()
	p := newPool(1000)
	now := p.Tokens.At
	p.Shares = map[string]*rule.Share{"t2": {TenantID: "t2", Weight: 2}}
	p.Serve("t1", 100, now, false)
	p.Serve("t2", 100, now, false) // new to the pool: lifted to t1's counter first
	if p.Tokens.BalanceMicro != 800*rule.Micro || !p.Changed {
		t.Fatalf("balance %d changed %v", p.Tokens.BalanceMicro, p.Changed)
	}
	if s1, s2 := p.Shares["t1"], p.Shares["t2"]; s1.VTCMicro != 100*rule.Micro || s2.VTCMicro != 150*rule.Micro || s1.Served != 100 || s2.Served != 100 ||
		s1.Weight != 1 || !s1.Changed || s1.ActiveAt == nil || !s1.ActiveAt.Equal(now) {
		t.Fatalf("shares %+v %+v", s1, s2)
	}
	p.Correct("t2", 100, 40, now)
	if s2 := p.Shares["t2"]; s2.VTCMicro != 120*rule.Micro || s2.Served != 40 || p.Tokens.BalanceMicro != 860*rule.Micro {
		t.Fatalf("after a correction: %+v, balance %d", s2, p.Tokens.BalanceMicro)
	}
	p.Correct("t1", 100, -5000, now) // a refund past anything served
	if s1 := p.Shares["t1"]; s1.VTCMicro != 0 || p.Tokens.BalanceMicro != 1000*rule.Micro {
		t.Fatalf("an over-refund: %+v, balance %d", s1, p.Tokens.BalanceMicro)
	}
	st := p.State()
	if st.ID != "gpu" || st.TokensMicro != p.Tokens.BalanceMicro || st.VTC["t2"] != 120*rule.Micro || len(st.VTC) != 2 {
		t.Fatalf("state %+v", st)
	}
}

// TestPoolIdleTenantLifted: a tenant idle past PoolActiveWindow comes back
// at the lowest counter of the tenants served meanwhile (idle time earns
// no credit); one that was backlogged, a capacity below it; one still
// active keeps its own counter.
func TestPoolIdleTenantLifted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		idle       time.Duration
		backlogged bool
		want       int64 // the counter before it is served
	}{
		{"active", rule.PoolActiveWindow, false, 10},
		{"idle", rule.PoolActiveWindow + time.Millisecond, false, 5000},
		{"idle, backlogged", rule.PoolActiveWindow + time.Millisecond, true, 5000 - 1000},
	} {
		p := newPool(1000)
		now := p.Tokens.At
		then, busy := now.Add(-c.idle), now.Add(-time.Second)
		p.Shares = map[string]*rule.Share{
			"back": {TenantID: "back", Weight: 1, VTCMicro: 10 * rule.Micro, ActiveAt: &then},
			"a":    {TenantID: "a", Weight: 1, VTCMicro: 5000 * rule.Micro, ActiveAt: &busy},
			"b":    {TenantID: "b", Weight: 1, VTCMicro: 9000 * rule.Micro, ActiveAt: &busy},
		}
		p.Serve("back", 1, now, c.backlogged)
		if got := p.Shares["back"].VTCMicro; got != (c.want+1)*rule.Micro {
			t.Errorf("%s: counter %d, want %d", c.name, got, (c.want+1)*rule.Micro)
		}
	}
}

// TestPoolRefusal: past the capacity a request can never fit; past the
// balance less the holdback of the requests ahead it waits for the refill;
// at the balance exactly it fits, and a refusal changes nothing.
func TestPoolRefusal(t *testing.T) {
	t.Parallel()
	p := newPool(1000)
	p.Tokens.BalanceMicro = 300 * rule.Micro
	var tl *rule.TooLargeError
	if err := p.Refusal(1001, 0); !errors.As(err, &tl) || tl.Pool != "gpu" || tl.Capacity != 1000 || tl.Cost != 1001 {
		t.Fatalf("past the capacity: %v", err)
	}
	if err := p.Refusal(300, 0); err != nil {
		t.Fatalf("the balance exactly: %v", err)
	}
	var rej *rule.RejectedError
	if err := p.Refusal(200, 101*rule.Micro); !errors.As(err, &rej) || rej.Limit != rule.LimitPool || rej.Pool != "gpu" || rej.RetryAfter != time.Second {
		t.Fatalf("past the holdback: %v", err)
	}
	if err := p.Refusal(200, -5*rule.Micro); err != nil {
		t.Fatalf("a negative holdback counts as none: %v", err)
	}
	if p.Tokens.BalanceMicro != 300*rule.Micro || p.Changed || len(p.Shares) != 0 {
		t.Fatalf("a refusal changed the pool: %+v", p)
	}
}

// TestPoolValues: a pool's limits and a share's weight are refused
// outside their bounds, naming the field, and taken at them.
func TestPoolValues(t *testing.T) {
	t.Parallel()
	var le *rule.LimitError
	for _, c := range []struct {
		l     rule.PoolLimits
		field string
	}{
		{rule.PoolLimits{TokensCapacity: 1, TokensRateMicro: 1}, ""},
		{rule.PoolLimits{TokensCapacity: rule.MaxAmount, TokensRateMicro: rule.MaxAmount * rule.Micro / 1000}, ""},
		{rule.PoolLimits{TokensCapacity: 0, TokensRateMicro: 1}, "tokens_capacity"},
		{rule.PoolLimits{TokensCapacity: rule.MaxAmount + 1, TokensRateMicro: 1}, "tokens_capacity"},
		{rule.PoolLimits{TokensCapacity: 1, TokensRateMicro: 0}, "tokens_per_second"},
		{rule.PoolLimits{TokensCapacity: 1, TokensRateMicro: rule.MaxAmount*rule.Micro/1000 + 1}, "tokens_per_second"},
	} {
		err := c.l.Validate()
		if (c.field == "" && err != nil) || (c.field != "" && (!errors.As(err, &le) || le.Field != c.field)) {
			t.Errorf("%+v: %v, want field %q", c.l, err, c.field)
		}
	}
	for w, ok := range map[int64]bool{0: false, 1: true, rule.MaxPoolWeight: true, rule.MaxPoolWeight + 1: false, -1: false} {
		if err := rule.ValidatePoolWeight(w); (err == nil) != ok || (err != nil && (!errors.As(err, &le) || le.Field != "weight")) {
			t.Errorf("weight %d: %v", w, err)
		}
	}
}
