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
	if !maybe {
		return false
	}
	var c Chunk
	if json.Unmarshal(payload, &c) != nil {
		return false
	}
	return c.CarriesToken()
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
