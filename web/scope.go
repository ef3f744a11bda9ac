package web

import (
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// Model scopes (issue 38) on the tenant page: the tenant's list and each
// key's. The rule and the ledger entries are budget/admin's; these
// handlers only translate a form.

// modelList reads a model scope as a form gives it: names or globs
// separated by commas or white space ("" for every model).
func modelList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\r' || r == '\t' })
}

// scopeErr is a refused list, as the page says it.
func scopeErr(le *rule.LimitError) error {
	return pageErr(http.StatusUnprocessableEntity, "Models: "+le.Reason+".")
}

// tenantModels replaces a tenant's model scope.
func (d *Dashboard) tenantModels(c *echo.Context) error {
	id := c.Param("id")
	_, err := d.admin.TenantModelsSet(c.Request().Context(), account.SetModelsParams{TenantID: id, Models: modelList(postForm(c).Get("models")), Actor: actor(c)})
	if le := (*rule.LimitError)(nil); errors.As(err, &le) {
		return scopeErr(le)
	}
	if err != nil {
		return err
	}
	return seeOther(c, tenantURL(id, "models"))
}

// keyModels replaces a key's model scope.
func (d *Dashboard) keyModels(c *echo.Context) error {
	id := c.Param("id")
	_, err := d.admin.KeySetModels(c.Request().Context(), id, c.Param("key"), modelList(postForm(c).Get("models")), actor(c))
	if le := (*rule.LimitError)(nil); errors.As(err, &le) {
		return scopeErr(le)
	}
	switch {
	case errors.Is(err, credential.ErrKeyNotFound):
		return pageErr(http.StatusNotFound, "This tenant has no such active key (it may have been revoked).")
	case err != nil:
		return err
	}
	return seeOther(c, tenantURL(id, "models"))
}
