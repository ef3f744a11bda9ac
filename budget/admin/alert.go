package admin

import (
	"context"

	"github.com/tokengate/tokengate/budget/alert"
)

// AlertsHaveKey reports whether alert endpoints can be created (their
// secrets need the alert key).
func (s *Service) AlertsHaveKey() bool { return s.alerts.HasKey() }

// AlertEndpointCreate creates a webhook endpoint and returns it with its
// signing secret, shown once.
func (s *Service) AlertEndpointCreate(ctx context.Context, url, description string) (alert.Endpoint, string, error) {
	return s.alerts.CreateEndpoint(ctx, url, description)
}

// AlertEndpointList returns every alert endpoint.
func (s *Service) AlertEndpointList(ctx context.Context) ([]alert.Endpoint, error) {
	return s.alerts.Endpoints(ctx)
}

// AlertEndpointRotate gives an endpoint a new signing secret.
func (s *Service) AlertEndpointRotate(ctx context.Context, id string) (string, error) {
	return s.alerts.RotateSecret(ctx, id)
}

// AlertEndpointDisable stops deliveries to an endpoint.
func (s *Service) AlertEndpointDisable(ctx context.Context, id string) error {
	return s.alerts.DisableEndpoint(ctx, id)
}

// AlertRuleCreate creates an alert rule. A period budget rule is raised by
// this replica from its next decision (others within their refresh).
func (s *Service) AlertRuleCreate(ctx context.Context, p alert.RuleParams) (alert.Rule, error) {
	r, err := s.alerts.CreateRule(ctx, p)
	if err != nil {
		return r, err
	}
	if r.Kind == alert.KindPeriodBudget {
		s.store.NotePeriodAlertRule()
	}
	return r, nil
}

// AlertRuleList returns the alert rules (only a tenant's when tenantID is
// not empty).
func (s *Service) AlertRuleList(ctx context.Context, tenantID string) ([]alert.Rule, error) {
	return s.alerts.Rules(ctx, tenantID)
}

// AlertRuleDelete deletes an alert rule.
func (s *Service) AlertRuleDelete(ctx context.Context, id int64) error {
	return s.alerts.DeleteRule(ctx, id)
}

// AlertEventList returns the alert events a filter selects.
func (s *Service) AlertEventList(ctx context.Context, f alert.EventFilter) ([]alert.Event, error) {
	return s.alerts.Events(ctx, f)
}

// AlertEventRedeliver queues a failed event for delivery again.
func (s *Service) AlertEventRedeliver(ctx context.Context, id string) error {
	return s.alerts.Redeliver(ctx, id)
}
