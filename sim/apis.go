package sim

import (
	"encoding/json"
	"fmt"
	"strings"
)

// apiKind is the wire format a generation request came in, and is answered, in.
type apiKind int

const (
	apiOpenAI    apiKind = iota // chat and text completions
	apiMessages                 // Anthropic Messages (/v1/messages)
	apiResponses                // OpenAI Responses (/v1/responses)
)

// apiStreamState is where an Anthropic or Responses answer stands.
type apiStreamState struct {
	// block is the kind of the block or item pieces go to now ("" none):
	// "text", "thinking" or "tool_use".
	block string
	// opened lists the Anthropic content blocks started, in order (their
	// index is their place); closed counts those stopped.
	opened []string
	closed int
	// Responses: the output items started, in order, and their ids; the
	// sequence_number (vLLM sends it).
	items                 []string
	seq                   int
	msgID, reasoningID    string
	text, reasoning, args strings.Builder
}

// blockKind says which content block a piece belongs to in an Anthropic or
// Responses answer; "" when it shows nothing (a <think> tag when thoughts
// go to their own block).
func (j *job) blockKind(p piece) string {
	switch p.kind {
	case pieceThinkTag:
		if j.placement == thoughtsField {
			return ""
		}
		return "text"
	case pieceReasoning:
		if j.placement == thoughtsInline {
			return "text"
		}
		return "thinking"
	case pieceToolArgs:
		return "tool_use"
	}
	return "text"
}

func (j *job) apiStart() {
	if j.api == apiMessages {
		j.messagesStart()
		return
	}
	j.responsesStart()
}

func (j *job) apiPiece(p piece) {
	kind := j.blockKind(p)
	if kind == "" {
		return
	}
	if j.api == apiMessages {
		j.messagesPiece(kind, p.text)
		return
	}
	j.responsesPiece(kind, p.text)
}

func (j *job) apiFinish() {
	if j.api == apiMessages {
		j.messagesFinish()
		return
	}
	j.responsesFinish()
}

// sendNamed writes one SSE event with an event: line, as both Anthropic and
// Responses streams carry, and flushes it.
func (j *job) sendNamed(event string, payload obj) {
	if j.writeErr != nil {
		return
	}
	if _, err := fmt.Fprintf(j.w, "event: %s\ndata: %s\n\n", event, marshal(payload)); err != nil {
		j.writeErr = err
		return
	}
	j.flush()
}

// blockText flattens Anthropic or Responses content: a string, or a list of
// blocks whose text, tool input or nested content is taken in order.
func blockText(raw json.RawMessage) string {
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return str
	}
	var blocks []struct {
		Text    string          `json:"text"`
		Input   json.RawMessage `json:"input"`
		Content json.RawMessage `json:"content"`
		Output  json.RawMessage `json:"output"`
	}
	if json.Unmarshal(raw, &blocks) != nil {
		return ""
	}
	var b strings.Builder
	for _, bl := range blocks {
		b.WriteString(bl.Text)
		if len(bl.Input) > 0 {
			b.Write(bl.Input)
		}
		if len(bl.Content) > 0 {
			b.WriteString(blockText(bl.Content))
		}
		if len(bl.Output) > 0 {
			b.WriteString(blockText(bl.Output))
		}
	}
	return b.String()
}
