package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// endUserPolicyJSON is a tenant's end-user policy as the admin API shows
// it. The template has the fields of a tenant's limits, as POST
// /v1/admin/tenants takes them.
type endUserPolicyJSON struct {
	Tenant      string          `json:"tenant"`
	Source      string          `json:"source"`
	Header      *string         `json:"header"`
	Template    json.RawMessage `json:"template"`
	MaxEndUsers int             `json:"max_end_users"`
	IdleTTLS    int64           `json:"idle_ttl_s"`
	UpdatedAt   time.Time       `json:"updated_at"`
	UpdatedBy   string          `json:"updated_by"`
}

func endUserPolicyOf(p *account.EndUserPolicy) endUserPolicyJSON {
	out := endUserPolicyJSON{Tenant: p.TenantID, Source: string(p.Source), Template: rule.LimitsJSON(p.Template),
		MaxEndUsers: p.MaxEndUsers, IdleTTLS: int64(p.IdleTTL / time.Second), UpdatedAt: p.UpdatedAt, UpdatedBy: p.UpdatedBy}
	if p.Source == rule.SourceHeader {
		out.Header = &p.Header
	}
	return out
}

// prefixField names a template's bad field as the body has it
// (template.tokens_capacity).
func prefixField(err error, prefix string) error {
	var e *Error
	var le *rule.LimitError
	switch {
	case errors.As(err, &e) && e.Field != "":
		e.Field = prefix + e.Field
		return e
	case errors.As(err, &le):
		return invalid(prefix+le.Field, le.Reason)
	}
	return err
}

// adminEndUserPolicyPut is PUT /v1/admin/tenants/{id}/end-user-policy:
// where the tenant's requests name their end user, the limits each end
// user gets on first sight, how many it may have and how long an idle one
// lives. A changed template applies to every live end user at once.
func (s *Server) adminEndUserPolicyPut(c *echo.Context) error {
	var in struct {
		Source      *string      `json:"source"`
		Header      *string      `json:"header"`
		Template    *limitsPatch `json:"template"`
		MaxEndUsers *int64       `json:"max_end_users"`
		IdleTTLS    *int64       `json:"idle_ttl_s"`
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	switch {
	case in.Source == nil:
		return invalid("source", `required: "user", "safety_identifier", "metadata.user_id" or "header"`)
	case in.Template == nil:
		return invalid("template", "required: the limits of each end user, as a tenant's (tokens_capacity, tokens_per_second, ...)")
	case in.MaxEndUsers == nil:
		return invalid("max_end_users", "required: how many live end users the tenant may have")
	case in.IdleTTLS == nil:
		return invalid("idle_ttl_s", "required: how long an end user may be idle before it expires, in seconds")
	case *in.MaxEndUsers <= 0 || *in.MaxEndUsers > rule.MaxEndUsersCap:
		return invalid("max_end_users", "must be between 1 and "+strconv.Itoa(rule.MaxEndUsersCap))
	case *in.IdleTTLS <= 0 || *in.IdleTTLS > 366*24*3600:
		return invalid("idle_ttl_s", "must be between 1 and 31622400 seconds (366 days)")
	}
	patch, err := in.Template.patch()
	if err != nil {
		return prefixField(err, "template.")
	}
	p := account.EndUserPolicyParams{TenantID: c.Param("id"), Source: rule.EndUserSource(*in.Source),
		Template: patch.Apply(rule.Limits{}), MaxEndUsers: int(*in.MaxEndUsers), IdleTTL: time.Duration(*in.IdleTTLS) * time.Second,
		Actor: actorOf(c)}
	if in.Header != nil {
		p.Header = *in.Header
	}
	pol, err := s.admin.EndUserPolicySet(c.Request().Context(), p)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, endUserPolicyOf(pol))
}

func (s *Server) adminEndUserPolicyGet(c *echo.Context) error {
	pol, err := s.admin.EndUserPolicyGet(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, endUserPolicyOf(pol))
}

func (s *Server) adminEndUserPolicyDelete(c *echo.Context) error {
	if err := s.admin.EndUserPolicyDelete(c.Request().Context(), c.Param("id"), actorOf(c)); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// endUserJSON is one end user of a tenant, as listed.
type endUserJSON struct {
	// ID is the end user's tenant id (its ledger and budget are under it).
	ID        string     `json:"id"`
	EndUserID string     `json:"end_user_id"`
	CreatedAt time.Time  `json:"created_at"`
	LastSeen  time.Time  `json:"last_seen"`
	ExpiredAt *time.Time `json:"expired_at"`
	Budget    budgetJSON `json:"budget"`
}

// maxEndUserPage bounds a page of end users.
const maxEndUserPage = 1000

// adminEndUserList is GET /v1/admin/tenants/{id}/end-users: a page of the
// tenant's end users, by id; next is the after of the next page (null on
// the last).
func (s *Server) adminEndUserList(c *echo.Context) error {
	limit := 100
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEndUserPage {
			return invalid("limit", "must be an integer between 1 and "+strconv.Itoa(maxEndUserPage))
		}
		limit = n
	}
	after := c.QueryParam("after")
	if len(after) > 64 {
		return invalid("after", "must be an end user's id (the next of the previous page)")
	}
	ctx := c.Request().Context()
	list, err := s.admin.EndUserList(ctx, c.Param("id"), after, limit)
	if err != nil {
		return err
	}
	out := struct {
		EndUsers []endUserJSON `json:"end_users"`
		Next     *string       `json:"next"`
	}{EndUsers: make([]endUserJSON, len(list))}
	budgets := make([]*budgetJSON, len(list))
	for i, u := range list {
		out.EndUsers[i] = endUserJSON{ID: u.Snapshot.TenantID, EndUserID: u.EndUserID, CreatedAt: u.CreatedAt, LastSeen: u.LastSeen,
			ExpiredAt: u.ExpiredAt, Budget: budgetOf(u.Snapshot)}
		budgets[i] = &out.EndUsers[i].Budget
	}
	if err := s.withSpend(ctx, budgets...); err != nil {
		return err
	}
	if len(list) == limit {
		next := list[len(list)-1].Snapshot.TenantID
		out.Next = &next
	}
	return c.JSON(http.StatusOK, out)
}
