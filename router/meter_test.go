package router

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMeterSplitReads: the meter counts the same events, usage and first
// token however the stream is cut into reads, including lines cut in the
// middle, a line too long to keep, and CRLF line ends.
func TestMeterSplitReads(t *testing.T) {
	long := `data: {"choices":[{"delta":{"content":"` + strings.Repeat("x", maxMeterLine+10) + `"}}]}` + "\n\n"
	stream := ": keepalive\n\n" +
		`data: {"choices":[{"delta":{"role":"assistant"}}]}` + "\n\n" +
		sseEvent("a") +
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\r\n\r\n" +
		long +
		sseEvent("c") +
		`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}` + "\n\n" +
		"data: [DONE]\n\n"
	base := time.Unix(1000, 0)
	for _, size := range []int{1, 2, 7, 64, 4096, len(stream)} {
		m := newMeter(true)
		for i, k := 0, 0; i < len(stream); i, k = i+size, k+1 {
			m.feed([]byte(stream[i:min(i+size, len(stream))]), base.Add(time.Duration(k)*time.Millisecond))
		}
		// The role chunk, a, b, the long line (too long to read, but its
		// start says it is a data event), c; the usage chunk carries no
		// token.
		if m.events != 5 {
			t.Errorf("reads of %d bytes: %d events, want 5", size, m.events)
		}
		if got := m.outputTokens(); got != 7 {
			t.Errorf("reads of %d bytes: %d output tokens, want 7 from usage", size, got)
		}
		if m.firstToken.IsZero() || !m.firstToken.After(m.firstData) && size < 64 {
			t.Errorf("reads of %d bytes: first token at %v, first data at %v: the role chunk is no token", size, m.firstToken, m.firstData)
		}
	}
}

// BenchmarkMeterFeed meters a stream of vLLM-shaped chunks, one read per
// event as an engine flushes them.
func BenchmarkMeterFeed(b *testing.B) {
	event := []byte(`data: {"id":"chatcmpl-0b5a2c","object":"chat.completion.chunk","created":1764540000,"model":"Qwen/Qwen3-4B","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	usage := []byte(`data: {"id":"chatcmpl-0b5a2c","object":"chat.completion.chunk","created":1764540000,"model":"Qwen/Qwen3-4B","choices":[],"usage":{"prompt_tokens":31,"total_tokens":159,"completion_tokens":128}}` + "\n\ndata: [DONE]\n\n")
	now := time.Now()
	b.SetBytes(int64(128*len(event) + len(usage)))
	for b.Loop() {
		m := newMeter(true)
		for range 128 {
			m.feed(event, now)
		}
		m.feed(usage, now)
		if m.outputTokens() != 128 || m.events != 128 {
			b.Fatalf("%d tokens, %d events", m.outputTokens(), m.events)
		}
	}
}

// BenchmarkMeterFeedLlamaServer meters a stream shaped as llama-server's
// (and the instant sim's): 128 token events with finish_reason,
// reasoning_content and system_fingerprint, then the timings chunk, read
// 2 KiB at a time as the router reads a fast engine.
func BenchmarkMeterFeedLlamaServer(b *testing.B) {
	var s strings.Builder
	const tail = `"created":1796160612,"id":"chatcmpl-y5q8jFuq06bcOFCfup1pGppwX459QcrT","model":"qwen3-4b","system_fingerprint":"b6700-de3ff81","object":"chat.completion.chunk"`
	s.WriteString(`data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],` + tail + "}\n\n")
	for i := range 128 {
		s.WriteString(`data: {"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":" tok` + strconv.Itoa(i) + `"}}],` + tail + "}\n\n")
	}
	s.WriteString(`data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],` + tail + `,"timings":{"cache_n":0,"prompt_n":1,"prompt_ms":0.1,"predicted_n":128,"predicted_ms":1.087}}` + "\n\ndata: [DONE]\n\n")
	stream := []byte(s.String())
	now := time.Now()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		m := newMeter(true)
		for i := 0; i < len(stream); i += 2048 {
			m.feed(stream[i:min(i+2048, len(stream))], now)
		}
		if m.events != 130 || m.cache.computedN != 1 {
			b.Fatalf("%d events, prompt_n %d", m.events, m.cache.computedN)
		}
	}
}

// BenchmarkMeterTail reads what the end of a non-streamed llama-server
// answer says (usage, timings, prompt time), as a request's end asks it.
func BenchmarkMeterTail(b *testing.B) {
	body := []byte(`{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"` + strings.Repeat("word ", 300) + `"}}],` +
		`"created":1796160612,"model":"qwen3-4b","system_fingerprint":"b6700-de3ff81","object":"chat.completion",` +
		`"usage":{"completion_tokens":8,"prompt_tokens":3,"total_tokens":11},"id":"chatcmpl-x",` +
		`"timings":{"cache_n":0,"prompt_n":3,"prompt_ms":0.5,"prompt_per_token_ms":0.1,"prompt_per_second":100,"predicted_n":8,"predicted_ms":1.0,"predicted_per_token_ms":0.1,"predicted_per_second":1000}}`)
	now := time.Now()
	for b.Loop() {
		m := newMeter(false)
		m.feed(body, now)
		_, ok := promptTime(m.tail)
		if m.outputTokens() != 8 || m.promptCache().computedN != 3 || !ok {
			b.Fatalf("%d tokens, %+v", m.outputTokens(), m.promptCache())
		}
	}
}

// TestMeterKeys: the one pass finds the keys the meter reads wherever they
// sit, and not a key's name inside a string value (where its quotes are
// escaped).
func TestMeterKeys(t *testing.T) {
	for _, tc := range []struct {
		name                                string
		payload                             string
		usage, timings, noChoices, apiUsage bool
	}{
		{name: "a token", payload: `{"id":"x","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`},
		{name: "vLLM's usage chunk", payload: `{"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}`, usage: true, noChoices: true},
		{name: "llama-server's last chunk", payload: `{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"usage":{"completion_tokens":7},"timings":{"prompt_n":3}}`, usage: true, timings: true},
		{name: "timings alone", payload: `{"choices":[],"timings":{"prompt_ms":1.5}}`, timings: true, noChoices: true},
		{name: "names inside a token", payload: `{"choices":[{"delta":{"content":"\"completion_tokens\":1 \"timings\": \"choices\":[]"}}]}`},
		{name: "a key at the very end", payload: `"timings":`, timings: true},
		{name: "a lone quote", payload: `"`},
		{name: "Anthropic's message_delta", payload: `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}`, apiUsage: true},
		{name: "Anthropic's text delta", payload: `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\"output_tokens\":1"}}`},
		{name: "prompt tokens alone", payload: `{"usage":{"prompt_tokens":3}}`},
		{name: "a tail before the key", payload: `{"choices":[{"delta":{"content":"[]"}}],"x":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`, usage: true},
		{name: "a key at the very start", payload: `"completion_tokens":1`, usage: true},
		{name: "both usages, output first", payload: `{"usage":{"output_tokens":2,"total_tokens":3,"completion_tokens":2}}`, usage: true, apiUsage: true},
		{name: "other token counts only", payload: `{"usage":{"input_tokens":2,"total_tokens":3,"reasoning_tokens":1}}`},
		{name: "a key's tail without its head", payload: `{"x_tokens":1,"completion":"output_tokens"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, tm, nc, au := meterKeys([]byte(tc.payload))
			if u != tc.usage || tm != tc.timings || nc != tc.noChoices || au != tc.apiUsage {
				t.Errorf("usage %v timings %v no choices %v API usage %v; want %v %v %v %v", u, tm, nc, au, tc.usage, tc.timings, tc.noChoices, tc.apiUsage)
			}
		})
	}
}

// TestLastIndexIsBytesLastIndex: the forward search finds what
// bytes.LastIndex finds, overlaps and the edges included.
func TestLastIndexIsBytesLastIndex(t *testing.T) {
	for _, tc := range []struct{ p, sep string }{
		{"", ""}, {"abc", ""}, {"", "a"}, {"aaa", "aa"}, {"aaaa", "a"},
		{`{"usage":{"prompt_tokens":3,"completion_tokens":7}}`, `"completion_tokens":`},
		{`"prompt_tokens":1 ... "prompt_tokens":2`, `"prompt_tokens":`},
		{`"prompt_tokens"`, `"prompt_tokens":`},
		{"xyz", "xyz"}, {"xyzxyz", "xyz"}, {"xy", "xyz"},
		// Found from the '_' on: the part before it is checked, at the
		// very start too, and a tail with another head is not it.
		{`"total_tokens":1,"prompt_tokens":2,"x_tokens":3`, `"prompt_tokens":`},
		{`_tokens":`, `"prompt_tokens":`}, {`ompt_tokens":1`, `"prompt_tokens":`},
		{`a_b_c a_b_c_`, `a_b_c`}, {`__`, `_`}, {`x__y__`, `__`},
	} {
		if got, want := lastIndex([]byte(tc.p), []byte(tc.sep)), bytes.LastIndex([]byte(tc.p), []byte(tc.sep)); got != want {
			t.Errorf("lastIndex(%q, %q) = %d, want %d", tc.p, tc.sep, got, want)
		}
	}
}

// TestMeterRereadsTheTailAfterMoreBytes: the usage of a non-streamed
// answer is read once, and again when more of the answer came since.
func TestMeterRereadsTheTailAfterMoreBytes(t *testing.T) {
	m := newMeter(false)
	now := time.Now()
	m.feed([]byte(`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7`), now)
	if got := m.outputTokens(); got != 7 {
		t.Fatalf("outputTokens = %d, want 7", got)
	}
	m.feed([]byte(`0,"prompt_tokens_details":{"cached_tokens":2}}}`), now)
	if got := m.outputTokens(); got != 70 {
		t.Errorf("after the rest of the answer outputTokens = %d, want 70", got)
	}
	if c := m.promptCache(); c.promptTokens != 3 || c.cached != 2 {
		t.Errorf("promptCache = %+v, want 3 prompt tokens, 2 cached", c)
	}
}
