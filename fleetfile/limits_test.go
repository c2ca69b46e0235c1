package fleetfile

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/goccy/go-yaml/ast"
)

// indented nests n block mappings by indentation alone.
func indented(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(strings.Repeat(" ", i) + "a:\n")
	}
	return b.String()
}

// Deep nesting is refused with a positioned error before the YAML parser
// runs, and cheaply: 20,000 brackets took the parser 672 MB.
func TestDeepNestingRefusedCheaply(t *testing.T) {
	const deep = 20_000
	tests := []struct {
		name string
		in   string
		line int
	}{
		{"flow sequences", "nodes: " + strings.Repeat("[", deep) + strings.Repeat("]", deep) + "\n", 1},
		{"flow mappings", "nodes: " + strings.Repeat("{a: ", deep) + "b" + strings.Repeat("}", deep) + "\n", 1},
		{"unclosed brackets", "# hostile\nnodes: " + strings.Repeat("[", deep) + "\n", 2},
		{"flow across lines", "nodes:\n" + strings.Repeat("  [\n", deep), 2 + MaxNesting - 1},
		{"compact sequences", "nodes:\n" + strings.Repeat("- ", deep) + "x\n", 2},
		{"indentation", indented(1000), MaxNesting + 1},
		{"sequences of mappings", strings.Repeat("- a:\n", 1) + func() string {
			var b strings.Builder
			for i := 1; i < 500; i++ {
				b.WriteString(strings.Repeat("  ", i) + "- a:\n")
			}
			return b.String()
		}(), 7},
		// go-yaml hangs the node after a dangling tag under it.
		{"dangling tags", strings.Repeat("a: !t\n", deep), MaxNesting + 1},
		// go-yaml also hangs the next line under a nameless anchor.
		{"nameless anchors", strings.Repeat("0: ! & 0 0\n", deep), MaxNesting + 1},
		{"tagged and anchored", "nodes: " + strings.Repeat("!!seq &x [", deep) + strings.Repeat("]", deep) + "\n", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := Parse("deep.yaml", []byte(tt.in))
			runtime.ReadMemStats(&after)
			var fe *Error
			if !errors.As(err, &fe) || !strings.Contains(fe.Msg, fmt.Sprintf("more than %d deep", MaxNesting)) {
				t.Fatalf("Parse of %d bytes nested deep: %v; want the nesting refusal", len(tt.in), err)
			}
			if fe.Line != tt.line || !strings.HasPrefix(err.Error(), fmt.Sprintf("deep.yaml:%d: ", tt.line)) {
				t.Errorf("error at line %d (%v), want line %d", fe.Line, err, tt.line)
			}
			// Generous against the input's size: the refusal holds no tokens.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(len(tt.in))+1<<20 {
				t.Errorf("refusing %d bytes allocated %d bytes", len(tt.in), alloc)
			}
		})
	}
}

// Brackets, dashes and colons that are text, not structure, do not count.
func TestNestingIgnoresText(t *testing.T) {
	file := validBase + `  - id: scripted
    context: 4096
    recipes:
      vllm:
        model: "[[[[[[[[[[[[[[[[x]]]]]]]]]]]]]]]]"
        args: ['[[[[[[[[[[[[[[', "{{{{{{{{{{{{{{{{{{{{", '- - - - - - - - - - - - - - - -', "it''s [", "\"[[[[[[[[[[[[[[[["]
        install: |
          if [[ -x /opt/x ]]; then [[[[[[[[[[[[[[[[[[[[ ]]]]]]]]]]]]]]]]]]]]; fi
            - - - - - - - - - - - - - - - - - - - - - - x
              a: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
        env:
          A: x [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[ # [[[[[[[[[[[[[[[[[[[[[
          B: >-
            {{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{
`
	if err := checkNesting([]byte(file), MaxNesting); err != nil {
		t.Fatalf("text counted as nesting: %v", err)
	}
	for _, f := range []string{string(Demo), designExample, validBase} {
		if err := checkNesting([]byte(f), 6); err != nil {
			t.Errorf("a real fleet file nests deeper than 6: %v", err)
		}
	}
}

// astDepth is how deep collections nest in go-yaml's tree: the truth the
// byte scanner is held to.
func astDepth(n ast.Node) int {
	switch v := n.(type) {
	case *ast.DocumentNode:
		return astDepth(v.Body)
	case *ast.MappingNode:
		d := 0
		for _, mv := range v.Values {
			d = max(d, astDepth(mv.Key), astDepth(mv.Value))
		}
		return d + 1
	case *ast.MappingValueNode:
		return 1 + max(astDepth(v.Key), astDepth(v.Value))
	case *ast.SequenceNode:
		d := 0
		for _, e := range v.Values {
			d = max(d, astDepth(e))
		}
		return d + 1
	case *ast.TagNode:
		return astDepth(v.Value)
	case *ast.AnchorNode:
		return astDepth(v.Value)
	case *ast.MappingKeyNode:
		return astDepth(v.Value)
	}
	return 0
}

func yamlDepth(data []byte) (int, bool) {
	file, err := parseYAML(data)
	if err != nil {
		return 0, false
	}
	d := 0
	for _, doc := range file.Docs {
		d = max(d, astDepth(doc))
	}
	return d, true
}

// genNested writes a random YAML value nested exactly depth deep, mixing
// block and flow mappings and sequences, compact "- -" entries, quoted and
// block scalars that hold brackets, anchors, tags and comments.
func genNested(r *rand.Rand, b *strings.Builder, depth, indent int, flow bool) {
	if depth == 0 {
		// No "a:b": go-yaml reads it as a pair in some flow contexts and
		// not others, so the scanner counts it deeper on purpose (see
		// FuzzNesting, which holds only the safe direction).
		scalars := []string{"x", `"[{"`, `'- ['`, "y", "'it''s ['"}
		b.WriteString(scalars[r.IntN(len(scalars))])
		return
	}
	pad := strings.Repeat(" ", indent)
	switch k := r.IntN(4); {
	case flow || k == 0:
		if r.IntN(2) == 0 {
			b.WriteString("[z, ")
			genNested(r, b, depth-1, indent, true)
			b.WriteString("]")
		} else {
			b.WriteString("{k: ")
			genNested(r, b, depth-1, indent, true)
			b.WriteString(", '[': v}")
		}
	case k == 1:
		b.WriteString("\n" + pad + "s: |\n" + pad + "  [[[[ - - a: {{{\n")
		b.WriteString(pad + "k: ")
		if r.IntN(3) == 0 {
			b.WriteString("&a !!map ")
		}
		genNested(r, b, depth-1, indent+2, false)
	case k == 2:
		b.WriteString("\n" + pad + "- # [[[[\n" + pad + "  ")
		genNested(r, b, depth-1, indent+2, false)
	default:
		b.WriteString("\n" + pad + "- ")
		genNested(r, b, depth-1, indent+2, false)
	}
}

// The scanner's depth is the parser's, for generated files of every depth
// up to past the limit: what it lets through nests within the limit, and it
// refuses nothing that does.
func TestNestingMatchesTheParser(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		depth := 1 + r.IntN(MaxNesting+4)
		var b strings.Builder
		b.WriteString("top: ")
		genNested(r, &b, depth-1, 2, false)
		b.WriteString("\n")
		in := []byte(b.String())
		got, ok := yamlDepth(in)
		if !ok {
			continue // the generator made something go-yaml refuses
		}
		for limit := got - 1; limit <= got; limit++ {
			err := checkNesting(in, limit)
			if (err == nil) != (got <= limit) {
				t.Fatalf("case %d: parser depth %d, scanner with limit %d says %v:\n%s", i, got, limit, err, in)
			}
		}
	}
}

// FuzzNesting holds the scanner to the parser on any input: whatever it lets
// through at a small limit nests no deeper in go-yaml's tree.
func FuzzNesting(f *testing.F) {
	for _, seed := range []string{
		string(Demo), validBase, "a: [b, {c: [d]}]\n", "- - - x\n", "a:\n  b:\n    c: d\n",
		"a: |\n  [[[[\nb: [[c]]\n", "a: \"[\\\"[\"\n", "? [a]\n: b\n", "a: &x !!seq [[b]]\nc: *x\n",
		"- a:\n  - b:\n    - c\n", "[a, [b,\n  [c]]]\n", "a:\n- b\n- - c\n", "--- [a]\n--- [[b]]\n",
		"a: 'it''s [' \nb: [[c]] # [[[\n", "a: >-\n   x\n  [[[[\n",
	} {
		f.Add([]byte(seed), uint8(2))
	}
	f.Fuzz(func(t *testing.T, data []byte, limit uint8) {
		if len(data) > 4096 {
			return
		}
		lim := int(limit%6) + 1
		if checkNesting(data, lim) != nil {
			return
		}
		if got, ok := yamlDepth(data); ok && got > lim {
			t.Fatalf("scanner let through nesting %d at limit %d:\n%q", got, lim, data)
		}
	})
}

// YAML allows no control character but tab and line breaks; go-yaml reads
// a NUL its own way (the nesting fuzzer found "- !\x000 -" nested where the
// text says otherwise), so such a file is refused with its line.
func TestControlCharactersRefused(t *testing.T) {
	for _, in := range []string{"nodes: []\nmodels: [\x00]\n", "nodes: []\r\nmodels: \x1b[31m\r\n", "nodes: []\rmodels: [\x7f\x01]\n"} {
		_, err := Parse("ctl.yaml", []byte(in))
		if err == nil || !strings.HasPrefix(err.Error(), "ctl.yaml:2: the line holds the control character 0x") {
			t.Errorf("Parse(%q) = %v; want the control character refused at line 2", in, err)
		}
	}
}

// aliasedModels is a fleet file of n models whose recipes all name one
// model path of size bytes through an alias.
func aliasedModels(n, size int) string {
	var b strings.Builder
	b.WriteString("nodes:\n  - name: rig\n    address: local\nmodels:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - id: m%d\n    context: 4096\n    recipes:\n      llamacpp:\n", i)
		if i == 0 {
			fmt.Fprintf(&b, "        model: &big %s\n", strings.Repeat("x", size))
		} else {
			b.WriteString("        model: *big\n")
		}
	}
	return b.String()
}

// laughs is the "billion laughs": each level lists the one before ten
// times, so n levels expand to 10^n empty lists.
func laughs(n int) string {
	var b strings.Builder
	b.WriteString("nodes: []\nmodels: []\nplacements: []\nx0: &l0 []\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "x%d: &l%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 10), ", "))
	}
	return b.String()
}

// YAML aliases multiply what a fleet file stores: a 1 MB file with 40
// aliases of a 1 MB model path stored 40 MB, and exporting it took the hub
// to 661 MB. A field longer than MaxFieldBytes, and a file whose text passes
// MaxExpandedBytes once aliases are expanded, are refused at the line that
// goes over.
func TestAliasesAndLongFieldsAreBounded(t *testing.T) {
	// 60 KiB fits a field; 100 aliases of it make 6 MB.
	const fits = 60 << 10
	tests := []struct {
		name string
		in   string
		want string // a regexp of the error; "" = accepted
	}{
		{"a few aliases of a long path", aliasedModels(3, fits), ""},
		{"aliases past the expanded bound", aliasedModels(100, fits),
			fmt.Sprintf(`^fleet\.yaml:(\d+): alias \*big: the file's text passes %d bytes once its aliases are expanded`, MaxExpandedBytes)},
		{"the issue's 1 MB path", aliasedModels(40, 1<<20),
			fmt.Sprintf(`^fleet\.yaml:(9): model is %d bytes long; a field holds at most %d bytes`, 1<<20, MaxFieldBytes)},
		{"a long key", "nodes: []\n" + strings.Repeat("k", MaxFieldBytes+1) + ": x\n",
			fmt.Sprintf(`^fleet\.yaml:(2): a key is %d bytes long; a field holds at most %d bytes`, MaxFieldBytes+1, MaxFieldBytes)},
		{"a long install script in a list", "nodes: [{name: rig, address: local}]\nmodels:\n  - id: m\n    context: 1\n    recipes:\n      llamacpp:\n        model: x\n        args: [a, " + strings.Repeat("y", MaxFieldBytes+1) + "]\n",
			`^fleet\.yaml:(8): args is \d+ bytes long`},
		{"laughs: aliases of aliases of empty lists", laughs(9),
			fmt.Sprintf(`^fleet\.yaml:(\d+): alias \*l\d: the file's text passes %d bytes`, MaxExpandedBytes)},
		{"an alias inside its own anchor", "nodes: &n [{name: a, address: local, identity: *n}]\n",
			`^fleet\.yaml:(1): alias \*n refers to itself`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("fleet.yaml", []byte(tt.in))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			m := regexp.MustCompile(tt.want).FindStringSubmatch(err.Error())
			if m == nil {
				t.Fatalf("error %v; want one matching %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), "; ") {
				t.Errorf("error %q does not say what to do", err)
			}
			// The line named is the one that goes over.
			line, _ := strconv.Atoi(m[1])
			lines := strings.Split(tt.in, "\n")
			if line < 1 || line > len(lines) || (tt.name == "aliases past the expanded bound" && strings.TrimSpace(lines[line-1]) != "model: *big") {
				t.Errorf("error names line %d, %.40q", line, lines[max(0, min(line, len(lines))-1)])
			}
		})
	}
}
