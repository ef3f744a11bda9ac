// Package pgtest gives each test its own real Postgres database.
//
// One Postgres server serves a whole test binary: either the server named by
// TOKENGATE_TEST_DATABASE_URL, or a container started with testcontainers-go
// from PG_IMAGE (default tc.local/postgres:15-bookworm, built by
// `make pg-image`). The embedded migrations are applied once, into a template
// database; every test then gets `CREATE DATABASE .. TEMPLATE ..`, which takes
// milliseconds, and the database is dropped when the test passes (a failed
// test's database is kept, and its name logged, for inspection).
//
// A package that uses pgtest must route its tests through Main:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// It is for tests only (TestLayout checks that no other code imports it); it
// may import migrations.
package pgtest
