// Package migrations owns tokengate's database schema: numbered SQL files,
// embedded in the binary and applied by goose, which records each applied
// version in the goose_db_version table.
//
// Replicas may run migrations concurrently (for example `serve --migrate` on
// every pod): a Postgres session advisory lock serialises them, so each
// version is applied exactly once.
//
// It is the database edge: it imports none of the module's packages.
package migrations
