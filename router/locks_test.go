package router

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPartsKeepToTheirLocks holds the Router to a composition of parts,
// each with its own lock (issue 18; catalog.go lists them), by reading the
// package's own source:
//   - the Router has no mutex of its own;
//   - a part is a struct with a mutex field mu: the fields declared after
//     mu are what it guards, and they (and mu) are touched only by the
//     part's own methods, so no other code reaches into a part or locks it;
//   - a method of a part that touches its guarded fields takes the lock, or
//     is named ...Locked and is called only by the part's own methods;
//   - what a part keeps per worker (worker, a backend's mutable fields,
//     ownedBy) is touched only by that part's methods and those of the
//     types it hands them to under its lock.
func TestPartsKeepToTheirLocks(t *testing.T) {
	c := checkLocks(t, ".", ownedBy)
	for _, v := range c.found {
		t.Error(v)
	}
	// A checker that saw nothing passes anything: each part must have been
	// found, and its guarded fields seen in use.
	for _, part := range []string{"catalog", "scheduler", "pool", "outputEstimates", "firstByteWaits", "engineMetrics", "bodyBudget", "cacheAwarePolicy"} {
		if c.seen[part] == 0 {
			t.Errorf("no use of %s's guarded fields was seen: the checker lost the package's types, or %s is no longer a part", part, part)
		}
	}
}

// ownedBy names the types whose fields a part guards though they are not
// its own fields: per type, the part, the fields, and the types whose
// methods may touch them (besides the part's): the type's own, and the
// views the part builds of it under its lock (member, memberTally) or
// runs a queue's dispatch with (poolSeats, within pool.seat).
var ownedBy = []owned{
	{typ: "worker", part: "pool", by: []string{"worker", "member", "memberTally", "poolSeats"}},
	{typ: "backend", part: "pool", fields: []string{"active", "checking", "notServed"}, by: []string{"backend", "member", "poolSeats"}},
}

type owned struct {
	typ, part string
	fields    []string // nil: every field
	by        []string
}

// TestLockViolationsAreFound checks the checker on a package that breaks
// each rule once.
func TestLockViolationsAreFound(t *testing.T) {
	dir := t.TempDir()
	src := `package router

import "sync"

type Router struct {
	part *part
	mu   sync.Mutex
}

type part struct {
	name string
	mu   sync.Mutex
	n    int
	kept map[string]*kept
}

type kept struct{ v int }

func (p *part) add() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
}

func (p *part) addUnlocked() { p.n++ }

func (p *part) addLocked() { p.n++ }

func (p *part) keptLocked(k string) *kept { return p.kept[k] }

func (r *Router) reach() int {
	r.part.mu.Lock()
	defer r.part.mu.Unlock()
	r.part.addLocked()
	return r.part.n + r.part.keptLocked("x").v
}

func (r *Router) name() string { return r.part.name }
`
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got := lockViolations(t, dir, []owned{{typ: "kept", part: "part"}})
	want := []string{
		"Router has a mutex of its own (mu): a lock guards a part, and the Router is their composition",
		"x.go:25: (*part).addUnlocked touches n, which mu guards, without taking it: lock it, or name the method ...Locked",
		"x.go:32: (*Router).reach locks part's mu: only part's own methods may",
		"x.go:34: (*Router).reach calls (*part).addLocked: only part's own methods may call it, under the lock",
		"x.go:35: (*Router).reach calls (*part).keptLocked: only part's own methods may call it, under the lock",
		"x.go:35: (*Router).reach touches kept's v, which part guards: only part's methods may",
		"x.go:35: (*Router).reach touches part's n, which part's mu guards: only part's own methods may",
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// lockViolations type-checks the non-test files of dir (imports stand in
// empty: only the package's own types are needed) and lists where they
// break the rules of TestPartsKeepToTheirLocks.
func lockViolations(t *testing.T, dir string, own []owned) []string {
	t.Helper()
	return checkLocks(t, dir, own).found
}

func checkLocks(t *testing.T, dir string, own []owned) *lockChecker {
	t.Helper()
	fset := token.NewFileSet()
	files := parseDir(t, fset, dir)
	info := &types.Info{Defs: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}, Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: emptyImporter{}, Error: func(error) {}}
	_, _ = conf.Check("router", fset, files, info) // errors: the stand-in imports

	c := &lockChecker{fset: fset, info: info, guards: map[*types.Var]guard{}, seen: map[string]int{}}
	c.findParts(files)
	for _, o := range own {
		c.addOwned(files, o)
	}
	for _, f := range files {
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Body != nil {
				c.checkFunc(fn)
			}
		}
	}
	return c
}

type guard struct {
	part  string   // the part whose lock guards the field
	owner string   // the type that declares it
	by    []string // types besides the part whose methods may touch it
}

type lockChecker struct {
	fset   *token.FileSet
	info   *types.Info
	guards map[*types.Var]guard
	parts  []string
	found  []string
	// seen counts, per part, the uses of its guarded fields.
	seen map[string]int
}

func parseDir(t *testing.T, fset *token.FileSet, dir string) []*ast.File {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// emptyImporter gives every import as an empty package: the checker needs
// the package's own types only, and type-checking the standard library and
// the dependencies from source would take most of a minute.
type emptyImporter struct{}

func (emptyImporter) Import(p string) (*types.Package, error) {
	if p == "unsafe" {
		return importer.Default().Import(p)
	}
	name := path.Base(p)
	if strings.HasPrefix(name, "v") && strings.Trim(name[1:], "0123456789") == "" {
		name = path.Base(path.Dir(p)) // math/rand/v2
	}
	pkg := types.NewPackage(p, name)
	pkg.MarkComplete()
	return pkg, nil
}

func isMutex(e ast.Expr) bool {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "sync" && (sel.Sel.Name == "Mutex" || sel.Sel.Name == "RWMutex")
}

// findParts records every struct with a mutex field mu, and what it guards.
func (c *lockChecker) findParts(files []*ast.File) {
	for _, ts := range typeSpecs(files) {
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			continue
		}
		guarded := false
		for _, fld := range st.Fields.List {
			for _, n := range fld.Names {
				if ts.Name.Name == "Router" && isMutex(fld.Type) {
					c.found = append(c.found, fmt.Sprintf("Router has a mutex of its own (%s): a lock guards a part, and the Router is their composition", n.Name))
				}
				if n.Name == "mu" && isMutex(fld.Type) {
					guarded = true
					c.parts = append(c.parts, ts.Name.Name)
				}
				if v, ok := c.info.Defs[n].(*types.Var); ok && guarded {
					c.guards[v] = guard{part: ts.Name.Name, owner: ts.Name.Name}
				}
			}
		}
	}
}

// addOwned records the fields of o.typ that o.part guards.
func (c *lockChecker) addOwned(files []*ast.File, o owned) {
	for _, ts := range typeSpecs(files) {
		st, ok := ts.Type.(*ast.StructType)
		if !ok || ts.Name.Name != o.typ {
			continue
		}
		for _, fld := range st.Fields.List {
			for _, n := range fld.Names {
				if v, ok := c.info.Defs[n].(*types.Var); ok && (o.fields == nil || slices.Contains(o.fields, n.Name)) {
					c.guards[v] = guard{part: o.part, owner: o.typ, by: o.by}
				}
			}
		}
	}
}

func typeSpecs(files []*ast.File) []*ast.TypeSpec {
	var out []*ast.TypeSpec
	for _, f := range files {
		for _, d := range f.Decls {
			if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.TYPE {
				for _, s := range gd.Specs {
					out = append(out, s.(*ast.TypeSpec))
				}
			}
		}
	}
	return out
}

// receiver is fn's receiver type name and variable, "" for a function.
func receiver(fn *ast.FuncDecl) (typ, name string) {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return "", ""
	}
	r := fn.Recv.List[0]
	e := r.Type
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	if id, ok := e.(*ast.Ident); ok {
		typ = id.Name
	}
	if len(r.Names) > 0 {
		name = r.Names[0].Name
	}
	return typ, name
}

func (c *lockChecker) checkFunc(fn *ast.FuncDecl) {
	recvType, recvName := receiver(fn)
	where := fn.Name.Name
	if recvType != "" {
		where = fmt.Sprintf("(*%s).%s", recvType, fn.Name.Name)
	}
	at := func(n ast.Node) string {
		p := c.fset.Position(n.Pos())
		return fmt.Sprintf("%s:%d: %s", filepath.Base(p.Filename), p.Line, where)
	}
	locks := locksOwn(fn, recvName)
	var unlocked, locked []string
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		s := c.info.Selections[sel]
		if s == nil {
			return true
		}
		switch s.Kind() {
		case types.FieldVal:
			v, _ := s.Obj().(*types.Var)
			g, ok := c.guards[v]
			if ok {
				c.seen[g.part]++
			}
			switch {
			case !ok:
			case sel.Sel.Name == "mu" && g.owner == g.part:
				if recvType != g.part && !slices.Contains(locked, g.part) {
					locked = append(locked, g.part)
					c.found = append(c.found, fmt.Sprintf("%s locks %s's mu: only %s's own methods may", at(sel), g.part, g.part))
				}
			case g.owner == g.part && recvType != g.part:
				c.found = append(c.found, fmt.Sprintf("%s touches %s's %s, which %s's mu guards: only %s's own methods may", at(sel), g.part, v.Name(), g.part, g.part))
			case g.owner == g.part:
				if !locks && !strings.HasSuffix(fn.Name.Name, "Locked") && !slices.Contains(unlocked, v.Name()) {
					unlocked = append(unlocked, v.Name())
					c.found = append(c.found, fmt.Sprintf("%s touches %s, which mu guards, without taking it: lock it, or name the method ...Locked", at(sel), v.Name()))
				}
			case recvType != g.part && !slices.Contains(g.by, recvType):
				also := ""
				if len(g.by) > 0 {
					also = fmt.Sprintf(" (and those of %s)", strings.Join(g.by, ", "))
				}
				c.found = append(c.found, fmt.Sprintf("%s touches %s's %s, which %s guards: only %s's methods%s may", at(sel), g.owner, v.Name(), g.part, g.part, also))
			}
		case types.MethodVal:
			m := s.Obj()
			if !strings.HasSuffix(m.Name(), "Locked") {
				return true
			}
			owner := recvTypeName(s.Recv())
			if slices.Contains(c.parts, owner) && owner != recvType && !c.mayCallLocked(owner, recvType) {
				c.found = append(c.found, fmt.Sprintf("%s calls (*%s).%s: only %s's own methods may call it, under the lock", at(sel), owner, m.Name(), owner))
			}
		}
		return true
	})
}

// mayCallLocked says whether methods of typ may call part's ...Locked
// methods: typ is a view the part hands out under its lock (ownedBy).
func (c *lockChecker) mayCallLocked(part, typ string) bool {
	for _, g := range c.guards {
		if g.part == part && g.owner != part && slices.Contains(g.by, typ) {
			return true
		}
	}
	return false
}

func recvTypeName(t types.Type) string {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	if n, ok := t.(*types.Named); ok {
		return n.Obj().Name()
	}
	return ""
}

// locksOwn says whether fn's body calls recv.mu.Lock or recv.mu.RLock.
func locksOwn(fn *ast.FuncDecl, recv string) bool {
	if recv == "" {
		return false
	}
	found := false
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return !found
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || (sel.Sel.Name != "Lock" && sel.Sel.Name != "RLock") {
			return true
		}
		mu, ok := sel.X.(*ast.SelectorExpr)
		if !ok || mu.Sel.Name != "mu" {
			return true
		}
		if id, ok := mu.X.(*ast.Ident); ok && id.Name == recv {
			found = true
		}
		return !found
	})
	return found
}
