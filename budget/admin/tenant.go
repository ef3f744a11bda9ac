package admin

import (
	"context"
	"errors"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// TenantCreate creates a tenant (under its parent, if any) and its first
// ledger entry in one transaction. It returns rule.ErrTenantExists,
// rule.ErrTenantNotFound (the parent) or a validation error.
func (s *Service) TenantCreate(ctx context.Context, p account.CreateTenantParams) (rule.Snapshot, error) {
	return s.store.CreateTenant(ctx, p)
}

// Tenant returns a tenant's budget refilled to now, or
// rule.ErrTenantNotFound.
func (s *Service) Tenant(ctx context.Context, tenantID string) (rule.Snapshot, error) {
	return s.store.TenantSnapshot(ctx, tenantID)
}

// TenantList returns every tenant's budget.
func (s *Service) TenantList(ctx context.Context) ([]rule.Snapshot, error) {
	return s.store.TenantList(ctx)
}

// TenantTree returns the whole budget tree holding tenantID, or
// rule.ErrTenantNotFound.
func (s *Service) TenantTree(ctx context.Context, tenantID string) (*account.TreeNode, error) {
	return s.store.TenantTree(ctx, tenantID)
}

// TenantLimitsUpdate changes the limits a patch names, with its ledger
// entry, in one transaction, which also ends the tenant's live leases
// (lease_end.go).
func (s *Service) TenantLimitsUpdate(ctx context.Context, p account.UpdateLimitsParams) (rule.Snapshot, error) {
	return s.limitsUpdate(ctx, p)
}

// TenantSetDisabled disables or enables a tenant, with its ledger entry, in
// one transaction, which also ends the tenant's live leases (lease_end.go).
func (s *Service) TenantSetDisabled(ctx context.Context, p account.SetDisabledParams) (rule.Snapshot, error) {
	return s.setDisabled(ctx, p)
}

// TenantAdjust credits or debits a tenant's tokens, with its ledger entry,
// in one transaction.
func (s *Service) TenantAdjust(ctx context.Context, p account.AdjustParams) (rule.Snapshot, error) {
	return s.store.Adjust(ctx, p)
}

// ModelLimitsSet sets a tenant's limits for one model, with its ledger
// entry, in one transaction.
func (s *Service) ModelLimitsSet(ctx context.Context, p account.SetModelLimitsParams) (rule.ModelSnapshot, error) {
	return s.store.SetModelLimits(ctx, p)
}

// ModelLimitsRemove removes a tenant's limits for one model, with its
// ledger entry, in one transaction.
func (s *Service) ModelLimitsRemove(ctx context.Context, tenantID, model, actor string) error {
	return s.store.RemoveModelLimits(ctx, tenantID, model, actor)
}

// ModelLimitsList returns a tenant's model limits. It returns
// rule.ErrTenantNotFound for a tenant that does not exist (not an empty
// list).
func (s *Service) ModelLimitsList(ctx context.Context, tenantID string) ([]rule.ModelSnapshot, error) {
	if _, err := s.store.TenantSnapshot(ctx, tenantID); err != nil {
		return nil, err
	}
	return s.store.ModelLimitsList(ctx, tenantID)
}

// EndUserPolicySet sets a tenant's end-user policy, with its ledger entry,
// in one transaction.
func (s *Service) EndUserPolicySet(ctx context.Context, p account.EndUserPolicyParams) (*account.EndUserPolicy, error) {
	return s.store.EndUserPolicySet(ctx, p)
}

// EndUserPolicyGet returns a tenant's end-user policy.
func (s *Service) EndUserPolicyGet(ctx context.Context, tenantID string) (*account.EndUserPolicy, error) {
	return s.store.EndUserPolicyGet(ctx, tenantID)
}

// EndUserPolicyDelete removes a tenant's end-user policy, with its ledger
// entry, in one transaction.
func (s *Service) EndUserPolicyDelete(ctx context.Context, tenantID, actor string) error {
	return s.store.EndUserPolicyDelete(ctx, tenantID, actor)
}

// EndUserList returns up to limit of a tenant's end users after the id
// after. It returns rule.ErrTenantNotFound for a tenant that does not
// exist (not an empty list).
func (s *Service) EndUserList(ctx context.Context, tenantID, after string, limit int) ([]account.EndUser, error) {
	if _, err := s.store.TenantSnapshot(ctx, tenantID); err != nil {
		return nil, err
	}
	return s.store.EndUserList(ctx, tenantID, after, limit)
}

// Admission returns one of a tenant's admissions, or one of its end users'
// (an end-user policy admits in the end user's name), or
// rule.ErrAdmissionNotFound.
func (s *Service) Admission(ctx context.Context, tenantID, admissionID string) (*account.Admission, error) {
	a, err := s.store.AdmissionGet(ctx, tenantID, admissionID)
	if errors.Is(err, rule.ErrAdmissionNotFound) {
		if child, cerr := s.store.EndUserAdmissionTenant(ctx, tenantID, admissionID); cerr == nil && child != "" {
			a, err = s.store.AdmissionGet(ctx, child, admissionID)
		}
	}
	return a, err
}

// AdmissionRecent returns a tenant's latest admissions, newest first.
func (s *Service) AdmissionRecent(ctx context.Context, tenantID string, limit int) ([]*account.Admission, error) {
	return s.store.AdmissionRecent(ctx, tenantID, limit)
}

// Activity returns every tenant's admissions and refusals per minute over
// the last minutes before now.
func (s *Service) Activity(ctx context.Context, now time.Time, minutes int) (map[string]*account.Activity, error) {
	return s.store.Activity(ctx, now, minutes)
}

// TenantModelsSet sets a tenant's model scope (exact names or '*' globs;
// empty: every model its ancestors allow) and writes its ledger entry, the
// lists before and after, in one transaction, which also ends the
// tenant's live leases (lease_end.go). It returns a *rule.LimitError
// (field "models") or rule.ErrTenantNotFound.
func (s *Service) TenantModelsSet(ctx context.Context, p account.SetModelsParams) (rule.Snapshot, error) {
	return s.setModels(ctx, p)
}

// TenantModels returns a tenant's model scope (empty: every model its
// ancestors allow). It returns rule.ErrTenantNotFound.
func (s *Service) TenantModels(ctx context.Context, tenantID string) ([]string, error) {
	snap, err := s.store.TenantSnapshot(ctx, tenantID)
	if err != nil {
		return nil, err
	}
	if snap.Models == nil {
		return []string{}, nil
	}
	return snap.Models, nil
}
