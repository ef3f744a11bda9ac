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

// TestQueryParamsMatchOpenAPI: the query parameters each GET and DELETE
// route accepts (api.QueryParams, refused otherwise) are the ones
// openapi.yaml documents for it, no more and no fewer.
func TestQueryParamsMatchOpenAPI(t *testing.T) {
	t.Parallel()
	type param struct {
		Ref  string `yaml:"$ref"`
		Name string `yaml:"name"`
		In   string `yaml:"in"`
	}
	var doc struct {
		Paths      map[string]map[string]yaml.Node `yaml:"paths"`
		Components struct {
			Parameters map[string]param `yaml:"parameters"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	brace := regexp.MustCompile(`\{([a-zA-Z_]+)\}`)
	for path, ops := range doc.Paths {
		if !strings.HasPrefix(path, "/v1/") {
			continue
		}
		for method, node := range ops {
			m := strings.ToUpper(method)
			if m != http.MethodGet && m != http.MethodDelete {
				continue
			}
			var op struct {
				Parameters []param `yaml:"parameters"`
			}
			if err := node.Decode(&op); err != nil {
				t.Fatal(err)
			}
			var documented []string
			for _, p := range op.Parameters {
				if p.Ref != "" {
					p = doc.Components.Parameters[strings.TrimPrefix(p.Ref, "#/components/parameters/")]
				}
				if p.In == "query" {
					documented = append(documented, p.Name)
				}
			}
			route := m + " " + brace.ReplaceAllString(path, ":$1")
			accepted := append([]string(nil), api.QueryParams[route]...)
			sort.Strings(documented)
			sort.Strings(accepted)
			if strings.Join(documented, ",") != strings.Join(accepted, ",") {
				t.Errorf("%s: openapi.yaml documents %v, the route accepts %v", route, documented, accepted)
			}
		}
	}
}
