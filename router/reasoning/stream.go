package reasoning

import (
	"bytes"
	"encoding/json"
	"strings"
)

// StreamRewriter rewrites one streamed chat completion, event by event. It
// is not safe for concurrent use: make one per response.
type StreamRewriter struct {
	mode    Mode
	choices map[int]*choiceState
	// last holds the envelope (id, object, created, model…) of the latest
	// chunk, so text still held back when the stream ends without a finish
	// chunk can be flushed in a chunk clients accept.
	last map[string]json.RawMessage
}

// phase is where a choice's content stands in Field mode.
type phase int

const (
	phaseStart    phase = iota // no content text seen yet: it may open with <think>
	phaseThinking              // inside an inline <think> block
	phaseAnswer                // after </think>, or content that never opened one
)

type choiceState struct {
	// Inline mode: a "<think>\n" has been sent and not yet closed.
	open bool
	// Field mode.
	phase phase
	// pending is content text held back because it may be the start of a
	// tag split across chunks ("<thi" … "nk>"): at most a tag and the
	// newlines just before it.
	pending string
	// trimLeadingNewlines drops the newlines a template puts right after a
	// tag, which may arrive in the next chunk.
	trimLeadingNewlines bool
}

// NewStreamRewriter returns a rewriter for one streamed response. With Off
// (or an unknown mode) every event passes through unchanged.
func NewStreamRewriter(mode Mode) *StreamRewriter {
	return &StreamRewriter{mode: mode, choices: map[int]*choiceState{}}
}

// Rewrite takes the payload of one SSE data event (the JSON after "data: ",
// or "[DONE]") and returns the payloads to send instead, in order: usually
// one, none when the event only carried a partial tag, two when held-back
// text is flushed before [DONE]. The caller frames each as "data: …\n\n".
func (s *StreamRewriter) Rewrite(event []byte) [][]byte {
	if s.mode != Inline && s.mode != Field {
		return [][]byte{event}
	}
	if string(bytes.TrimSpace(event)) == "[DONE]" {
		return append(s.flushPending(), event)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(event, &top); err != nil {
		return [][]byte{event}
	}
	choices, ok := decodeChoices(top["choices"])
	if !ok || len(choices) == 0 {
		// Usage chunks (choices: []) and error events carry no text.
		return [][]byte{event}
	}
	s.rememberEnvelope(top)
	changed, keep := false, false
	for _, choice := range choices {
		c, k := s.rewriteChoice(choice)
		changed = changed || c
		keep = keep || k
	}
	if !keep {
		return nil
	}
	if !changed {
		return [][]byte{event}
	}
	top["choices"] = mustEncode(choices)
	return [][]byte{mustEncode(top)}
}

// rewriteChoice rewrites one streamed choice in place. It reports whether
// the choice changed, and whether it still carries anything worth sending.
func (s *StreamRewriter) rewriteChoice(choice map[string]json.RawMessage) (changed, keep bool) {
	var index int
	_ = json.Unmarshal(choice["index"], &index)
	st := s.choices[index]
	if st == nil {
		st = &choiceState{}
		s.choices[index] = st
	}
	var delta map[string]json.RawMessage
	if err := json.Unmarshal(choice["delta"], &delta); err != nil || delta == nil {
		return false, true
	}
	finishing := !isNull(choice["finish_reason"])
	var c bool
	if s.mode == Inline {
		c = st.inline(delta)
	} else {
		c = st.field(delta, finishing)
	}
	if !c {
		return false, true
	}
	choice["delta"] = mustEncode(delta)
	return true, len(delta) > 0 || finishing || hasOtherThanText(choice)
}

// inline turns reasoning deltas into content deltas, opening <think> on the
// first and closing it on the first answer text or tool call after them.
func (st *choiceState) inline(delta map[string]json.RawMessage) bool {
	reasoning, hadField := takeReasoning(delta)
	content, _ := stringField(delta, "content")
	var text strings.Builder
	if reasoning != "" {
		if !st.open {
			text.WriteString(inlineOpen)
			st.open = true
		}
		text.WriteString(reasoning)
	}
	_, toolCalls := delta["tool_calls"]
	if st.open && (content != "" || toolCalls) {
		text.WriteString(inlineClose)
		st.open = false
	}
	if text.Len() == 0 {
		return hadField
	}
	text.WriteString(content)
	setString(delta, "content", text.String())
	return true
}

// field splits inline <think>…</think> content into reasoning_content and
// content, and renames vLLM's reasoning to reasoning_content.
func (st *choiceState) field(delta map[string]json.RawMessage, finishing bool) bool {
	changed := false
	var reasoning strings.Builder
	if r, had := takeReasoning(delta); had {
		changed = true
		reasoning.WriteString(r)
	}
	content, isString := stringField(delta, "content")
	if (!isString || content == "") && !(finishing && st.pending != "") {
		if reasoning.Len() > 0 {
			setString(delta, fieldReasoningContent, reasoning.String())
		}
		return changed
	}
	thinking, answer := st.splitText(st.pending+content, finishing)
	reasoning.WriteString(thinking)
	if answer != content || thinking != "" {
		changed = true
	}
	if !changed {
		return false
	}
	if reasoning.Len() > 0 {
		setString(delta, fieldReasoningContent, reasoning.String())
	}
	if answer != "" {
		setString(delta, "content", answer)
	} else if isString {
		delete(delta, "content")
	}
	return true
}

// splitText consumes text (held-back text first) and returns what is
// thinking and what is answer, keeping back a trailing partial tag unless
// the choice is finishing.
func (st *choiceState) splitText(text string, finishing bool) (thinking, answer string) {
	st.pending = ""
	var think, ans strings.Builder
	for text != "" {
		if st.trimLeadingNewlines {
			text = strings.TrimLeft(text, "\r\n")
			if text == "" {
				break
			}
			st.trimLeadingNewlines = false
		}
		switch st.phase {
		case phaseStart:
			trimmed := strings.TrimLeft(text, " \t\r\n")
			switch {
			case strings.HasPrefix(trimmed, openTag):
				st.phase = phaseThinking
				st.trimLeadingNewlines = true
				text = trimmed[len(openTag):]
			case strings.HasPrefix(openTag, trimmed) && !finishing:
				st.pending = text
				text = ""
			default:
				st.phase = phaseAnswer
			}
		case phaseThinking:
			before, after, found := strings.Cut(text, closeTag)
			if found {
				think.WriteString(strings.TrimRight(before, "\n"))
				st.phase = phaseAnswer
				st.trimLeadingNewlines = true
				text = after
				continue
			}
			keep := 0
			if !finishing {
				// The newline before </think> belongs to the tag, as the
				// non-streamed split trims it; hold it back with the tag.
				keep = partialSuffix(text, closeTag)
				for keep < len(text) && text[len(text)-keep-1] == '\n' {
					keep++
				}
			}
			think.WriteString(text[:len(text)-keep])
			st.pending = text[len(text)-keep:]
			text = ""
		case phaseAnswer:
			ans.WriteString(text)
			text = ""
		}
	}
	return think.String(), ans.String()
}

// partialSuffix is the length of the longest suffix of text that is a proper
// prefix of tag: the bytes that may be a tag cut in two by chunking.
func partialSuffix(text, tag string) int {
	for n := min(len(tag)-1, len(text)); n > 0; n-- {
		if strings.HasSuffix(text, tag[:n]) {
			return n
		}
	}
	return 0
}

// flushPending emits text still held back when the stream ends without a
// finish chunk, so no byte the engine sent is lost.
func (s *StreamRewriter) flushPending() [][]byte {
	var out [][]byte
	for index, st := range s.choices {
		if st.pending == "" {
			continue
		}
		key := "content"
		if st.phase == phaseThinking {
			key = fieldReasoningContent
		}
		delta := map[string]json.RawMessage{key: mustEncode(st.pending)}
		st.pending = ""
		chunk := map[string]json.RawMessage{}
		for k, v := range s.last {
			chunk[k] = v
		}
		chunk["choices"] = mustEncode([]map[string]json.RawMessage{{
			"index":         mustEncode(index),
			"delta":         mustEncode(delta),
			"finish_reason": json.RawMessage("null"),
		}})
		out = append(out, mustEncode(chunk))
	}
	return out
}

func (s *StreamRewriter) rememberEnvelope(top map[string]json.RawMessage) {
	s.last = map[string]json.RawMessage{}
	for _, k := range []string{"id", "object", "created", "model", "system_fingerprint"} {
		if v, ok := top[k]; ok {
			s.last[k] = v
		}
	}
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// hasOtherThanText reports whether a choice carries something besides its
// delta and bookkeeping (logprobs, for instance) that must still be sent.
func hasOtherThanText(choice map[string]json.RawMessage) bool {
	for k, v := range choice {
		switch k {
		case "index", "delta", "finish_reason":
			continue
		}
		if !isNull(v) {
			return true
		}
	}
	return false
}
