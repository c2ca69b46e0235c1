package fleetfile

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/goccy/go-yaml/ast"

	"fleet"
)

// MaxNesting bounds how deep collections may nest in a fleet file. The
// deepest thing a fleet file means is six levels (the file's mapping,
// models:, a model, recipes:, a recipe, its args: or env:); the margin lets
// a slightly wrong file reach the decoder, whose errors say more than
// "too deep". Anything deeper is refused before the YAML parser sees it:
// 100,000 nested brackets (200 KB) took the parser 32 s and 15 GB.
const MaxNesting = 12

// MaxFieldBytes bounds one value (or key) of a fleet file. The longest a
// fleet file needs is an install: script, a few KB; a model path or an
// argument is far shorter.
const MaxFieldBytes = 64 << 10

// MaxExpandedBytes bounds the text of a fleet file's values once its
// aliases are expanded, which is what the hub stores and `export` writes
// out (and parses again). Aliases multiplied it: a 1 MB file with 40
// aliases of a 1 MB model path stored 40 MB, and one export of it took the
// hub to 661 MB. A large real fleet (100 models, three recipes each, their
// install scripts) holds under half of it; at the bound, one export
// allocates about 40 MB.
const MaxExpandedBytes = 1 << 20

// maxAliasDepth bounds how deep aliases may nest inside anchors while the
// size is measured (an anchor holding an alias holding an alias...).
const maxAliasDepth = 64

// checkSizes measures the document as the decoder reads it, every alias
// expanded, and stops at the first field longer than MaxFieldBytes or the
// point where the text passes MaxExpandedBytes, reporting the line of the
// value, or of the alias that goes over. Every node counts a byte as well
// as its text, so aliases of empty collections cannot make the walk itself
// long.
func (d *decoder) checkSizes(root ast.Node) {
	w := sizeWalk{d: d, expanding: map[string]bool{}}
	w.walk(root, "", nil, 0)
}

type sizeWalk struct {
	d         *decoder
	total     int
	done      bool
	expanding map[string]bool // the anchors being expanded on the current path
}

// walk adds n to the total; field names the key n is the value of, and via
// is the alias through which the walk reached n (nil outside any).
func (w *sizeWalk) walk(n ast.Node, field string, via *ast.AliasNode, depth int) {
	if n == nil || w.done {
		return
	}
	w.total++
	if text, ok := scalarText(n); ok {
		if len(text) > MaxFieldBytes {
			what := field + " is"
			if field == "" {
				what = "a value is"
			}
			w.d.errorf(n, "", "%s %d bytes long; a field holds at most %d bytes (fleetfile.MaxFieldBytes), so shorten it (a long install script can live in a file on the node)", what, len(text), MaxFieldBytes)
			w.done = true
			return
		}
		w.total += len(text)
	}
	if w.total > MaxExpandedBytes {
		if via != nil {
			w.d.errorf(via, "", "alias *%s: the file's text passes %d bytes once its aliases are expanded (each alias repeats its anchor's text, and the hub stores it expanded); use fewer aliases or shorter values", aliasName(via), MaxExpandedBytes)
		} else {
			w.d.errorf(n, "", "the file's text passes %d bytes; a fleet file holds at most that, so split the fleet or shorten values", MaxExpandedBytes)
		}
		w.done = true
		return
	}
	switch v := n.(type) {
	case *ast.AliasNode:
		name := aliasName(v)
		target, ok := w.d.anchors[name]
		if !ok {
			return // the decoder reports it
		}
		if w.expanding[name] || depth >= maxAliasDepth {
			w.d.errorf(v, "", "alias *%s refers to itself, or aliases nest more than %d deep; write the value out", name, maxAliasDepth)
			w.done = true
			return
		}
		if via == nil {
			via = v
		}
		w.expanding[name] = true
		w.walk(target, field, via, depth+1)
		delete(w.expanding, name)
	case *ast.AnchorNode:
		w.walk(v.Value, field, via, depth)
	case *ast.TagNode:
		w.walk(v.Value, field, via, depth)
	case *ast.MappingNode:
		for _, mv := range v.Values {
			w.walk(mv, field, via, depth)
		}
	case *ast.MappingValueNode:
		w.walk(v.Key, "a key", via, depth)
		key := field
		if k, ok := keyText(v.Key); ok {
			key = k
		}
		w.walk(v.Value, key, via, depth)
	case *ast.MappingKeyNode:
		w.walk(v.Value, field, via, depth)
	case *ast.SequenceNode:
		for _, x := range v.Values {
			w.walk(x, field, via, depth)
		}
	}
}

// scalarText is the text of a scalar node as the decoder reads it.
func scalarText(n ast.Node) (string, bool) {
	switch v := n.(type) {
	case *ast.StringNode:
		return v.Value, true
	case *ast.LiteralNode:
		if v.Value == nil {
			return "", true
		}
		return v.Value.Value, true
	case ast.ScalarNode:
		if tk := n.GetToken(); tk != nil {
			return tk.Value, true
		}
	}
	return "", false
}

// keyText is a mapping key's text, when it is a short plain one.
func keyText(n ast.Node) (string, bool) {
	if k, ok := n.(*ast.MappingKeyNode); ok {
		n = k.Value
	}
	s, ok := scalarText(n)
	return s, ok && len(s) <= 64
}

func aliasName(a *ast.AliasNode) string {
	if s, ok := a.Value.(ast.ScalarNode); ok {
		return fmt.Sprint(s.GetValue())
	}
	return ""
}

// textError is a problem checkNesting found, at a line.
type textError struct {
	line int
	msg  string
}

func (e *textError) Error() string { return e.msg }

func nestingMsg(limit int) string {
	return fmt.Sprintf("collections nest more than %d deep here; a fleet file needs at most 6 (file, models, model, recipes, recipe, args), so remove the extra brackets, dashes or indentation", limit)
}

// checkNesting refuses control characters and measures how deep block and
// flow collections nest, in one
// pass over the bytes with memory bounded by limit, without building
// tokens (go-yaml's scanner alone takes 1 GB for 4 MiB of brackets). It
// skips comments, quoted scalars and block scalars (an install: script may
// hold "[[ ]]") so that text does not count as nesting; where go-yaml reads
// more nesting than YAML says, it counts go-yaml's reading. FuzzNesting
// holds it to counting at least as deep as go-yaml's tree.
func checkNesting(data []byte, limit int) error {
	s := nestScanner{limit: limit, blockScalar: noColumn, dangling: noColumn, carry: noColumn}
	line := 0
	for start := 0; start < len(data); {
		// YAML breaks lines at \n, \r\n and a lone \r.
		end := start
		for end < len(data) && data[end] != '\n' && data[end] != '\r' {
			end++
		}
		line++
		l := data[start:end]
		// YAML allows no control character but tab and line breaks, and
		// go-yaml's reading of a NUL is its own.
		for _, c := range l {
			if c < 0x20 && c != '\t' {
				return &textError{line: line, msg: fmt.Sprintf("the line holds the control character 0x%02x; a fleet file is text (remove it)", c)}
			}
		}
		if !s.line(l) {
			return &textError{line: line, msg: nestingMsg(limit)}
		}
		if end+1 < len(data) && data[end] == '\r' && data[end+1] == '\n' {
			end++
		}
		start = end + 1
	}
	return nil
}

// noColumn marks an unset column.
const noColumn = -2

type openCollection struct {
	col int
	seq bool
}

// flowLevel is one open [ or {. An entry of a flow sequence holding a ':'
// is a one-pair mapping, one level deeper; a flow mapping entry with a
// second ':' is counted so too (go-yaml reads "a:b" as a pair in some
// flow contexts, and counting deeper than the parser is the safe side).
// go-yaml also reads "- " at the start of a flow entry as a block
// sequence: "[- - a]" is three deep.
type flowLevel struct {
	seq    bool
	colons int
	pair   bool
	// extra is the depth the current entry adds: its pair and dashes.
	extra int
}

type nestScanner struct {
	limit int
	stack []openCollection // open block collections, outermost first
	flows []flowLevel      // open [ and {, outermost first
	// flow is the depth the open flow collections add, pairs included.
	flow int
	// dangling is the column of a node left empty at the end of a line (a
	// "-" alone, or a tag or anchor with no value), noColumn when none. go-yaml hangs
	// the next line's node under it even when that is indented no deeper:
	// "-" then "a: b" at its column is a mapping inside the entry, and
	// "a: !t" then "b: c" nests the mapping under the tag.
	dangling    int
	danglingTag bool
	// floor is how many stack entries such a node froze: what follows
	// nests under them whatever its indentation. force makes the line's
	// first collection a new one even where it would continue the top one
	// (after a dangling tag).
	floor int
	force bool
	// carry is a dangling node's column and kind kept for the next line
	// when this one hangs only a scalar under it ("&\n0\n0:"); opens
	// counts open calls, so a line can tell whether it opened anything.
	carry, carryOpens int
	carryTag          bool
	opens             int
	// blockScalar is the column its content must be indented beyond, or
	// noColumn outside one.
	blockScalar int
}

func (s *nestScanner) depth() int { return len(s.stack) + s.flow }

// open records a block collection starting at col. It reports false when
// the nesting passes the limit.
func (s *nestScanner) open(col int, seq bool) bool {
	s.opens++
	for len(s.stack) > 0 {
		top := s.stack[len(s.stack)-1]
		if top.col == col && top.seq == seq && !s.force {
			return true // another entry of the same collection
		}
		// A dedent closes collections; a key back at a sequence's column
		// ends the sequence (it was the value of a key at that column).
		if len(s.stack) > s.floor && (top.col > col || (top.col == col && top.seq && !seq)) {
			s.stack = s.stack[:len(s.stack)-1]
			continue
		}
		break
	}
	s.force = false
	s.stack = append(s.stack, openCollection{col, seq})
	return s.depth() <= s.limit
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

// line scans one line; false means the nesting went over the limit.
func (s *nestScanner) line(l []byte) bool {
	indent := 0
	for indent < len(l) && l[indent] == ' ' {
		indent++
	}
	if s.blockScalar != noColumn {
		if indent == len(l) || indent > s.blockScalar {
			return true // blank or indented: the block scalar's text
		}
		s.blockScalar = noColumn
	}
	pos := 0
	valueStart := true
	if n := len(s.flows); n > 0 {
		// go-yaml reads a flow entry's next line as able to open another
		// pair ("[\n0:\n- 0: 0]"): count its colons afresh.
		s.flows[n-1].colons, s.flows[n-1].pair = 0, false
	}
	if s.flow == 0 {
		pos = indent
		if pos == len(l) || l[pos] == '#' {
			return true
		}
		s.force, s.carry = false, noColumn
		if s.dangling != noColumn && indent <= s.dangling {
			s.floor, s.force = len(s.stack), s.danglingTag
			s.carry, s.carryTag, s.carryOpens = s.dangling, s.danglingTag, s.opens
		}
		s.dangling = noColumn
		if indent == 0 && len(l) >= 3 && (string(l[:3]) == "---" || string(l[:3]) == "...") && (len(l) == 3 || isBlank(l[3])) {
			s.stack, s.dangling, s.floor = s.stack[:0], noColumn, 0 // a new document
			pos = 3
		}
		// "- - x" opens one sequence per dash; "? k" an explicit key.
		for pos < len(l) && (l[pos] == '-' || l[pos] == '?') && (pos+1 == len(l) || isBlank(l[pos+1])) {
			if !s.open(pos, l[pos] == '-') {
				return false
			}
			pos++
			for pos < len(l) && isBlank(l[pos]) {
				pos++
			}
			if pos == len(l) || l[pos] == '#' {
				s.dangling, s.danglingTag = pos-1, false
				for s.dangling > 0 && l[s.dangling] != '-' && l[s.dangling] != '?' {
					s.dangling--
				}
				return true
			}
		}
		if pos < len(l) && l[pos] == ':' && (pos+1 == len(l) || isBlank(l[pos+1])) {
			// A value for a key on an earlier line ("0\n: v"): go-yaml
			// makes that a mapping of its own, nested under what is open.
			s.floor, s.force = len(s.stack), true
		}
		if pos < len(l) && l[pos] != '#' && hasKey(l[pos:]) && !s.open(pos, false) {
			return false
		}
	}
	// props says the line ended in a tag or anchor awaiting its value
	// ('&'), and whether a tag was among them ('!'); 0 otherwise.
	var props byte
	emptyAnchor := false // an anchor without a name, which YAML has not
	// bare is the column of a line that is nothing but properties, whose
	// node go-yaml hangs the next line under whatever its indentation.
	bare := noColumn
	if s.flow == 0 && pos < len(l) && (l[pos] == '&' || l[pos] == '!') {
		bare = pos
	}
	// A quoted scalar is taken to end with its line: go-yaml reads a quote
	// on a plain scalar's continuation line as text, and a quote wrongly
	// left open would hide the rest of the file from the count.
	var quote byte
	// colons counts the line's block value indicators and scalar is where
	// the current plain scalar began: a second "k:" on one line is a key
	// go-yaml nests under the first.
	colons, scalar := 0, pos
	for i := pos; i < len(l); i++ {
		c := l[i]
		if !isBlank(c) && c != '#' && c != '!' && c != '&' {
			props = 0
		}
		if quote != 0 {
			switch {
			case c == '\\' && quote == '"':
				i++
			case c == '\'' && quote == '\'' && i+1 < len(l) && l[i+1] == '\'':
				i++
			case c == quote:
				quote = 0
				valueStart = false
			}
			continue
		}
		switch {
		case isBlank(c):
		case c == '#' && (i == 0 || isBlank(l[i-1])):
			return s.endLine(valueStart || emptyAnchor, danglingProps(props, emptyAnchor), bare)
		case (c == '"' || c == '\'') && valueStart:
			quote = c
		case c == '[' || c == '{':
			if s.flow > 0 || valueStart {
				s.flows = append(s.flows, flowLevel{seq: c == '['})
				s.flow++
				if s.depth() > s.limit {
					return false
				}
				valueStart = true
			}
		case c == ']' || c == '}':
			// Only the matching bracket closes: go-yaml reads "[}" as still open.
			if n := len(s.flows); n > 0 && s.flows[n-1].seq == (c == ']') {
				s.flow -= 1 + s.flows[n-1].extra
				s.flows = s.flows[:n-1]
				valueStart = false
			}
		case c == ',' && s.flow > 0:
			lvl := &s.flows[len(s.flows)-1]
			s.flow -= lvl.extra
			*lvl = flowLevel{seq: lvl.seq}
			valueStart = true
		case c == ':' && s.flow > 0:
			lvl := &s.flows[len(s.flows)-1]
			lvl.colons++
			if !lvl.pair && ((lvl.seq && lvl.colons == 1) || (!lvl.seq && lvl.colons == 2)) {
				lvl.pair = true
				lvl.extra++
				s.flow++
				if s.depth() > s.limit {
					return false
				}
			}
			valueStart = true
		case (c == '-' || c == '?') && s.flow == 0 && valueStart && (i+1 == len(l) || isBlank(l[i+1])):
			// An entry or explicit key after a tag or anchor ("! - -") or
			// a value (": ? k"): go-yaml nests it.
			if !s.open(i, c == '-') {
				return false
			}
		case (c == '-' || c == '?') && s.flow > 0 && valueStart && (i+1 == len(l) || isBlank(l[i+1])):
			s.flows[len(s.flows)-1].extra++
			s.flow++
			if s.depth() > s.limit {
				return false
			}
		case c == ':' && (i+1 == len(l) || isBlank(l[i+1])):
			if colons++; colons > 1 && !s.open(scalar, false) {
				return false
			}
			valueStart = true
		case (c == '|' || c == '>') && valueStart && s.flow == 0 && blockHeader(l[i+1:]):
			s.blockScalar = -1
			if len(s.stack) > 0 {
				s.blockScalar = s.stack[len(s.stack)-1].col
			}
			return true
		case (c == '&' || c == '!') && valueStart:
			// An anchor or tag before a value: the value still starts after it.
			start := i
			for i+1 < len(l) && !isBlank(l[i+1]) && !(s.flow > 0 && isFlowIndicator(l[i+1])) {
				i++
			}
			if c == '&' && i == start {
				// go-yaml takes the next word as the name of an anchor "& "
				// and, whatever follows, hangs the next line's node under
				// it: "0: ! & 0 0" repeated nests a level a line.
				for i+1 < len(l) && isBlank(l[i+1]) {
					i++
				}
				for i+1 < len(l) && !isBlank(l[i+1]) && !(s.flow > 0 && isFlowIndicator(l[i+1])) {
					i++
				}
				emptyAnchor = true
			}
			if props != '!' {
				props = c
			}
		default:
			if valueStart {
				scalar = i
			}
			valueStart = false
		}
	}
	return s.endLine(valueStart || emptyAnchor, danglingProps(props, emptyAnchor), bare)
}

// danglingProps makes a line with a nameless anchor end as if on a
// dangling tag.
func danglingProps(props byte, emptyAnchor bool) byte {
	if emptyAnchor {
		return '!'
	}
	return props
}

// endLine notes a tag or anchor left without its value at the end of a
// block line: go-yaml may hang the next line's node under it.
func (s *nestScanner) endLine(valueStart bool, props byte, bare int) bool {
	if s.carry != noColumn && s.opens == s.carryOpens && s.flow == 0 {
		// Only a scalar hung under the dangling node: the next line may
		// still be hung there.
		s.dangling, s.danglingTag = s.carry, s.carryTag
	}
	s.carry = noColumn
	if !valueStart || props == 0 || s.flow > 0 {
		return true
	}
	s.dangling, s.danglingTag = -1, props == '!'
	if len(s.stack) > 0 {
		s.dangling = s.stack[len(s.stack)-1].col
	}
	if bare != noColumn {
		s.dangling, s.danglingTag = bare, true
	}
	return true
}

func isFlowIndicator(c byte) bool { return c == ',' || c == '[' || c == ']' || c == '{' || c == '}' }

// blockHeader reports whether rest, after a | or >, is a block scalar header:
// chomping and indentation indicators, then nothing but a comment.
func blockHeader(rest []byte) bool {
	i := 0
	for i < len(rest) && (rest[i] == '+' || rest[i] == '-' || (rest[i] >= '0' && rest[i] <= '9')) {
		i++
	}
	if i < len(rest) && !isBlank(rest[i]) {
		return false
	}
	for i < len(rest) && isBlank(rest[i]) {
		i++
	}
	return i == len(rest) || rest[i] == '#'
}

// hasKey reports whether a block line's content is a mapping key: a ':'
// followed by a blank or the end, outside quotes and brackets, before any
// comment.
func hasKey(l []byte) bool {
	var quote byte
	flow := 0
	for i := 0; i < len(l); i++ {
		c := l[i]
		if quote != 0 {
			switch {
			case c == '\\' && quote == '"':
				i++
			case c == quote:
				quote = 0
			}
			continue
		}
		switch {
		case (c == '"' || c == '\'') && i == 0:
			quote = c
		case c == '[' || c == '{':
			if i == 0 || flow > 0 {
				flow++
			}
		case (c == ']' || c == '}') && flow > 0:
			flow--
		case c == '#' && i > 0 && isBlank(l[i-1]):
			return false
		case c == ':' && flow == 0 && (i+1 == len(l) || isBlank(l[i+1])):
			return true
		}
	}
	return false
}

// RefuseRedacted refuses a fleet holding the placeholder an export shows
// non-admins in place of secrets (fleet.RedactModels: env values, secret
// flag values, credentials in a recipe's weights, bin or install script):
// applying it would hand the engine or the installer the placeholder
// instead of the secret. Export itself writes such files (they are valid
// YAML and parse), so the check belongs to apply.
func RefuseRedacted(filename string, f fleet.Fleet) error {
	for _, m := range f.Models {
		for _, e := range slices.Sorted(maps.Keys(m.Recipes)) {
			r := m.Recipes[e]
			var field string
			switch {
			case slices.ContainsFunc(r.Args, func(a string) bool { return strings.Contains(a, fleet.Redacted) }):
				field = "args"
				for _, a := range r.Args {
					if flag, _ := fleet.IsSecretFlag(a); flag != "" {
						field = "args: " + flag
						break
					}
				}
			case strings.Contains(r.Model, fleet.Redacted):
				field = "model"
			case strings.Contains(r.Bin, fleet.Redacted):
				field = "bin"
			case strings.Contains(r.Install, fleet.Redacted):
				field = "install"
			}
			for _, name := range slices.Sorted(maps.Keys(r.Env)) {
				if field == "" && strings.Contains(r.Env[name], fleet.Redacted) {
					field = "env " + name
				}
			}
			if field != "" {
				return &Error{File: filename, Where: fmt.Sprintf("model %s: recipe %s", m.ID, e),
					Msg: fmt.Sprintf("%s holds %s, the placeholder an export shows non-admins in place of a secret; put the real value in its place (an admin's export has it)", field, fleet.Redacted)}
			}
		}
	}
	return nil
}
