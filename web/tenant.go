package web

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// recentEntries and recentAdmissions bound what a tenant page loads.
const (
	recentEntries    = 25
	recentAdmissions = 40
	maxReasonLen     = 500
)

type tenantView struct {
	layout
	Row  *tenantRow
	Snap rule.Snapshot
	// Tree is the tenant's ancestors, itself and its children, in tree
	// order; Levels are the tenants every admission of it must fit, root
	// first (its ancestors and itself).
	Tree     []*tenantRow
	Levels   []string
	Children int
	// CanNest says whether a tenant may be created below this one.
	CanNest bool
	Limits  *form
	Adjust  *form
	Disable *form
	Keys    []credential.Key
	// ModelLimits are the tenant's own per-model buckets; ModelForm sets
	// one (filled in by a row's edit link, or as a refused form was sent).
	ModelLimits []modelLimitRow
	ModelForm   *form
	// NewKey is set only on the answer to the POST that created the key:
	// the one time its secret is shown.
	NewKey  *newKey
	Entries entryTable
	Chart   costChart
	Drift   driftView
	// Windows are the calendar windows of every tenant of Tree.
	Windows windowsView
	// EndUsers is the tenant's end-user policy and end users (end_users.go).
	EndUsers endUsersView
	// Batch is the tenant's batch allowance and its form (batch.go).
	Batch batchView
	// Lease is the tenant's lease mode (lease.go).
	Lease leaseView
}

type newKey struct {
	Secret string
	Prefix string
}

// renderTenant loads a tenant page; edit adjusts the view (a refused form,
// a new key) before it is rendered.
func (d *Dashboard) renderTenant(c *echo.Context, id string, status int, edit func(*tenantView)) error {
	ctx := c.Request().Context()
	tree, err := d.admin.TenantTree(ctx, id)
	if err != nil {
		return err
	}
	snaps, snap, ok := treeSnapshots(tree, id)
	if !ok {
		return rule.ErrTenantNotFound
	}
	rows, err := d.tenantRows(ctx, snaps)
	if err != nil {
		return err
	}
	var row *tenantRow
	for _, r := range rows {
		if r.ID == id {
			row, r.Current = r, true
		}
	}
	keys, err := d.admin.KeyList(ctx, id)
	if err != nil {
		return err
	}
	entries, _, err := d.admin.LedgerQuery(ctx, ledger.Filter{TenantID: id, Limit: recentEntries})
	if err != nil {
		return err
	}
	models, err := d.admin.ModelLimitsList(ctx, id)
	if err != nil {
		return err
	}
	adms, err := d.admin.AdmissionRecent(ctx, id, recentAdmissions)
	if err != nil {
		return err
	}
	drift, err := d.drift(ctx, id)
	if err != nil {
		return err
	}
	endUsers, err := d.endUsers(ctx, id)
	if err != nil {
		return err
	}
	// The windows of the tree, and of the end users the page lists.
	wsnaps, wrows, userNames := withEndUsers(snaps, rows, row, endUsers.Users)
	windows, err := d.windowLines(ctx, wsnaps, wrows)
	if err != nil {
		return err
	}
	for i := range windows.Lines {
		windows.Lines[i].EndUser = userNames[windows.Lines[i].Tenant]
	}
	currency, err := d.admin.PriceCurrency(ctx)
	if err != nil {
		return err
	}
	batches, err := d.batchAllowanceView(ctx, id)
	if err != nil {
		return err
	}
	leaseMode, err := d.leaseModeView(ctx, id)
	if err != nil {
		return err
	}
	v := &tenantView{
		layout: layout{Title: "Tenant " + id, Nav: "overview", Session: sessionOf(c), Flash: flash(c),
			Live: "/ui/overview.json?tenant=" + pathEscape(id)},
		Row:         row,
		Snap:        snap,
		Tree:        rows,
		Levels:      append(slices.Clone(snap.Path), id),
		Children:    len(rows) - len(snap.Path) - 1,
		CanNest:     len(snap.Path)+1 < rule.MaxDepth,
		Limits:      limitsForm(snap.Limits),
		Adjust:      newForm(),
		Disable:     newForm(),
		Keys:        keys,
		ModelLimits: modelLimitRows(models),
		ModelForm:   modelLimitsEdit(models, c.QueryParam("model")),
		Entries:     entryTable{Entries: entries, Currency: currency},
		Chart:       newCostChart(adms),
		Drift:       drift,
		Windows:     windows,
		EndUsers:    endUsers,
		Batch:       batches,
		Lease:       leaseMode,
	}
	if edit != nil {
		edit(v)
	}
	return d.render(c, status, "tenant.html", v)
}

func (d *Dashboard) tenantShow(c *echo.Context) error {
	return d.renderTenant(c, c.Param("id"), http.StatusOK, nil)
}

func tenantURL(id, done string) string {
	return "/tenants/" + pathEscape(id) + "?done=" + done
}

// tenantLimits changes the limits the admin edited (the form's hidden was
// fields tell which), as one patch applied under the tenant's row lock;
// budget refills at the old rates first and records the change, before and
// after, in the ledger. A form with nothing edited changes nothing.
func (d *Dashboard) tenantLimits(c *echo.Context) error {
	id := c.Param("id")
	posted := postForm(c)
	f := formFrom(posted, append(slices.Clone(limitFields), wasFields...)...)
	p := f.limitsPatch(posted)
	f.windowsPatch(posted, &p)
	if f.OK() && !p.Empty() {
		_, err := d.admin.TenantLimitsUpdate(c.Request().Context(), account.UpdateLimitsParams{TenantID: id, Patch: p, Actor: actor(c)})
		if !f.limitError(err) && err != nil {
			return err
		}
	}
	if !f.OK() {
		return d.renderTenant(c, id, http.StatusUnprocessableEntity, func(v *tenantView) { v.Limits = f })
	}
	return seeOther(c, tenantURL(id, "limits"))
}

func (d *Dashboard) tenantDisable(c *echo.Context) error { return d.setDisabled(c, true) }

func (d *Dashboard) tenantEnable(c *echo.Context) error { return d.setDisabled(c, false) }

func (d *Dashboard) setDisabled(c *echo.Context, disabled bool) error {
	id := c.Param("id")
	f := formFrom(postForm(c), "reason")
	if utf8.RuneCountInString(f.Get("reason")) > maxReasonLen {
		f.Fail("reason", "must be at most "+strconv.Itoa(maxReasonLen)+" characters")
		return d.renderTenant(c, id, http.StatusUnprocessableEntity, func(v *tenantView) { v.Disable = f })
	}
	_, err := d.admin.TenantSetDisabled(c.Request().Context(), account.SetDisabledParams{
		TenantID: id, Disabled: disabled, Reason: f.Get("reason"), Actor: actor(c),
	})
	if err != nil {
		return err
	}
	if disabled {
		return seeOther(c, tenantURL(id, "disabled"))
	}
	return seeOther(c, tenantURL(id, "enabled"))
}

// tenantAdjust credits (positive) or debits (negative) the token balance
// with a reason, which the ledger keeps.
func (d *Dashboard) tenantAdjust(c *echo.Context) error {
	id := c.Param("id")
	f := formFrom(postForm(c), "tokens", "reason")
	n := f.SignedInt("tokens")
	if f.OK() && n == 0 {
		f.Fail("tokens", "must not be 0: a positive number credits, a negative one debits")
	}
	switch reason := f.Get("reason"); {
	case reason == "":
		f.Fail("reason", "is required: the ledger records why")
	case utf8.RuneCountInString(reason) > maxReasonLen:
		f.Fail("reason", "must be at most "+strconv.Itoa(maxReasonLen)+" characters")
	}
	if f.OK() {
		_, err := d.admin.TenantAdjust(c.Request().Context(), account.AdjustParams{TenantID: id, Tokens: n, Reason: f.Get("reason"), Actor: actor(c)})
		switch {
		case errors.Is(err, rule.ErrBadAdjustment), errors.Is(err, rule.ErrOverflow):
			f.Fail("tokens", "is out of range (at most 1,000,000,000,000 either way, and the balance must stay representable)")
		case errors.Is(err, rule.ErrDebtFloor):
			f.Fail("tokens", "would take the balance below the debt floor (minus one tokens capacity)")
		case err != nil:
			return err
		}
	}
	if !f.OK() {
		return d.renderTenant(c, id, http.StatusUnprocessableEntity, func(v *tenantView) { v.Adjust = f })
	}
	return seeOther(c, tenantURL(id, "adjusted"))
}

// keyCreate makes a key and answers with the tenant page showing its
// secret. That answer is the only place the secret ever appears: it is not
// stored, logged, or put in a URL, and the page's script swaps the address
// for the plain tenant page so that a reload shows it no more.
func (d *Dashboard) keyCreate(c *echo.Context) error {
	id := c.Param("id")
	k, secret, err := d.admin.KeyCreate(c.Request().Context(), id, modelList(postForm(c).Get("models")), actor(c))
	if errors.Is(err, credential.ErrTenantNotFound) {
		return rule.ErrTenantNotFound
	}
	if le := (*rule.LimitError)(nil); errors.As(err, &le) {
		return scopeErr(le)
	}
	if err != nil {
		return err
	}
	return d.renderTenant(c, id, http.StatusOK, func(v *tenantView) {
		v.NewKey = &newKey{Secret: secret, Prefix: k.Prefix}
		v.ReplaceURL = "/tenants/" + pathEscape(id)
	})
}

func (d *Dashboard) keyRevoke(c *echo.Context) error {
	id := c.Param("id")
	err := d.admin.KeyRevoke(c.Request().Context(), id, c.Param("key"), actor(c))
	if errors.Is(err, credential.ErrKeyNotFound) {
		return pageErr(http.StatusNotFound, "This tenant has no such active key (it may have been revoked already).")
	}
	if err != nil {
		return err
	}
	return seeOther(c, tenantURL(id, "revoked"))
}
