package api

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// Model scopes (issue 38): which models a tenant and each of its keys may
// use. The rule and its ledger entries are budget/admin's; these routes
// only translate.

type modelsBody struct {
	Models []string `json:"models"`
}

// adminTenantModelsGet answers GET /v1/admin/tenants/{id}/models.
func (s *Server) adminTenantModelsGet(c *echo.Context) error {
	models, err := s.admin.TenantModels(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, modelsBody{Models: models})
}

// adminTenantModelsPut answers PUT /v1/admin/tenants/{id}/models: the
// tenant's whole list, replaced ([] for every model).
func (s *Server) adminTenantModelsPut(c *echo.Context) error {
	var in struct {
		Models *[]string `json:"models"`
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	if in.Models == nil {
		return invalid("models", "is required: a list of model names or globs ([] for every model)")
	}
	snap, err := s.admin.TenantModelsSet(c.Request().Context(), account.SetModelsParams{TenantID: c.Param("id"), Models: *in.Models, Actor: actorOf(c)})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, modelsBody{Models: nonNilModels(snap.Models)})
}

func nonNilModels(m []string) []string {
	if m == nil {
		return []string{}
	}
	return m
}

// keyNotFound is a key that is not one of the tenant's unrevoked keys.
var keyNotFound = &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such unrevoked key for this tenant"}

func (s *Server) adminKeyCreate(c *echo.Context) error {
	var in modelsBody
	if c.Request().ContentLength != 0 {
		if err := decodeStrict(c, &in); err != nil {
			return err
		}
	}
	k, secret, err := s.admin.KeyCreate(c.Request().Context(), c.Param("id"), in.Models, actorOf(c))
	if errors.Is(err, credential.ErrTenantNotFound) {
		return rule.ErrTenantNotFound
	}
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusCreated, struct {
		credential.Key
		Secret string `json:"secret"`
		Note   string `json:"note"`
	}{k, secret, "the secret is shown once; only its SHA-256 is stored"})
}

// adminKeyPatch changes a key's priority class among the requests waiting
// for an upstream pool, its model scope, or both.
func (s *Server) adminKeyPatch(c *echo.Context) error {
	var in struct {
		Priority *string   `json:"priority"`
		Models   *[]string `json:"models"`
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	if in.Priority == nil && in.Models == nil {
		return invalid("body", `give "priority", "models" or both`)
	}
	ctx, tenantID, keyID := c.Request().Context(), c.Param("id"), c.Param("key")
	if in.Models != nil {
		if _, err := rule.NormalizeModels(*in.Models); err != nil {
			return err // before the priority is changed
		}
	}
	if in.Priority != nil {
		err := s.admin.KeySetPriority(ctx, tenantID, keyID, rule.Priority(*in.Priority), actorOf(c))
		switch {
		case errors.Is(err, credential.ErrBadPriority):
			return invalid("priority", `must be "critical", "standard" or "sheddable"`)
		case errors.Is(err, credential.ErrKeyNotFound):
			return keyNotFound
		case err != nil:
			return err
		}
	}
	if in.Models != nil {
		_, err := s.admin.KeySetModels(ctx, tenantID, keyID, *in.Models, actorOf(c))
		switch {
		case errors.Is(err, credential.ErrKeyNotFound):
			return keyNotFound
		case err != nil:
			return err
		}
	}
	return c.NoContent(http.StatusNoContent)
}
