package fleetfile

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"

	"fleet"
)

// Marshal writes f as a fleet file (what `fleet export` prints), in the
// layout of the README's example. Only declared fields are written: a node's probe,
// state and host key belong to the database. Consecutive placements of one
// model with one engine and context are grouped back into `nodes: [...]`.
//
// The output is parsed again before it is returned, so Marshal never hands
// out a file that `fleet apply` would refuse.
func Marshal(f fleet.Fleet) ([]byte, error) {
	var b strings.Builder
	b.WriteString("nodes:")
	if len(f.Nodes) == 0 {
		b.WriteString(" []")
	}
	b.WriteString("\n")
	for _, n := range f.Nodes {
		fmt.Fprintf(&b, "  - name: %s\n", scalar(n.Name))
		fmt.Fprintf(&b, "    address: %s\n", scalar(n.Address))
		optional(&b, "    ", "identity", n.Identity)
		optional(&b, "    ", "endpoint", n.Endpoint)
		optional(&b, "    ", "ports", n.Ports.String())
	}
	b.WriteString("models:")
	if len(f.Models) == 0 {
		b.WriteString(" []")
	}
	b.WriteString("\n")
	for _, m := range f.Models {
		writeModel(&b, m)
	}
	b.WriteString("placements:")
	if len(f.Placements) == 0 {
		b.WriteString(" []")
	}
	b.WriteString("\n")
	for i := 0; i < len(f.Placements); {
		p := f.Placements[i]
		j := i + 1
		for j < len(f.Placements) && f.Placements[j].Model == p.Model && f.Placements[j].Engine == p.Engine && f.Placements[j].Context == p.Context {
			j++
		}
		fmt.Fprintf(&b, "  - model: %s\n", scalar(p.Model))
		if j-i == 1 {
			fmt.Fprintf(&b, "    node: %s\n", scalar(p.Node))
		} else {
			nodes := make([]string, 0, j-i)
			for _, q := range f.Placements[i:j] {
				nodes = append(nodes, q.Node)
			}
			fmt.Fprintf(&b, "    nodes: %s\n", flowList(nodes))
		}
		optional(&b, "    ", "engine", string(p.Engine))
		if p.Context > 0 {
			fmt.Fprintf(&b, "    context: %d\n", p.Context)
		}
		i = j
	}
	out := []byte(b.String())
	if _, err := Parse("exported fleet", out); err != nil {
		return nil, fmt.Errorf("the fleet cannot be written as a valid fleet file: %w", err)
	}
	return out, nil
}

func writeModel(b *strings.Builder, m fleet.Model) {
	fmt.Fprintf(b, "  - id: %s\n", scalar(m.ID))
	if len(m.Aliases) > 0 {
		fmt.Fprintf(b, "    aliases: %s\n", flowList(m.Aliases))
	}
	fmt.Fprintf(b, "    context: %d\n", m.Context)
	if m.MemoryGB != 0 {
		fmt.Fprintf(b, "    memory_gb: %s\n", formatNumber(m.MemoryGB))
	}
	if m.SpeedTolerance != 0 {
		fmt.Fprintf(b, "    speed_tolerance: %s\n", formatNumber(m.SpeedTolerance))
	}
	optional(b, "    ", "reasoning", m.Reasoning)
	optional(b, "    ", "reference", m.Reference)
	b.WriteString("    recipes:")
	if len(m.Recipes) == 0 {
		b.WriteString(" {}")
	}
	b.WriteString("\n")
	for _, engine := range recipeOrder(m.Recipes) {
		r := m.Recipes[engine]
		fmt.Fprintf(b, "      %s:", scalar(string(engine)))
		if r.Model == "" && len(r.Args) == 0 && r.Bin == "" && r.Install == "" && len(r.Env) == 0 && r.Profile == "" && r.ReadyTimeout == 0 {
			b.WriteString(" {}\n")
			continue
		}
		b.WriteString("\n")
		optional(b, "        ", "model", r.Model)
		if len(r.Args) > 0 {
			fmt.Fprintf(b, "        args: %s\n", flowList(r.Args))
		}
		optional(b, "        ", "bin", r.Bin)
		optional(b, "        ", "install", r.Install)
		if len(r.Env) > 0 {
			b.WriteString("        env:\n")
			for _, k := range slices.Sorted(maps.Keys(r.Env)) {
				fmt.Fprintf(b, "          %s: %s\n", scalar(k), scalar(r.Env[k]))
			}
		}
		optional(b, "        ", "profile", r.Profile)
		if r.ReadyTimeout > 0 {
			fmt.Fprintf(b, "        ready_timeout: %s\n", shortDuration(r.ReadyTimeout))
		}
	}
}

// shortDuration writes 30m rather than Go's 30m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// recipeOrder lists engines in documented order, unknown ones last, so the
// export is stable.
func recipeOrder(recipes map[fleet.EngineKind]fleet.Recipe) []fleet.EngineKind {
	var out []fleet.EngineKind
	for _, k := range fleet.EngineKinds {
		if _, ok := recipes[k]; ok {
			out = append(out, k)
		}
	}
	var rest []fleet.EngineKind
	for k := range recipes {
		if !k.Valid() {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	return append(out, rest...)
}

func optional(b *strings.Builder, indent, key, value string) {
	if value != "" {
		fmt.Fprintf(b, "%s%s: %s\n", indent, key, scalar(value))
	}
}

func flowList(items []string) string {
	quoted := make([]string, len(items))
	for i, s := range items {
		quoted[i] = scalar(s)
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// formatNumber never uses an exponent: go-yaml reads "1e+21" as text.
func formatNumber(v float64) string {
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// plainCandidate is what may be left unquoted; parsesAsText then rules out
// words YAML reads as something else (true, null, 0x1F, ~).
var plainCandidate = regexp.MustCompile(`^[A-Za-z0-9_./~+-][A-Za-z0-9_./~+=@:-]*$`)

// scalar writes s plain when YAML reads it back as the same text in both
// block and flow position, and double-quoted otherwise. strconv.Quote's
// escapes (\n, \t, \x1b, \u2028) are all YAML double-quote escapes.
func scalar(s string) string {
	if plainCandidate.MatchString(s) && !strings.HasSuffix(s, ":") && !yaml11Bool[strings.ToLower(s)] && parsesAsText(s) {
		return s
	}
	return strconv.Quote(s)
}

// yaml11Bool are words go-yaml reads as text but YAML 1.1 tools read as
// booleans; quoting them keeps an export unambiguous to other readers.
var yaml11Bool = map[string]bool{"y": true, "yes": true, "n": true, "no": true, "on": true, "off": true}

func parsesAsText(s string) bool {
	block, err := parser.ParseBytes([]byte("k: "+s+"\n"), 0)
	if err != nil || !singleString(block, s, false) {
		return false
	}
	flow, err := parser.ParseBytes([]byte("k: ["+s+"]\n"), 0)
	return err == nil && singleString(flow, s, true)
}

func singleString(f *ast.File, want string, inList bool) bool {
	if len(f.Docs) != 1 || f.Docs[0].Body == nil {
		return false
	}
	m, ok := f.Docs[0].Body.(*ast.MappingNode)
	if !ok || len(m.Values) != 1 {
		return false
	}
	v := m.Values[0].Value
	if inList {
		seq, ok := v.(*ast.SequenceNode)
		if !ok || len(seq.Values) != 1 {
			return false
		}
		v = seq.Values[0]
	}
	str, ok := v.(*ast.StringNode)
	return ok && str.Value == want
}
