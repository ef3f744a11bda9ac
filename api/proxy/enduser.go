package proxy

import (
	"net/http"

	"github.com/tokengate/tokengate/budget/admission"
)

// endUserOf is what may name a call's end user: the call's headers, and
// the body's fields its wire parsed (OpenAI's user and safety_identifier,
// Anthropic's metadata.user_id), which Admit reads from the parsed
// request. The admission layer picks the one the tenant's end-user policy
// names, if it has one.
func endUserOf(r *http.Request) admission.EndUser {
	return admission.EndUser{HeaderFunc: r.Header.Get}
}

// tenantID is the tenant the call was admitted as: its end user's, when
// the key's tenant has an end-user policy that named one, whose settle or
// release must name it; else the key's tenant.
func (c *call) tenantID() string {
	if id := c.admission.Snapshot.TenantID; id != "" {
		return id
	}
	return c.principal.TenantID
}
