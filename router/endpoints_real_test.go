package router

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"fleet"
	"fleet/internal/llamatest"
)

// TestRealLlamaServerEndpointsThroughRouter routes the new endpoints to the
// real llama-server (the tiny GGUF, served as qwen3-4b, asked for by the
// alias qwen3): the Anthropic stream comes back under the asked name and is
// metered as the engine counted it, as is a Responses answer; /tokenize
// passes; /v1/rerank, which this llama-server was not started to serve
// (501), is learnt and answered 404 by the router; n = 2 is refused before
// it reaches the engine.
func TestRealLlamaServerEndpointsThroughRouter(t *testing.T) {
	real := llamatest.Start(t, "-a", "qwen3-4b", "--jinja", "-np", "1", "-c", "2048")
	var mu sync.Mutex
	var samples []fleet.Sample
	opts := Options{OnSample: func(s fleet.Sample) { mu.Lock(); samples = append(samples, s); mu.Unlock() }}
	addr := strings.TrimPrefix(real.URL, "http://")
	r, srv := startRouter(t, opts, Backend{Name: "ultra/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, Addr: addr, Context: 2048, Slots: 1})
	last := func() fleet.Sample {
		mu.Lock()
		defer mu.Unlock()
		if len(samples) == 0 {
			return fleet.Sample{}
		}
		return samples[len(samples)-1]
	}

	// This llama-server build leaves message_start out of a few streams
	// (3 of 40 when asked directly): the router makes one up, so every
	// stream starts with it.
	code, body := sendPath(t, srv.URL, "/v1/messages", `{"model":"qwen3","max_tokens":6,"stream":true,"messages":[{"role":"user","content":"Tell me a story"}]}`, nil)
	evs := sseData(body)
	if code != 200 || len(evs) < 3 {
		t.Fatalf("/v1/messages stream: HTTP %d %s\n%s", code, body, real.Log())
	}
	if evs[0]["type"] != "message_start" {
		t.Fatalf("the stream does not start with message_start: %.300s", body)
	}
	if m, _ := evs[0]["message"].(map[string]any); m["model"] != "qwen3" {
		t.Fatalf("message_start names %v, want the asked qwen3: %s", m["model"], body)
	}
	usage, _ := evs[len(evs)-2]["usage"].(map[string]any)
	out, _ := usage["output_tokens"].(float64)
	if s := last(); s.OutputTokens != int(out) || out == 0 {
		t.Errorf("metered %d output tokens, the engine said %v", s.OutputTokens, out)
	}

	code, body = sendPath(t, srv.URL, "/v1/responses", `{"model":"qwen3","max_output_tokens":5,"input":"Count to ten"}`, nil)
	var resp struct {
		Model string `json:"model"`
		Usage struct {
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	if code != 200 || json.Unmarshal(body, &resp) != nil || resp.Model != "qwen3" {
		t.Fatalf("/v1/responses: HTTP %d %s", code, body)
	}
	if s := last(); s.OutputTokens != resp.Usage.OutputTokens || resp.Usage.OutputTokens == 0 {
		t.Errorf("metered %d output tokens, the engine said %d", s.OutputTokens, resp.Usage.OutputTokens)
	}

	if code, body = sendPath(t, srv.URL, "/tokenize", `{"model":"qwen3","content":"hello"}`, nil); code != 200 || !strings.Contains(string(body), `"tokens"`) {
		t.Errorf("/tokenize: HTTP %d %s", code, body)
	}
	for i := range 2 {
		code, body = sendPath(t, srv.URL, "/v1/rerank", `{"model":"qwen3","query":"a","documents":["b"]}`, nil)
		var e errorReply
		if code != 404 || json.Unmarshal(body, &e) != nil || e.Error.Code == nil || *e.Error.Code != "endpoint_not_served" {
			t.Errorf("/v1/rerank, request %d: HTTP %d %s", i, code, body)
		}
	}
	if code, body = sendPath(t, srv.URL, "/v1/chat/completions", `{"model":"qwen3","n":2,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, nil); code != 400 ||
		!strings.Contains(string(body), "llama-server does not") {
		t.Errorf("n=2: HTTP %d %s", code, body)
	}
	r.pool.mu.Lock()
	learnt := r.pool.backends[0].notServed["/v1/rerank"]
	r.pool.mu.Unlock()
	if !learnt {
		t.Error("the router did not remember that the worker answered /v1/rerank with 501")
	}
}
