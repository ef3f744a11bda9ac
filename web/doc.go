// Package web is tokengate's admin dashboard: server-rendered pages over the
// budget, ledger, estimator and key packages, for the people who run the
// service.
//
// Everything it serves is embedded in the binary (html/template pages, one
// stylesheet, one small script, an icon), so the dashboard works offline and
// its Content-Security-Policy can forbid every inline script and style and
// every other origin. Charts and gauges are SVG drawn here, in Go; the
// script only moves SVG attributes and text when it polls for live numbers.
//
// Budgets nest, and an admission must fit every level of its tenant's
// tree, so tenants are shown as trees (each under its parent, with its own
// gauges) rather than as a flat list that would hide which organisation a
// busy team draws on. Shadow limits are marked wherever limits are shown,
// with what they would have refused beside them: a shadow limit exists to
// be judged on real traffic before it is enforced.
//
// A tenant's model limits (input and output token buckets per model, as
// providers state ITPM and OTPM) sit on its page beside its tenant-wide
// limits, because an admission for the model must fit both. An upstream
// pool is shared by tenants in weighted fair shares, so the pools page puts
// each tenant's weight beside what it was actually served: whether the
// split matches the weights is the question an admin brings to it. A key's
// priority class is set on its tenant's page, with a ledger entry, like
// every other change to a tenant.
//
// The alerts page (budget/alert) shows where budget alerts go and whether
// they got there: endpoints, whose signing secret appears once, on the
// answer to the POST that made it; rules; and the outbox's delivery log
// with every attempt, so a receiver that keeps failing is seen failing
// and an event given up can be sent again.
//
// An admin logs in with an admin token (tga_...); the session lives in
// Postgres (credential), so every replica serves it, and logging out or
// revoking the token ends it everywhere. Each session has its own CSRF
// token: every state change is a POST carrying it, checked in constant
// time, so a form rendered for an ended session is useless.
//
// It is a face: it may import the domain (budget, budget/alert,
// budget/credential, estimator, ledger), never another face (api); the serve command mounts it
// on the API's router.
package web
