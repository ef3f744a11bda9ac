package lease

import (
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
)

// key is a tenant key as a journal group reads it.
type key struct {
	tenant  string
	revoked bool
	models  []string
}

// groupKeys is the distinct keys of a group's admissions.
func groupKeys(order []string, byLease map[string][]*appendReq) []string {
	var ids []string
	for _, id := range order {
		for _, r := range byLease[id] {
			if r.a.KeyID != "" && !slices.Contains(ids, r.a.KeyID) {
				ids = append(ids, r.a.KeyID)
			}
		}
	}
	return ids
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
		if err := rows.Scan(&id, &k.tenant, &k.revoked, &k.models); err != nil {
			return nil, fmt.Errorf("keys: %w", err)
		}
		keys[id] = k
	}
	return keys, rows.Err()
}

// refuseByKey is the key's rule of a decision, applied to the admissions
// of the leases that accepted: a key revoked, unknown or another tenant's
// refuses with rule.ErrKeyRevoked, a model outside the key's scope with
// *rule.ModelNotAllowedError (the tenants' scopes keep a tenant exact:
// account.Level.ExactOnly).
func refuseByKey(order []string, byLease map[string][]*appendReq, verdict map[string]string, keys map[string]key) map[*appendReq]error {
	var refused map[*appendReq]error
	for _, id := range order {
		tenant := verdict[id]
		if tenant == "" {
			continue
		}
		for _, r := range byLease[id] {
			if r.a.KeyID == "" {
				continue
			}
			k, ok := keys[r.a.KeyID]
			var err error
			switch {
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
// rule (and so did not count its cost in the lease's use).
func refusedByKey(err error) bool {
	var scope *rule.ModelNotAllowedError
	return errors.Is(err, rule.ErrKeyRevoked) || errors.As(err, &scope)
}
