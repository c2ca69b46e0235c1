package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"fleet"
	"fleet/internal/syncbuf"
)

const mathPrompt = "What is 17 multiplied by 23?"

// startSim runs a sim built from `fleet sim` args in-process.
func startSim(t *testing.T, args string) (*Server, *httptest.Server) {
	t.Helper()
	opts, err := ParseArgs(strings.Fields(args))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return srv, ts
}

func post(t *testing.T, url string, body any) (int, map[string]any) {
	t.Helper()
	var raw []byte
	if s, ok := body.(string); ok {
		raw = []byte(s)
	} else {
		raw, _ = json.Marshal(body)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("status %d, body not JSON: %q", resp.StatusCode, data)
	}
	return resp.StatusCode, out
}

// postStream posts body as a streaming request and checks that an event
// stream answers.
func postStream(t *testing.T, url string, body map[string]any) *http.Response {
	t.Helper()
	body["stream"] = true
	raw, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body.Close()
		t.Fatalf("%s: status %d content-type %q", url, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp
}

// stream posts a streaming request and returns every data: payload but [DONE].
func stream(t *testing.T, url string, body map[string]any) (chunks []map[string]any, done bool) {
	t.Helper()
	resp := postStream(t, url, body)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		payload, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		if payload == "[DONE]" {
			done = true
			continue
		}
		if done {
			t.Fatal("data after [DONE]")
		}
		var c map[string]any
		if err := json.Unmarshal([]byte(payload), &c); err != nil {
			t.Fatalf("chunk not JSON: %q", payload)
		}
		chunks = append(chunks, c)
	}
	return chunks, done
}

func chat(prompt string, extra map[string]any) map[string]any {
	b := map[string]any{"model": "qwen3-4b", "messages": []any{map[string]any{"role": "user", "content": prompt}}}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func message(t *testing.T, resp map[string]any) map[string]any {
	t.Helper()
	choices, _ := resp["choices"].([]any)
	if len(choices) != 1 {
		t.Fatalf("want one choice, got %v", resp)
	}
	return choices[0].(map[string]any)["message"].(map[string]any)
}

// joinDeltas concatenates a streamed field over all chunks.
func joinDeltas(chunks []map[string]any, key string) (string, bool) {
	var b strings.Builder
	seen := false
	for _, c := range chunks {
		choices, _ := c["choices"].([]any)
		for _, ch := range choices {
			d, _ := ch.(map[string]any)["delta"].(map[string]any)
			if v, ok := d[key].(string); ok {
				b.WriteString(v)
				seen = true
			}
		}
	}
	return b.String(), seen
}

func TestReasoningPlacement(t *testing.T) {
	const llama = "--mimic llamacpp --profile instant -- -a qwen3-4b"
	const vllm = "--mimic vllm --profile instant -- serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3-4b"
	tests := []struct {
		name        string
		args        string
		noThinking  bool
		inline      bool   // content starts with <think>
		field       string // reasoning field expected, "" for none
		absentField string // a field that must not carry text
	}{
		{name: "llama default puts thoughts in reasoning_content", args: llama, field: "reasoning_content"},
		{name: "llama auto", args: llama + " --reasoning-format auto", field: "reasoning_content"},
		{name: "llama deepseek", args: llama + " --reasoning-format deepseek", field: "reasoning_content"},
		{name: "llama none keeps <think> inline", args: llama + " --reasoning-format none", inline: true, absentField: "reasoning_content"},
		{name: "llama deepseek-legacy does both", args: llama + " --reasoning-format deepseek-legacy", inline: true, field: "reasoning_content"},
		{name: "vllm without parser keeps <think> inline", args: vllm, inline: true, absentField: "reasoning"},
		{name: "vllm with parser uses reasoning", args: vllm + " --reasoning-parser qwen3", field: "reasoning", absentField: "reasoning_content"},
		{name: "enable_thinking false: no thoughts (llama)", args: llama, noThinking: true, absentField: "reasoning_content"},
		{name: "enable_thinking false: no thoughts (vllm parser)", args: vllm + " --reasoning-parser qwen3", noThinking: true, absentField: "reasoning"},
		{name: "server-wide kwargs turn thinking off", args: llama + ` --chat-template-kwargs {"enable_thinking":false}`, absentField: "reasoning_content"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ts := startSim(t, tt.args)
			extra := map[string]any{}
			if tt.noThinking {
				extra["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
			}
			code, resp := post(t, ts.URL+"/v1/chat/completions", chat(mathPrompt, extra))
			if code != 200 {
				t.Fatalf("status %d: %v", code, resp)
			}
			msg := message(t, resp)
			content, _ := msg["content"].(string)
			if !strings.Contains(content, "391") {
				t.Errorf("content %q does not answer 391", content)
			}
			if got := strings.HasPrefix(content, "<think>\n"); got != tt.inline {
				t.Errorf("content starts with <think>: %v, want %v (content %q)", got, tt.inline, content)
			}
			if tt.inline && !strings.Contains(content, "</think>\n\n") {
				t.Errorf("inline thoughts not closed: %q", content)
			}
			if !tt.inline && strings.Contains(content, "think>") {
				t.Errorf("content leaks think tags: %q", content)
			}
			if tt.field != "" {
				r, _ := msg[tt.field].(string)
				if !strings.HasPrefix(r, "Okay") || strings.Contains(r, "<think>") {
					t.Errorf("%s = %q, want the bare thoughts", tt.field, r)
				}
			}
			if tt.absentField != "" {
				if r, _ := msg[tt.absentField].(string); r != "" {
					t.Errorf("%s should be empty, got %q", tt.absentField, r)
				}
			}

			// The stream must assemble to the same message.
			chunks, done := stream(t, ts.URL+"/v1/chat/completions", chat(mathPrompt, extra))
			if !done {
				t.Error("stream did not end with [DONE]")
			}
			sc, _ := joinDeltas(chunks, "content")
			if sc != content {
				t.Errorf("streamed content %q != non-streamed %q", sc, content)
			}
			if tt.field != "" {
				sr, _ := joinDeltas(chunks, tt.field)
				if sr != msg[tt.field] {
					t.Errorf("streamed %s %q != %q", tt.field, sr, msg[tt.field])
				}
			}
			if tt.absentField != "" {
				if _, seen := joinDeltas(chunks, tt.absentField); seen {
					t.Errorf("stream carries %s", tt.absentField)
				}
			}
		})
	}
}

func TestToolCalls(t *testing.T) {
	tools := []any{map[string]any{"type": "function", "function": map[string]any{
		"name": "get_weather",
		"parameters": map[string]any{"type": "object", "required": []string{"location", "days"},
			"properties": map[string]any{"location": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer"}}},
	}}}
	tests := []struct {
		name       string
		args       string
		structured bool
	}{
		{"llama jinja (default)", "--mimic llamacpp --profile instant -- -a qwen3-4b", true},
		{"llama --no-jinja gives prose", "--mimic llamacpp --profile instant -- -a qwen3-4b --no-jinja", false},
		{"vllm with auto tool choice", "--mimic vllm --profile instant -- serve m --served-model-name qwen3-4b --enable-auto-tool-choice --tool-call-parser hermes", true},
		{"vllm without gives prose", "--mimic vllm --profile instant -- serve m --served-model-name qwen3-4b", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ts := startSim(t, tt.args)
			body := chat("What is the weather in Paris?", map[string]any{"tools": tools})
			code, resp := post(t, ts.URL+"/v1/chat/completions", body)
			if code != 200 {
				t.Fatalf("status %d: %v", code, resp)
			}
			choice := resp["choices"].([]any)[0].(map[string]any)
			msg := choice["message"].(map[string]any)
			calls, _ := msg["tool_calls"].([]any)
			content, _ := msg["content"].(string)
			if !tt.structured {
				if len(calls) != 0 || choice["finish_reason"] != "stop" {
					t.Fatalf("want prose, got calls %v finish %v", calls, choice["finish_reason"])
				}
				if !strings.Contains(content, `<tool_call>`) || !strings.Contains(content, `"name":"get_weather"`) {
					t.Errorf("prose tool call missing from content %q", content)
				}
				return
			}
			if choice["finish_reason"] != "tool_calls" || len(calls) != 1 {
				t.Fatalf("want one structured call, got %v", choice)
			}
			fn := calls[0].(map[string]any)["function"].(map[string]any)
			var args map[string]any
			if fn["name"] != "get_weather" || json.Unmarshal([]byte(fn["arguments"].(string)), &args) != nil || args["location"] != "Paris" {
				t.Errorf("bad call %v", fn)
			}
			if strings.Contains(content, "tool_call") {
				t.Errorf("structured call also in content: %q", content)
			}

			chunks, _ := stream(t, ts.URL+"/v1/chat/completions", body)
			var name, argStr, finish string
			for _, c := range chunks {
				for _, ch := range c["choices"].([]any) {
					chm := ch.(map[string]any)
					if f, ok := chm["finish_reason"].(string); ok {
						finish = f
					}
					d, _ := chm["delta"].(map[string]any)
					tc, _ := d["tool_calls"].([]any)
					for _, x := range tc {
						f := x.(map[string]any)["function"].(map[string]any)
						if n, ok := f["name"].(string); ok {
							name += n
						}
						argStr += f["arguments"].(string)
					}
				}
			}
			if name != "get_weather" || argStr != fn["arguments"] || finish != "tool_calls" {
				t.Errorf("streamed call %q(%s) finish %q, want %v", name, argStr, finish, fn)
			}
		})
	}
}

func TestStreamShape(t *testing.T) {
	tests := []struct {
		name         string
		args         string
		includeUsage bool
		wantUsage    bool
		llama        bool
	}{
		{"llama with include_usage", "--mimic llamacpp --profile instant -- -a qwen3-4b", true, true, true},
		{"llama without: timings on the finish chunk only", "--mimic llamacpp --profile instant -- -a qwen3-4b", false, false, true},
		{"vllm with include_usage", "--mimic vllm --profile instant -- serve qwen3-4b", true, true, false},
		{"vllm without", "--mimic vllm --profile instant -- serve qwen3-4b", false, false, false},
		{"vllm forced usage", "--mimic vllm --profile instant -- serve qwen3-4b --enable-force-include-usage", false, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ts := startSim(t, tt.args)
			extra := map[string]any{"max_tokens": 20}
			if tt.includeUsage {
				extra["stream_options"] = map[string]any{"include_usage": true}
			}
			chunks, done := stream(t, ts.URL+"/v1/chat/completions", chat("hello there", extra))
			if !done || len(chunks) < 3 {
				t.Fatalf("done %v, %d chunks", done, len(chunks))
			}
			first := chunks[0]["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
			if first["role"] != "assistant" {
				t.Errorf("first delta %v lacks the assistant role", first)
			}
			fp, _ := chunks[0]["system_fingerprint"].(string)
			if tt.llama && !strings.HasPrefix(fp, "b") || !tt.llama && !strings.HasPrefix(fp, "vllm-") {
				t.Errorf("system_fingerprint %q", fp)
			}
			last := chunks[len(chunks)-1]
			usageChunk := len(last["choices"].([]any)) == 0
			if usageChunk != tt.wantUsage {
				t.Fatalf("usage chunk present %v, want %v (last %v)", usageChunk, tt.wantUsage, last)
			}
			if tt.wantUsage {
				u := last["usage"].(map[string]any)
				if u["completion_tokens"] != 20.0 {
					t.Errorf("usage %v, want 20 completion tokens", u)
				}
				if _, ok := last["timings"]; ok != tt.llama {
					t.Errorf("timings on usage chunk: %v, want %v", ok, tt.llama)
				}
			}
			finishIdx := len(chunks) - 1
			if tt.wantUsage {
				finishIdx--
			}
			fc := chunks[finishIdx]["choices"].([]any)[0].(map[string]any)
			if fc["finish_reason"] != "length" {
				t.Errorf("finish chunk %v, want finish_reason length", fc)
			}
			if tt.llama {
				tm, ok := chunks[finishIdx]["timings"].(map[string]any)
				if !ok || tm["predicted_n"] != 20.0 {
					t.Errorf("finish chunk timings %v", tm)
				}
				for _, k := range []string{"prompt_n", "prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_token_ms", "predicted_per_second", "cache_n"} {
					if _, ok := tm[k]; !ok {
						t.Errorf("timings lacks %s", k)
					}
				}
			} else {
				if _, ok := fc["stop_reason"]; !ok {
					t.Errorf("vLLM finish choice lacks stop_reason: %v", fc)
				}
				if _, ok := fc["logprobs"]; !ok {
					t.Errorf("vLLM choice lacks logprobs: %v", fc)
				}
			}
			// One token per content chunk.
			tokens := 0
			for _, c := range chunks {
				for _, ch := range c["choices"].([]any) {
					d := ch.(map[string]any)["delta"].(map[string]any)
					if s, _ := d["content"].(string); s != "" {
						tokens++
					} else if s, _ := d["reasoning_content"].(string); s != "" {
						tokens++
					}
				}
			}
			if tokens > 20 || tokens < 14 { // <think> tags in field mode make no chunk
				t.Errorf("%d token chunks for 20 tokens", tokens)
			}
		})
	}
}

func TestNonStreamShapes(t *testing.T) {
	_, llama := startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b")
	code, resp := post(t, llama.URL+"/v1/chat/completions", chat("hi", map[string]any{"max_tokens": 7}))
	if code != 200 || resp["object"] != "chat.completion" || resp["model"] != "qwen3-4b" {
		t.Fatalf("%d %v", code, resp)
	}
	if tm, ok := resp["timings"].(map[string]any); !ok || tm["predicted_n"] != 7.0 {
		t.Errorf("llama timings %v", resp["timings"])
	}
	if u := resp["usage"].(map[string]any); u["completion_tokens"] != 7.0 || u["prompt_tokens_details"] == nil {
		t.Errorf("usage %v", u)
	}

	_, vllm := startSim(t, "--mimic vllm --profile instant -- serve qwen3-4b")
	code, resp = post(t, vllm.URL+"/v1/chat/completions", chat("hi", nil))
	if code != 200 {
		t.Fatalf("%d %v", code, resp)
	}
	choice := resp["choices"].([]any)[0].(map[string]any)
	if _, ok := choice["stop_reason"]; !ok || choice["finish_reason"] != "stop" {
		t.Errorf("vLLM choice %v", choice)
	}
	if _, ok := resp["timings"]; ok {
		t.Error("vLLM must not send timings")
	}
	if u := resp["usage"].(map[string]any); u["completion_tokens"].(float64) < 30 {
		t.Errorf("natural answer too short: %v", u)
	}

	for _, ts := range []*httptest.Server{llama, vllm} {
		code, resp := post(t, ts.URL+"/v1/completions", map[string]any{"model": "qwen3-4b", "prompt": "Once upon", "max_tokens": 5})
		ch := resp["choices"].([]any)[0].(map[string]any)
		if code != 200 || resp["object"] != "text_completion" || ch["finish_reason"] != "length" || len(strings.Fields(ch["text"].(string))) != 5 {
			t.Errorf("completion %d %v", code, resp)
		}
		chunks, done := stream(t, ts.URL+"/v1/completions", map[string]any{"model": "qwen3-4b", "prompt": "Once upon", "max_tokens": 5})
		if !done || len(chunks) < 5 {
			t.Errorf("streamed completion: done %v, %d chunks", done, len(chunks))
		}
	}
}

func TestErrors(t *testing.T) {
	_, llama := startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b -c 1024")
	_, vllm := startSim(t, "--mimic vllm --profile instant -- serve m --served-model-name qwen3-4b --max-model-len 1024")
	long := strings.Repeat("word ", 1000) // 5000 chars = 1250 tokens
	tests := []struct {
		name     string
		url      string
		body     any
		status   int
		wantType string
		check    func(t *testing.T, e map[string]any)
	}{
		{"llama prompt over context", llama.URL, chat(long, nil), 400, "exceed_context_size_error", func(t *testing.T, e map[string]any) {
			if e["n_ctx"] != 1024.0 || e["n_prompt_tokens"].(float64) < 1024 || e["code"] != 400.0 {
				t.Errorf("error %v", e)
			}
		}},
		{"llama prompt + max_tokens over context", llama.URL, chat("short", map[string]any{"max_tokens": 1024}), 400, "exceed_context_size_error", nil},
		{"vllm over context", vllm.URL, chat("short", map[string]any{"max_tokens": 2000}), 400, "BadRequestError", func(t *testing.T, e map[string]any) {
			if e["code"] != 400.0 || !strings.Contains(e["message"].(string), "maximum context length is 1024") {
				t.Errorf("error %v", e)
			}
			if _, ok := e["param"]; !ok {
				t.Error("vLLM error lacks param")
			}
		}},
		// prompt + max_tokens overflows int: the check must not wrap
		// round to a small sum and let the request through (issue 19).
		{"llama max_tokens 2^63-1", llama.URL, chat("short", map[string]any{"max_tokens": math.MaxInt64}), 400, "exceed_context_size_error", nil},
		{"vllm max_tokens 2^63-1", vllm.URL, chat("short", map[string]any{"max_tokens": math.MaxInt64}), 400, "BadRequestError", func(t *testing.T, e map[string]any) {
			// The sum is told as it is, not wrapped to a negative number.
			if msg := e["message"].(string); !strings.Contains(msg, "you requested 9223372036854775") || strings.Contains(msg, "-") {
				t.Errorf("error %v", e)
			}
		}},
		{"llama malformed JSON", llama.URL, `{"messages": [`, 400, "invalid_request_error", nil},
		{"vllm malformed JSON", vllm.URL, `{"messages": [`, 400, "BadRequestError", nil},
		{"vllm unknown model", vllm.URL, map[string]any{"model": "other", "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 404, "NotFoundError", nil},
		{"no messages", vllm.URL, map[string]any{"model": "qwen3-4b", "messages": []any{}}, 400, "BadRequestError", nil},
		{"zero max_tokens", llama.URL, chat("x", map[string]any{"max_tokens": 0}), 400, "invalid_request_error", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, resp := post(t, tt.url+"/v1/chat/completions", tt.body)
			e, _ := resp["error"].(map[string]any)
			if code != tt.status || e == nil || e["type"] != tt.wantType || e["message"] == "" {
				t.Fatalf("got %d %v, want %d %s", code, resp, tt.status, tt.wantType)
			}
			if tt.check != nil {
				tt.check(t, e)
			}
		})
	}
	// llama-server serves any model name.
	if code, _ := post(t, llama.URL+"/v1/chat/completions", map[string]any{"model": "whatever", "messages": []any{map[string]any{"role": "user", "content": "x"}}}); code != 200 {
		t.Errorf("llama with another model name: %d", code)
	}
}

func TestDeterminism(t *testing.T) {
	run := func(seed int, prompt string) string {
		_, ts := startSim(t, "--mimic vllm --profile instant --seed "+strconv.Itoa(seed)+" -- serve qwen3-4b --reasoning-parser qwen3")
		_, resp := post(t, ts.URL+"/v1/chat/completions", chat(prompt, map[string]any{"max_tokens": 64}))
		msg := message(t, resp)
		return msg["reasoning"].(string) + "|" + msg["content"].(string)
	}
	a := run(7, "tell me about clusters")
	if b := run(7, "tell me about clusters"); a != b {
		t.Errorf("same seed and prompt differ:\n%s\n%s", a, b)
	}
	if c := run(8, "tell me about clusters"); c == a {
		t.Error("another seed gave the same text")
	}
	if d := run(7, "tell me about queues"); d == a {
		t.Error("another prompt gave the same text")
	}
}

func TestEmbeddings(t *testing.T) {
	_, ts := startSim(t, "--mimic llamacpp --profile instant -- -a emb")
	get := func(input any) []any {
		code, resp := post(t, ts.URL+"/v1/embeddings", map[string]any{"model": "emb", "input": input})
		if code != 200 {
			t.Fatalf("%d %v", code, resp)
		}
		return resp["data"].([]any)
	}
	one := get("hello")[0].(map[string]any)["embedding"].([]any)
	again := get([]string{"hello", "world"})
	if len(again) != 2 || len(one) != embeddingDims {
		t.Fatalf("got %d vectors of %d dims", len(again), len(one))
	}
	var norm float64
	for i, v := range one {
		if again[0].(map[string]any)["embedding"].([]any)[i] != v {
			t.Fatal("embedding not deterministic")
		}
		norm += v.(float64) * v.(float64)
	}
	if math.Abs(norm-1) > 1e-9 {
		t.Errorf("norm² %v, want 1", norm)
	}
	if code, _ := post(t, ts.URL+"/v1/embeddings", map[string]any{"input": 3}); code != 400 {
		t.Errorf("bad input gave %d", code)
	}
}

func getJSON(t *testing.T, url string) (int, any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var v any
	if len(data) > 0 {
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatalf("%s: not JSON: %q", url, data)
		}
	}
	return resp.StatusCode, v
}

func getText(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func TestLlamaHealthWhileLoading(t *testing.T) {
	opts, err := ParseArgs(strings.Fields("--mimic llamacpp --profile instant --load-time 10s -- -a qwen3-4b"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	clock := srv.created
	srv.now = func() time.Time { return clock }
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	code, body := getJSON(t, ts.URL+"/health")
	e, _ := body.(map[string]any)["error"].(map[string]any)
	if code != 503 || e["message"] != "Loading model" || e["type"] != "unavailable_error" || e["code"] != 503.0 {
		t.Fatalf("while loading: %d %v", code, body)
	}
	if code, _ := post(t, ts.URL+"/v1/chat/completions", chat("hi", nil)); code != 503 {
		t.Errorf("chat while loading: %d", code)
	}
	clock = clock.Add(10 * time.Second)
	code, body = getJSON(t, ts.URL+"/health")
	if code != 200 || body.(map[string]any)["status"] != "ok" {
		t.Fatalf("after load: %d %v", code, body)
	}
}

func TestInfoEndpoints(t *testing.T) {
	_, llama := startSim(t, "--mimic llamacpp --profile m4max-llamacpp --load-time 0s -- -m /models/Qwen3-4B-Q4_K_M.gguf -a qwen3-4b -c 16384 -np 4 --metrics")
	_, vllm := startSim(t, "--mimic vllm --profile rtx3060-vllm --load-time 0s -- serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3-4b --max-model-len 16384")

	_, models := getJSON(t, llama.URL+"/v1/models")
	d := models.(map[string]any)["data"].([]any)[0].(map[string]any)
	if d["id"] != "qwen3-4b" || d["owned_by"] != "llamacpp" || d["meta"].(map[string]any)["n_ctx"] != 4096.0 {
		t.Errorf("llama models %v", d)
	}
	_, models = getJSON(t, vllm.URL+"/v1/models")
	d = models.(map[string]any)["data"].([]any)[0].(map[string]any)
	if d["id"] != "qwen3-4b" || d["owned_by"] != "vllm" || d["max_model_len"] != 16384.0 || d["root"] != "Qwen/Qwen3-4B-AWQ" {
		t.Errorf("vllm models %v", d)
	}

	_, props := getJSON(t, llama.URL+"/props")
	p := props.(map[string]any)
	if p["total_slots"] != 4.0 || p["default_generation_settings"].(map[string]any)["n_ctx"] != 4096.0 ||
		p["model_path"] != "/models/Qwen3-4B-Q4_K_M.gguf" || p["model_alias"] != "qwen3-4b" || p["is_sleeping"] != false ||
		!strings.HasPrefix(p["build_info"].(string), "b") {
		t.Errorf("props %v", p)
	}
	_, slots := getJSON(t, llama.URL+"/slots")
	if s := slots.([]any); len(s) != 4 || s[3].(map[string]any)["id"] != 3.0 || s[0].(map[string]any)["is_processing"] != false {
		t.Errorf("slots %v", slots)
	}

	code, body := getJSON(t, vllm.URL+"/health")
	if code != 200 || body != nil {
		t.Errorf("vllm health %d %v", code, body)
	}
	_, ver := getJSON(t, vllm.URL+"/version")
	if ver.(map[string]any)["version"] == "" {
		t.Error("no vllm version")
	}
	if code, _ := getJSON(t, vllm.URL+"/props"); code != 404 {
		t.Errorf("vllm /props: %d", code)
	}
}

func TestMetricsNames(t *testing.T) {
	tests := []struct {
		args  string
		names []string
	}{
		{"--mimic llamacpp --profile instant -- -a qwen3-4b --metrics", []string{
			"llamacpp:requests_processing 0", "llamacpp:requests_deferred 0", "llamacpp:tokens_predicted_total 5",
			"llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total",
			"llamacpp:predicted_tokens_seconds", "llamacpp:n_decode_total 5", "# TYPE llamacpp:requests_deferred gauge",
		}},
		{"--mimic vllm --profile instant -- serve qwen3-4b", []string{
			`vllm:num_requests_running{model_name="qwen3-4b",engine="0"} 0`, `vllm:num_requests_waiting{model_name="qwen3-4b",engine="0"} 0`,
			`vllm:kv_cache_usage_perc{model_name="qwen3-4b"`, `vllm:generation_tokens_total{model_name="qwen3-4b",engine="0"} 5`,
			`vllm:prompt_tokens_total{`, `vllm:time_to_first_token_seconds_bucket{model_name="qwen3-4b",engine="0",le="+Inf"} 1`,
			`vllm:inter_token_latency_seconds_count{model_name="qwen3-4b",engine="0"} 4`, `vllm:e2e_request_latency_seconds_sum{`,
			`vllm:request_success_total{model_name="qwen3-4b",engine="0",finished_reason="length"} 1`, "# TYPE vllm:time_to_first_token_seconds histogram",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			_, ts := startSim(t, tt.args)
			if code, _ := post(t, ts.URL+"/v1/chat/completions", chat("hi", map[string]any{"max_tokens": 5})); code != 200 {
				t.Fatal(code)
			}
			code, text := getText(t, ts.URL+"/metrics")
			if code != 200 {
				t.Fatalf("%d %s", code, text)
			}
			for _, n := range tt.names {
				if !strings.Contains(text, n) {
					t.Errorf("metrics lack %q", n)
				}
			}
		})
	}
	_, ts := startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b")
	if code, _ := getText(t, ts.URL+"/metrics"); code != 501 {
		t.Errorf("llama without --metrics: %d, want 501", code)
	}
}

// slowProfile decodes one token per 10 s: requests hold their slots for as
// long as a test needs, with no timing assumption.
func slowProfile() Profile {
	return Profile{Name: "slow", Curve: []SpeedPoint{{Concurrency: 1, TotalTokPerSec: 0.1}}, Slots: 2, KVCacheTokens: 1000}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second) // hang guard only
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSlotsQueueAndDisconnect(t *testing.T) {
	for _, mimic := range []string{"llamacpp", "vllm"} {
		t.Run(mimic, func(t *testing.T) {
			opts := Options{Mimic: fleetKind(mimic), Profile: slowProfile(), Slots: 2, ServedNames: []string{"m"},
				MetricsEnabled: true, SlotsEndpoint: true}
			srv, err := NewServer(opts)
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(srv.Handler())
			defer ts.Close()

			var wg sync.WaitGroup
			cancels := make([]context.CancelFunc, 3)
			for i := range cancels {
				ctx, cancel := context.WithCancel(context.Background())
				cancels[i] = cancel
				raw, _ := json.Marshal(chat("hold a slot", map[string]any{"model": "m", "max_tokens": 100, "stream": true}))
				req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/chat/completions", bytes.NewReader(raw))
				wg.Add(1)
				go func() {
					defer wg.Done()
					if resp, err := http.DefaultClient.Do(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}()
				// Start them in order so the queue order is known.
				want := i + 1
				waitFor(t, "request to arrive", func() bool { st := srv.pool.stats(); return st.busy+st.waiting == want })
			}
			st := srv.pool.stats()
			if st.busy != 2 || st.waiting != 1 {
				t.Fatalf("busy %d waiting %d, want 2 running and 1 queued", st.busy, st.waiting)
			}
			_, text := getText(t, ts.URL+"/metrics")
			wantRunning, wantWaiting := "llamacpp:requests_processing 2", "llamacpp:requests_deferred 1"
			if mimic == "vllm" {
				wantRunning, wantWaiting = `vllm:num_requests_running{model_name="m",engine="0"} 2`, `vllm:num_requests_waiting{model_name="m",engine="0"} 1`
			}
			if !strings.Contains(text, wantRunning) || !strings.Contains(text, wantWaiting) {
				t.Errorf("metrics do not show 2 running / 1 waiting:\n%s", text)
			}
			if mimic == "llamacpp" {
				_, slots := getJSON(t, ts.URL+"/slots")
				for _, s := range slots.([]any) {
					if s.(map[string]any)["is_processing"] != true {
						t.Errorf("slot not processing: %v", s)
					}
				}
			}
			// A client that goes away frees its slot at once for the queued one.
			cancels[0]()
			waitFor(t, "queued request to take the freed slot", func() bool { st := srv.pool.stats(); return st.busy == 2 && st.waiting == 0 })
			// A queued client that goes away leaves the queue.
			cancels[1]()
			cancels[2]()
			waitFor(t, "all slots free", func() bool { st := srv.pool.stats(); return st.busy == 0 && st.waiting == 0 })
			wg.Wait()
		})
	}
}

func TestSlotPoolFIFO(t *testing.T) {
	p := newSlotPool(1, 100, 0)
	ctx := context.Background()
	first, err := p.acquire(ctx, 1, 1, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan int, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slot, err := p.acquire(ctx, 1, 1, nil, nil)
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			p.release(slot)
		}()
		waitFor(t, "waiter queued", func() bool { return p.stats().waiting == i+1 })
	}
	p.release(first)
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Errorf("served %d, want %d (FIFO)", got, want)
		}
		want++
	}
}

func TestMainStartsAndStops(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncbuf.Buffer
	errc := make(chan error, 1)
	go func() {
		errc <- Main(ctx, strings.Fields("--mimic llamacpp --profile instant -- -a qwen3-4b --host 127.0.0.1 --port "+strconv.Itoa(port)), io.Discard, &stderr)
	}()
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	waitFor(t, "sim to answer /health", func() bool {
		resp, err := http.Get(base + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	if code, resp := post(t, base+"/v1/chat/completions", chat(mathPrompt, nil)); code != 200 || !strings.Contains(resp["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string), "391") {
		t.Errorf("chat through Main: %d %v", code, resp)
	}
	waitFor(t, "ready log line", func() bool { return strings.Contains(stderr.String(), "sim engine ready") })
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("Main returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Main did not stop after cancel")
	}
	if _, err := http.Get(base + "/health"); err == nil {
		t.Error("still serving after Main returned")
	}
}

func TestVLLMRefusesConnectionsWhileLoading(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- Main(ctx, strings.Fields("--mimic vllm --profile instant --load-time 1h -- serve m --port "+strconv.Itoa(port)), io.Discard, io.Discard)
	}()
	_, err = net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial while loading: %v, want connection refused", err)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Main: %v", err)
	}
}

func TestMainRejectsBadArgs(t *testing.T) {
	err := Main(context.Background(), []string{"--profile", "nope"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "instant") {
		t.Errorf("got %v", err)
	}
}

func fleetKind(s string) fleet.EngineKind { return fleet.EngineKind(s) }

// Each chunk must reach the client as it is made: the first token arrives
// while the request is still decoding.
func TestStreamIsFlushedPerChunk(t *testing.T) {
	for _, mimic := range []string{"llamacpp", "vllm"} {
		t.Run(mimic, func(t *testing.T) {
			p := Profile{Name: "four-per-second", Curve: []SpeedPoint{{Concurrency: 1, TotalTokPerSec: 4}}, Slots: 1}
			srv, err := NewServer(Options{Mimic: fleetKind(mimic), Profile: p, ServedNames: []string{"m"}})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(srv.Handler())
			defer ts.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			raw, _ := json.Marshal(chat("x", map[string]any{"model": "m", "max_tokens": 1000, "stream": true,
				"chat_template_kwargs": map[string]any{"enable_thinking": false}}))
			req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/chat/completions", bytes.NewReader(raw))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.Contains(sc.Text(), `"content":"`) && !strings.Contains(sc.Text(), `"content":""`) {
					break
				}
			}
			if st := srv.pool.stats(); st.busy != 1 {
				t.Fatalf("first token arrived but the request is not decoding (busy %d): chunks are buffered", st.busy)
			}
			cancel()
			waitFor(t, "slot freed after disconnect", func() bool { return srv.pool.stats().busy == 0 })
		})
	}
}

// A real engine's first requests after the load are slow (Metal compiles
// its shaders, CUDA its kernels): the sim's first request, and one sent
// while it warms the engine up, wait for the cold start, and it shows as
// prompt time as in llama-server's timings; a warm engine holds nothing.
func TestColdStartHoldsTheFirstRequests(t *testing.T) {
	const cold = 400 * time.Millisecond
	_, ts := startSim(t, "--mimic llamacpp --profile instant --cold-start "+cold.String()+" -- -a qwen3-4b")
	promptMS := func(resp map[string]any) float64 {
		tm, _ := resp["timings"].(map[string]any)
		v, _ := tm["prompt_ms"].(float64)
		return v
	}
	var wg sync.WaitGroup
	first := make([]float64, 2)
	for i := range first {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, resp := post(t, ts.URL+"/v1/chat/completions", chat("hi", map[string]any{"max_tokens": 4}))
			if code != 200 {
				t.Errorf("cold request %d: %d %v", i, code, resp)
			}
			first[i] = promptMS(resp)
		}()
	}
	wg.Wait()
	if max(first[0], first[1]) < float64(cold.Milliseconds()) || min(first[0], first[1]) <= 0 {
		t.Errorf("the first requests' prompt times are %v ms: want one to pay the %s cold start and both to wait for it", first, cold)
	}
	code, resp := post(t, ts.URL+"/v1/chat/completions", chat("hi", map[string]any{"max_tokens": 4}))
	if code != 200 || promptMS(resp) != 0 {
		t.Errorf("warm request: %d, prompt time %v ms; want 0 on the instant profile once warm", code, promptMS(resp))
	}
}
