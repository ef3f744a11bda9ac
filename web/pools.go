package web

import (
	"errors"
	"math/big"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// An upstream capacity pool is one deployment's token limit, shared by
// every tenant whose requests use a model routed to it. When it runs short
// the tenants get weighted fair shares, so the pools page puts each
// tenant's weight beside what it was actually served: the admin can see
// whether the split matches the weights, and change them.

// poolCard is one pool as the pools page shows it, with its own forms (a
// refused one comes back filled in, on its pool's card).
type poolCard struct {
	ID     string
	Prefix string // the id prefix of its forms' fields
	Tokens gauge
	Rate   string // tokens per second
	Models []string
	Shares []shareRow
	// ServedTotal is what the pool has served all its tenants, in raw
	// tokens: exact, as each tenant's count may be near int64's end.
	ServedTotal account.Total

	Limits, Route, Weight *form
}

// shareRow is a tenant's share of a pool: its weight and what fraction of
// the weights that is, and what it was served and what fraction of
// everything served that is. Counter is the virtual token counter (served
// / weight, in micro units): when the pool is short, the waiting tenant
// with the lowest is served first.
type shareRow struct {
	TenantID  string
	Weight    int64
	WeightPct string // "33.3%"
	Served    int64
	ServedPct string // "33.3%", "—" before anything was served
	Counter   int64
}

// sharePct is part of whole as a percentage with one decimal, rounded to
// the nearest (so the shares of 1:2 read 33.3 % and 66.7 %); "—" when the
// whole is nothing. It is exact for any sizes: whole is a sum of int64s.
func sharePct(part int64, whole account.Total) string {
	if whole.Sign() <= 0 {
		return "—"
	}
	w := whole.Big()
	tenths := new(big.Int).Mul(big.NewInt(max(part, 0)), big.NewInt(1000))
	tenths.Add(tenths, new(big.Int).Rsh(w, 1))
	tenths.Quo(tenths, w)
	q, r := new(big.Int).QuoRem(tenths, big.NewInt(10), new(big.Int))
	return q.String() + "." + r.String() + "%"
}

// poolCards lays out the pools in the store's order (by id), each with a
// blank weight and route form and its limits form filled in.
func poolCards(snaps []rule.PoolSnapshot) []*poolCard {
	cards := make([]*poolCard, 0, len(snaps))
	for _, p := range snaps {
		c := &poolCard{
			ID:     p.ID,
			Prefix: "pool-" + p.ID,
			Tokens: balanceGauge("pool", wholeTokens(p.TokensMicro), p.Limits.TokensCapacity),
			Rate:   rule.FormatRate(p.Limits.TokensRateMicro),
			Models: p.Models,
			Limits: poolLimitsForm(p.Limits),
			Route:  newForm(),
			Weight: newForm(),
		}
		var weights account.Total
		for _, sh := range p.Shares {
			weights = weights.AddInt64(sh.Weight)
			c.ServedTotal = c.ServedTotal.AddInt64(sh.Served)
		}
		for _, sh := range p.Shares {
			c.Shares = append(c.Shares, shareRow{TenantID: sh.TenantID, Weight: sh.Weight, WeightPct: sharePct(sh.Weight, weights),
				Served: sh.Served, ServedPct: sharePct(sh.Served, c.ServedTotal), Counter: sh.VTCMicro})
		}
		cards = append(cards, c)
	}
	return cards
}

func poolLimitsForm(l rule.PoolLimits) *form {
	f := newForm()
	f.Set("tokens_capacity", strconv.FormatInt(l.TokensCapacity, 10))
	f.Set("tokens_per_second", rule.FormatRate(l.TokensRateMicro))
	return f
}

// poolLimits reads a pool's bucket from a form, validated with budget's
// own rules.
func (f *form) poolLimits() rule.PoolLimits {
	l := rule.PoolLimits{TokensCapacity: f.Int("tokens_capacity", true), TokensRateMicro: f.Decimal("tokens_per_second", true)}
	if f.OK() {
		f.limitError(l.Validate())
	}
	return l
}

type poolsView struct {
	layout
	Pools  []*poolCard
	Create *form
	// Tenants are the ids the weight forms suggest.
	Tenants []string
}

func (v *poolsView) card(id string) *poolCard {
	for _, c := range v.Pools {
		if c.ID == id {
			return c
		}
	}
	return nil
}

// renderPools loads the pools page; edit puts a refused form back on its
// card, and returns rule.ErrPoolNotFound when the pool is not there.
func (d *Dashboard) renderPools(c *echo.Context, status int, edit func(*poolsView) error) error {
	ctx := c.Request().Context()
	pools, err := d.admin.PoolList(ctx)
	if err != nil {
		return err
	}
	snaps, err := d.admin.TenantList(ctx)
	if err != nil {
		return err
	}
	v := &poolsView{
		layout: layout{Title: "Pools", Nav: "pools", Session: sessionOf(c), Flash: flash(c)},
		Pools:  poolCards(pools),
		Create: newForm(),
	}
	for _, s := range snaps {
		v.Tenants = append(v.Tenants, s.TenantID)
	}
	if edit != nil {
		if err := edit(v); err != nil {
			return err
		}
	}
	return d.render(c, status, "pools.html", v)
}

func (d *Dashboard) poolsPage(c *echo.Context) error { return d.renderPools(c, http.StatusOK, nil) }

// refusedOn renders the pools page with f, refused, on pool id's card.
func (d *Dashboard) refusedOn(c *echo.Context, id string, set func(*poolCard)) error {
	return d.renderPools(c, http.StatusUnprocessableEntity, func(v *poolsView) error {
		card := v.card(id)
		if card == nil {
			return rule.ErrPoolNotFound
		}
		set(card)
		return nil
	})
}

// poolCreate creates a pool with a full bucket; models are routed to it
// and weights set on its card.
func (d *Dashboard) poolCreate(c *echo.Context) error {
	f := formFrom(postForm(c), "id", "tokens_capacity", "tokens_per_second")
	id := f.Get("id")
	f.limitError(rule.ValidateTenantID(id))
	l := f.poolLimits()
	if f.OK() {
		err := d.admin.PoolCreate(c.Request().Context(), id, l)
		switch {
		case errors.Is(err, rule.ErrPoolExists):
			f.Fail("id", "a pool with this id already exists")
		case f.limitError(err):
		case err != nil:
			return err
		}
	}
	if !f.OK() {
		return d.renderPools(c, http.StatusUnprocessableEntity, func(v *poolsView) error { v.Create = f; return nil })
	}
	return seeOther(c, "/pools?done=pool_created")
}

// poolSetLimits changes a pool's bucket: refilled at the old rate first, then
// cut to a lowered capacity.
func (d *Dashboard) poolSetLimits(c *echo.Context) error {
	id := c.Param("id")
	f := formFrom(postForm(c), "tokens_capacity", "tokens_per_second")
	l := f.poolLimits()
	if f.OK() {
		err := d.admin.PoolSetLimits(c.Request().Context(), id, l)
		if !f.limitError(err) && err != nil {
			return err
		}
	}
	if !f.OK() {
		return d.refusedOn(c, id, func(card *poolCard) { card.Limits = f })
	}
	return seeOther(c, "/pools?done=pool_limits")
}

// poolRoute makes a model's admissions draw on the pool; a model draws on
// one pool at most, so routing it here moves it from any other.
func (d *Dashboard) poolRoute(c *echo.Context) error {
	id := c.Param("id")
	f := formFrom(postForm(c), "model")
	if f.Get("model") == "" {
		f.Fail("model", "is required")
	}
	if f.OK() {
		err := d.admin.PoolRoute(c.Request().Context(), f.Get("model"), id)
		if !f.limitError(err) && err != nil {
			return err
		}
	}
	if !f.OK() {
		return d.refusedOn(c, id, func(card *poolCard) { card.Route = f })
	}
	return seeOther(c, "/pools?done=routed")
}

// poolUnroute takes a model off the pool, if it is still routed to this
// one (another admin may have moved it meanwhile).
func (d *Dashboard) poolUnroute(c *echo.Context) error {
	id, model := c.Param("id"), postForm(c).Get("model")
	ctx := c.Request().Context()
	pools, err := d.admin.PoolList(ctx)
	if err != nil {
		return err
	}
	routed := false
	for _, p := range pools {
		for _, m := range p.Models {
			routed = routed || p.ID == id && m == model
		}
	}
	if !routed {
		return pageErr(http.StatusNotFound, "That model is not routed to this pool (it may have been moved or unrouted already).")
	}
	if err := d.admin.PoolRoute(ctx, model, ""); err != nil {
		return err
	}
	return seeOther(c, "/pools?done=unrouted")
}

// poolWeight sets a tenant's weight in the pool; its counter is kept.
func (d *Dashboard) poolWeight(c *echo.Context) error {
	id := c.Param("id")
	f := formFrom(postForm(c), "tenant", "weight")
	tenant := f.Get("tenant")
	if tenant == "" {
		f.Fail("tenant", "is required")
	}
	w := f.Int("weight", true)
	if f.OK() {
		err := d.admin.PoolSetWeight(c.Request().Context(), id, tenant, w)
		switch {
		case errors.Is(err, rule.ErrTenantNotFound):
			f.Fail("tenant", "no tenant has the id "+strconv.Quote(tenant))
		case f.limitError(err):
		case err != nil:
			return err
		}
	}
	if !f.OK() {
		return d.refusedOn(c, id, func(card *poolCard) { card.Weight = f })
	}
	return seeOther(c, "/pools?done=weight")
}
