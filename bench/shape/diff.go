package shape

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Verdicts.
const (
	VerdictSame    = "same"
	VerdictDiffers = "differs"
)

// Report is the comparison of two shapes.
type Report struct {
	A       string `json:"a"`
	B       string `json:"b"`
	Verdict string `json:"verdict"`
	// Differences are what a client would notice (Material) and what it
	// would not unless it looks for it (notes: extra fields, timings).
	Differences []Difference `json:"differences"`
	// Rows is the side-by-side table, one row per request and aspect.
	Rows []Row `json:"rows"`
}

// Difference is one finding, worded for a person.
type Difference struct {
	// Requests are the shape requests it was seen on ("reasoning,
	// streamed"); the same finding on several is reported once.
	Requests []string `json:"probes"`
	Aspect   string   `json:"aspect"`
	Material bool     `json:"material"`
	Text     string   `json:"text"`
}

// String is the finding with the requests it was seen on:
// "reasoning prompt, non-streamed: content empty on ultra, …".
func (d Difference) String() string {
	return requestsLabel(d.Requests) + ": " + d.Text
}

// requestsLabel words a set of request keys compactly.
func requestsLabel(keys []string) string {
	modes := map[string]map[string]bool{}
	var names []string
	for _, k := range keys {
		name, m, _ := strings.Cut(k, ", ")
		if modes[name] == nil {
			modes[name] = map[string]bool{}
			names = append(names, name)
		}
		modes[name][m] = true
	}
	both := true
	shared := map[string]bool{}
	for _, n := range names {
		both = both && len(modes[n]) == 2
		for m := range modes[n] {
			shared[m] = true
		}
	}
	prompts := func() string {
		if len(names) == 1 {
			return names[0] + " prompt"
		}
		if len(names) == 3 {
			return "every prompt"
		}
		return strings.Join(names, " and ") + " prompts"
	}
	switch {
	case len(keys) == 1:
		return strings.Replace(keys[0], ", ", " prompt, ", 1)
	case both:
		return prompts() + ", streamed and not"
	case len(shared) == 1:
		for m := range shared {
			return prompts() + ", " + m
		}
	}
	return strings.Join(keys, "; ")
}

// merge folds findings with the same wording on several requests into one.
func merge(ds []Difference) []Difference {
	var out []Difference
	index := map[string]int{}
	for _, d := range ds {
		k := fmt.Sprintf("%v|%s|%s", d.Material, d.Aspect, d.Text)
		if i, ok := index[k]; ok {
			out[i].Requests = append(out[i].Requests, d.Requests...)
			continue
		}
		index[k] = len(out)
		out = append(out, d)
	}
	return out
}

// Row is one line of the side-by-side table.
type Row struct {
	Request string `json:"probe"`
	Aspect  string `json:"aspect"`
	A       string `json:"a"`
	B       string `json:"b"`
	Same    bool   `json:"same"`
}

// Matches checks a worker's shape against its model's reference shape: it
// passes when a client could not tell the two apart.
func Matches(ref, got Shape) (bool, Report) {
	r := Diff(ref, got)
	return r.Verdict == VerdictSame, r
}

// Diff compares two shapes request by request and says what a client would
// notice, naming each side by its target.
func Diff(a, b Shape) Report {
	r := Report{A: a.Target, B: b.Target, Verdict: VerdictSame}
	if r.A == r.B {
		r.A, r.B = r.A+" (1)", r.B+" (2)"
	}
	bByKey := map[string]Answer{}
	for _, p := range b.Answers {
		bByKey[p.Key()] = p
	}
	for _, pa := range a.Answers {
		pb, ok := bByKey[pa.Key()]
		if !ok {
			r.add(Difference{Requests: []string{pa.Key()}, Aspect: "request", Material: true,
				Text: "asked of " + r.A + " only"})
			continue
		}
		delete(bByKey, pa.Key())
		r.compare(pa, pb)
	}
	for _, pb := range b.Answers {
		if _, left := bByKey[pb.Key()]; left {
			r.add(Difference{Requests: []string{pb.Key()}, Aspect: "request", Material: true,
				Text: "asked of " + r.B + " only"})
		}
	}
	r.Differences = merge(r.Differences)
	for _, d := range r.Differences {
		if d.Material {
			r.Verdict = VerdictDiffers
		}
	}
	return r
}

func (r *Report) add(d Difference) { r.Differences = append(r.Differences, d) }

func (r *Report) row(request, aspect, a, b string) bool {
	same := a == b
	r.Rows = append(r.Rows, Row{Request: request, Aspect: aspect, A: a, B: b, Same: same})
	return same
}

func (r *Report) compare(a, b Answer) {
	key := a.Key()
	if a.Error != "" || b.Error != "" {
		if !r.row(key, "error", orDash(a.Error), orDash(b.Error)) {
			var parts []string
			if a.Error != "" {
				parts = append(parts, fmt.Sprintf("failed on %s (%s)", r.A, a.Error))
			} else {
				parts = append(parts, fmt.Sprintf("answered on %s", r.A))
			}
			if b.Error != "" {
				parts = append(parts, fmt.Sprintf("failed on %s (%s)", r.B, b.Error))
			} else {
				parts = append(parts, fmt.Sprintf("answered on %s", r.B))
			}
			r.add(Difference{Requests: []string{key}, Aspect: "error", Material: true, Text: strings.Join(parts, "; ")})
		}
		// Without an answer on both sides there is no shape to compare.
		return
	}

	contentA, contentB := contentWords(a.ContentEmpty), contentWords(b.ContentEmpty)
	sameContent := r.row(key, "content", contentA, contentB)
	sameReasoning := r.row(key, "reasoning", a.Reasoning, b.Reasoning)
	if !sameContent || !sameReasoning {
		r.add(Difference{Requests: []string{key}, Aspect: "reasoning", Material: true,
			Text: describe(b) + " on " + r.B + "; " + describe(a) + " on " + r.A})
	}
	if !r.row(key, "tool calls", a.ToolCalls, b.ToolCalls) {
		r.add(Difference{Requests: []string{key}, Aspect: "tool calls", Material: true,
			Text: "tool calls " + toolWords(a.ToolCalls) + " on " + r.A + "; " + toolWords(b.ToolCalls) + " on " + r.B})
	}
	if !r.row(key, "finish_reason", orDash(a.FinishReason), orDash(b.FinishReason)) {
		material := a.FinishReason == "" || b.FinishReason == "" || a.FinishReason == "tool_calls" || b.FinishReason == "tool_calls"
		text := fmt.Sprintf("finish_reason %q on %s, %q on %s", a.FinishReason, r.A, b.FinishReason, r.B)
		if !material {
			text += " (the answer's length, not its shape)"
		}
		r.add(Difference{Requests: []string{key}, Aspect: "finish_reason", Material: material, Text: text})
	}
	if !r.row(key, "usage", yesNo(a.Usage), yesNo(b.Usage)) {
		r.add(Difference{Requests: []string{key}, Aspect: "usage", Material: true,
			Text: "usage only on " + r.which(a.Usage) + "; a client counting tokens gets nothing from the other"})
	}
	if !r.row(key, "timings", yesNo(a.Timings), yesNo(b.Timings)) {
		r.add(Difference{Requests: []string{key}, Aspect: "timings", Material: false,
			Text: "llama-server timings only on " + r.which(a.Timings) + " (an extra field clients ignore)"})
	}
	if a.Stream != nil && b.Stream != nil {
		if !r.row(key, "role first", yesNo(a.Stream.RoleFirst), yesNo(b.Stream.RoleFirst)) {
			r.add(Difference{Requests: []string{key}, Aspect: "role first", Material: false,
				Text: "first delta carries role \"assistant\" only on " + r.which(a.Stream.RoleFirst)})
		}
		if !r.row(key, "usage chunk", yesNo(a.Stream.UsageChunk), yesNo(b.Stream.UsageChunk)) {
			r.add(Difference{Requests: []string{key}, Aspect: "usage chunk", Material: true,
				Text: "usage arrives in a separate chunk with empty choices only on " + r.which(a.Stream.UsageChunk) +
					"; a client reading choices[0] of every chunk breaks there"})
		}
		if !r.row(key, "[DONE]", yesNo(a.Stream.Done), yesNo(b.Stream.Done)) {
			r.add(Difference{Requests: []string{key}, Aspect: "[DONE]", Material: true,
				Text: "stream ends with data: [DONE] only on " + r.which(a.Stream.Done)})
		}
	}
	cva, cvb := clientWords(a.Client), clientWords(b.Client)
	if !r.row(key, "go-openai sees", cva, cvb) && sameContent && sameReasoning {
		r.add(Difference{Requests: []string{key}, Aspect: "go-openai", Material: false,
			Text: "go-openai sees " + cva + " on " + r.A + ", " + cvb + " on " + r.B})
	}
	r.row(key, "go-openai cannot see", orDash(strings.Join(a.Client.Hidden, ", ")), orDash(strings.Join(b.Client.Hidden, ", ")))
	ha, hb := strings.Join(uncovered(a.Client.Hidden), ", "), strings.Join(uncovered(b.Client.Hidden), ", ")
	if ha != hb {
		// A hidden reasoning field is already a material reasoning
		// difference above; the rest are extras a client never reads.
		r.add(Difference{Requests: []string{key}, Aspect: "go-openai cannot see", Material: false,
			Text: "fields a go-openai user cannot read: " + orNone(ha) + " on " + r.A + "; " + orNone(hb) + " on " + r.B})
	}
	r.fieldNotes(key, a, b)
}

// fieldNotes reports paths present on one side only, top-most first, as
// notes: a client that ignores unknown fields does not notice them.
func (r *Report) fieldNotes(key string, a, b Answer) {
	only := func(x, y map[string]string) []string {
		var paths []string
		for p := range x {
			if _, ok := y[p]; !ok && !coveredElsewhere(p) {
				paths = append(paths, p)
			}
		}
		slices.Sort(paths)
		var top []string
		for _, p := range paths {
			if len(top) > 0 && (strings.HasPrefix(p, top[len(top)-1]+".") || strings.HasPrefix(p, top[len(top)-1]+"[]")) {
				continue
			}
			top = append(top, p)
		}
		return top
	}
	onlyA, onlyB := only(a.Fields, b.Fields), only(b.Fields, a.Fields)
	if len(onlyA) > 0 {
		r.add(Difference{Requests: []string{key}, Aspect: "fields", Text: "fields only on " + r.A + ": " + strings.Join(onlyA, ", ")})
	}
	if len(onlyB) > 0 {
		r.add(Difference{Requests: []string{key}, Aspect: "fields", Text: "fields only on " + r.B + ": " + strings.Join(onlyB, ", ")})
	}
}

// coveredElsewhere: reasoning fields and timings have their own findings.
func coveredElsewhere(path string) bool {
	return path == "timings" || strings.HasPrefix(path, "timings.") ||
		strings.HasSuffix(path, ".reasoning") || strings.HasSuffix(path, ".reasoning_content")
}

func (r *Report) which(onA bool) string {
	if onA {
		return r.A
	}
	return r.B
}

// describe words where a response put its text: "content empty, reasoning
// in reasoning_content", "inline <think>".
func describe(p Answer) string {
	var parts []string
	if p.ContentEmpty {
		parts = append(parts, "content empty")
	}
	switch p.Reasoning {
	case ReasoningNone:
		parts = append(parts, "no reasoning")
	case ReasoningInline:
		parts = append(parts, "inline <think>")
	default:
		where := strings.ReplaceAll(p.Reasoning, "+", " and ")
		where = strings.ReplaceAll(where, ReasoningInline, "inline <think>")
		s := "reasoning in " + where
		if strings.Contains(p.Reasoning, ReasoningField) && !strings.Contains(p.Reasoning, ReasoningContentField) {
			s += " (go-openai cannot see it)"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

func contentWords(empty bool) string {
	if empty {
		return "empty"
	}
	return "text"
}

func toolWords(t string) string {
	switch t {
	case ToolCallsStructured:
		return "structured"
	case ToolCallsProse:
		return "as prose in content"
	}
	return "absent"
}

func clientWords(c ClientView) string {
	var parts []string
	if c.Content {
		parts = append(parts, "content")
	}
	if c.ReasoningContent {
		parts = append(parts, "reasoning_content")
	}
	if c.ToolCalls > 0 {
		parts = append(parts, fmt.Sprintf("%d tool call(s)", c.ToolCalls))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, " + ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func uncovered(paths []string) []string {
	var out []string
	for _, p := range paths {
		if !coveredElsewhere(p) {
			out = append(out, p)
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

const (
	ansiRed   = "\x1b[31m"
	ansiGreen = "\x1b[32m"
	ansiDim   = "\x1b[2m"
	ansiBold  = "\x1b[1m"
	ansiReset = "\x1b[0m"
)

// Text renders the report side by side in width columns (80 when width is
// under 40), with ANSI colour when colour is set: differing rows red, the
// verdict green or red.
func (r Report) Text(width int, colour bool) string {
	if width < 40 {
		width = 80
	}
	paint := func(code, s string) string {
		if !colour {
			return s
		}
		return code + s + ansiReset
	}
	var sb strings.Builder
	verdict := strings.ToUpper(r.Verdict)
	if r.Verdict == VerdictSame {
		verdict = paint(ansiGreen+ansiBold, verdict)
	} else {
		verdict = paint(ansiRed+ansiBold, verdict)
	}
	material := 0
	for _, d := range r.Differences {
		if d.Material {
			material++
		}
	}
	fmt.Fprintf(&sb, "Response shape: %s vs %s: %s", r.A, r.B, verdict)
	if material > 0 {
		fmt.Fprintf(&sb, " (%d difference(s) a client would notice)", material)
	}
	sb.WriteString("\n\n")

	aspectW := 22
	colW := (width - aspectW - 4) / 2
	fmt.Fprintf(&sb, "%s %s %s\n", pad("", aspectW), pad(paint(ansiBold, fit(r.A, colW)), colW), paint(ansiBold, fit(r.B, colW)))
	request := ""
	for _, row := range r.Rows {
		if row.Same && !essentialAspects[row.Aspect] {
			continue
		}
		if row.Request != request {
			request = row.Request
			sb.WriteString(paint(ansiBold, request) + "\n")
		}
		mark := " "
		line := fmt.Sprintf("  %s %s %s", pad(fit(row.Aspect, aspectW-2), aspectW-2), pad(fit(row.A, colW), colW), pad(fit(row.B, colW), colW))
		if !row.Same {
			mark = "≠"
			line = paint(ansiRed, line)
		} else {
			line = paint(ansiDim, line)
		}
		sb.WriteString(strings.TrimRight(line, " ") + " " + mark + "\n")
	}
	if len(r.Differences) > 0 {
		sb.WriteString("\n" + paint(ansiBold, "What a client would notice") + "\n")
		for _, d := range r.Differences {
			if d.Material {
				sb.WriteString(wrap("✗ "+d.String(), width, "  ", func(s string) string { return paint(ansiRed, s) }))
			}
		}
		notes := false
		for _, d := range r.Differences {
			if !d.Material {
				if !notes {
					sb.WriteString(paint(ansiBold, "Notes (clients that ignore unknown fields will not notice)") + "\n")
					notes = true
				}
				sb.WriteString(wrap("· "+d.String(), width, "  ", func(s string) string { return paint(ansiDim, s) }))
			}
		}
	}
	return sb.String()
}

// essentialAspects are shown even when equal; the rest only when they differ.
var essentialAspects = map[string]bool{"content": true, "reasoning": true, "tool calls": true, "finish_reason": true, "go-openai sees": true}

// fit truncates s to n display columns.
func fit(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	if n <= 1 {
		return "…"
	}
	return string([]rune(s)[:n-1]) + "…"
}

// pad right-pads s to n display columns, ignoring ANSI escapes.
func pad(s string, n int) string {
	w := visibleWidth(s)
	if w >= n {
		return s
	}
	return s + strings.Repeat(" ", n-w)
}

func visibleWidth(s string) int {
	w, esc := 0, false
	for _, r := range s {
		switch {
		case r == '\x1b':
			esc = true
		case esc && r == 'm':
			esc = false
		case !esc:
			w++
		}
	}
	return w
}

// wrap breaks text into lines of at most width columns, indenting
// continuation lines, and paints each line.
func wrap(text string, width int, indent string, paint func(string) string) string {
	var sb strings.Builder
	line := ""
	for _, word := range strings.Fields(text) {
		if line != "" && utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) > width {
			sb.WriteString(paint(line) + "\n")
			line = indent + word
			continue
		}
		if line == "" {
			line = word
		} else {
			line += " " + word
		}
	}
	if line != "" {
		sb.WriteString(paint(line) + "\n")
	}
	return sb.String()
}
