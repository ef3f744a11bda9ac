// Package api is tokengate's HTTP surface: the Echo router, its middleware,
// the frontend and admin endpoints, and the single error handler that turns
// package sentinels into HTTP statuses.
//
// It is a face: it may import the domain (budget and the packages below it,
// estimator, ledger) and migrations, never another face (web). Handlers
// decode, call the domain, and encode; the one error handler maps the
// domain's sentinels to statuses.
package api
