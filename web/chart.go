package web

import (
	"fmt"
	"math"
	"math/big"
	"strconv"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/ledger"
)

// costChart is the tenant page's SVG of estimated against actual cost for
// recent settled admissions, oldest on the left. It is drawn here, as
// plain SVG geometry, so the page needs no chart library and no inline
// style.
type costChart struct {
	Width, Height int
	Left, Bottom  int // plot edges, inside the viewBox
	Top, Right    int
	Bars          []costBar
	Ticks         []chartTick
	Count         int
	// The sums are exact (rendered with bignum): each admission's cost
	// fits an int64, their sum may not.
	SumEstimate account.Total
	SumActual   account.Total
}

type costBar struct {
	Title            string
	X, W             string
	EstY, EstH       string
	ActX, ActY, ActH string
	Over             bool // actual above the estimate: settle charged extra
}

type chartTick struct {
	Y, Label string
}

// Ratio is what the estimates reserved per unit actually used, as a
// decimal with two places: 1.00 is exact, above it over-reserved.
func (ch costChart) Ratio() string {
	if ch.SumActual.Sign() <= 0 {
		return "—"
	}
	act := ch.SumActual.Big()
	hundredths := new(big.Int).Mul(ch.SumEstimate.Big(), big.NewInt(100))
	hundredths.Add(hundredths, new(big.Int).Rsh(act, 1))
	hundredths.Quo(hundredths, act)
	q, r := new(big.Int).QuoRem(hundredths, big.NewInt(100), new(big.Int))
	return q.String() + "." + fmt.Sprintf("%02d", r.Int64())
}

func fmt1(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

// newCostChart lays out the settled admissions among adms (newest first, as
// AdmissionRecent returns them).
func newCostChart(adms []*account.Admission) costChart {
	ch := costChart{Width: 960, Height: 240, Left: 64, Right: 950, Top: 12, Bottom: 216}
	var settled []*account.Admission
	for i := len(adms) - 1; i >= 0; i-- {
		if a := adms[i]; a.ActualCost != nil {
			settled = append(settled, a)
		}
	}
	ch.Count = len(settled)
	if ch.Count == 0 {
		return ch
	}
	var top int64 = 1
	for _, a := range settled {
		top = max(top, a.Estimate.Cost, *a.ActualCost)
		ch.SumEstimate = ch.SumEstimate.AddInt64(a.Estimate.Cost)
		ch.SumActual = ch.SumActual.AddInt64(*a.ActualCost)
	}
	top = niceCeil(top)
	plotH := float64(ch.Bottom - ch.Top)
	y := func(v int64) float64 { return float64(ch.Bottom) - float64(max(v, 0))*plotH/float64(top) }
	for i := range 5 {
		v := top/4*int64(i) + top%4*int64(i)/4 // top * i / 4, which cannot overflow
		ch.Ticks = append(ch.Ticks, chartTick{Y: fmt1(y(v)), Label: groupDigits(v)})
	}
	slot := float64(ch.Right-ch.Left) / float64(max(len(settled), 20))
	w := slot * 0.38
	for i, a := range settled {
		x := float64(ch.Left) + float64(i)*slot + slot*0.1
		est, act := a.Estimate.Cost, *a.ActualCost
		ch.Bars = append(ch.Bars, costBar{
			Title: a.ID + " (" + a.Estimate.Model + "): estimate " + groupDigits(est) + ", actual " + groupDigits(act),
			X:     fmt1(x), W: fmt1(w),
			EstY: fmt1(y(est)), EstH: fmt1(float64(ch.Bottom) - y(est)),
			ActX: fmt1(x + w), ActY: fmt1(y(act)), ActH: fmt1(float64(ch.Bottom) - y(act)),
			Over: act > est,
		})
	}
	return ch
}

// niceCeil rounds an axis maximum up to 1, 2 or 5 times a power of ten;
// beyond 5e18, the next such number is beyond int64, so it is v itself.
func niceCeil(v int64) int64 {
	for p := int64(1); ; p *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if m*p >= v {
				return m * p
			}
		}
		if p > math.MaxInt64/10 {
			return v
		}
	}
}

// entryTable is a list of ledger entries as the tenant and ledger pages
// show them.
type entryTable struct {
	Entries    []ledger.Entry
	ShowTenant bool
	// Currency is the deployment's, of the entries' money.
	Currency string
}
