// Package fleetfile reads and writes the fleet file: the YAML an operator
// applies to declare nodes, models with one recipe per engine, and
// placements. Every error it reports names the file, the line and the field.
package fleetfile

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"

	"fleet"
	"fleet/enginectl"
	"fleet/sim/profiles"
)

// Demo is the built-in demo fleet (`fleet serve --demo`): the three machines
// of the first seed's worker table, simulated.
//
//go:embed demo.yaml
var Demo []byte

// Error is one problem in a fleet file, at a line. Parse joins several.
type Error struct {
	File string
	Line int // 0 when the problem is the file as a whole
	// Where names the element, like "model qwen3-4b: recipe llamacpp".
	Where string
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Where != "" {
		b.WriteString(e.Where + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

var (
	nodeNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	envNameRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	hostRE     = regexp.MustCompile(`^[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?$`)
	profileRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

// Bounds that catch typos (a context in bytes, memory in MB) rather than
// describe hardware limits.
const (
	maxContext  = 10_000_000
	maxMemoryGB = 100_000
	// maxAliasHops bounds alias chains, which YAML lets refer to themselves.
	maxAliasHops = 16
	// A recipe's ready_timeout: less than a probe cycle is a typo, more
	// than two days no download needs.
	minReadyTimeout = 10 * time.Second
	maxReadyTimeout = 48 * time.Hour
)

// Parse reads a fleet file. filename is only used in error messages. Errors
// are *Error values (joined when there are several), each with its line.
func Parse(filename string, data []byte) (fleet.Fleet, error) {
	if filename == "" {
		filename = "fleet file"
	}
	fileErr := func(msg string) error { return &Error{File: filename, Msg: msg} }
	if !utf8.Valid(data) {
		return fleet.Fleet{}, fileErr("the file is not UTF-8 text; save it as UTF-8")
	}
	// The parser's cost grows with nesting far faster than with size, so
	// nesting no fleet file has is refused before it runs.
	var bad *textError
	if errors.As(checkNesting(data, MaxNesting), &bad) {
		return fleet.Fleet{}, &Error{File: filename, Line: bad.line, Msg: bad.msg}
	}
	file, err := parseYAML(data)
	if err != nil {
		return fleet.Fleet{}, syntaxError(filename, err)
	}
	var docs []ast.Node
	for _, d := range file.Docs {
		if d != nil && d.Body != nil {
			docs = append(docs, d.Body)
		}
	}
	switch {
	case len(docs) == 0:
		return fleet.Fleet{}, fileErr("the file is empty; a fleet file is a mapping with nodes:, models: and placements:")
	case len(docs) > 1:
		return fleet.Fleet{}, &Error{File: filename, Line: line(docs[1]), Msg: fmt.Sprintf("the file holds %d YAML documents; a fleet file is one (remove the extra ---)", len(docs))}
	}
	d := &decoder{file: filename, anchors: map[string]ast.Node{}}
	d.collectAnchors(docs[0], 0)
	// Sizes first: what the decoder would build must be bounded.
	d.checkSizes(docs[0])
	f := fleet.Fleet{}
	if len(d.errs) == 0 {
		f = d.fleet(docs[0])
	}
	if len(d.errs) > 0 {
		slices.SortStableFunc(d.errs, func(a, b *Error) int { return a.Line - b.Line })
		errs := make([]error, len(d.errs))
		for i, e := range d.errs {
			errs[i] = e
		}
		return fleet.Fleet{}, errors.Join(errs...)
	}
	return f, nil
}

// parseYAML contains a panic of the third-party parser: a fleet file arrives
// over `ssh … apply`, and a hostile one must not take the hub down.
func parseYAML(data []byte) (file *ast.File, err error) {
	defer func() {
		if r := recover(); r != nil {
			file, err = nil, fmt.Errorf("the YAML parser failed on this file (%v); simplify the file and report the input", r)
		}
	}()
	return parser.ParseBytes(data, 0)
}

// syntaxError turns go-yaml's multi-line report into one positioned line.
func syntaxError(filename string, err error) error {
	var ye yaml.Error
	if errors.As(err, &ye) {
		e := &Error{File: filename, Msg: "not valid YAML: " + ye.GetMessage()}
		if tk := ye.GetToken(); tk != nil && tk.Position != nil {
			e.Line = tk.Position.Line
		}
		return e
	}
	return &Error{File: filename, Msg: "not valid YAML: " + err.Error()}
}

type decoder struct {
	file    string
	anchors map[string]ast.Node
	errs    []*Error
	// refs are the models' `reference:` values, checked once placements
	// are known.
	refs []refAt
}

type refAt struct {
	model, node string
	at          ast.Node
}

func (d *decoder) errorf(n ast.Node, where, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Line: line(n), Where: where, Msg: fmt.Sprintf(format, args...)})
}

func line(n ast.Node) int {
	if n == nil {
		return 0
	}
	if tk := n.GetToken(); tk != nil && tk.Position != nil {
		return tk.Position.Line
	}
	return 0
}

func (d *decoder) collectAnchors(n ast.Node, depth int) {
	if n == nil || depth > 100 {
		return
	}
	switch v := n.(type) {
	case *ast.AnchorNode:
		if name, ok := v.Name.(ast.ScalarNode); ok {
			key := fmt.Sprint(name.GetValue())
			if _, dup := d.anchors[key]; dup {
				d.errorf(v, "", "anchor &%s is defined twice; give each anchor its own name", key)
			}
			d.anchors[key] = v.Value
		}
		d.collectAnchors(v.Value, depth+1)
	case *ast.MappingNode:
		for _, mv := range v.Values {
			d.collectAnchors(mv, depth+1)
		}
	case *ast.MappingValueNode:
		d.collectAnchors(v.Key, depth+1)
		d.collectAnchors(v.Value, depth+1)
	case *ast.MappingKeyNode:
		d.collectAnchors(v.Value, depth+1)
	case *ast.SequenceNode:
		for _, x := range v.Values {
			d.collectAnchors(x, depth+1)
		}
	case *ast.TagNode:
		d.collectAnchors(v.Value, depth+1)
	}
}

// resolve looks through anchors and aliases to the node that holds the value.
func (d *decoder) resolve(n ast.Node, where string) (ast.Node, bool) {
	for range maxAliasHops {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.AliasNode:
			name := ""
			if s, ok := v.Value.(ast.ScalarNode); ok {
				name = fmt.Sprint(s.GetValue())
			}
			target, ok := d.anchors[name]
			if !ok {
				d.errorf(v, where, "alias *%s names no anchor; define &%s first", name, name)
				return nil, false
			}
			n = target
		case *ast.TagNode:
			d.errorf(v, where, "YAML tags like %s are not supported; quote the value instead", v.Start.Value)
			return nil, false
		case *ast.MergeKeyNode:
			d.errorf(v, where, "merge keys (<<) are not supported; write the keys out")
			return nil, false
		default:
			return n, true
		}
	}
	d.errorf(n, where, "aliases refer to each other more than %d times; write the value out", maxAliasHops)
	return nil, false
}

// peek finds the text of key in a mapping without reporting anything, so
// errors inside an element can name it even before its keys are checked.
func (d *decoder) peek(n ast.Node, key string) string {
	probe := decoder{file: d.file, anchors: d.anchors}
	entries, _ := probe.mapping(n, "", "", nil)
	for _, e := range entries {
		if e.key == key {
			s, _ := probe.scalar(e.value, "", key)
			return s
		}
	}
	return ""
}

// kind names what a node holds, for "must be a list, not a mapping".
func kind(n ast.Node) string {
	switch n.(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.NullNode:
		return "empty"
	case *ast.IntegerNode, *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return "a number"
	case *ast.BoolNode:
		return "true/false"
	}
	return "text"
}

// scalar returns a scalar's text as written: a string field accepts
// `-ngl, 99` without quotes around 99. Null is "". Text a terminal would
// act on is refused (checkText).
func (d *decoder) scalar(n ast.Node, where, field string) (string, bool) {
	s, ok := d.scalarText(n, where, field)
	if ok && !d.checkText(n, where, field, s) {
		return "", false
	}
	return s, ok
}

func (d *decoder) scalarText(n ast.Node, where, field string) (string, bool) {
	n, ok := d.resolve(n, where)
	if !ok {
		return "", false
	}
	switch v := n.(type) {
	case *ast.StringNode:
		return v.Value, true
	case *ast.LiteralNode:
		if v.Value == nil {
			return "", true
		}
		return v.Value.Value, true
	case *ast.NullNode:
		return "", true
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.InfinityNode, *ast.NanNode:
		return n.GetToken().Value, true
	}
	d.errorf(n, where, "%s must be text, not %s", field, kind(n))
	return "", false
}

// entry is one key of a mapping with its value.
type entry struct {
	key   string
	keyAt ast.Node
	value ast.Node
}

// mapping reads a mapping, refusing keys outside known (in the order
// written, so error messages follow the file).
func (d *decoder) mapping(n ast.Node, where, what string, known []string) ([]entry, bool) {
	n, ok := d.resolve(n, where)
	if !ok {
		return nil, false
	}
	var values []*ast.MappingValueNode
	switch v := n.(type) {
	case *ast.MappingNode:
		values = v.Values
	case *ast.MappingValueNode:
		values = []*ast.MappingValueNode{v}
	case *ast.NullNode:
		return nil, true
	default:
		d.errorf(n, where, "%s must be a mapping (key: value), not %s", what, kind(n))
		return nil, false
	}
	seen := map[string]int{}
	var out []entry
	ok = true
	for _, mv := range values {
		var keyNode ast.Node = mv.Key
		if k, isKey := mv.Key.(*ast.MappingKeyNode); isKey {
			keyNode = k.Value
		}
		if _, merge := keyNode.(*ast.MergeKeyNode); merge {
			d.errorf(mv.Key, where, "merge keys (<<) are not supported; write the keys out")
			ok = false
			continue
		}
		key, kok := d.scalar(keyNode, where, "a key")
		if !kok {
			ok = false
			continue
		}
		if known != nil && !slices.Contains(known, key) {
			d.errorf(mv.Key, where, "unknown key '%s' (known: %s)", key, strings.Join(known, ", "))
			ok = false
			continue
		}
		if first, dup := seen[key]; dup {
			d.errorf(mv.Key, where, "key '%s' is given twice (first on line %d)", key, first)
			ok = false
			continue
		}
		seen[key] = line(mv.Key)
		out = append(out, entry{key: key, keyAt: mv.Key, value: mv.Value})
	}
	return out, ok
}

func (d *decoder) list(n ast.Node, where, field, example string) ([]ast.Node, bool) {
	n, ok := d.resolve(n, where)
	if !ok {
		return nil, false
	}
	switch v := n.(type) {
	case *ast.SequenceNode:
		return v.Values, true
	case *ast.NullNode:
		return nil, true
	}
	d.errorf(n, where, "%s must be a list, like %s, not %s", field, example, kind(n))
	return nil, false
}

func (d *decoder) stringList(n ast.Node, where, field, example string) ([]string, bool) {
	items, ok := d.list(n, where, field, example)
	if !ok {
		return nil, false
	}
	var out []string
	for _, it := range items {
		s, sok := d.scalar(it, where, "each item of "+field)
		if !sok {
			ok = false
			continue
		}
		out = append(out, s)
	}
	return out, ok
}

func (d *decoder) number(n ast.Node, where, field string) (float64, bool) {
	n, ok := d.resolve(n, where)
	if !ok {
		return 0, false
	}
	switch v := n.(type) {
	case *ast.IntegerNode:
		switch x := v.Value.(type) {
		case int64:
			return float64(x), true
		case uint64:
			return float64(x), true
		}
	case *ast.FloatNode:
		return v.Value, true
	}
	d.errorf(n, where, "%s must be a number, not %s", field, kind(n))
	return 0, false
}

func (d *decoder) fleet(root ast.Node) fleet.Fleet {
	f := fleet.Fleet{Nodes: []fleet.Node{}, Models: []fleet.Model{}, Placements: []fleet.Placement{}}
	top, ok := d.resolve(root, "")
	if !ok {
		return f
	}
	if _, isMap := top.(*ast.MappingNode); !isMap {
		if _, isMV := top.(*ast.MappingValueNode); !isMV {
			d.errorf(top, "", "the top level must be a mapping with nodes:, models: and placements:, not %s", kind(top))
			return f
		}
	}
	entries, _ := d.mapping(top, "", "the file", []string{"nodes", "models", "placements"})
	var nodesAt, modelsAt, placementsAt ast.Node
	for _, e := range entries {
		switch e.key {
		case "nodes":
			nodesAt = e.value
		case "models":
			modelsAt = e.value
		case "placements":
			placementsAt = e.value
		}
	}
	// Nodes and models first: placements are checked against them.
	nodeLines := d.nodes(nodesAt, &f)
	models := d.models(modelsAt, &f)
	d.placements(placementsAt, &f, nodeLines, models)
	d.checkReferences(&f)
	return f
}

// checkReferences makes sure each model's reference names a node the model
// is placed on: the reference shape is taken from that node's worker.
func (d *decoder) checkReferences(f *fleet.Fleet) {
	for _, r := range d.refs {
		var placed []string
		for _, p := range f.Placements {
			if p.Model == r.model {
				placed = append(placed, p.Node)
			}
		}
		if slices.Contains(placed, r.node) {
			continue
		}
		where := "model " + r.model
		if len(placed) == 0 {
			d.errorf(r.at, where, "reference %q: the model is not placed on any node; place it on %s or remove reference:", r.node, r.node)
			continue
		}
		d.errorf(r.at, where, "reference %q is not a node the model is placed on; use one of %s", r.node, strings.Join(placed, ", "))
	}
}

func (d *decoder) nodes(n ast.Node, f *fleet.Fleet) map[string]int {
	seen := map[string]int{}
	if n == nil {
		return seen
	}
	items, ok := d.list(n, "", "nodes", "[{name: rig, address: ops@rig.lan}]")
	if !ok {
		return seen
	}
	for i, it := range items {
		where := fmt.Sprintf("node %d", i+1)
		if name := d.peek(it, "name"); name != "" {
			where = "node " + name
		}
		entries, ok := d.mapping(it, where, "a node", []string{"name", "address", "identity", "endpoint", "ports"})
		if !ok && entries == nil {
			continue
		}
		var node fleet.Node
		var nameAt, addressAt ast.Node
		for _, e := range entries {
			if e.key == "name" {
				node.Name, _ = d.scalar(e.value, where, "name")
				nameAt = e.value
			}
		}
		for _, e := range entries {
			switch e.key {
			case "address":
				node.Address, _ = d.scalar(e.value, where, "address")
				addressAt = e.value
			case "identity":
				node.Identity, _ = d.scalar(e.value, where, "identity")
			case "endpoint":
				node.Endpoint, _ = d.scalar(e.value, where, "endpoint")
				if node.Endpoint != "" && node.Endpoint != "tunnel" && node.Endpoint != "direct" {
					d.errorf(e.value, where, "endpoint %q must be tunnel (through SSH, the default) or direct", node.Endpoint)
				}
			case "ports":
				if s, ok := d.scalar(e.value, where, "ports"); ok {
					r, err := fleet.ParsePortRange(s)
					if err != nil {
						d.errorf(e.value, where, "%v (the TCP ports this node's engines may listen on; leave it out for the hub's default, serve --engine-ports)", err)
					}
					node.Ports = r
				}
			}
		}
		switch {
		case nameAt == nil:
			d.errorf(it, where, "missing 'name'")
		case !nodeNameRE.MatchString(node.Name):
			d.errorf(nameAt, where, "name %q must be lower-case letters, digits, '.', '_' or '-', starting with a letter or digit", node.Name)
		}
		if first, dup := seen[node.Name]; dup && node.Name != "" {
			d.errorf(nameAt, where, "node %s is declared twice (first on line %d)", node.Name, first)
		} else if node.Name != "" {
			seen[node.Name] = line(nameAt)
		}
		if addressAt == nil {
			d.errorf(it, where, "missing 'address' (local, sim:PROFILE or user@host[:port])")
		} else if msg := checkAddress(node.Address); msg != "" {
			d.errorf(addressAt, where, "%s", msg)
		}
		f.Nodes = append(f.Nodes, node)
	}
	return seen
}

// checkAddress explains what is wrong with an address, or returns "".
func checkAddress(addr string) string {
	const want = "local, sim:PROFILE or user@host[:port]"
	if addr == fleet.AddressLocal {
		return ""
	}
	if profile, ok := strings.CutPrefix(addr, fleet.AddressSimPrefix); ok {
		if !profileRE.MatchString(profile) {
			return fmt.Sprintf("address %q names no sim profile; write sim:PROFILE, like sim:m4max-llamacpp", addr)
		}
		// A typo here would pass apply and take the node down.
		if _, err := profiles.Lookup(profile); err != nil {
			return fmt.Sprintf("address %q: %v", addr, err)
		}
		return ""
	}
	user, hostport, ok := strings.Cut(addr, "@")
	if !ok || user == "" || strings.ContainsFunc(user, unicode.IsSpace) {
		return fmt.Sprintf("address %q must be %s", addr, want)
	}
	host, port := hostport, ""
	if rest, ok := strings.CutPrefix(hostport, "["); ok {
		inner, after, closed := strings.Cut(rest, "]")
		if !closed || net.ParseIP(inner) == nil || (after != "" && !strings.HasPrefix(after, ":")) {
			return fmt.Sprintf("address %q: %q is not a bracketed IP address like [fd00::1]", addr, hostport)
		}
		host, port = inner, strings.TrimPrefix(after, ":")
		if after == "" {
			port = ""
		} else if port == "" {
			return fmt.Sprintf("address %q ends in ':' without a port", addr)
		}
	} else {
		if h, p, hasPort := strings.Cut(hostport, ":"); hasPort {
			if p == "" {
				return fmt.Sprintf("address %q ends in ':' without a port", addr)
			}
			host, port = h, p
		}
		if host == "" {
			return fmt.Sprintf("address %q has no host after '@'; it must be %s", addr, want)
		}
		if !hostRE.MatchString(host) {
			return fmt.Sprintf("address %q: %q is not a host name or IP address", addr, host)
		}
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || port[0] == '0' || port[0] == '+' {
			return fmt.Sprintf("address %q: port %q must be a number from 1 to 65535", addr, port)
		}
	}
	return ""
}

func (d *decoder) models(n ast.Node, f *fleet.Fleet) map[string]fleet.Model {
	byID := map[string]fleet.Model{}
	if n == nil {
		return byID
	}
	items, ok := d.list(n, "", "models", "[{id: qwen3-4b, context: 16384, recipes: {...}}]")
	if !ok {
		return byID
	}
	idLines := map[string]int{}
	type aliasAt struct {
		name  string
		model string
		at    ast.Node
	}
	var aliases []aliasAt
	for i, it := range items {
		where := fmt.Sprintf("model %d", i+1)
		if id := d.peek(it, "id"); id != "" {
			where = "model " + id
		}
		entries, ok := d.mapping(it, where, "a model", []string{"id", "aliases", "context", "memory_gb", "speed_tolerance", "reasoning", "reference", "recipes"})
		if !ok && entries == nil {
			continue
		}
		m := fleet.Model{Recipes: map[fleet.EngineKind]fleet.Recipe{}}
		var idAt, contextAt, recipesAt ast.Node
		for _, e := range entries {
			if e.key == "id" {
				m.ID, _ = d.scalar(e.value, where, "id")
				idAt = e.value
			}
		}
		for _, e := range entries {
			switch e.key {
			case "aliases":
				m.Aliases, _ = d.stringList(e.value, where, "aliases", "[qwen3]")
				for _, a := range m.Aliases {
					aliases = append(aliases, aliasAt{a, m.ID, e.value})
				}
			case "context":
				contextAt = e.value
				v, ok := d.number(e.value, where, "context")
				if ok && (v != math.Trunc(v) || v <= 0 || v > maxContext) {
					d.errorf(e.value, where, "context must be a whole number of tokens from 1 to %d, like 16384", maxContext)
				}
				if ok {
					m.Context = int(v)
				}
			case "memory_gb":
				v, ok := d.number(e.value, where, "memory_gb")
				if ok && (v < 0 || v > maxMemoryGB) {
					d.errorf(e.value, where, "memory_gb must be from 0 to %d (the GiB the model needs resident, like 3.5)", maxMemoryGB)
				}
				m.MemoryGB = v
			case "speed_tolerance":
				v, ok := d.number(e.value, where, "speed_tolerance")
				if ok && (v <= 0 || v > 1) {
					d.errorf(e.value, where, "speed_tolerance must be a fraction above 0 and at most 1, like 0.5")
				}
				m.SpeedTolerance = v
			case "reasoning":
				m.Reasoning, _ = d.scalar(e.value, where, "reasoning")
				if m.Reasoning != "" && m.Reasoning != "inline" && m.Reasoning != "field" {
					d.errorf(e.value, where, "reasoning %q must be inline or field (or left out)", m.Reasoning)
				}
			case "reference":
				m.Reference, _ = d.scalar(e.value, where, "reference")
				if m.Reference == "" {
					d.errorf(e.value, where, "reference is empty; name the node whose worker sets the model's response shape, or leave the key out")
				} else {
					d.refs = append(d.refs, refAt{m.ID, m.Reference, e.value})
				}
			case "recipes":
				recipesAt = e.value
				d.recipes(e.value, where, &m)
			}
		}
		if len(m.Aliases) == 0 {
			m.Aliases = nil
		}
		switch {
		case idAt == nil:
			d.errorf(it, where, "missing 'id' (the model name clients send)")
		case m.ID == "" || strings.ContainsFunc(m.ID, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }):
			d.errorf(idAt, where, "id %q must be a name without spaces, like qwen3-4b", m.ID)
		}
		if contextAt == nil {
			d.errorf(it, where, "missing 'context' (tokens, like 16384)")
		}
		if recipesAt == nil {
			d.errorf(it, where, "missing 'recipes' (one per engine: vllm, llamacpp, vllm-metal, ollama, sim)")
		} else if len(m.Recipes) == 0 {
			d.errorf(recipesAt, where, "recipes is empty; give at least one engine's recipe")
		}
		if first, dup := idLines[m.ID]; dup && m.ID != "" {
			d.errorf(idAt, where, "model %s is declared twice (first on line %d)", m.ID, first)
		} else if m.ID != "" {
			idLines[m.ID] = line(idAt)
			byID[m.ID] = m
		}
		f.Models = append(f.Models, m)
	}
	aliasOwner := map[string]string{}
	for _, a := range aliases {
		where := "model " + a.model
		switch owner, taken := aliasOwner[a.name]; {
		case a.name == "":
			d.errorf(a.at, where, "an alias is empty")
		case idLines[a.name] != 0:
			d.errorf(a.at, where, "alias %s is the id of model %s; a name must mean one model", a.name, a.name)
		case taken:
			d.errorf(a.at, where, "alias %s is already an alias of model %s; a name must mean one model", a.name, owner)
		default:
			aliasOwner[a.name] = a.model
		}
	}
	return byID
}

func (d *decoder) recipes(n ast.Node, where string, m *fleet.Model) {
	entries, _ := d.mapping(n, where, "recipes", nil)
	for _, e := range entries {
		engine := fleet.EngineKind(e.key)
		if !engine.Valid() {
			d.errorf(e.keyAt, where, "recipe for unknown engine '%s' (known: %s)", e.key, engineList())
			continue
		}
		rwhere := where + ": recipe " + e.key
		fields, ok := d.mapping(e.value, rwhere, "a recipe", []string{"model", "args", "bin", "install", "env", "profile", "ready_timeout"})
		if !ok && fields == nil {
			continue
		}
		r := fleet.Recipe{Engine: engine}
		for _, fe := range fields {
			switch fe.key {
			case "model":
				r.Model, _ = d.scalar(fe.value, rwhere, "model")
			case "args":
				var ok bool
				r.Args, ok = d.stringList(fe.value, rwhere, "args", `[-ngl, "99", --jinja]`)
				if i, flag := enginectl.OwnedFlag(engine, r.Args); ok && flag != "" {
					at := fe.value
					if items, _ := d.list(fe.value, rwhere, "args", ""); i < len(items) {
						at = items[i]
					}
					d.errorf(at, rwhere, "args pass %s, which fleet sets itself (host, port, served name, context come from the fleet file); remove it from args", flag)
				}
			case "bin":
				r.Bin, _ = d.scalar(fe.value, rwhere, "bin")
			case "install":
				r.Install, _ = d.scalar(fe.value, rwhere, "install")
			case "ready_timeout":
				s, ok := d.scalar(fe.value, rwhere, "ready_timeout")
				v, err := time.ParseDuration(s)
				switch {
				case !ok:
				case err != nil || v < minReadyTimeout || v > maxReadyTimeout:
					d.errorf(fe.value, rwhere, "ready_timeout %q must be a duration from %s to %s, like 30m or 2h (how long a launch may take to serve, first download included)", s, shortDuration(minReadyTimeout), shortDuration(maxReadyTimeout))
				default:
					r.ReadyTimeout = v
				}
			case "profile":
				r.Profile, _ = d.scalar(fe.value, rwhere, "profile")
				if engine != fleet.EngineSim {
					d.errorf(fe.keyAt, rwhere, "profile is only for the sim engine")
				}
			case "env":
				vars, _ := d.mapping(fe.value, rwhere, "env", nil)
				for _, v := range vars {
					if !envNameRE.MatchString(v.key) {
						d.errorf(v.keyAt, rwhere, "env name %q must be letters, digits and '_', not starting with a digit", v.key)
						continue
					}
					val, ok := d.scalar(v.value, rwhere, "env "+v.key)
					if !ok {
						continue
					}
					if r.Env == nil {
						r.Env = map[string]string{}
					}
					r.Env[v.key] = val
				}
			}
		}
		if len(r.Args) == 0 {
			r.Args = nil
		}
		if r.Model == "" && engine != fleet.EngineSim {
			d.errorf(e.keyAt, rwhere, "missing 'model' (the weights: an HF repo, a GGUF path or repo:quant)")
		}
		m.Recipes[engine] = r
	}
}

func engineList() string {
	names := make([]string, len(fleet.EngineKinds))
	for i, k := range fleet.EngineKinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

// stemOwner is the placement that named an engine file stem first.
type stemOwner struct {
	model, node string
	line        int
}

func (d *decoder) placements(n ast.Node, f *fleet.Fleet, nodes map[string]int, models map[string]fleet.Model) {
	if n == nil {
		return
	}
	items, ok := d.list(n, "", "placements", "[{model: qwen3-4b, nodes: [rig, ultra]}]")
	if !ok {
		return
	}
	placed := map[[2]string]int{}
	stems := map[string]stemOwner{}
	for i, it := range items {
		where := fmt.Sprintf("placement %d", i+1)
		if model := d.peek(it, "model"); model != "" {
			where = fmt.Sprintf("placement %d (model %s)", i+1, model)
		}
		entries, ok := d.mapping(it, where, "a placement", []string{"model", "node", "nodes", "engine", "context"})
		if !ok && entries == nil {
			continue
		}
		var (
			model                         string
			engine                        fleet.EngineKind
			modelAt, nodeAt, nodesAt, pin ast.Node
			contextAt                     ast.Node
			context                       int
			targets                       []string
			targetAt                      []ast.Node
		)
		for _, e := range entries {
			switch e.key {
			case "model":
				model, _ = d.scalar(e.value, where, "model")
				modelAt = e.value
			case "engine":
				s, _ := d.scalar(e.value, where, "engine")
				engine, pin = fleet.EngineKind(s), e.value
			case "context":
				contextAt = e.value
				v, ok := d.number(e.value, where, "context")
				if ok && (v != math.Trunc(v) || v <= 0 || v > maxContext) {
					d.errorf(e.value, where, "context must be a whole number of tokens from 1 to %d, like 8192", maxContext)
				} else if ok {
					context = int(v)
				}
			case "node":
				s, ok := d.scalar(e.value, where, "node")
				if ok {
					targets, targetAt = append(targets, s), append(targetAt, e.value)
				}
				nodeAt = e.keyAt
			case "nodes":
				nodesAt = e.keyAt
				items, ok := d.list(e.value, where, "nodes", "[rig, ultra]")
				if ok && len(items) == 0 {
					d.errorf(e.value, where, "nodes is empty; name at least one node")
				}
				for _, it := range items {
					if s, ok := d.scalar(it, where, "each item of nodes"); ok {
						targets, targetAt = append(targets, s), append(targetAt, it)
					}
				}
			}
		}
		m, known := models[model]
		switch {
		case modelAt == nil:
			d.errorf(it, where, "missing 'model'")
		case !known:
			d.errorf(modelAt, where, "model %q is not declared under models:", model)
		}
		switch {
		case nodeAt != nil && nodesAt != nil:
			d.errorf(nodesAt, where, "give either node: or nodes:, not both")
			targets = nil
		case nodeAt == nil && nodesAt == nil:
			d.errorf(it, where, "missing 'node' or 'nodes' (where the model runs)")
		}
		if pin != nil {
			switch {
			case !engine.Valid():
				d.errorf(pin, where, "engine %q is not one of %s", engine, engineList())
			case known:
				if _, has := m.Recipes[engine]; !has {
					d.errorf(pin, where, "engine %s is pinned but model %s has no %s recipe", engine, model, engine)
				}
			}
		}
		if known && context > m.Context && m.Context > 0 {
			d.errorf(contextAt, where, "context %d is more than model %s's context %d; a placement may run the model with a smaller context, not a larger one (raise the model's context: instead)", context, model, m.Context)
			context = 0
		}
		for j, node := range targets {
			if _, ok := nodes[node]; !ok {
				d.errorf(targetAt[j], where, "node %q is not declared under nodes:", node)
				continue
			}
			key := [2]string{model, node}
			if first, dup := placed[key]; dup {
				d.errorf(targetAt[j], where, "model %s is already placed on node %s (line %d); a node runs one worker per model", model, node, first)
				continue
			}
			placed[key] = line(targetAt[j])
			// An engine's pid, argv and log files on its node are named
			// NODE-MODEL, so two workers whose names join alike would share
			// them on a machine both nodes reach, and each hub would take
			// the other's engine for its own (and stop it).
			stem := enginectl.FileStem(node, model)
			if other, clash := stems[stem]; clash {
				d.errorf(targetAt[j], where, "model %s on node %s names its engine's files %s.*, as model %s on node %s does (line %d): on a machine both nodes reach they would take each other's engine; rename a node or a model",
					model, node, stem, other.model, other.node, other.line)
				continue
			}
			stems[stem] = stemOwner{model: model, node: node, line: line(targetAt[j])}
			f.Placements = append(f.Placements, fleet.Placement{Model: model, Node: node, Engine: engine, Context: context})
		}
	}
}
