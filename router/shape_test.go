package router

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxMethodLines bounds a Router method (issue 18): one that grows past it
// does two things, and its parts want names of their own.
const maxMethodLines = 60

// TestRouterMethodsAreShort parses the package's own source and fails for
// every Router method longer than maxMethodLines, from its func line to its
// closing brace, so the bound is checked in CI rather than by hand.
func TestRouterMethodsAreShort(t *testing.T) {
	long := longRouterMethods(t, ".", maxMethodLines)
	for _, m := range long {
		t.Errorf("%s is %d lines, over %d: split it into named steps", m.name, m.lines, maxMethodLines)
	}
}

// TestLongRouterMethodsAreFound checks the checker: a method one line over
// the bound is reported, one at the bound is not.
func TestLongRouterMethodsAreFound(t *testing.T) {
	dir := t.TempDir()
	body := func(name string, lines int) string {
		// func line + (lines-2) statements + closing brace.
		return "func (r *Router) " + name + "() {\n" + strings.Repeat("\t_ = 0\n", lines-2) + "}\n"
	}
	src := "package router\n\ntype Router struct{}\n\n" + body("atBound", 60) + body("over", 61) +
		"func notAMethod() {\n" + strings.Repeat("\t_ = 0\n", 80) + "}\n"
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	long := longRouterMethods(t, dir, 60)
	if len(long) != 1 || long[0].name != "x.go: (*Router).over" || long[0].lines != 61 {
		t.Fatalf("long methods = %+v, want only over at 61 lines", long)
	}
}

type longMethod struct {
	name  string
	lines int
}

// longRouterMethods lists the methods on Router in dir's non-test Go files
// that are longer than limit lines.
func longRouterMethods(t *testing.T, dir string, limit int) []longMethod {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var long []longMethod
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Body == nil || !isRouter(fn.Recv.List[0].Type) {
				continue
			}
			n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if n > limit {
				long = append(long, longMethod{name: filepath.Base(path) + ": (*Router)." + fn.Name.Name, lines: n})
			}
		}
	}
	return long
}

func isRouter(e ast.Expr) bool {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "Router"
}
