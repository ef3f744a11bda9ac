package api

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/batch"
)

// batchAllowanceJSON is a tenant's enqueued-tokens allowance for batches.
type batchAllowanceJSON struct {
	Tenant string `json:"tenant"`
	// Capacity is in tokens at batch prices; Enqueued what open batches
	// hold now (a decimal: batch prices halve whole tokens).
	Capacity int64       `json:"capacity"`
	Enqueued json.Number `json:"enqueued"`
}

func batchAllowanceOf(tenant string, a batch.Allowance) batchAllowanceJSON {
	return batchAllowanceJSON{Tenant: tenant, Capacity: a.Capacity, Enqueued: json.Number(formatMicro(a.EnqueuedMicro))}
}

func (s *Server) adminBatchAllowanceGet(c *echo.Context) error {
	a, err := s.admin.BatchAllowance(c.Request().Context(), c.Param("id"))
	if errors.Is(err, batch.ErrNoAllowance) {
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "the tenant has no batch allowance (or no such tenant): its batches are refused"}
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, batchAllowanceOf(c.Param("id"), a))
}

// adminBatchAllowancePut sets a tenant's batch allowance: the body is the
// whole allowance. The models a batch line may name are the tenant's and
// its key's model scopes (PUT /v1/admin/tenants/{id}/models), as for any
// request: a list here is refused, naming where it now lives.
func (s *Server) adminBatchAllowancePut(c *echo.Context) error {
	var in struct {
		Capacity *int64           `json:"capacity"`
		Models   *json.RawMessage `json:"models"`
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	if in.Models != nil {
		return invalid("models", "a batch line may name the models its key and tenant may use, as any request: set them with PUT /v1/admin/tenants/{id}/models")
	}
	if in.Capacity == nil {
		return invalid("capacity", "required: the tokens (at batch prices) the tenant's open batches may hold at once, 0 or more")
	}
	a, err := s.admin.BatchAllowanceSet(c.Request().Context(), batch.SetAllowanceParams{TenantID: c.Param("id"), Capacity: *in.Capacity,
		Actor: actorOf(c)})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, batchAllowanceOf(c.Param("id"), a))
}
