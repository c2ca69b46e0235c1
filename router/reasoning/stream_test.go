package reasoning

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// chunk builds one chat.completion.chunk payload with the given delta JSON.
func chunk(delta string, finish string) []byte {
	fr := "null"
	if finish != "" {
		fr = jsonString(finish)
	}
	return []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3-4b",` +
		`"choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + fr + `}]}`)
}

func contentChunk(s string) []byte   { return chunk(`{"content":`+jsonString(s)+`}`, "") }
func reasoningChunk(s string) []byte { return chunk(`{"reasoning_content":`+jsonString(s)+`}`, "") }
func vllmReasonChunk(s string) []byte {
	return chunk(`{"reasoning":`+jsonString(s)+`}`, "")
}

var (
	roleChunk   = chunk(`{"role":"assistant","content":""}`, "")
	finishChunk = chunk(`{}`, "stop")
	usageChunk  = []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3-4b","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":40,"total_tokens":60}}`)
	done        = []byte("[DONE]")
)

// assembled is what a client accumulates from a stream.
type assembled struct {
	content, reasoning string
	events             int
	sawVLLMField       bool
	done               bool
	finish             string
	usage              bool
}

func assemble(t *testing.T, events [][]byte) assembled {
	t.Helper()
	var a assembled
	for _, ev := range events {
		a.events++
		if string(ev) == "[DONE]" {
			a.done = true
			continue
		}
		var c struct {
			Choices []struct {
				Delta        map[string]any `json:"delta"`
				FinishReason *string        `json:"finish_reason"`
			} `json:"choices"`
			Usage any `json:"usage"`
		}
		if err := json.Unmarshal(ev, &c); err != nil {
			t.Fatalf("event is not JSON: %v: %s", err, ev)
		}
		if c.Usage != nil {
			a.usage = true
		}
		for _, ch := range c.Choices {
			s, _ := ch.Delta["content"].(string)
			a.content += s
			r, _ := ch.Delta["reasoning_content"].(string)
			a.reasoning += r
			if _, ok := ch.Delta["reasoning"]; ok {
				a.sawVLLMField = true
			}
			if ch.FinishReason != nil {
				a.finish = *ch.FinishReason
			}
		}
	}
	return a
}

func run(mode Mode, events ...[]byte) [][]byte {
	rw := NewStreamRewriter(mode)
	var out [][]byte
	for _, ev := range events {
		out = append(out, rw.Rewrite(ev)...)
	}
	return out
}

func TestStreamRewriter(t *testing.T) {
	llama := [][]byte{roleChunk, reasoningChunk("Okay, 17 times 23"), reasoningChunk(": 17×20 is 340, 17×3 is 51, so 391."),
		contentChunk("17 × 23"), contentChunk(" = 391."), finishChunk, usageChunk, done}
	vllmParser := [][]byte{roleChunk, vllmReasonChunk("Okay, 17 times 23"), vllmReasonChunk(": 17×20 is 340, 17×3 is 51, so 391."),
		contentChunk("17 × 23"), contentChunk(" = 391."), finishChunk, usageChunk, done}
	vllmInline := [][]byte{roleChunk, contentChunk("<think>"), contentChunk("\n"), contentChunk("Okay, 17 times 23"),
		contentChunk(": 17×20 is 340, 17×3 is 51, so 391."), contentChunk("\n</think>\n\n"), contentChunk("17 × 23"),
		contentChunk(" = 391."), finishChunk, usageChunk, done}
	plain := [][]byte{roleChunk, contentChunk("Hello"), contentChunk(" there."), finishChunk, usageChunk, done}
	toolAfterThinking := [][]byte{roleChunk, reasoningChunk("I should call the tool."),
		chunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]}`, ""),
		chunk(`{}`, "tool_calls"), done}

	tests := []struct {
		name          string
		mode          Mode
		events        [][]byte
		wantContent   string
		wantReasoning string
		wantEvents    int // -1: don't check
	}{
		{"inline from llama-server", Inline, llama, inlined, "", len(llama)},
		{"inline from vLLM parser", Inline, vllmParser, inlined, "", len(vllmParser)},
		{"inline from vLLM inline is unchanged", Inline, vllmInline, inlined, "", len(vllmInline)},
		{"inline plain", Inline, plain, "Hello there.", "", len(plain)},
		{"inline closes think before tool call", Inline, toolAfterThinking, "<think>\nI should call the tool.\n</think>\n\n", "", len(toolAfterThinking)},
		{"field from vLLM inline", Field, vllmInline, answer, thinking, -1},
		{"field from vLLM parser", Field, vllmParser, answer, thinking, len(vllmParser)},
		{"field from llama-server", Field, llama, answer, thinking, len(llama)},
		{"field plain", Field, plain, "Hello there.", "", len(plain)},
		{"off", Off, vllmParser, answer, "", len(vllmParser)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := run(tt.mode, tt.events...)
			a := assemble(t, out)
			if a.content != tt.wantContent {
				t.Errorf("content = %q, want %q", a.content, tt.wantContent)
			}
			if a.reasoning != tt.wantReasoning {
				t.Errorf("reasoning_content = %q, want %q", a.reasoning, tt.wantReasoning)
			}
			if tt.mode != Off && a.sawVLLMField {
				t.Errorf("vLLM's reasoning field survived normalisation")
			}
			if !a.done || a.usage != hasUsage(tt.events) {
				t.Errorf("stream lost its usage chunk (%v) or [DONE] (%v)", a.usage, a.done)
			}
			if tt.wantEvents >= 0 && len(out) != tt.wantEvents {
				t.Errorf("got %d events, want %d (one out per event in)", len(out), tt.wantEvents)
			}
		})
	}
}

func hasUsage(events [][]byte) bool {
	for _, ev := range events {
		if string(ev) == string(usageChunk) {
			return true
		}
	}
	return false
}

// TestStreamFieldSplitAnywhere cuts the inline text at every pair of
// positions, so the tags arrive split across chunks in every possible way.
func TestStreamFieldSplitAnywhere(t *testing.T) {
	text := "<think>\nhm, ok\n</think>\n\nYes."
	for i := 1; i < len(text); i++ {
		for j := i; j < len(text); j++ {
			parts := []string{text[:i], text[i:j], text[j:]}
			events := [][]byte{roleChunk}
			for _, p := range parts {
				if p != "" {
					events = append(events, contentChunk(p))
				}
			}
			events = append(events, finishChunk, done)
			a := assemble(t, run(Field, events...))
			if a.reasoning != "hm, ok" || a.content != "Yes." {
				t.Fatalf("split %q: reasoning %q content %q", parts, a.reasoning, a.content)
			}
		}
	}
}

func TestStreamFieldHeldBackText(t *testing.T) {
	tests := []struct {
		name          string
		events        [][]byte
		wantContent   string
		wantReasoning string
	}{
		{
			name:        "a lone '<' that is not a tag is released",
			events:      [][]byte{roleChunk, contentChunk("<"), contentChunk("3 is less than 4"), finishChunk, done},
			wantContent: "<3 is less than 4",
		},
		{
			name:        "a partial tag at the finish chunk is flushed as text",
			events:      [][]byte{roleChunk, contentChunk("<thi"), finishChunk, done},
			wantContent: "<thi",
		},
		{
			name:          "stream cut before a finish chunk flushes at [DONE]",
			events:        [][]byte{roleChunk, contentChunk("<think>abc</thi"), done},
			wantReasoning: "abc</thi",
		},
		{
			name:        "think later in content is not reasoning",
			events:      [][]byte{roleChunk, contentChunk("Use <think> tags"), finishChunk, done},
			wantContent: "Use <think> tags",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := assemble(t, run(Field, tt.events...))
			if a.content != tt.wantContent || a.reasoning != tt.wantReasoning {
				t.Errorf("content %q reasoning %q, want %q and %q", a.content, a.reasoning, tt.wantContent, tt.wantReasoning)
			}
		})
	}
}

func TestStreamPassThrough(t *testing.T) {
	tests := []string{
		`{"error":{"message":"boom","type":"server_error","code":500}}`,
		`not json at all`,
		`{"choices":[]}`,
	}
	for _, mode := range []Mode{Inline, Field} {
		for _, ev := range tests {
			t.Run(fmt.Sprintf("%s/%s", mode, ev), func(t *testing.T) {
				out := NewStreamRewriter(mode).Rewrite([]byte(ev))
				if len(out) != 1 || string(out[0]) != ev {
					t.Errorf("event changed: %q", out)
				}
			})
		}
	}
}

// TestStreamKeepsOnlyTagState shows the held-back state never exceeds a tag.
func TestStreamKeepsOnlyTagState(t *testing.T) {
	rw := NewStreamRewriter(Field)
	rw.Rewrite(roleChunk)
	rw.Rewrite(contentChunk("<think>" + strings.Repeat("long thought ", 200) + "</thi"))
	if p := rw.choices[0].pending; p != "</thi" {
		t.Errorf("held back %q, want only the partial tag", p)
	}
}
