package api_test

import (
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tokengate/tokengate/api"
)

func apiPath(p string) bool {
	switch p {
	case "/healthz", "/readyz", "/metrics", "/openapi.yaml":
		return true
	}
	return strings.HasPrefix(p, "/v1/")
}

// TestOpenAPIMatchesRouter checks that every route the router serves is in
// api/openapi.yaml, and that the document describes no route the router
// lacks.
func TestOpenAPIMatchesRouter(t *testing.T) {
	t.Parallel()
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}

	b := setup(t, nil)
	param := regexp.MustCompile(`:([a-zA-Z_]+)`)
	served := map[string]bool{}
	for _, r := range b.srv.Echo().Router().Routes() {
		if strings.HasPrefix(r.Name, "echo_route_not_found") || r.Method == "echo_route_not_found" {
			continue
		}
		if r.Method == http.MethodOptions || r.Method == "RouteNotFound" {
			continue
		}
		if !apiPath(r.Path) {
			continue // the dashboard's HTML pages are not part of the API
		}
		served[r.Method+" "+param.ReplaceAllString(r.Path, "{$1}")] = true
	}
	var missing, extra []string
	for k := range served {
		if !documented[k] {
			missing = append(missing, k)
		}
	}
	for k := range documented {
		if !served[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Fatalf("routes not in openapi.yaml: %v\nopenapi.yaml paths the router lacks: %v", missing, extra)
	}
	if len(served) < 10 {
		t.Fatalf("only %d routes served: %v", len(served), served)
	}
}
