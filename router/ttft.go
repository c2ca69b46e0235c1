package router

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
)

// tokenChunk is the part of a streamed chunk that says whether it carries a
// token: chat deltas (content, reasoning under either name, tool calls) and
// completion text.
type tokenChunk struct {
	// Type is an Anthropic or Responses stream event's type.
	Type    string `json:"type"`
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string            `json:"content"`
			ReasoningContent string            `json:"reasoning_content"`
			Reasoning        string            `json:"reasoning"`
			ToolCalls        []json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
}

var tokenKeys = [][]byte{[]byte(`"content"`), []byte(`"reasoning`), []byte(`"text"`), []byte(`"tool_calls"`), []byte(`"delta"`)}

// apiTokenEvents are the Anthropic and Responses stream events that carry a
// token (text, thinking or tool input).
var apiTokenEvents = map[string]bool{
	"content_block_delta": true, "response.output_text.delta": true, "response.reasoning_text.delta": true,
	"response.function_call_arguments.delta": true,
}

// carriesToken reports whether an SSE data payload carries a token. It is
// asked only until the first token of a stream, so the JSON decode costs a
// few chunks per request.
func carriesToken(payload []byte) bool {
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
	var c tokenChunk
	if json.Unmarshal(payload, &c) != nil {
		return false
	}
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

var promptMsField = []byte(`"prompt_ms":`)

// promptTime reads the engine's own prefill time from the end of a
// non-streamed answer: llama-server's timings.prompt_ms.
func promptTime(tail []byte) (time.Duration, bool) {
	i := bytes.LastIndex(tail, promptMsField)
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(tail[i+len(promptMsField):], " ")
	n := 0
	for n < len(rest) && (rest[n] == '.' || rest[n] == '-' || rest[n] == '+' || rest[n] == 'e' || rest[n] == 'E' || (rest[n] >= '0' && rest[n] <= '9')) {
		n++
	}
	v, err := strconv.ParseFloat(string(rest[:n]), 64)
	if err != nil || v <= 0 {
		return 0, false
	}
	return time.Duration(v * float64(time.Millisecond)), true
}
