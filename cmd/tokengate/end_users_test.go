package main

import (
	"context"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestEndUsersCLI: end-users policy set, get, list and delete, and a bad
// policy refused with an error naming its field.
func TestEndUsersCLI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, nil)
	if _, notes, err := cli2(t, "tenant", "create", "acme", "--database-url", url, "--tokens-capacity", "1000", "--tokens-per-second", "1"); err != nil {
		t.Fatalf("create: %v %s", err, notes)
	}
	for _, tc := range []struct {
		args  []string
		field string
	}{
		{[]string{"--source", "header"}, "header"},
		{[]string{"--source", "user", "--header", "X-User"}, "header"},
		{[]string{"--source", "cookie"}, "source"},
		{[]string{"--source", "user", "--max-end-users", "0"}, "max_end_users"},
	} {
		args := append([]string{"end-users", "policy", "set", "acme", "--database-url", url, "--tokens-capacity", "10", "--tokens-per-second", "1",
			"--max-end-users", "5"}, tc.args...)
		if _, notes, err := cli2(t, args...); err == nil || !strings.Contains(err.Error()+notes, tc.field) {
			t.Errorf("%v: %v %q, want an error naming %s", tc.args, err, notes, tc.field)
		}
	}
	if _, notes, err := cli2(t, "end-users", "policy", "set", "acme", "--database-url", url, "--source", "header", "--header", "x-end-user",
		"--tokens-capacity", "10", "--tokens-per-second", "0.5", "--max-end-users", "5", "--idle-ttl", "1h"); err != nil {
		t.Fatalf("set: %v %s", err, notes)
	}
	out, notes, err := cli2(t, "end-users", "policy", "get", "acme", "--database-url", url)
	if err != nil || !strings.Contains(out, "header X-End-User") || !strings.Contains(out, `"tokens_per_second":"0.5"`) || !strings.Contains(out, "1h0m0s") {
		t.Fatalf("get: %v %s %s", err, out, notes)
	}
	id, err := account.NewStore(pool).EndUserEnsure(ctx, "acme", "alice")
	if err != nil {
		t.Fatal(err)
	}
	out, notes, err = cli2(t, "end-users", "list", "acme", "--database-url", url)
	if err != nil || !strings.Contains(out, id) || !strings.Contains(out, `"alice"`) || !strings.Contains(out, "10/10") {
		t.Fatalf("list: %v %s %s", err, out, notes)
	}
	if _, notes, err := cli2(t, "end-users", "policy", "delete", "acme", "--database-url", url); err != nil {
		t.Fatalf("delete: %v %s", err, notes)
	}
	if _, _, err := cli2(t, "end-users", "policy", "get", "acme", "--database-url", url); err == nil || !strings.Contains(err.Error(), "no end-user policy") {
		t.Fatalf("get after delete: %v", err)
	}
}
