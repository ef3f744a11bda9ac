package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/rule"
)

// poolJSON is an upstream capacity pool: its bucket, the models that draw
// on it, and each tenant's share of what it served.
type poolJSON struct {
	ID              string      `json:"id"`
	TokensCapacity  int64       `json:"tokens_capacity"`
	TokensPerSecond json.Number `json:"tokens_per_second"`
	Tokens          json.Number `json:"tokens"`
	Models          []string    `json:"models"`
	Shares          []shareJSON `json:"shares"`
	At              time.Time   `json:"at"`
}

type shareJSON struct {
	Tenant string `json:"tenant"`
	Weight int64  `json:"weight"`
	// Served is the raw tokens the pool served the tenant; VTC is its
	// virtual token counter (served / weight): lowest is served first.
	Served int64       `json:"served"`
	VTC    json.Number `json:"vtc"`
}

func poolOf(p rule.PoolSnapshot) poolJSON {
	out := poolJSON{ID: p.ID, TokensCapacity: p.Limits.TokensCapacity, TokensPerSecond: json.Number(rule.FormatRate(p.Limits.TokensRateMicro)),
		Tokens: json.Number(formatMicro(p.TokensMicro)), Models: p.Models, Shares: []shareJSON{}, At: p.At}
	if out.Models == nil {
		out.Models = []string{}
	}
	for _, sh := range p.Shares {
		out.Shares = append(out.Shares, shareJSON{Tenant: sh.TenantID, Weight: sh.Weight, Served: sh.Served, VTC: json.Number(formatMicro(sh.VTCMicro))})
	}
	return out
}

func (s *Server) adminPoolList(c *echo.Context) error {
	pools, err := s.admin.PoolList(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]poolJSON, len(pools))
	for i, p := range pools {
		out[i] = poolOf(p)
	}
	return c.JSON(http.StatusOK, map[string]any{"pools": out})
}

func (s *Server) findPool(c *echo.Context, id string) (poolJSON, error) {
	p, err := s.admin.Pool(c.Request().Context(), id)
	if err != nil {
		return poolJSON{}, err
	}
	return poolOf(p), nil
}

type poolLimitsIn struct {
	TokensCapacity  int64           `json:"tokens_capacity"`
	TokensPerSecond json.RawMessage `json:"tokens_per_second"`
}

func (in poolLimitsIn) limits() (rule.PoolLimits, error) {
	l := rule.PoolLimits{TokensCapacity: in.TokensCapacity}
	if in.TokensPerSecond == nil {
		return l, invalid("tokens_per_second", "required")
	}
	err := rateField(in.TokensPerSecond, "tokens_per_second", &l.TokensRateMicro)
	return l, err
}

func (s *Server) adminPoolCreate(c *echo.Context) error {
	var in struct {
		ID string `json:"id"`
		poolLimitsIn
		Models []string `json:"models"`
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	l, err := in.limits()
	if err != nil {
		return err
	}
	err = s.admin.PoolCreate(c.Request().Context(), in.ID, l, in.Models...)
	if errors.Is(err, rule.ErrPoolExists) {
		return &Error{Status: http.StatusConflict, Type: "conflict", Field: "id", Message: "a pool with this id exists"}
	}
	if err != nil {
		return err
	}
	p, err := s.findPool(c, in.ID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, p)
}

func (s *Server) adminPoolLimits(c *echo.Context) error {
	var in poolLimitsIn
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	l, err := in.limits()
	if err != nil {
		return err
	}
	if err := s.admin.PoolSetLimits(c.Request().Context(), c.Param("pool"), l); err != nil {
		return err
	}
	p, err := s.findPool(c, c.Param("pool"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

// adminPoolRoute routes a model to the pool (PUT), or takes it off (DELETE
// with ?model=). The model is in the body or query: names may hold slashes.
func (s *Server) adminPoolRoute(c *echo.Context) error {
	var in struct {
		Model string `json:"model"`
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	if err := s.admin.PoolRoute(c.Request().Context(), in.Model, c.Param("pool")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) adminPoolUnroute(c *echo.Context) error {
	model := c.QueryParam("model")
	if model == "" {
		return invalid("model", "name the model: ?model=NAME")
	}
	if _, err := s.findPool(c, c.Param("pool")); err != nil {
		return err
	}
	if err := s.admin.PoolRoute(c.Request().Context(), model, ""); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) adminPoolWeight(c *echo.Context) error {
	var in struct {
		Weight int64 `json:"weight"`
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	if err := s.admin.PoolSetWeight(c.Request().Context(), c.Param("pool"), c.Param("id"), in.Weight); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
