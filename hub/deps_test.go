package hub

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDependencies keeps two edges out of the build graph: the hub linking
// the whole simulated engine to look up a profile (cmd/fleet hands it the
// lookup, Options.SimProfile),
// and the command tree importing the store for a type (fleet.APIKey is the
// shared one).
func TestDependencies(t *testing.T) {
	tests := []struct{ pkg, mustNot string }{
		{"fleet/hub", "fleet/sim"},
		{"fleet/cli", "fleet/store"},
	}
	for _, tt := range tests {
		out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", tt.pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", tt.pkg, err)
		}
		if slices.Contains(strings.Fields(string(out)), tt.mustNot) {
			t.Errorf("%s depends on %s again", tt.pkg, tt.mustNot)
		}
	}
}

// modulePackages lists the module's packages with the module's packages
// each imports (test files left out: a test may drive the CLI).
func modulePackages(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-json=ImportPath,Imports", "fleet/...").Output()
	if err != nil {
		t.Fatalf("go list fleet/...: %v", err)
	}
	pkgs := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("reading go list's output: %v", err)
		}
		var own []string
		for _, imp := range p.Imports {
			if imp == "fleet" || strings.HasPrefix(imp, "fleet/") {
				own = append(own, imp)
			}
		}
		pkgs[p.ImportPath] = own
	}
	return pkgs
}

// TestLayers: the command tree sits on top. Only the binary (cmd/...)
// imports fleet/cli; the hub below it speaks the vocabulary of package
// fleet (HubStatus, BenchOptions), and is given the command tree to run
// (Options.Commands) instead of importing it.
func TestLayers(t *testing.T) {
	for pkg, imports := range modulePackages(t) {
		if slices.Contains(imports, "fleet/cli") && !strings.HasPrefix(pkg, "fleet/cmd/") {
			t.Errorf("%s imports fleet/cli; only the binary may (pass what it needs down, as hub.Options.Commands does)", pkg)
		}
	}
}

// TestHubImports holds the hub's imports of the module's packages to at
// most 10 (root package included), as issue 18 asks: admission and the
// shape and bench runs are a package of their own (hub/admission, which
// alone imports bench, bench/shape, bench/sweep and router/reasoning),
// cmd/fleet hands in the sim profiles (Options.SimProfile), and the SSH
// console server says which themes it paints (sshserver.CheckTheme).
func TestHubImports(t *testing.T) {
	const most = 10
	if own := modulePackages(t)["fleet/hub"]; len(own) > most {
		t.Errorf("fleet/hub imports %d of the module's packages, more than %d: %s", len(own), most, strings.Join(own, " "))
	}
}

// TestHubComposes: the hub composes parts that own their state (guard,
// mirror, admission's Judge and Runs, Admin, Ledger, pruner) instead of knowing
// everything itself. Counted from the source: the methods declared on Hub,
// and no embedded field that would promote a part's methods into Hub's.
func TestHubComposes(t *testing.T) {
	const maxMethods = 50
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var methods []string
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil && receiverType(d.Recv.List[0].Type) == "Hub" {
					methods = append(methods, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok || ts.Name.Name != "Hub" {
						continue
					}
					for _, field := range ts.Type.(*ast.StructType).Fields.List {
						if len(field.Names) == 0 {
							t.Errorf("Hub embeds %s, which promotes its methods into Hub's; hold it in a named field", receiverType(field.Type))
						}
					}
				}
			}
		}
	}
	if len(methods) > maxMethods {
		slices.Sort(methods)
		t.Errorf("Hub has %d methods, more than %d: move the ones a part owns to that part\n%s", len(methods), maxMethods, strings.Join(methods, " "))
	}
}

func receiverType(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
