// Package reasoning rewrites chat-completion responses so that every worker of
// a model puts a reasoning model's thinking in the same place, whatever engine
// produced it.
//
// Engines disagree by default (see the first seed): vLLM without a reasoning
// parser leaves "<think>…</think>" inline in content; vLLM with a parser puts
// it in message.reasoning (older builds: reasoning_content); llama-server puts
// it in reasoning_content and leaves content empty unless started with
// --reasoning-format none. A client that reads content then gets an answer
// from one worker and an empty string from another.
//
// Two target shapes are offered, opt-in per model:
//
//   - Inline: thinking goes back into content as "<think>\n…\n</think>\n\n"
//     followed by the answer, as vLLM without a parser and llama-server with
//     --reasoning-format none return it. Every client sees the same text.
//   - Field: thinking goes into reasoning_content (the DeepSeek convention,
//     which llama-server and go-openai use), the answer alone into content.
//     vLLM's newer "reasoning" field is renamed to reasoning_content.
//
// Non-streamed bodies go through RewriteJSON. Streams go through a
// StreamRewriter, one SSE data payload at a time, with no buffering beyond
// the current event except the few bytes of a "<think>"/"</think>" tag split
// across chunks. Anything the rewriter does not understand (errors, other
// endpoints, malformed JSON) passes through untouched, so normalisation can
// never break a response that would otherwise have reached the client.
package reasoning

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Mode is the shape a model's responses are normalised to.
type Mode string

const (
	// Off leaves responses exactly as the engine sent them.
	Off Mode = ""
	// Inline puts thinking in content between <think> tags.
	Inline Mode = "inline"
	// Field puts thinking in reasoning_content and the answer alone in content.
	Field Mode = "field"
)

// ParseMode reads a model's `reasoning:` setting. The empty string is Off.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.TrimSpace(strings.ToLower(s))); m {
	case Off, Inline, Field:
		return m, nil
	}
	return Off, fmt.Errorf("reasoning normalisation %q is not known: use \"inline\" (thinking inside <think> in content), \"field\" (thinking in reasoning_content) or leave it empty to pass responses through", s)
}

const (
	openTag  = "<think>"
	closeTag = "</think>"
	// inlineOpen and inlineClose are what Qwen3-style templates emit around
	// the thinking when it stays in content, so an Inline rewrite of a
	// llama-server response is character-for-character vLLM's inline text.
	inlineOpen  = openTag + "\n"
	inlineClose = "\n" + closeTag + "\n\n"

	fieldReasoningContent = "reasoning_content" // llama-server, DeepSeek, go-openai
	fieldReasoning        = "reasoning"         // vLLM ≥ late 2025
)

// RewriteJSON rewrites a non-streamed chat completion body into mode. Bodies
// that are not a chat completion with choices (errors, embeddings) come back
// unchanged; a body that is not JSON at all is an error and the caller should
// pass the original through.
func RewriteJSON(body []byte, mode Mode) ([]byte, error) {
	if mode == Off {
		return body, nil
	}
	if mode != Inline && mode != Field {
		return nil, fmt.Errorf("rewrite response: unknown reasoning mode %q", mode)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("rewrite response: body is not a JSON object (%w); pass it through unchanged", err)
	}
	choices, ok := decodeChoices(top["choices"])
	if !ok {
		return body, nil
	}
	changed := false
	for _, choice := range choices {
		var msg map[string]json.RawMessage
		if err := json.Unmarshal(choice["message"], &msg); err != nil || msg == nil {
			continue
		}
		var finish string
		_ = json.Unmarshal(choice["finish_reason"], &finish)
		if rewriteMessage(msg, mode, finish == "length") {
			choice["message"] = mustEncode(msg)
			changed = true
		}
	}
	if !changed {
		return body, nil
	}
	top["choices"] = mustEncode(choices)
	return mustEncode(top), nil
}

// rewriteMessage normalises one non-streamed message in place and reports
// whether it changed. A thought cut off by max_tokens (no answer, finish
// "length") stays unclosed, as the stream rewriter and vLLM leave it.
func rewriteMessage(msg map[string]json.RawMessage, mode Mode, cutOff bool) bool {
	reasoning, hadField := takeReasoning(msg)
	content, _ := stringField(msg, "content")
	switch mode {
	case Inline:
		if reasoning == "" {
			return hadField
		}
		if cutOff && content == "" {
			setString(msg, "content", inlineOpen+reasoning)
			return true
		}
		setString(msg, "content", inlineOpen+reasoning+inlineClose+content)
		return true
	case Field:
		if reasoning == "" {
			if r, answer, ok := splitInline(content); ok {
				reasoning, content = r, answer
				setString(msg, "content", content)
			}
		}
		if reasoning != "" {
			setString(msg, fieldReasoningContent, reasoning)
			return true
		}
		return hadField
	}
	return false
}

// takeReasoning removes both reasoning fields from m and returns the text,
// preferring reasoning_content when an engine in transition sent both.
func takeReasoning(m map[string]json.RawMessage) (string, bool) {
	rc, hasRC := stringField(m, fieldReasoningContent)
	r, hasR := stringField(m, fieldReasoning)
	_, rawRC := m[fieldReasoningContent]
	_, rawR := m[fieldReasoning]
	delete(m, fieldReasoningContent)
	delete(m, fieldReasoning)
	switch {
	case hasRC && rc != "":
		return rc, true
	case hasR && r != "":
		return r, true
	}
	return "", rawRC || rawR
}

// splitInline splits content that starts with a <think> block into the
// thinking and the answer, trimming the newlines the template puts around
// the tags. A block never closed (cut by max_tokens) is all thinking.
func splitInline(content string) (thinking, answer string, ok bool) {
	rest, found := strings.CutPrefix(strings.TrimLeft(content, " \t\r\n"), openTag)
	if !found {
		return "", content, false
	}
	thinking, answer, _ = strings.Cut(rest, closeTag)
	return strings.Trim(thinking, "\n"), strings.TrimLeft(answer, "\n"), true
}

func decodeChoices(raw json.RawMessage) ([]map[string]json.RawMessage, bool) {
	if len(raw) == 0 {
		return nil, false
	}
	var choices []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &choices); err != nil {
		return nil, false
	}
	return choices, true
}

// stringField reads m[key] as a string; null and absent are ("", false).
func stringField(m map[string]json.RawMessage, key string) (string, bool) {
	raw, ok := m[key]
	if !ok {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

func setString(m map[string]json.RawMessage, key, value string) {
	m[key] = mustEncode(value)
}

// mustEncode marshals without HTML escaping, so "<think>" stays readable on
// the wire as engines send it. The values are maps, slices and strings built
// from already-valid JSON, which cannot fail to encode.
func mustEncode(v any) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(fmt.Sprintf("reasoning: encoding decoded JSON failed: %v", err))
	}
	return bytes.TrimRight(buf.Bytes(), "\n")
}
