package rule

import "slices"

// GatewayAllTenants in a gateway's scope lets it ask on behalf of every
// tenant.
const GatewayAllTenants = "*"

// GatewayMay reports whether a gateway scoped to scope may ask on behalf of
// tenantID: the scope names the tenant itself, or every tenant
// (GatewayAllTenants). A scope names tenants exactly: a parent in it does
// not cover its children. It is the one rule, applied both where a gateway
// authenticates (credential.Gateway.May) and in the decision that checks
// a request's GatewayID under the tenant locks.
func GatewayMay(scope []string, tenantID string) bool {
	return slices.Contains(scope, GatewayAllTenants) || slices.Contains(scope, tenantID)
}
