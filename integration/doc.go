// Package integration holds tokengate's end-to-end tests: several server
// instances on real listeners sharing one real Postgres, as replicas do in
// production. Its subpackages are the local Postgres image recipe (pgimage)
// and the per-test database harness (pgtest).
package integration
