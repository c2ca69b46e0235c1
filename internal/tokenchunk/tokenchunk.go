// Package tokenchunk is the one rule for whether a streamed event carries a
// token (content, reasoning under either name, a tool call, completion
// text, or an Anthropic or Responses delta). The router times a worker's
// TTFT by it and the bench times TTFT and ITL by it, so the two cannot
// disagree on when the first token came: a role-only chunk, a usage chunk
// or an empty delta is never one.
package tokenchunk

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
)

// Chunk is the part of a streamed event that says whether it carries a
// token: chat deltas and completion text, and the Anthropic or Responses
// event type. A caller that reads more of the event embeds it.
type Chunk struct {
	// Type is an Anthropic or Responses stream event's type.
	Type    string   `json:"type"`
	Choices []Choice `json:"choices"`
}

// Choice is one choice of a chat or completion chunk.
type Choice struct {
	// Text is a completion chunk's token.
	Text  string `json:"text"`
	Delta Delta  `json:"delta"`
}

// Delta is a chat chunk's delta.
type Delta struct {
	Content string `json:"content"`
	// ReasoningContent is llama-server's (and DeepSeek's) name for the
	// thinking, Reasoning vLLM's.
	ReasoningContent string            `json:"reasoning_content"`
	Reasoning        string            `json:"reasoning"`
	ToolCalls        []json.RawMessage `json:"tool_calls"`
}

// CarriesToken reports whether the chunk carries a token. An event with a
// type is judged by its type alone: a chat chunk has none.
func (c Chunk) CarriesToken() bool {
	if c.Type != "" {
		return apiTokenEvents[c.Type]
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		if ch.Text != "" || d.Content != "" || d.ReasoningContent != "" || d.Reasoning != "" || len(d.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

// apiTokenEvents are the Anthropic and Responses stream events that carry a
// token (text, thinking or tool input).
var apiTokenEvents = map[string]bool{
	"content_block_delta": true, "response.output_text.delta": true, "response.reasoning_text.delta": true,
	"response.function_call_arguments.delta": true,
}

// tokenKeys are the keys without which no payload carries a token: a
// payload holding none of them is answered without decoding it.
var tokenKeys = [][]byte{[]byte(`"content"`), []byte(`"reasoning`), []byte(`"text"`), []byte(`"tool_calls"`), []byte(`"delta"`)}

// Carries reports whether an SSE data payload carries a token. A payload
// that is not JSON carries none.
func Carries(payload []byte) bool {
	maybe := false
	for _, k := range tokenKeys {
		if bytes.Contains(payload, k) {
			maybe = true
			break
		}
	}
	if !maybe || !json.Valid(payload) {
		return false
	}
	// Decoding into a Chunk (reflection, and a deep stack) cost the
	// router more than the rest of its meter; a walk of the few keys a
	// Chunk has gives the same answer without it, and leaves to the
	// decoder the payloads it is not sure of.
	w := walker{p: payload}
	switch carries, how := w.chunk(); how {
	case walked:
		return carries
	case mismatched:
		return false // the decoder would fail as well
	}
	var c Chunk
	if json.Unmarshal(payload, &c) != nil {
		return false
	}
	return c.CarriesToken()
}

// walked, mismatched and unsure are how a walker's reading ended: it read
// what a Chunk would hold; a key of Chunk holds a value of the wrong type
// (json.Unmarshal fails); or the payload needs the decoder's own reading
// (an escaped or non-ASCII key, a key given twice, an escaped type).
const (
	walked = iota
	mismatched
	unsure
)

// walker reads what a Chunk would hold from a payload json.Valid passed,
// matching keys as json.Unmarshal does (case-insensitively) and skipping
// every other value unread.
type walker struct {
	p []byte
	i int
}

func (w *walker) next() byte {
	for w.i < len(w.p) {
		switch w.p[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return w.p[w.i]
		}
	}
	return 0
}

// str reads the string at w.i and returns its bytes as written and whether
// it holds an escape; a string is empty decoded only if it is written so.
func (w *walker) str() (raw []byte, escaped bool) {
	w.i++
	start := w.i
	for {
		w.i += bytes.IndexByte(w.p[w.i:], '"')
		if !escaped && bytes.IndexByte(w.p[start:w.i], '\\') < 0 {
			w.i++
			return w.p[start : w.i-1], false
		}
		escaped = true
		// The quote ends the string unless an odd run of backslashes
		// escapes it.
		odd := false
		for j := w.i - 1; j >= start && w.p[j] == '\\'; j-- {
			odd = !odd
		}
		w.i++
		if !odd {
			return w.p[start : w.i-1], true
		}
	}
}

// skip passes the value at w.i.
func (w *walker) skip() {
	switch w.next() {
	case '"':
		w.str()
	case '{', '[':
		for depth := 0; ; {
			switch w.p[w.i] {
			case '"':
				w.str()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			w.i++
			if depth == 0 {
				return
			}
		}
	default:
		for ; w.i < len(w.p); w.i++ {
			switch w.p[w.i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return
			}
		}
	}
}

// null passes a null at w.i, if one is there.
func (w *walker) null() bool {
	if w.next() == 'n' {
		w.i += len("null")
		return true
	}
	return false
}

// object reads the object at w.i (w.next() is '{'), calling field with the
// index in keys of each key it has (case-insensitively), which reads the
// value; any other key's value is skipped.
func (w *walker) object(keys [][]byte, field func(k int) int) int {
	w.i++
	var seen uint
	for {
		switch w.next() {
		case '}':
			w.i++
			return walked
		case ',':
			w.i++
			continue
		}
		raw, escaped := w.str()
		if escaped || !ascii(raw) {
			return unsure
		}
		w.next() // the colon
		w.i++
		k := slices.IndexFunc(keys, func(key []byte) bool { return bytes.EqualFold(key, raw) })
		if k < 0 {
			w.skip()
			continue
		}
		if seen&(1<<k) != 0 {
			return unsure
		}
		seen |= 1 << k
		if how := field(k); how != walked {
			return how
		}
	}
}

func ascii(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// text reads a string field's value: whether it is a non-empty string.
func (w *walker) text(nonEmpty *bool) int {
	if w.null() {
		return walked
	}
	if w.next() != '"' {
		return mismatched
	}
	raw, _ := w.str()
	*nonEmpty = *nonEmpty || len(raw) > 0
	return walked
}

var (
	chunkKeys  = [][]byte{[]byte("type"), []byte("choices")}
	choiceKeys = [][]byte{[]byte("text"), []byte("delta")}
	deltaKeys  = [][]byte{[]byte("content"), []byte("reasoning_content"), []byte("reasoning"), []byte("tool_calls")}
)

// chunk reads the payload as a Chunk and says whether it carries a token.
func (w *walker) chunk() (bool, int) {
	if w.next() != '{' {
		return false, mismatched // or null: no token either way
	}
	var typ []byte
	choice := false
	how := w.object(chunkKeys, func(k int) int {
		if k == 0 { // type
			if w.null() {
				return walked
			}
			if w.next() != '"' {
				return mismatched
			}
			raw, escaped := w.str()
			if escaped {
				return unsure
			}
			typ = raw
			return walked
		}
		if w.null() { // choices
			return walked
		}
		if w.next() != '[' {
			return mismatched
		}
		w.i++
		for {
			switch w.next() {
			case ']':
				w.i++
				return walked
			case ',':
				w.i++
			case 'n':
				w.null()
			case '{':
				if how := w.object(choiceKeys, func(k int) int { return w.choiceField(k, &choice) }); how != walked {
					return how
				}
			default:
				return mismatched
			}
		}
	})
	if how != walked {
		return false, how
	}
	if len(typ) > 0 {
		return apiTokenEvents[string(typ)], walked
	}
	return choice, walked
}

// choiceField reads the value of a choice's key choiceKeys[k].
func (w *walker) choiceField(k int, carries *bool) int {
	if k == 0 { // text
		return w.text(carries)
	}
	if w.null() { // delta
		return walked
	}
	if w.next() != '{' {
		return mismatched
	}
	return w.object(deltaKeys, func(k int) int {
		if k < 3 {
			return w.text(carries)
		}
		if w.null() { // tool_calls
			return walked
		}
		if w.next() != '[' {
			return mismatched
		}
		start := w.i
		w.i++
		if w.next() != ']' {
			*carries = true // any element, even null, is a call
		}
		w.i = start
		w.skip()
		return walked
	})
}

// CarriesStart is Carries for a payload of which only the start is at hand
// (a line longer than a reader keeps). The SSE event name says it where the
// stream gives one; else the start is read as JSON as far as it goes, so
// that a long first event that is not a token (a Responses stream's
// response.created echoing long instructions) is not taken for one.
func CarriesStart(event, start []byte) bool {
	if len(event) > 0 {
		return apiTokenEvents[string(event)]
	}
	// frame is an open object (its current key, whether a key comes next)
	// or array.
	type frame struct {
		obj, wantKey bool
		key          string
	}
	var stack []frame
	// path names the place of a value as the keys of the objects it is
	// in, arrays left out: "choices.delta.content".
	path := func() string {
		var keys []string
		for _, f := range stack {
			if f.obj {
				keys = append(keys, f.key)
			}
		}
		return strings.Join(keys, ".")
	}
	d := json.NewDecoder(bytes.NewReader(start))
	for {
		tok, err := d.Token()
		if err != nil {
			// Cut here: a string that begins at a token's place and goes on
			// past the cut is a long, non-empty token.
			if n := len(stack); n == 0 || !stack[n-1].obj || stack[n-1].wantKey || !tokenStrings[path()] {
				return false
			}
			rest := bytes.TrimLeft(start[d.InputOffset():], " \t:")
			return len(rest) > 1 && rest[0] == '"' && rest[1] != '"'
		}
		n := len(stack)
		if n > 0 && !stack[n-1].obj && tok != json.Delim(']') && path() == "choices.delta.tool_calls" {
			return true // a tool call's first element
		}
		if s, ok := tok.(string); ok && n > 0 && stack[n-1].obj && stack[n-1].wantKey {
			stack[n-1].key, stack[n-1].wantKey = s, false
			continue
		}
		if n > 0 && stack[n-1].obj {
			p := path()
			if s, ok := tok.(string); ok && (tokenStrings[p] && s != "" || p == "type") {
				return tokenStrings[p] || n == 1 && apiTokenEvents[s]
			}
			stack[n-1].wantKey = true // a value ends the pair
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{obj: true, wantKey: true})
		case json.Delim('['):
			stack = append(stack, frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:n-1]
		}
	}
}

// tokenStrings are the places in a chat or completion chunk whose non-empty
// string is a token.
var tokenStrings = map[string]bool{
	"choices.delta.content": true, "choices.delta.reasoning_content": true, "choices.delta.reasoning": true, "choices.text": true,
}
