// Package api is tokengate's HTTP surface: the Echo router, its middleware,
// the frontend and admin endpoints, and the single error handler that turns
// package sentinels into HTTP statuses.
//
// It is a face: it may import the domain (budget and the packages below it,
// estimator, ledger) and migrations, never another face (web, api/proxy,
// api/rls). It builds no domain service: New takes the replica
// (budget/replica) that cmd built and hands to every face, and Config
// holds only HTTP concerns. Handlers decode, call the domain (admissions
// through budget/admission, the use case every face shares), and encode;
// the one error handler (errors.go) maps the domain's sentinels to
// statuses.
package api
