package admin

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// KeyList returns a tenant's API keys (never their secrets). It returns
// rule.ErrTenantNotFound for a tenant that does not exist.
func (s *Service) KeyList(ctx context.Context, tenantID string) ([]credential.Key, error) {
	if _, err := s.store.TenantSnapshot(ctx, tenantID); err != nil {
		return nil, err
	}
	return credential.KeyList(ctx, s.db, tenantID)
}

// KeyCreate creates an API key for a tenant, limited to models (its model
// scope: exact names or '*' globs; empty: every model the tenant may use),
// and its ledger entry in one transaction (the tenant's lock held). It
// returns the key with its secret, shown once, a *rule.LimitError (field
// "models") or credential.ErrTenantNotFound.
func (s *Service) KeyCreate(ctx context.Context, tenantID string, models []string, actor string) (credential.Key, string, error) {
	return credential.KeyCreateRecorded(ctx, s.store, tenantID, models, actor)
}

// KeySetModels sets a key's model scope (empty: every model its tenant may
// use) and writes its ledger entry, the lists before and after, in one
// transaction. It returns the list stored, a *rule.LimitError (field
// "models") or credential.ErrKeyNotFound.
func (s *Service) KeySetModels(ctx context.Context, tenantID, keyID string, models []string, actor string) ([]string, error) {
	return credential.KeySetModelsRecorded(ctx, leaseLocking{s.store, s.leases}, tenantID, keyID, models, actor)
}

// KeyModels returns a key's model scope (empty: every model its tenant
// may use). It returns credential.ErrKeyNotFound.
func (s *Service) KeyModels(ctx context.Context, tenantID, keyID string) ([]string, error) {
	keys, err := s.KeyList(ctx, tenantID)
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if k.ID == keyID && k.RevokedAt == nil {
			return k.Models, nil
		}
	}
	return nil, credential.ErrKeyNotFound
}

// KeyRevoke revokes a key and writes its ledger entry in one transaction,
// with the tenant's live leases locked, so that their journal refuses the
// key from the commit on (lease_end.go). It returns
// credential.ErrKeyNotFound.
func (s *Service) KeyRevoke(ctx context.Context, tenantID, keyID, actor string) error {
	return credential.KeyRevokeRecorded(ctx, leaseLocking{s.store, s.leases}, tenantID, keyID, actor)
}

// KeySetPriority sets a key's priority class and writes its ledger entry in
// one transaction. It returns credential.ErrKeyNotFound or
// credential.ErrBadPriority.
func (s *Service) KeySetPriority(ctx context.Context, tenantID, keyID string, p rule.Priority, actor string) error {
	return credential.KeySetPriorityRecorded(ctx, s.store, tenantID, keyID, p, actor)
}

// GatewayCreate creates a gateway credential for the tenants it may act
// for, and returns it with its secret, shown once.
func (s *Service) GatewayCreate(ctx context.Context, name string, tenants []string) (credential.Gateway, string, error) {
	return credential.GatewayCreate(ctx, s.db, name, tenants)
}

// GatewayList returns every gateway credential (never their secrets).
func (s *Service) GatewayList(ctx context.Context) ([]credential.Gateway, error) {
	return credential.GatewayList(ctx, s.db)
}

// GatewayRevoke revokes a gateway credential, with the live leases it may
// admit through locked after the revoke in the same transaction
// (lease.Store.LockLiveGateway: its tenants', or every live lease for a
// gateway of every tenant): the journal reads gateways after it locks its
// leases, so it refuses the gateway's admissions from the revoke's commit
// on.
func (s *Service) GatewayRevoke(ctx context.Context, id string) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		scope, err := credential.GatewayRevokeScope(ctx, tx, id)
		if err != nil {
			return err
		}
		return s.leases.LockLiveGateway(ctx, tx, scope)
	})
}

// AdminTokenCreate creates an admin token and returns it with its secret,
// shown once. It returns credential.ErrAdminNameTaken or
// credential.ErrAdminBadName.
func (s *Service) AdminTokenCreate(ctx context.Context, name string) (credential.AdminToken, string, error) {
	return credential.AdminTokenCreate(ctx, s.db, name)
}

// AdminTokenList returns every admin token (never their secrets).
func (s *Service) AdminTokenList(ctx context.Context) ([]credential.AdminToken, error) {
	return credential.AdminTokenList(ctx, s.db)
}

// AdminTokenRevoke revokes an admin token. It returns
// credential.ErrAdminNotFound.
func (s *Service) AdminTokenRevoke(ctx context.Context, id string) error {
	return credential.AdminTokenRevoke(ctx, s.db, id)
}

// Login checks a presented admin token and opens a session of ttl for it,
// returning the session's cookie. It returns credential.ErrAdminInvalid.
// The token's last use is recorded best effort: a login does not fail
// because that write did.
func (s *Service) Login(ctx context.Context, presented string, ttl time.Duration) (string, credential.Session, error) {
	tok, err := credential.AdminTokenAuthenticate(ctx, s.db, presented)
	if err != nil {
		return "", credential.Session{}, err
	}
	cookie, sess, err := credential.SessionCreate(ctx, s.db, tok, ttl)
	if err != nil {
		return "", credential.Session{}, err
	}
	if err := credential.AdminTokenTouch(ctx, s.db, tok.ID); err != nil {
		s.logger.WarnContext(ctx, "record admin token use", "token_id", tok.ID, "error", err.Error())
	}
	return cookie, sess, nil
}

// Session returns the live session of a cookie, or
// credential.ErrAdminInvalid.
func (s *Service) Session(ctx context.Context, cookie string) (credential.Session, error) {
	return credential.SessionGet(ctx, s.db, cookie)
}

// Logout ends the session of a cookie.
func (s *Service) Logout(ctx context.Context, cookie string) error {
	return credential.SessionDelete(ctx, s.db, cookie)
}
