// Package credential owns who may call tokengate: tenant API keys
// (tg_<id>_<secret>), admin tokens (tga_<id>_<secret>) and the dashboard's
// sessions, the limiter of failed authentication, and the Guard that
// applies it in front of every face (HTTP, dashboard, gateways).
//
// Every credential has one format: a prefix, a 12-character id stored in
// clear and shown in listings, and a 52-character (256-bit) secret shown
// once, at creation, of which only the SHA-256 is stored. Verification looks
// the id up and compares hashes in constant time, so neither timing nor a
// database leak reveals a usable credential.
//
// It may import budget (a key's creation and revocation are entries of the
// tenant's ledger), never a face.
package credential
