package rule_test

import (
	"errors"
	"testing"

	"github.com/tokengate/tokengate/budget/rule"
)

func TestModelMatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		entry, model string
		want         bool
	}{
		{"gpt-4o", "gpt-4o", true},
		{"gpt-4o", "gpt-4o-mini", false},
		{"gpt-4o*", "gpt-4o", true},
		{"gpt-4o*", "gpt-4o-mini", true},
		{"gpt-4o*", "gpt-4", false},
		{"claude-*", "claude-sonnet-4-5", true},
		{"claude-*", "claude", false},
		{"*-mini", "gpt-4o-mini", true},
		{"*-mini", "gpt-4o-mini-2024", false},
		{"gpt-*-mini", "gpt-4o-mini", true},
		{"gpt-*-mini", "gpt--mini", true},
		{"gpt-*-mini", "gpt-mini", false}, // the prefix and suffix may not overlap
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"*", "anything/at-all", true},
		{"*", "", true},
		{"publishers/google/models/gemini-*", "publishers/google/models/gemini-2.0-flash", true},
		{"gemini-?", "gemini-1", false}, // only '*' is special
		{"gemini-[12]", "gemini-[12]", true},
		{"", "", true},
		{"", "gpt-4o", false},
	} {
		if got := rule.ModelMatches(tc.entry, tc.model); got != tc.want {
			t.Errorf("ModelMatches(%q, %q) = %v, want %v", tc.entry, tc.model, got, tc.want)
		}
	}
}

func TestModelsAllow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		scope []string
		model string
		want  bool
	}{
		{nil, "gpt-4o", true},
		{[]string{}, "anything", true},
		{[]string{"gpt-4o-mini", "claude-*"}, "claude-haiku-4-5", true},
		{[]string{"gpt-4o-mini", "claude-*"}, "gpt-4o-mini", true},
		{[]string{"gpt-4o-mini", "claude-*"}, "gpt-4o", false},
	} {
		if got := rule.ModelsAllow(tc.scope, tc.model); got != tc.want {
			t.Errorf("ModelsAllow(%q, %q) = %v, want %v", tc.scope, tc.model, got, tc.want)
		}
	}
}

func TestCheckModelScopes(t *testing.T) {
	t.Parallel()
	org := rule.ScopeLevel{TenantID: "org", Models: []string{"gpt-*", "claude-*"}}
	team := rule.ScopeLevel{TenantID: "team", Models: []string{"gpt-4o*"}}
	open := rule.ScopeLevel{TenantID: "open"}
	for _, tc := range []struct {
		name         string
		model        string
		levels       []rule.ScopeLevel
		key          []string
		scope, level string // "" for allowed
	}{
		{"no scopes", "anything", []rule.ScopeLevel{open}, nil, "", ""},
		{"parent allows, child narrows", "claude-sonnet-4-5", []rule.ScopeLevel{org, team}, nil, "tenant", "team"},
		{"both allow", "gpt-4o-mini", []rule.ScopeLevel{org, team}, nil, "", ""},
		{"parent refuses what child lists", "o3", []rule.ScopeLevel{org, {TenantID: "wide", Models: []string{"o3"}}}, nil, "tenant", "org"},
		{"key narrows tenant", "gpt-4o", []rule.ScopeLevel{org}, []string{"gpt-4o-mini"}, "key", ""},
		{"key may not widen tenant", "o3", []rule.ScopeLevel{org}, []string{"o3"}, "tenant", "org"},
		{"key within tenant", "gpt-4o-mini", []rule.ScopeLevel{org}, []string{"gpt-4o-mini"}, "", ""},
		{"key alone", "gpt-4o", []rule.ScopeLevel{open}, []string{"claude-*"}, "key", ""},
	} {
		err := rule.CheckModelScopes(tc.model, "model", tc.levels, tc.key)
		if tc.scope == "" {
			if err != nil {
				t.Errorf("%s: %v, want allowed", tc.name, err)
			}
			continue
		}
		var mna *rule.ModelNotAllowedError
		if !errors.As(err, &mna) || !errors.Is(err, rule.ErrModelNotAllowed) {
			t.Fatalf("%s: %v, want a *ModelNotAllowedError", tc.name, err)
		}
		if mna.Scope != tc.scope || mna.Level != tc.level || mna.Model != tc.model || mna.FieldOr() != "model" {
			t.Errorf("%s: %+v, want scope %s level %q", tc.name, *mna, tc.scope, tc.level)
		}
	}
}

func TestNormalizeModels(t *testing.T) {
	t.Parallel()
	got, err := rule.NormalizeModels([]string{" gpt-4o ", "claude-*", "gpt-4o"})
	if err != nil || len(got) != 2 || got[0] != "gpt-4o" || got[1] != "claude-*" {
		t.Fatalf("NormalizeModels = %q, %v", got, err)
	}
	if got, err := rule.NormalizeModels(nil); err != nil || len(got) != 0 {
		t.Fatalf("NormalizeModels(nil) = %q, %v", got, err)
	}
	long := make([]byte, rule.MaxModelEntry+1)
	for i := range long {
		long[i] = 'a'
	}
	many := make([]string, rule.MaxModelScope+1)
	for i := range many {
		many[i] = "m" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	for _, bad := range [][]string{{""}, {"  "}, {"gpt 4o"}, {"gpt\t4o"}, {string(long)}, many} {
		var le *rule.LimitError
		if _, err := rule.NormalizeModels(bad); !errors.As(err, &le) || le.Field != "models" {
			t.Errorf("NormalizeModels(%.40q) = %v, want a LimitError on models", bad, err)
		}
	}
}
