package web

import (
	"context"
	"errors"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// endUsersShown bounds the end users a tenant page lists (the admin API
// and the CLI page through all of them).
const endUsersShown = 50

// endUsersView is a tenant's end-user policy and its first end users, as
// its page shows them (read-only: the policy is set through the admin API
// or the CLI).
type endUsersView struct {
	Policy *account.EndUserPolicy
	Users  []account.EndUser
	// More says the tenant has more end users than are shown.
	More bool
}

// endUsers loads a tenant's end-user view: nothing for a tenant without a
// policy or end users.
func (d *Dashboard) endUsers(ctx context.Context, id string) (endUsersView, error) {
	var v endUsersView
	pol, err := d.admin.EndUserPolicyGet(ctx, id)
	switch {
	case errors.Is(err, rule.ErrNoEndUserPolicy):
	case err != nil:
		return v, err
	default:
		v.Policy = pol
	}
	users, err := d.admin.EndUserList(ctx, id, "", endUsersShown+1)
	if err != nil {
		return v, err
	}
	if len(users) > endUsersShown {
		users, v.More = users[:endUsersShown], true
	}
	v.Users = users
	return v, nil
}
