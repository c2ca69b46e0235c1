package router

import (
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"slices"
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

// TestErrorsAreAnsweredInOnePlace holds the inbound path to one place that
// counts and writes a request's error (answer, inbound.go) and one that
// counts a forwarded request's end (finish): a stage returns its error
// rather than writing it, so no count-then-write pair can drift apart
// again. writeError is also the error of the two endpoints outside the
// inbound path (GET /v1/models, an unknown URL).
func TestErrorsAreAnsweredInOnePlace(t *testing.T) {
	allowed := map[string][]string{
		"writeError":  {"answer", "serveModels", "routes"},
		"countStatus": {"answer", "finish"},
	}
	for callee, callers := range callersIn(t, ".", "writeError", "countStatus") {
		for _, caller := range callers {
			if !slices.Contains(allowed[callee], caller) {
				t.Errorf("%s calls %s: return an *answerError for answer to write and count instead", caller, callee)
			}
		}
	}
}

// callersIn maps each of names to the functions of dir's non-test files
// that call it.
func callersIn(t *testing.T, dir string, names ...string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, f := range parseDir(t, token.NewFileSet(), dir) {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				var name string
				switch f := call.Fun.(type) {
				case *ast.Ident:
					name = f.Name
				case *ast.SelectorExpr:
					name = f.Sel.Name
				}
				if slices.Contains(names, name) {
					out[name] = append(out[name], fn.Name.Name)
				}
				return true
			})
		}
	}
	return out
}

type longMethod struct {
	name  string
	lines int
}

// longRouterMethods lists the methods on Router in dir's non-test Go files
// that are longer than limit lines.
func longRouterMethods(t *testing.T, dir string, limit int) []longMethod {
	t.Helper()
	fset := token.NewFileSet()
	var long []longMethod
	for _, f := range parseDir(t, fset, dir) {
		path := fset.Position(f.Pos()).Filename
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
