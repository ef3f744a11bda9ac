package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/integration/pgtest"
)

// asMain is the environment variable that makes the test binary run as
// tokengate itself (see TestMain): the README's commands call
// bin/tokengate, and the test gives them this binary, so the round trip
// runs the code under test without a separate build.
const asMain = "TOKENGATE_TEST_AS_MAIN"

// readmeMaxLines is the README's length budget: a newcomer reads it in five
// minutes, and everything else lives in docs/.
const readmeMaxLines = 250

// repoRoot is the repository's root, seen from this package.
const repoRoot = "../.."

// markedBlock returns the fenced code block that follows the HTML comment
// marker in md, without its fences, and fails when there is none.
func markedBlock(t *testing.T, md, marker string) string {
	t.Helper()
	_, after, ok := strings.Cut(md, "<!-- "+marker+" -->\n")
	if !ok {
		t.Fatalf("README.md has no <!-- %s --> marker", marker)
	}
	fence, body, ok := strings.Cut(after, "\n")
	if !strings.HasPrefix(fence, "```") || !ok {
		t.Fatalf("<!-- %s --> is not followed by a fenced code block (found %q)", marker, fence)
	}
	body, _, ok = strings.Cut(body, "\n```")
	if !ok {
		t.Fatalf("the code block after <!-- %s --> is not closed", marker)
	}
	return body
}

// TestReadmeRoundTrip runs the README's round trip, command for command,
// with bash, curl and jq, against a real server on a real Postgres, and
// checks that it exits 0 and prints what the README says it prints. Only
// the address and the database URL are replaced by the test's own.
func TestReadmeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the README's round trip needs %s on the PATH (.ci/run installs it): %v", tool, err)
		}
	}
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	script := markedBlock(t, string(readme), "round-trip")
	want := markedBlock(t, string(readme), "round-trip output")

	dbURL := pgtest.URL(t)
	addr := freeAddr(t)
	startServe(t, []string{"serve", "--database-url", dbURL, "--addr", addr, "--log-level", "error"}, "http://"+addr+"/readyz")

	// The README's own address and database become the test's; each must
	// be there, so a README that changes them fails here rather than
	// talking to something else.
	for _, s := range []string{"localhost:8080", "TOKENGATE_DATABASE_URL="} {
		if !strings.Contains(script, s) {
			t.Fatalf("the round trip no longer mentions %q: update this test with it", s)
		}
	}
	script = strings.ReplaceAll(script, "localhost:8080", addr)
	script = regexp.MustCompile(`TOKENGATE_DATABASE_URL='[^']*'`).ReplaceAllLiteralString(script, "TOKENGATE_DATABASE_URL='"+dbURL+"'")

	// bin/tokengate, as make run builds it, is this test binary run as main.
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	wrapper := "#!/bin/sh\n" + asMain + "=1 exec '" + self + "' \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "bin", "tokengate"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the README's round trip failed: %v\nstdout:\n%s\nstderr:\n%s\nscript:\n%s", err, stdout.String(), stderr.String(), script)
	}
	if got := strings.TrimSpace(stdout.String()); got != strings.TrimSpace(want) {
		t.Fatalf("the README's round trip printed\n%s\nwhere the README says\n%s\n(stderr:\n%s)", got, want, stderr.String())
	}
}

// TestReadmeIsShort holds README.md to its length budget.
func TestReadmeIsShort(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n > readmeMaxLines {
		t.Fatalf("README.md has %d lines, more than %d: move the detail to a guide in docs/", n, readmeMaxLines)
	}
}

var (
	// mdLink is an inline markdown link or image: [text](target) or
	// [text](target "title"); autolinks <http://...> are caught too.
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)|<(https?://[^>]+)>`)
	mdFence  = regexp.MustCompile("(?ms)^```.*?^```")
	mdCode   = regexp.MustCompile("`[^`\n]*`")
	mdHeader = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*$`)
	slugDrop = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
)

// anchors are the heading anchors GitHub makes for md: lower case, spaces
// to hyphens, punctuation dropped, repeats numbered.
func anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range mdHeader.FindAllStringSubmatch(mdFence.ReplaceAllString(md, ""), -1) {
		h := strings.ReplaceAll(m[1], "`", "")
		s := strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestReadmeLinksStayInTheRepository checks every link of README.md and
// docs/*.md: a relative path that exists inside the repository (and, with
// a #fragment, a heading of that file), never a path that climbs out of
// it, and no link to the web: whoever clones the repository has every page
// a guide sends them to.
func TestReadmeLinksStayInTheRepository(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	if len(files) < 7 {
		t.Fatalf("found %d markdown files (README.md and docs/*.md), want the README and its six guides", len(files))
	}
	links := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(root, file)
		text := mdCode.ReplaceAllString(mdFence.ReplaceAllString(string(b), ""), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if target == "" {
				t.Errorf("%s: links to the web (%s): whoever clones the repository may not reach it; say it in the repository", name, m[2])
				continue
			}
			links++
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				t.Errorf("%s: links to %s, outside the repository", name, target)
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				if filepath.IsAbs(path) {
					t.Errorf("%s: links to the absolute path %s", name, target)
					continue
				}
				dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				if rel, err := filepath.Rel(root, dest); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
					t.Errorf("%s: links to %s, outside the repository", name, target)
					continue
				}
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: links to %s, which does not exist", name, target)
					continue
				}
			}
			if frag == "" {
				continue
			}
			db, err := os.ReadFile(dest)
			if err != nil {
				t.Errorf("%s: links to %s, whose file cannot be read for its headings: %v", name, target, err)
				continue
			}
			if !anchors(string(db))[frag] {
				t.Errorf("%s: links to %s, but no heading of it has the anchor #%s", name, target, frag)
			}
		}
	}
	if links == 0 {
		t.Fatal("no link was checked: the link pattern is broken")
	}
}

// TestReadmeNoFileNamesTheDesignOutsideTheRepository finds any markdown or Go file
// that names the design document which lived beside the repository: its
// contract is docs/contract.md now.
func TestReadmeNoFileNamesTheDesignOutsideTheRepository(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	banned := []string{"../" + "shared/", "design." + "md"}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(path); ext != ".md" && ext != ".go" && ext != ".yaml" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, s := range banned {
			if bytes.Contains(b, []byte(s)) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s names %q, a file outside the repository: point to docs/contract.md", rel, s)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

var (
	helpCommand = regexp.MustCompile(`(?m)^  ([a-z][a-z-]*(?: [a-z][a-z-]*)*)(?: |$)`)
	helpFlag    = regexp.MustCompile(`(?m)^(?:  -\w, |      )(--[a-z0-9-]+)`)
	helpEnv     = regexp.MustCompile(`\(\$([A-Z0-9_]+)\)`)
)

// TestReadmeConfigurationNamesEveryFlag holds docs/configuration.md to the
// binary: every flag and environment variable that any command's --help
// shows must be named there, so a new flag cannot go undocumented.
func TestReadmeConfigurationNamesEveryFlag(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	help := func(args ...string) string {
		cmd := exec.Command(self, append(args, "--help")...)
		cmd.Env = append(os.Environ(), asMain+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tokengate %s --help: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	top := help()
	_, list, ok := strings.Cut(top, "\nCommands:\n")
	if !ok {
		t.Fatalf("tokengate --help lists no commands:\n%s", top)
	}
	commands := helpCommand.FindAllStringSubmatch(list, -1)
	if len(commands) < 10 {
		t.Fatalf("found %d commands in tokengate --help, want them all:\n%s", len(commands), list)
	}
	missing := map[string][]string{}
	for _, c := range append([][]string{{"", ""}}, commands...) {
		var out string
		if c[1] == "" {
			out = top
		} else {
			out = help(strings.Fields(c[1])...)
		}
		for _, m := range helpFlag.FindAllStringSubmatch(out, -1) {
			if m[1] != "--help" && !bytes.Contains(doc, []byte("`"+m[1])) {
				missing[m[1]] = append(missing[m[1]], c[1])
			}
		}
		for _, m := range helpEnv.FindAllStringSubmatch(out, -1) {
			if !bytes.Contains(doc, []byte("`"+m[1]+"`")) {
				missing[m[1]] = append(missing[m[1]], c[1])
			}
		}
	}
	for name, cmds := range missing {
		t.Errorf("docs/configuration.md does not name %s (from tokengate %s --help)", name, strings.Join(cmds, ", "))
	}
}
