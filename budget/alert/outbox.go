package alert

import (
	_ "embed"
	"strconv"
	"strings"
	"time"
)

// ThresholdsCrossedSQL writes the events of the period_budget thresholds a
// decision crossed. budget queues it in the deciding transaction's commit
// batch (see Crossings), so an event exists exactly when the decision that
// crossed its threshold does.
//
//go:embed sql/thresholds_crossed.sql
var ThresholdsCrossedSQL string

// Crossings collects the window usage rises of one transaction, for
// ThresholdsCrossedSQL's arguments.
type Crossings struct {
	tenants, windows, counts, own []string
	before, after, per            []int64
	starts, ends                  []time.Time
}

// Crossing is one window's usage rise in a transaction: from Before to
// After, of a limit of Limit, in the window [Start, End). Thresholds are
// the window's own percents (a soft budget's limit among them), raised
// beside those of the tenant's period_budget rules.
type Crossing struct {
	Tenant, Window, Counts string
	Before, After, Limit   int64
	Start, End             time.Time
	Thresholds             []int64
}

// Add records x. Usage that did not grow cannot cross a threshold and is
// not recorded.
func (c *Crossings) Add(x Crossing) {
	if x.After <= x.Before || x.Limit <= 0 {
		return
	}
	own := make([]string, len(x.Thresholds))
	for i, p := range x.Thresholds {
		own[i] = strconv.FormatInt(p, 10)
	}
	c.tenants, c.windows, c.counts = append(c.tenants, x.Tenant), append(c.windows, x.Window), append(c.counts, x.Counts)
	c.own = append(c.own, strings.Join(own, ","))
	c.before, c.after, c.per = append(c.before, x.Before), append(c.after, x.After), append(c.per, x.Limit)
	c.starts, c.ends = append(c.starts, x.Start), append(c.ends, x.End)
}

// Args returns the statement's arguments, or nil when nothing grew.
func (c *Crossings) Args() []any {
	if len(c.tenants) == 0 {
		return nil
	}
	return []any{c.tenants, c.before, c.after, c.per, c.starts, c.ends, c.windows, c.counts, c.own}
}
