package alert

import (
	_ "embed"
	"time"
)

// ThresholdsCrossedSQL writes the events of the period_budget thresholds a
// decision crossed. budget queues it in the deciding transaction's commit
// batch (see Crossings), so an event exists exactly when the decision that
// crossed its threshold does.
//
//go:embed sql/thresholds_crossed.sql
var ThresholdsCrossedSQL string

// PeriodRulesExistSQL says whether any period_budget rule exists: budget
// reads it every few seconds, and queues ThresholdsCrossedSQL only then.
const PeriodRulesExistSQL = `SELECT EXISTS (SELECT 1 FROM alert_rules WHERE kind = 'period_budget' AND deleted_at IS NULL)`

// Crossings collects the period usage changes of one transaction, for
// ThresholdsCrossedSQL's arguments.
type Crossings struct {
	tenants            []string
	before, after, per []int64
	starts, ends       []time.Time
}

// Add records that tenant's period usage went from before to after, of a
// budget of per, in the period [start, end). Usage that did not grow cannot
// cross a threshold and is not recorded.
func (c *Crossings) Add(tenant string, before, after, per int64, start, end time.Time) {
	if after <= before || per <= 0 {
		return
	}
	c.tenants = append(c.tenants, tenant)
	c.before, c.after, c.per = append(c.before, before), append(c.after, after), append(c.per, per)
	c.starts, c.ends = append(c.starts, start), append(c.ends, end)
}

// Args returns the statement's arguments, or nil when nothing grew.
func (c *Crossings) Args() []any {
	if len(c.tenants) == 0 {
		return nil
	}
	return []any{c.tenants, c.before, c.after, c.per, c.starts, c.ends}
}
