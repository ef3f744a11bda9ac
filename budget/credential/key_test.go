package credential_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

func TestKeyLifecycle(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	for _, id := range []string{"acme", "globex"} {
		if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: rule.Limits{TokensCapacity: 10, TokensRateMicro: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	k, secret, err := credential.KeyCreate(ctx, pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, k.Prefix) || !strings.HasPrefix(secret, "tg_") || len(secret) != 3+12+1+52 {
		t.Fatalf("key %q (prefix %q) has the wrong shape", secret, k.Prefix)
	}
	// Only the hash of the secret part is stored.
	var stored []byte
	if err := pool.QueryRow(ctx, `SELECT secret_hash FROM api_keys WHERE id = $1`, k.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(strings.TrimPrefix(secret, k.Prefix)))
	if string(stored) != string(sum[:]) {
		t.Fatal("stored value is not the SHA-256 of the secret")
	}
	var leaked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM api_keys WHERE position($1 in encode(secret_hash, 'escape')) > 0 OR id = $1`, secret).Scan(&leaked); err != nil || leaked != 0 {
		t.Fatalf("the secret is stored in clear (%v)", err)
	}

	tenant, keyID, err := credential.KeyAuthenticate(ctx, pool, secret)
	if err != nil || tenant != "acme" || keyID != k.ID {
		t.Fatalf("Authenticate = %q %q %v", tenant, keyID, err)
	}
	flip := func(s string) string {
		last := s[len(s)-1]
		if last == 'a' {
			return s[:len(s)-1] + "b"
		}
		return s[:len(s)-1] + "a"
	}
	for _, bad := range []string{"", "tg_", secret + "x", strings.ToUpper(secret), flip(secret), "tg_" + strings.Repeat("a", 12) + "_" + strings.Repeat("a", 52)} {
		if _, _, err := credential.KeyAuthenticate(ctx, pool, bad); !errors.Is(err, credential.ErrKeyInvalid) {
			t.Errorf("Authenticate(%q) = %v, want ErrInvalid", bad, err)
		}
	}

	// Keys are listed without their secret, and revocation is per tenant.
	keys, err := credential.KeyList(ctx, pool, "acme")
	if err != nil || len(keys) != 1 || keys[0].ID != k.ID || keys[0].RevokedAt != nil {
		t.Fatalf("List = %+v %v", keys, err)
	}
	if err := credential.KeyRevoke(ctx, pool, "globex", k.ID); !errors.Is(err, credential.ErrKeyNotFound) {
		t.Fatalf("another tenant revoked the key: %v", err)
	}
	if err := credential.KeyRevoke(ctx, pool, "acme", k.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := credential.KeyAuthenticate(ctx, pool, secret); !errors.Is(err, credential.ErrKeyInvalid) {
		t.Fatalf("revoked key: %v", err)
	}
	if err := credential.KeyRevoke(ctx, pool, "acme", k.ID); !errors.Is(err, credential.ErrKeyNotFound) {
		t.Fatalf("second revoke: %v", err)
	}
	if _, _, err := credential.KeyCreate(ctx, pool, "nobody"); !errors.Is(err, credential.ErrTenantNotFound) {
		t.Fatalf("key for a missing tenant: %v", err)
	}
	if err := credential.KeyTouch(ctx, pool, k.ID); err != nil {
		t.Fatal(err)
	}
	keys, _ = credential.KeyList(ctx, pool, "acme")
	if keys[0].LastUsedAt == nil {
		t.Fatal("Touch did not record the use")
	}
}

func TestDisabledTenantKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	if _, err := account.NewStore(pool).CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 10, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	_, secret, err := credential.KeyCreate(ctx, pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE tenants SET disabled_at = now() WHERE id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := credential.KeyAuthenticate(ctx, pool, secret); !errors.Is(err, credential.ErrTenantDisabled) {
		t.Fatalf("disabled tenant: %v", err)
	}
}

// TestKeyChangesAreAtomicWithTheirLedgerEntry: when the ledger entry of a
// key creation or revocation cannot be written (a trigger refuses it here;
// a crash or a lost connection in life), the key change is not made either:
// both are one transaction.
func TestKeyChangesAreAtomicWithTheirLedgerEntry(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 10, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	k, _, err := credential.KeyCreateRecorded(ctx, store, "acme", nil, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse_key_entries() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'the ledger is refusing key entries'; END $$;
		CREATE TRIGGER refuse_key_entries BEFORE INSERT ON ledger_rows
		FOR EACH ROW WHEN (NEW.reason LIKE 'key %') EXECUTE FUNCTION refuse_key_entries();`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := credential.KeyCreateRecorded(ctx, store, "acme", nil, "alice"); err == nil {
		t.Fatal("a key was created without its ledger entry")
	}
	if err := credential.KeyRevokeRecorded(ctx, store, "acme", k.ID, "alice"); err == nil {
		t.Fatal("a key was revoked without its ledger entry")
	}
	var keys, revoked, entries int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(revoked_at) FROM api_keys WHERE tenant_id = 'acme'`).Scan(&keys, &revoked); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND reason LIKE 'key %'`).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if keys != 1 || revoked != 0 || entries != 1 {
		t.Fatalf("%d keys (%d revoked) and %d key entries; want the first key, unrevoked, and its one entry", keys, revoked, entries)
	}
	// Unknown tenants and keys.
	if _, _, err := credential.KeyCreateRecorded(ctx, store, "nobody", nil, "alice"); !errors.Is(err, credential.ErrTenantNotFound) {
		t.Fatalf("create for no tenant: %v", err)
	}
	if err := credential.KeyRevokeRecorded(ctx, store, "acme", "nosuchkey000", "alice"); !errors.Is(err, credential.ErrKeyNotFound) {
		t.Fatalf("revoke of no key: %v", err)
	}
}
