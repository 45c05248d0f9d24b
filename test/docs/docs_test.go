package docs

import (
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// readmeMaxLines is how long the README may be: a newcomer reads it in five minutes, and
// every topic has its page in docs/.
const readmeMaxLines = 150

// TestArchitectureListsEveryPackage checks that the package table of docs/architecture.md
// names every Go package of the module, and nothing else: the README once listed 10 of 20
// internal packages and a dispatcher stage (route/) that no longer existed.
func TestArchitectureListsEveryPackage(t *testing.T) {
	root := testenv.Root()
	table := Section(read(t, filepath.Join(root, "docs", "architecture.md")), "Packages")
	if table == "" {
		t.Fatal(`docs/architecture.md has no "## Packages" section`)
	}
	var listed []string
	for _, cell := range TableColumn(table) {
		spans := CodeSpans(cell)
		if len(spans) == 0 {
			t.Errorf("docs/architecture.md: the package cell %q names no `package`", cell)
		}
		for _, p := range spans {
			if slices.Contains(listed, p) {
				t.Errorf("docs/architecture.md lists %s twice", p)
			}
			listed = append(listed, p)
		}
	}
	pkgs := goPackages(t, root)
	for _, p := range pkgs {
		if !slices.Contains(listed, p) {
			t.Errorf("docs/architecture.md does not list the package %s: add a row saying what it holds", p)
		}
	}
	for _, p := range listed {
		if !slices.Contains(pkgs, p) {
			t.Errorf("docs/architecture.md lists %s, which is not a Go package of the module", p)
		}
	}
}

// TestREADMEIsShort keeps the README to what a newcomer reads in five minutes.
func TestREADMEIsShort(t *testing.T) {
	readme := read(t, filepath.Join(testenv.Root(), "README.md"))
	if n := strings.Count(strings.TrimRight(readme, "\n"), "\n") + 1; n > readmeMaxLines {
		t.Errorf("README.md has %d lines, at most %d: move the detail to its page in docs/", n, readmeMaxLines)
	}
}

// TestRelativeLinksResolve checks every relative link of every Markdown file of the repository:
// the file it names exists, and the anchor it names is a heading of that file.
func TestRelativeLinksResolve(t *testing.T) {
	root := testenv.Root()
	pages := markdownFiles(t, root)
	if !slices.Contains(pages, "README.md") || !slices.Contains(pages, "docs/architecture.md") {
		t.Fatalf("found only %q", pages)
	}
	for _, page := range pages {
		md := read(t, filepath.Join(root, page))
		for _, link := range Links(md) {
			u, err := url.Parse(link)
			if err != nil {
				t.Errorf("%s: link %q: %v", page, link, err)
				continue
			}
			if u.Scheme != "" || u.Host != "" {
				continue // absolute: not checked here
			}
			target := page
			if u.Path != "" {
				target = filepath.ToSlash(filepath.Join(filepath.Dir(page), u.Path))
			}
			st, err := os.Stat(filepath.Join(root, target))
			if err != nil {
				t.Errorf("%s: link %q: %s does not exist", page, link, target)
				continue
			}
			if u.Fragment == "" || st.IsDir() || !strings.HasSuffix(target, ".md") {
				continue
			}
			if !Anchors(read(t, filepath.Join(root, target)))[u.Fragment] {
				t.Errorf("%s: link %q: %s has no heading #%s", page, link, target, u.Fragment)
			}
		}
	}
}

// goPackages returns the directories of the module, relative to root, that hold a Go file:
// its packages (test-only ones included), as `go list ./...` finds them.
func goPackages(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (skipDir(name) || exists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") {
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			if rel != "." && !slices.Contains(out, filepath.ToSlash(rel)) {
				out = append(out, filepath.ToSlash(rel))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no Go package below %s", root)
	}
	return out
}

// markdownFiles returns the Markdown files of the repository, relative to root.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			rel, _ := filepath.Rel(root, path)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// skipDir says whether a directory is outside what the go tool and the pages cover: hidden
// ones (.git), the go tool's ignored ones (_x, testdata, vendor) and bin/, the built tools.
func skipDir(name string) bool {
	return strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") ||
		name == "testdata" || name == "vendor" || name == "bin"
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tokenOnACommandLine matches a bearer token expanded into a command's argument (curl -H
// "Authorization: Bearer $TOKEN", --oauth2-bearer $TOKEN), or given as one in Go ("-H",
// "Authorization: ..."): a command line is visible to every user of the machine.
var tokenOnACommandLine = regexp.MustCompile(`Bearer \$|--oauth2-bearer|"-H",\s*"Authorization`)

// TestNoTokenOnACommandLine keeps tokens off command lines in what users copy (every Markdown
// page, the chart's notes) and in what the demo runs and prints: they go in a header file
// (curl -H @file) or on standard input.
func TestNoTokenOnACommandLine(t *testing.T) {
	root := testenv.Root()
	files := append(markdownFiles(t, root), "charts/webhook-operator/templates/NOTES.txt")
	demo, err := filepath.Glob(filepath.Join(root, "cmd/webhook-operator-demo/*.go"))
	if err != nil || len(demo) == 0 {
		t.Fatalf("no demo sources: %v", err)
	}
	for _, f := range demo {
		rel, _ := filepath.Rel(root, f)
		files = append(files, rel)
	}
	for _, f := range files {
		for i, line := range strings.Split(read(t, filepath.Join(root, f)), "\n") {
			if tokenOnACommandLine.MatchString(line) {
				t.Errorf("%s:%d puts a token on a command line: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}
