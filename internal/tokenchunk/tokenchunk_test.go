package tokenchunk

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestCarries: which whole events carry a token, in every shape the router
// and the bench meet.
func TestCarries(t *testing.T) {
	for _, tc := range []struct {
		name, payload string
		want          bool
	}{
		{"content", `{"choices":[{"index":0,"delta":{"content":"Hi"}}]}`, true},
		{"reasoning_content (llama-server)", `{"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}`, true},
		{"reasoning (vLLM)", `{"choices":[{"index":0,"delta":{"reasoning":"hm"}}]}`, true},
		{"tool call", `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":""}}]}}]}`, true},
		{"completion text", `{"choices":[{"index":0,"text":"Hi"}]}`, true},
		{"second choice carries it", `{"choices":[{"index":0,"delta":{}},{"index":1,"delta":{"content":"x"}}]}`, true},
		{"a 50 KB tool call", `{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"` + strings.Repeat("x", 50<<10) + `"}}]}}]}`, true},
		{"anthropic text delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`, true},
		{"responses text delta", `{"type":"response.output_text.delta","delta":"Hi","sequence_number":3}`, true},
		{"responses reasoning delta", `{"type":"response.reasoning_text.delta","delta":"hm"}`, true},
		{"responses tool arguments delta", `{"type":"response.function_call_arguments.delta","delta":"{"}`, true},
		{"role only", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, false},
		{"empty delta", `{"choices":[{"index":0,"delta":{}}]}`, false},
		{"empty tool calls", `{"choices":[{"index":0,"delta":{"tool_calls":[]}}]}`, false},
		{"usage only", `{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":5}}`, false},
		{"finish reason only", `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, false},
		{"anthropic message_start", `{"type":"message_start","message":{"content":[],"role":"assistant"}}`, false},
		{"anthropic block start with text", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`, false},
		{"responses created echoing text", `{"type":"response.created","response":{"instructions":"say \"content\""}}`, false},
		{"content key inside another string", `{"choices":[{"delta":{"role":"assistant"},"note":"\"content\":\"x\""}]}`, false},
		{"not JSON", `{"choices":[{"delta":{"content":"Hi"`, false},
		{"no token key at all", `{"id":"x","object":"chat.completion.chunk"}`, false},
	} {
		if got := Carries([]byte(tc.payload)); got != tc.want {
			t.Errorf("%s: Carries = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestCarriesStart: what the start of a long data line says, cut anywhere
// past the first key.
func TestCarriesStart(t *testing.T) {
	long := strings.Repeat("y", 100)
	for _, tc := range []struct {
		name, event, payload string
		want                 bool
	}{
		{"content", "", `{"id":"c","choices":[{"index":0,"delta":{"content":"` + long, true},
		{"content after an empty role", "", `{"choices":[{"index":0,"delta":{"role":"assistant","content":"` + long, true},
		{"reasoning_content", "", `{"choices":[{"delta":{"reasoning_content":"` + long, true},
		{"reasoning", "", `{"choices":[{"delta":{"reasoning":"` + long, true},
		{"tool call", "", `{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"` + long, true},
		{"completion text", "", `{"choices":[{"index":0,"text":"` + long, true},
		{"empty content, long logprobs", "", `{"choices":[{"delta":{"content":""},"logprobs":{"content":[{"token":"` + long, false},
		{"empty tool calls", "", `{"choices":[{"delta":{"tool_calls":[],"x":"` + long, false},
		{"content key inside another string", "", `{"choices":[{"delta":{"role":"assistant"},"note":"\"content\":\"` + long, false},
		{"api token type first", "", `{"type":"content_block_delta","delta":{"text":"` + long, true},
		{"api other type first", "", `{"type":"response.created","response":{"instructions":"` + long, false},
		{"responses echo, type last, no event line", "", `{"response":{"instructions":"` + long, false},
		{"event names a token", "response.function_call_arguments.delta", `{"delta":"` + long, true},
		{"event names no token", "response.created", `{"response":{"text":"` + long, false},
		{"not JSON", "", `<html>` + long, false},
	} {
		if got := CarriesStart([]byte(tc.event), []byte(tc.payload)); got != tc.want {
			t.Errorf("%s: CarriesStart = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestStartAgreesWithWhole: a whole event read as a start (as if cut after
// its last byte) says what Carries says, for the chat and completion shapes
// CarriesStart reads as JSON, so a stream's long first line is judged by
// the same rule as its short ones.
func TestStartAgreesWithWhole(t *testing.T) {
	for _, p := range []string{
		`{"choices":[{"index":0,"delta":{"content":"Hi"}}]}`,
		`{"choices":[{"index":0,"delta":{"reasoning":"hm"}}]}`,
		`{"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}`,
		`{"choices":[{"index":0,"text":"Hi"}]}`,
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[]}}]}`,
		`{"choices":[],"usage":{"completion_tokens":5}}`,
		`{"type":"content_block_delta","delta":{"text":"Hi"}}`,
		`{"type":"message_start","message":{}}`,
	} {
		if whole, start := Carries([]byte(p)), CarriesStart(nil, []byte(p)); whole != start {
			t.Errorf("%s: Carries %v, CarriesStart %v", p, whole, start)
		}
	}
}

// decoded is Carries as it was before the walk: the token keys looked for,
// then json.Unmarshal into a Chunk. The walk must answer exactly as it.
func decoded(payload []byte) bool {
	if !slices.ContainsFunc(tokenKeys, func(k []byte) bool { return bytes.Contains(payload, k) }) {
		return false
	}
	var c Chunk
	if json.Unmarshal(payload, &c) != nil {
		return false
	}
	return c.CarriesToken()
}

// carriesSeeds are payloads where a walk could part from the decoder:
// keys in other cases, twice, escaped or not ASCII; values of the wrong
// type; nulls; whitespace; nesting.
var carriesSeeds = []string{
	`{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}],"created":1,"id":"c","model":"m","object":"chat.completion.chunk"}`,
	`{"choices":[{"index":0,"delta":{"reasoning_content":"Okay,"}}],"created":1}`,
	`{"Choices":[{"Delta":{"CONTENT":"x"}}]}`,
	`{"choices":[{"delta":{"content":"x","content":""}}]}`,
	`{"choices":[{"delta":{"content":"x","Content":""}}]}`,
	`{"choices":[{"delta":{"content":""}}],"choices":[{"delta":{"content":"x"}}]}`,
	`{"choices":[{"delta":{"content":"x"}}],"choices":[{"delta":{}}]}`,
	`{"choices":[{"delta":{"content":"x"},"delta":{"role":"a"}}]}`,
	`{"choices":[{"delta":{"\u0063ontent":"x"}}]}`,
	`{"choiceſ":[{"delta":{"content":"x"}}]}`,
	`{"choices":[{"delta":{"content":5}}]}`,
	`{"choices":[{"delta":{"content":"x"}},{"text":5}]}`,
	`{"choices":[{"delta":"x"}]}`,
	`{"choices":{"delta":{"content":"x"}}}`,
	`{"choices":[null,{"delta":{"content":"x"}}]}`,
	`{"choices":[1]}`,
	`{"choices":null,"type":null}`,
	`{"type":5,"choices":[{"delta":{"content":"x"}}]}`,
	`{"type":"content_block_delta","choices":[{"text":[]}]}`,
	`{"type":"content_block_delta","choices":[{"text":"x"}]}`,
	`{"type":"content_block_\u0064elta"}`,
	`{"type":"","choices":[{"text":"x"}]}`,
	`{"choices":[{"delta":{"tool_calls":[null]}}]}`,
	`{"choices":[{"delta":{"tool_calls":[ ]}}]}`,
	`{"choices":[{"delta":{"tool_calls":{}}}]}`,
	`{"choices":[{"delta":{"tool_calls":"x"}}]}`,
	` { "choices" : [ { "delta" : { "content" : "\"" } } ] } `,
	`{"choices":[{"delta":{"content":"\u0000"}}]}`,
	`{"x":{"choices":[{"delta":{"content":"x"}}]},"choices":[]}`,
	`{"x":["{\"content\":\"x\"}",{"a":[1,2,{"b":"]}"}]}],"choices":[{"delta":{"content":""}}]}`,
	`[{"choices":[{"delta":{"content":"x"}}]}]`,
	`"content"`,
	`null`,
	`{"choices":[{"delta":{"content":"x"}}]} x`,
	`{"choices":[{"delta":{"content":true}}]}`,
	`{"choices":[{"delta":{"reasoning":"x","reasoning_content":5}}]}`,
}

// TestCarriesAsDecoded: the walk answers as decoding into a Chunk does,
// on the seeds and on every case of TestCarries.
func TestCarriesAsDecoded(t *testing.T) {
	for _, p := range carriesSeeds {
		if got, want := Carries([]byte(p)), decoded([]byte(p)); got != want {
			t.Errorf("Carries(%s) = %v, decoding says %v", p, got, want)
		}
	}
}

// FuzzCarries looks for a payload where the walk and the decoder part.
func FuzzCarries(f *testing.F) {
	for _, p := range carriesSeeds {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if got, want := Carries([]byte(p)), decoded([]byte(p)); got != want {
			t.Errorf("Carries(%q) = %v, decoding says %v", p, got, want)
		}
	})
}

func BenchmarkCarries(b *testing.B) {
	role := []byte(carriesSeeds[0])
	tok := []byte(carriesSeeds[1])
	b.ReportAllocs()
	for b.Loop() {
		Carries(role)
		Carries(tok)
	}
}

func BenchmarkCarriesDecoded(b *testing.B) {
	role := []byte(carriesSeeds[0])
	tok := []byte(carriesSeeds[1])
	b.ReportAllocs()
	for b.Loop() {
		decoded(role)
		decoded(tok)
	}
}

// TestCarriesAllocatesNothing: the router asks Carries of every event until
// the first token; a chunk is read where it lies, not decoded into one
// (21 allocations a role chunk and a token before the walk).
func TestCarriesAllocatesNothing(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector allocates where a plain build does not")
	}
	role, tok := []byte(carriesSeeds[0]), []byte(carriesSeeds[1])
	if n := testing.AllocsPerRun(100, func() { Carries(role); Carries(tok) }); n != 0 {
		t.Errorf("Carries allocates %v times a role chunk and a token, want 0", n)
	}
}
