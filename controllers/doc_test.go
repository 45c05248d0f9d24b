package controllers_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The package documentation names every reconciler, and says how many there are: a reconciler
// is a type with SetupWithManager and Reconcile methods. Every type with a SetupWithManager
// (the reconcilers and Runnables such as the retention sweep) is named and registered by Setup.
func TestDocNamesEveryReconciler(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var registered []string
	reconciles := map[string]bool{}
	var doc, setup string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if file.Doc != nil {
			doc += file.Doc.Text()
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Name.Name != "SetupWithManager" && fn.Name.Name != "Reconcile" {
				continue
			}
			recv := fn.Recv.List[0].Type
			if star, ok := recv.(*ast.StarExpr); ok {
				recv = star.X
			}
			if name := recv.(*ast.Ident).Name; fn.Name.Name == "Reconcile" {
				reconciles[name] = true
			} else {
				registered = append(registered, name)
			}
		}
		if f == "setup.go" {
			setup = string(src)
		}
	}
	slices.Sort(registered)
	var reconcilers []string
	for _, r := range registered {
		if reconciles[r] {
			reconcilers = append(reconcilers, r)
		}
	}
	words := []string{"", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine"}
	if len(reconcilers) >= len(words) {
		t.Fatalf("%d reconcilers: extend the test's words", len(reconcilers))
	}
	if want := words[len(reconcilers)] + " reconcilers"; !strings.Contains(doc, want) {
		t.Errorf("doc.go does not say %q (the reconcilers are %v)", want, reconcilers)
	}
	for _, r := range registered {
		if !strings.Contains(doc, r) {
			t.Errorf("doc.go does not name %s", r)
		}
		if !strings.Contains(setup, "&"+r+"{") && !strings.Contains(setup, "*"+r+" {") {
			t.Errorf("Setup does not register %s", r)
		}
	}
}
