package integration_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/tokengate/tokengate"

// layout is the architecture as a rule: which of the module's packages each
// package's non-test code may import. The domain (estimator, ledger, budget
// and the packages below it) imports no face; the faces (api, web) import
// the domain and never each other; cmd wires everything; nothing but tests
// imports the test harness. A package missing here fails the test, so a new
// package must take its place in the layout deliberately.
var layout = map[string][]string{
	// The database edge and the leaves of the domain.
	"migrations": nil,
	"estimator":  nil,
	"ledger":     {"ledger/pgarray"},
	// Array parameters for pgx, which every package that writes rows
	// sends: pgx's types only, below the ledger, the leaf they all import.
	"ledger/pgarray": nil,
	// Histories the store refuses to write, for tests of their readers.
	"ledger/ledgertest": {"ledger"},
	// Alerts own their tables and import nothing of the module: budget
	// imports them, because a threshold's event is written in the
	// transaction of the decision that crossed it.
	"budget/alert": nil,
	// Budget's rules: limits, windows, money arithmetic, bounds, the state
	// a decision changes, and the domain's errors. Pure values and
	// arithmetic (no SQL, no clock, no tracing), so the store and the
	// pipeline depend on them and never the reverse.
	"budget/rule": nil,
	// Budget's root is its map (doc.go) and holds no code, so that every
	// arrow inside budget points down or across, never up to it.
	"budget": nil,
	// The store (SQL over budget's tables, and caches of them) and the
	// pipeline that decides on them.
	"budget/account":    {"budget/alert", "budget/rule", "estimator", "ledger", "ledger/pgarray"},
	"budget/credential": {"budget/account", "budget/rule"},
	"budget/outage":     {"budget/account", "budget/rule", "estimator"},
	"budget/admission":  {"budget/account", "budget/lease", "budget/outage", "budget/rule", "estimator"},
	// Batches: the enqueued-tokens allowance, batches and their lines
	// (their tables and SQL), reserved through the store under the tenant
	// row lock.
	"budget/batch": {"budget/account", "budget/rule", "estimator", "ledger"},
	// Quota leasing: leases and their journal (their tables and SQL),
	// taken, renewed and ended through the store under the tree's locks.
	"budget/lease": {"budget/account", "budget/rule", "ledger", "ledger/pgarray"},
	// Administration as use cases, one method per admin operation, for
	// every face; it holds the pools the faces never see.
	"budget/admin": {"budget/account", "budget/alert", "budget/batch", "budget/credential", "budget/lease", "budget/rule", "estimator", "ledger"},
	// One replica's domain services, built once for every face.
	"budget/replica": {"budget/account", "budget/admin", "budget/admission", "budget/alert", "budget/batch", "budget/credential", "budget/lease", "budget/outage", "budget/rule", "estimator", "migrations"},
	// The faces.
	"api":       {"budget/account", "budget/admin", "budget/admission", "budget/alert", "budget/batch", "budget/credential", "budget/lease", "budget/replica", "budget/rule", "estimator", "ledger"},
	"web":       {"budget/account", "budget/admin", "budget/alert", "budget/batch", "budget/credential", "budget/lease", "budget/replica", "budget/rule", "estimator", "ledger"},
	"api/rls":   {"budget/account", "budget/admission", "budget/credential", "budget/replica", "budget/rule", "estimator"},
	"api/proxy": {"budget/account", "budget/admission", "budget/batch", "budget/credential", "budget/replica", "budget/rule", "estimator"},
	// The Go client, which frontends vendor: none of tokengate's packages.
	"api/client": nil,
	// The wiring and the tools.
	"cmd/tokengate": {"api", "api/proxy", "api/rls", "web", "budget/account", "budget/admin", "budget/admission", "budget/alert", "budget/batch", "budget/credential", "budget/lease", "budget/outage", "budget/replica", "budget/rule", "estimator",
		"ledger", "ledger/pgarray", "migrations", "cmd/tokengate/loadgen"},
	"cmd/tokengate/loadgen": nil,
	// The test harness, for tests only; its pools encode arrays as
	// cmd/tokengate's do (ledger/pgarray).
	"integration/pgtest": {"ledger/pgarray", "migrations"},
	// A Patroni cluster for failover tests: none of tokengate's packages.
	"integration/patroni": nil,
	// The OTLP trace receiver, and a replica's tracing pointed at it, for
	// tests only.
	"integration/otlptest": {"budget/replica"},
	// The memory sampler of the hostile-body tests: none of tokengate's
	// packages.
	"integration/memtest": nil,
	// Waiting with a deadline for what a test can observe but is not told
	// of: none of tokengate's packages.
	"integration/await": nil,
	// A benchmark tool (make bench-pgcost): Postgres's cost of the writes
	// the account store and the ledger send, so it sends their statements.
	"integration/bench/pgcost": {"budget/account", "ledger", "ledger/pgarray"},
}

// goFiles calls fn with the path of each of the module's files under root
// whose name ends in suffix, skipping hidden directories, testdata and
// node_modules.
func goFiles(root, suffix string, fn func(path string) error) error {
	return filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, suffix) {
			return nil
		}
		return fn(path)
	})
}

// faces may not import one another. (The dashboard's own tests run a whole
// replica, API and dashboard on one router as the serve command mounts
// them, to check that neither's middleware leaks onto the other: tests are
// where faces meet.)
var faces = []string{"api", "api/proxy", "api/rls", "web"}

// faceForbidden is the import outside the module a face's non-test code
// may not have, nor any package below it: the database driver (pgx,
// pgxpool). A face reads and changes state through the replica's services
// (budget/admin for administration), so it holds no pool and writes no SQL
// of its own.
const faceForbidden = "github.com/jackc/pgx/v5"

// budgetLeaves are the leaves of budget: the bottom of its layering, which
// the other packages (the store and pipeline in budget/account, admission,
// outage, the replica) build on. A leaf imports no package of budget, not
// its root nor another leaf nor anything deeper, so that a rule or an
// alert never depends on the store that applies it; a leaf listed here
// with a budget import in the layout still fails.
var budgetLeaves = []string{"budget/alert", "budget/rule"}

// pure are the packages that import only the standard library: no driver
// (pgx), no tracing (OpenTelemetry), no metrics (Prometheus), nothing of
// the module. budget/rule is where the rules of a decision are read and
// tested alone.
var pure = []string{"budget/rule"}

// untraced are the packages that import no OpenTelemetry: budget/account
// (the store and the pipeline) tells a small hook (PipelineTracer) what it
// does, and budget/admission, the use case, makes the spans.
var untraced = []string{"budget/account", "budget/rule"}

// TestLayout checks every import between the module's packages against
// the layout, and that no file outside tests imports the test harness.
func TestLayout(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	seen := map[string]bool{}
	err = goFiles(root, ".go", func(path string) error {
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		test := strings.HasSuffix(path, "_test.go")
		if !test {
			seen[pkg] = true
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !test && slices.Contains(faces, pkg) && (p == faceForbidden || strings.HasPrefix(p, faceForbidden+"/")) {
				t.Errorf("%s: the face %s imports %s (a face holds no pool: it calls the replica's services)", filepath.Join(rel, filepath.Base(path)), pkg, p)
			}
			if !test && slices.Contains(pure, pkg) && strings.Contains(strings.Split(p, "/")[0], ".") {
				t.Errorf("%s: %s imports %s, but imports only the standard library", filepath.Join(rel, filepath.Base(path)), pkg, p)
			}
			if !test && slices.Contains(untraced, pkg) && strings.HasPrefix(p, "go.opentelemetry.io/") {
				t.Errorf("%s: %s imports %s: the domain's root traces through a hook, never a tracing library", filepath.Join(rel, filepath.Base(path)), pkg, p)
			}
			dep, ok := strings.CutPrefix(p, module+"/")
			if !ok {
				continue
			}
			if test || pkg == "integration" || strings.HasPrefix(pkg, "integration/cluster") {
				continue // tests may use the harness and anything they exercise
			}
			if slices.Contains(budgetLeaves, pkg) && (dep == "budget" || strings.HasPrefix(dep, "budget/")) {
				t.Errorf("%s: the leaf %s imports %s: a leaf of budget imports no package of budget", filepath.Join(rel, filepath.Base(path)), pkg, dep)
			}
			if strings.HasPrefix(pkg, "budget/") && strings.HasPrefix(pkg, dep+"/") {
				t.Errorf("%s: %s imports %s, a shallower package of budget: arrows inside budget point down or across, never up", filepath.Join(rel, filepath.Base(path)), pkg, dep)
			}
			if slices.Contains(faces, pkg) && slices.Contains(faces, dep) && pkg != dep {
				t.Errorf("%s: the face %s imports the face %s", filepath.Join(rel, filepath.Base(path)), pkg, dep)
			}
			allowed, known := layout[pkg]
			switch {
			case !known:
				t.Errorf("%s: package %s has no place in the layout (integration/layout_test.go)", path, pkg)
			case !slices.Contains(allowed, dep):
				t.Errorf("%s: %s may not import %s (it may import %v)", filepath.Join(rel, filepath.Base(path)), pkg, dep, allowed)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The rule is only as good as its coverage: the domain's packages must
	// all have been read.
	var read []string
	for p := range seen {
		read = append(read, p)
	}
	sort.Strings(read)
	for _, must := range []string{"budget", "budget/account", "budget/admin", "budget/admission", "budget/rule", "budget/credential", "budget/outage", "budget/replica", "api", "api/proxy", "api/rls", "web", "cmd/tokengate"} {
		if !seen[must] {
			t.Errorf("no file of %s was read (read %v)", must, read)
		}
	}
}

// faceEstimates are the names of the estimator a face's non-test code may
// not use: estimating and pricing are the admission use case's
// (admission.Admitter.Admit, Quote, CountOutput, SettleReported), which
// holds the replica's model table. A face parses its wire into an
// *estimator.Request and reads the estimator's value types (Estimate,
// Model, Price, its errors), and never estimates, counts or prices
// itself.
var faceEstimates = []string{"Estimator", "New", "Table", "CountText", "ScaleMessagesCount", "Cost"}

// faceCalls are the methods a face's non-test code may not call, on
// anything: an estimate or a price is the use case's to make.
var faceCalls = []string{"Estimate", "Cost"}

// TestLayoutFacesDoNotEstimate checks that no face (api, api/proxy,
// api/rls, web) estimates or prices a request itself: no reference to the
// estimator's Estimator, New, Table, CountText, ScaleMessagesCount or
// Cost, and no call of a method named Estimate or Cost, in its non-test
// files.
func TestLayoutFacesDoNotEstimate(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	read := map[string]bool{}
	err = goFiles(root, ".go", func(path string) error {
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		if !slices.Contains(faces, pkg) || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		read[pkg] = true
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		name := "" // the estimator's name in f, "" if f does not import it
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == module+"/estimator" {
				name = "estimator"
				if imp.Name != nil {
					name = imp.Name.Name
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && name != "" && x.Name == name && slices.Contains(faceEstimates, n.Sel.Name) {
					t.Errorf("%s: the face %s uses estimator.%s: estimating and pricing are the admission use case's (admission.Admitter)",
						fset.Position(n.Pos()), pkg, n.Sel.Name)
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && slices.Contains(faceCalls, sel.Sel.Name) {
					t.Errorf("%s: the face %s calls %s: estimating and pricing are the admission use case's (admission.Admitter)",
						fset.Position(n.Pos()), pkg, sel.Sel.Name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, face := range faces {
		if !read[face] {
			t.Errorf("no file of the face %s was read", face)
		}
	}
}
