// Package admin is tokengate's administration as use cases: one method of
// Service per admin operation (tenants, keys, gateways, admin tokens and
// sessions, models, prices, pools, limits, model limits, end users,
// alerts) and per read the faces show (ledger queries and exports, audits,
// drift reports, window spend, activity).
//
// The HTTP API, the dashboard and the CLI call the same method for the same
// operation and only translate (JSON, forms, flags in; the domain's
// sentinel errors out, mapped once per face). A flow written once here
// (save a model and reload the replica's table, add a price in the default
// currency, sum a window's spend) cannot drift between faces.
//
// Invariant: each change is checked and written with its ledger entry in one
// transaction, owned by the method that makes it (or, for the budget's own
// rows, by the account.Store method it calls, which locks the tenant and
// appends its entry in the same transaction). Changes that have no ledger
// entry today (models, prices, pools, alerts, gateways, admin tokens) keep
// their own single transaction.
//
// Service holds the database pools; faces never see them.
package admin
