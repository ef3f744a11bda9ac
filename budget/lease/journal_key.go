package lease

import (
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
)

// key is a tenant key as a journal group reads it, with its row's
// version (lease_credentials_same.sql).
type key struct {
	tenant  string
	revoked bool
	models  []string
	version string
}

// gateway is an unrevoked gateway credential as a journal group reads it:
// its scope and its row's version.
type gateway struct {
	scope   []string
	version string
}

// groupKeys is the distinct tenant keys and gateways of a group's
// admissions.
func groupKeys(order []string, byLease map[string][]*appendReq) (keys, gateways []string) {
	for _, id := range order {
		for _, r := range byLease[id] {
			if r.a.KeyID != "" && !slices.Contains(keys, r.a.KeyID) {
				keys = append(keys, r.a.KeyID)
			}
			if r.a.GatewayID != "" && !slices.Contains(gateways, r.a.GatewayID) {
				gateways = append(gateways, r.a.GatewayID)
			}
		}
	}
	return keys, gateways
}

// readGateways is the unrevoked gateways of a group, with their scopes.
func readGateways(br pgx.BatchResults) (map[string]gateway, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("gateways: %w", err)
	}
	defer rows.Close()
	gws := map[string]gateway{}
	for rows.Next() {
		var id string
		var g gateway
		if err := rows.Scan(&id, &g.scope, &g.version); err != nil {
			return nil, fmt.Errorf("gateways: %w", err)
		}
		gws[id] = g
	}
	return gws, rows.Err()
}

func readKeys(br pgx.BatchResults) (map[string]key, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("keys: %w", err)
	}
	defer rows.Close()
	keys := map[string]key{}
	for rows.Next() {
		var id string
		var k key
		if err := rows.Scan(&id, &k.tenant, &k.revoked, &k.models, &k.version); err != nil {
			return nil, fmt.Errorf("keys: %w", err)
		}
		keys[id] = k
	}
	return keys, rows.Err()
}

// refuseByKey is the credentials' rules of a decision, applied to the
// admissions of the leases that accepted, in the decision's order: a
// gateway revoked or unknown refuses with rule.ErrGatewayRevoked, one whose
// scope leaves out the tenant with rule.ErrOutOfScope; a key revoked,
// unknown or another tenant's refuses with rule.ErrKeyRevoked, a model
// outside the key's scope with *rule.ModelNotAllowedError (the tenants'
// scopes keep a tenant exact: account.Level.ExactOnly).
func refuseByKey(order []string, byLease map[string][]*appendReq, verdict map[string]string, keys map[string]key, gws map[string]gateway) map[*appendReq]error {
	var refused map[*appendReq]error
	for _, id := range order {
		tenant := verdict[id]
		if tenant == "" {
			continue
		}
		for _, r := range byLease[id] {
			var err error
			if g := r.a.GatewayID; g != "" {
				gw, ok := gws[g]
				switch {
				case !ok:
					err = rule.ErrGatewayRevoked
				case !rule.GatewayMay(gw.scope, tenant):
					err = rule.ErrOutOfScope
				}
			}
			k, ok := keys[r.a.KeyID]
			switch {
			case err != nil || r.a.KeyID == "":
			case !ok || k.revoked || k.tenant != tenant:
				err = rule.ErrKeyRevoked
			default:
				err = rule.CheckModelScopes(r.a.Estimate.Model, "model", nil, k.models)
			}
			if err != nil {
				if refused == nil {
					refused = map[*appendReq]error{}
				}
				refused[r] = err
			}
		}
	}
	return refused
}

// refusedByKey reports whether a journal refused an admission by its key's
// or its gateway's rule (and so did not count its cost in the lease's use).
func refusedByKey(err error) bool {
	var scope *rule.ModelNotAllowedError
	return errors.Is(err, rule.ErrKeyRevoked) || errors.As(err, &scope) || errors.Is(err, rule.ErrGatewayRevoked) || errors.Is(err, rule.ErrOutOfScope)
}
