package integration_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// maxSleeps bounds the sleeps left in the module's tests (issue 37: 64
// before, at most 25).
const maxSleeps = 25

// realTime is how a test says that real time is its subject where it
// sleeps: a comment beginning with it on the sleep's line, or a comment
// block directly above the line that begins with it, e.g. a trailing
// "// real time: how long the partition lasts is the fault".
//
// A sleep that stands for a wait on the system (a goroutine reaching a
// point, a row written, a replica ready) is a test signal, the injected
// clock, or integration/await instead: a sleep is slow on an idle machine
// and too short on a busy one.
const realTime = "real time:"

// TestSleepsAreRealTime keeps the tests waiting on signals, not on the
// clock: every sleep in a _test.go file says why real time is its subject,
// and there are at most maxSleeps of them, so that none creeps back. The
// count is grep's: the call's text in the _test.go files, wherever it is.
func TestSleepsAreRealTime(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	sleep := "time." + "Sleep(" // not written whole: this file would count itself
	fset := token.NewFileSet()
	var grepped, calls int
	err = goFiles(root, "_test.go", func(path string) error {
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		grepped += strings.Count(string(src), sleep)
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, line := range sleepLines(fset, f) {
			calls++
			if !justified(fset, f, line) {
				t.Errorf("%s:%d: a sleep with no %q comment on its line or directly above it: wait on a test signal, the frozen clock or integration/await instead, or say why real time is the subject",
					rel, line, "// "+realTime)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls == 0 || grepped < calls {
		t.Fatalf("found %d sleeps by their calls and %d by their text: the check reads nothing", calls, grepped)
	}
	if grepped > maxSleeps {
		t.Errorf("%d sleeps in the tests, at most %d: wait on signals, not on the clock", grepped, maxSleeps)
	}
	t.Logf("%d sleeps in the tests (at most %d)", grepped, maxSleeps)
}

// sleepLines are the lines of f's calls to the time package's Sleep,
// whatever name the package is imported under.
func sleepLines(fset *token.FileSet, f *ast.File) []int {
	name := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == "time" {
			name = "time"
			if imp.Name != nil {
				name = imp.Name.Name
			}
		}
	}
	if name == "" {
		return nil
	}
	var lines []int
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Sleep" {
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == name {
				lines = append(lines, fset.Position(call.Pos()).Line)
			}
		}
		return true
	})
	return lines
}

// justified reports whether a comment beginning with realTime is on line,
// or begins the comment block that ends on the line above.
func justified(fset *token.FileSet, f *ast.File, line int) bool {
	for _, g := range f.Comments {
		start, end := fset.Position(g.Pos()).Line, fset.Position(g.End()).Line
		switch {
		case start == line:
			for _, c := range g.List {
				if strings.HasPrefix(strings.TrimSpace(strings.TrimPrefix(c.Text, "//")), realTime) {
					return true
				}
			}
		case end == line-1:
			if strings.HasPrefix(strings.TrimSpace(strings.TrimPrefix(g.List[0].Text, "//")), realTime) {
				return true
			}
		}
	}
	return false
}
