package router

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"fleet"
	"fleet/sim/simtest"
)

// sendPath posts body to path with the given headers.
func sendPath(t *testing.T, base, path, body string, hdr map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// sseData lists the data payloads of an SSE body.
func sseData(body []byte) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && d != "[DONE]" {
			var m map[string]any
			if json.Unmarshal([]byte(d), &m) == nil {
				out = append(out, m)
			}
		}
	}
	return out
}

// simFleet is a vLLM and a llama-server sim serving qwen3-4b under their own
// names, behind a round-robin router that records each request's sample.
type simFleet struct {
	r       *Router
	url     string
	mu      sync.Mutex
	samples []fleet.Sample
}

func startSimFleet(t *testing.T, opts Options, extra ...Backend) *simFleet {
	t.Helper()
	f := &simFleet{}
	vllm := simtest.Start(t, strings.Fields("--mimic vllm --profile instant -- serve Qwen/Qwen3-4B-AWQ --chat-template-kwargs {\"enable_thinking\":false}")...)
	llama := simtest.Start(t, strings.Fields("--mimic llamacpp --profile instant -- -m q.gguf -a qwen3-4b --jinja --chat-template-kwargs {\"enable_thinking\":false}")...)
	bs := append([]Backend{
		{Name: "rig/qwen3-4b", Model: "qwen3-4b", ServedName: "Qwen/Qwen3-4B-AWQ", Engine: fleet.EngineVLLM, Addr: vllm.Listener.Addr().String(), Context: 16384, Slots: 4},
		{Name: "ultra/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, Addr: llama.Listener.Addr().String(), Context: 16384, Slots: 4},
	}, extra...)
	opts.Policy = PolicyRoundRobin
	opts.OnSample = func(s fleet.Sample) {
		f.mu.Lock()
		f.samples = append(f.samples, s)
		f.mu.Unlock()
	}
	r, srv := startRouter(t, opts, bs...)
	f.r, f.url = r, srv.URL
	return f
}

func (f *simFleet) lastSample() fleet.Sample {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.samples) == 0 {
		return fleet.Sample{}
	}
	return f.samples[len(f.samples)-1]
}

// TestAnthropicAndResponsesRoutedToEveryEngine: /v1/messages and
// /v1/responses, streamed and not, reach both engines under the name each
// serves, answer with the alias the client asked for, and are metered
// (their output tokens reach the sample as chat's do).
func TestAnthropicAndResponsesRoutedToEveryEngine(t *testing.T) {
	f := startSimFleet(t, Options{})
	messages := `{"model":"qwen3","max_tokens":9,"system":"Be terse.","messages":[{"role":"user","content":"Describe the fleet."}]%s}`
	responses := `{"model":"qwen3","max_output_tokens":9,"instructions":"Be terse.","input":"Describe the fleet."%s}`
	workers := map[string]bool{}
	for i := range 4 { // round robin: each engine twice
		for _, tc := range []struct{ path, body string }{{"/v1/messages", messages}, {"/v1/responses", responses}} {
			for _, stream := range []bool{false, true} {
				extra := ""
				if stream {
					extra = `,"stream":true`
				}
				code, body := sendPath(t, f.url, tc.path, strings.Replace(tc.body, "%s", extra, 1), nil)
				if code != 200 {
					t.Fatalf("%s stream=%v: HTTP %d %s", tc.path, stream, code, body)
				}
				s := f.lastSample()
				workers[s.Worker] = true
				if s.OutputTokens != 9 {
					t.Errorf("%s stream=%v on %s (round %d): metered %d output tokens, want 9", tc.path, stream, s.Worker, i, s.OutputTokens)
				}
				// Every name the answer carries is the one asked for.
				if strings.Contains(string(body), `"model":"qwen3-4b"`) || strings.Contains(string(body), "Qwen/Qwen3-4B-AWQ") ||
					!strings.Contains(string(body), `"model":"qwen3"`) {
					t.Errorf("%s stream=%v on %s: the answer does not carry the asked name only: %.400s", tc.path, stream, s.Worker, body)
				}
				if stream {
					evs := sseData(body)
					if len(evs) < 4 {
						t.Fatalf("%s: %d events", tc.path, len(evs))
					}
					first := evs[0]
					if tc.path == "/v1/messages" && first["message"].(map[string]any)["model"] != "qwen3" {
						t.Errorf("message_start names %v", first["message"].(map[string]any)["model"])
					}
				}
			}
		}
	}
	if len(workers) != 2 {
		t.Errorf("the requests reached %v, want both engines", workers)
	}
}

// TestEndpointNotServedIsLearntAndAnsweredInShape: a worker whose engine is
// not known for a path is tried once, its 404 remembered (never again sent
// the path, not cooled down), and the request served elsewhere; a path no
// worker serves is a 404 saying so, in the API's shape.
func TestEndpointNotServedIsLearntAndAnsweredInShape(t *testing.T) {
	var ollamaMessages atomic.Int32
	_, ollama := startBackend(t, "tag/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v1/messages" {
			ollamaMessages.Add(1)
		}
		http.NotFound(w, req) // Go's "404 page not found", as Ollama's server answers
	})
	ollama.Engine = fleet.EngineOllama
	f := startSimFleet(t, Options{}, ollama)
	body := `{"model":"qwen3-4b","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	for i := range 6 {
		if code, b := sendPath(t, f.url, "/v1/messages", body, nil); code != 200 {
			t.Fatalf("request %d: HTTP %d %s", i, code, b)
		}
	}
	if n := ollamaMessages.Load(); n != 1 {
		t.Errorf("the worker that answered 404 got /v1/messages %d times, want once", n)
	}
	for _, st := range f.r.Stats() {
		if st.Cooling {
			t.Errorf("%s is cooling down after a 404: a path not served is not a failure", st.Name)
		}
	}
	// /v1/score: only vLLM is known for it, and the sim does not serve it.
	code, b := sendPath(t, f.url, "/v1/score", `{"model":"qwen3-4b","text_1":"a","text_2":"b"}`, nil)
	var oe errorReply
	_ = json.Unmarshal(b, &oe)
	if code != 404 || oe.Error.Code == nil || *oe.Error.Code != "endpoint_not_served" || !strings.Contains(oe.Error.Message, "rig/qwen3-4b (vllm)") {
		t.Errorf("/v1/score served by no worker: HTTP %d %s", code, b)
	}
	// /infill is llama-server's only: the vLLM worker is never tried.
	code, b = sendPath(t, f.url, "/infill", `{"model":"qwen3-4b","input_prefix":"a"}`, nil)
	if code != 404 || !strings.Contains(string(b), "ultra/qwen3-4b (llama-server)") {
		t.Errorf("/infill: HTTP %d %s", code, b)
	}
}

type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// TestAnthropicErrorsAndKeys: /v1/messages answers the router's own errors
// in Anthropic's shape, takes the key as x-api-key as well as Bearer, and
// forwards neither to the engine.
func TestAnthropicErrorsAndKeys(t *testing.T) {
	var leaked atomic.Int32
	_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("X-Api-Key") != "" || req.Header.Get("Authorization") != "" {
			leaked.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"m","type":"message","role":"assistant","content":[],"model":"qwen3-4b","usage":{"input_tokens":3,"output_tokens":2}}`)
	})
	_, srv := startRouter(t, Options{Keys: keys{"fk-good": "ci"}}, b)
	body := `{"model":"qwen3-4b","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name    string
		path    string
		body    string
		hdr     map[string]string
		status  int
		errType string
	}{
		{"x-api-key", "/v1/messages", body, map[string]string{"x-api-key": "fk-good"}, 200, ""},
		{"bearer", "/v1/messages", body, map[string]string{"Authorization": "Bearer fk-good"}, 200, ""},
		{"no key", "/v1/messages", body, nil, 401, "authentication_error"},
		{"bad key", "/v1/messages", body, map[string]string{"x-api-key": "fk-bad"}, 401, "authentication_error"},
		{"unknown model", "/v1/messages", strings.Replace(body, "qwen3-4b", "claude-opus", 1), map[string]string{"x-api-key": "fk-good"}, 404, "not_found_error"},
		{"not JSON", "/v1/messages/count_tokens", "{", map[string]string{"x-api-key": "fk-good"}, 400, "invalid_request_error"},
		{"x-api-key on OpenAI", "/v1/chat/completions", body, map[string]string{"x-api-key": "fk-good"}, 200, ""},
		// An Anthropic path the router does not route (message batches)
		// is still answered in Anthropic's shape.
		{"unrouted Anthropic path", "/v1/messages/batches", body, map[string]string{"x-api-key": "fk-good"}, 404, "not_found_error"},
	} {
		code, got := sendPath(t, srv.URL, tc.path, tc.body, tc.hdr)
		if code != tc.status {
			t.Errorf("%s: HTTP %d, want %d: %s", tc.name, code, tc.status, got)
			continue
		}
		if tc.errType == "" {
			continue
		}
		var e anthropicError
		if err := json.Unmarshal(got, &e); err != nil || e.Type != "error" || e.Error.Type != tc.errType || e.Error.Message == "" {
			t.Errorf("%s: body %s, want an Anthropic error of type %s", tc.name, got, tc.errType)
		}
	}
	if n := leaked.Load(); n != 0 {
		t.Errorf("the router's key reached the engine %d times", n)
	}
	// The OpenAI endpoints keep OpenAI's shape.
	code, got := sendPath(t, srv.URL, "/v1/chat/completions", body, nil)
	var oe errorReply
	if json.Unmarshal(got, &oe) != nil || code != 401 || oe.Error.Type != errTypeAuthentication {
		t.Errorf("chat without a key: HTTP %d %s", code, got)
	}
}

// TestChoicesNGoWhereServed: n > 1 goes only to an engine that returns n
// choices; a model served only by llama-server answers 400 saying so.
func TestChoicesNGoWhereServed(t *testing.T) {
	f := startSimFleet(t, Options{})
	body := `{"model":"qwen3-4b","n":2,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	for i := range 4 {
		code, b := sendPath(t, f.url, "/v1/chat/completions", body, nil)
		var resp struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if code != 200 || json.Unmarshal(b, &resp) != nil || len(resp.Choices) != 2 {
			t.Fatalf("n=2, request %d: HTTP %d %s", i, code, b)
		}
		if w := f.lastSample().Worker; w != "rig/qwen3-4b" {
			t.Errorf("n=2 went to %s, not the vLLM worker", w)
		}
	}
	llama := simtest.Start(t, strings.Fields("--mimic llamacpp --profile instant -- -m q.gguf -a qwen3-4b")...)
	_, srv := startRouter(t, Options{}, Backend{Name: "ultra/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp,
		Addr: llama.Listener.Addr().String(), Context: 16384, Slots: 4})
	code, b := sendPath(t, srv.URL, "/v1/chat/completions", body, nil)
	var oe errorReply
	_ = json.Unmarshal(b, &oe)
	if code != 400 || !strings.Contains(oe.Error.Message, "n = 2") || !strings.Contains(oe.Error.Message, "llama-server") {
		t.Errorf("n=2 on llama-server only: HTTP %d %s", code, b)
	}
	if code, b := sendPath(t, srv.URL, "/v1/chat/completions", strings.Replace(body, `"n":2`, `"n":1`, 1), nil); code != 200 {
		t.Errorf("n=1 on llama-server: HTTP %d %s", code, b)
	}
}

// TestTokenizeRoutedByModel: the cheap endpoints go to the model's worker.
func TestTokenizeRoutedByModel(t *testing.T) {
	f := startSimFleet(t, Options{})
	for range 2 {
		code, b := sendPath(t, f.url, "/tokenize", `{"model":"qwen3","prompt":"hello there","content":"hello there"}`, nil)
		if code != 200 || !strings.Contains(string(b), `"tokens":[`) {
			t.Errorf("/tokenize: HTTP %d %s", code, b)
		}
	}
}

// TestAnthropicMidStreamFailure: a worker dying in the middle of an
// Anthropic stream leaves the client Anthropic's error event, not OpenAI's.
func TestAnthropicMidStreamFailure(t *testing.T) {
	events := cutStream(t, "/v1/messages", `{"model":"qwen3-4b","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"model\":\"qwen3-4b\"}}\n\n")
	if len(events) != 2 {
		t.Fatalf("events %q", events)
	}
	payload, ok := strings.CutPrefix(events[1], "event: error\ndata: ")
	var e anthropicError
	if !ok || json.Unmarshal([]byte(payload), &e) != nil || e.Type != "error" || e.Error.Type != "api_error" || !strings.Contains(e.Error.Message, "mid-stream") {
		t.Errorf("last event %q, want Anthropic's error event", events[1])
	}
}

// TestResponsesMidStreamFailure: a worker dying in the middle of a
// Responses stream leaves the client the Responses API's error event,
// numbered after the last event it got, not chat's error chunk.
func TestResponsesMidStreamFailure(t *testing.T) {
	events := cutStream(t, "/v1/responses", `{"model":"qwen3-4b","stream":true,"input":"hi"}`,
		"event: response.created\ndata: {\"response\":{\"id\":\"r\",\"model\":\"qwen3-4b\",\"status\":\"in_progress\"},\"sequence_number\":0,\"type\":\"response.created\"}\n\n"+
			"event: response.output_text.delta\ndata: {\"content_index\":0,\"delta\":\"Hi\",\"item_id\":\"m\",\"output_index\":0,\"sequence_number\":1,\"type\":\"response.output_text.delta\"}\n\n")
	if len(events) != 3 {
		t.Fatalf("events %q", events)
	}
	payload, ok := strings.CutPrefix(events[2], "event: error\ndata: ")
	var e struct {
		Type           string  `json:"type"`
		Code           *string `json:"code"`
		Message        string  `json:"message"`
		Param          *string `json:"param"`
		SequenceNumber *int    `json:"sequence_number"`
	}
	if !ok || json.Unmarshal([]byte(payload), &e) != nil || e.Type != "error" || e.Code == nil || *e.Code != codeUpstreamFailed ||
		!strings.Contains(e.Message, "mid-stream") || e.SequenceNumber == nil || *e.SequenceNumber != 2 || !strings.Contains(payload, `"param":null`) {
		t.Errorf("last event %q, want the Responses API's error event with sequence_number 2", events[2])
	}
}

// cutStream sends body to path through the router to a real upstream that
// streams sent and then drops the connection, as a dying worker does, and
// returns the events the client got (the stream must have begun: 200).
func cutStream(t *testing.T, path, body, sent string) []string {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, sent)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	srv.Config.ErrorLog = nil
	srv.Start()
	t.Cleanup(srv.Close)
	_, rs := startRouter(t, Options{}, Backend{Name: "ultra/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp,
		Addr: srv.Listener.Addr().String(), Context: 16384, Slots: 4})
	code, got := sendPath(t, rs.URL, path, body, nil)
	if code != 200 {
		t.Fatalf("HTTP %d %s", code, got)
	}
	return strings.Split(strings.TrimSpace(string(got)), "\n\n")
}

// TestAnthropicRetriedThenAnsweredInShape: /v1/messages has chat's retries
// (a worker failing with 5xx before answering is left for another), and when
// every worker fails the answer is Anthropic-shaped.
func TestAnthropicRetriedThenAnsweredInShape(t *testing.T) {
	var failed atomic.Int32
	failing := func(w http.ResponseWriter, _ *http.Request) {
		failed.Add(1)
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
	}
	_, bad := startBackend(t, "max/qwen3-4b", 4, failing)
	f := startSimFleet(t, Options{MaxRetries: 2}, bad)
	body := `{"model":"qwen3-4b","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	for i := range 3 {
		if code, b := sendPath(t, f.url, "/v1/messages", body, nil); code != 200 {
			t.Fatalf("request %d with one failing worker of three: HTTP %d %s", i, code, b)
		}
	}
	if failed.Load() == 0 {
		t.Fatal("the failing worker was never tried; the test proves nothing")
	}
	_, bad2 := startBackend(t, "max/qwen3-4b", 4, failing)
	_, srv := startRouter(t, Options{MaxRetries: 0}, bad2)
	code, b := sendPath(t, srv.URL, "/v1/messages", body, nil)
	var e anthropicError
	if code < 500 || json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != anthropicErrorType(code) || !strings.Contains(e.Error.Message, "boom") {
		t.Errorf("every worker failing: HTTP %d %s, want an Anthropic error saying why", code, b)
	}
}

// TestAnthropicUsagePerKey: a /v1/messages answer counts for its key (sent
// as x-api-key) as the engine reported it (prompt = uncached input + cache
// reads), and a key past its limit gets the 429 in Anthropic's shape.
func TestAnthropicUsagePerKey(t *testing.T) {
	var mu sync.Mutex
	var usages []Usage
	llama := simtest.Start(t, strings.Fields("--mimic llamacpp --profile instant -- -m q.gguf -a qwen3-4b --chat-template-kwargs {\"enable_thinking\":false}")...)
	r, srv := startRouter(t, Options{Keys: keys{"fk-good": "ci"}, OnUsage: func(u Usage) { mu.Lock(); usages = append(usages, u); mu.Unlock() }},
		Backend{Name: "ultra/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, Addr: llama.Listener.Addr().String(), Context: 16384, Slots: 4})
	body := `{"model":"qwen3-4b","max_tokens":7,"stream":true,"system":"Be terse.","messages":[{"role":"user","content":"Describe the fleet."}]}`
	hdr := map[string]string{"x-api-key": "fk-good"}
	for i := range 2 { // the second is read from the engine's prompt cache
		code, b := sendPath(t, srv.URL, "/v1/messages", body, hdr)
		if code != 200 {
			t.Fatalf("HTTP %d %s", code, b)
		}
		su := sseData(b)[0]["message"].(map[string]any)["usage"].(map[string]any)
		in, read := int(su["input_tokens"].(float64)), int(su["cache_read_input_tokens"].(float64))
		mu.Lock()
		u := usages[len(usages)-1]
		mu.Unlock()
		if u.Key != "ci" || u.PromptTokens != in+read || u.CachedTokens != read || u.CompletionTokens != 7 {
			t.Errorf("request %d: usage %+v, the engine said input %d cache reads %d output 7", i, u, in, read)
		}
		if i == 1 && read == 0 {
			t.Error("the repeat was not read from the cache; the test proves less than it says")
		}
	}
	r.SetKeyLimits(map[string]fleet.KeyLimits{"ci": {RequestsPerMinute: 1}})
	sendPath(t, srv.URL, "/v1/messages", body, hdr)
	code, b := sendPath(t, srv.URL, "/v1/messages", body, hdr)
	var e anthropicError
	if code != http.StatusTooManyRequests || json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != "rate_limit_error" {
		t.Errorf("past the key's limit: HTTP %d %s, want Anthropic's rate_limit_error", code, b)
	}
}

// TestCountingTokensSpendsNone: /tokenize, /detokenize and
// /v1/messages/count_tokens on a real engine count as a key's requests
// (its requests limit, its usage) but not as its tokens: the day's token
// limit is neither spent by them nor refuses them, as it does generation.
func TestCountingTokensSpendsNone(t *testing.T) {
	var mu sync.Mutex
	var usages []Usage
	llama := simtest.Start(t, strings.Fields("--mimic llamacpp --profile instant -- -m q.gguf -a qwen3-4b --chat-template-kwargs {\"enable_thinking\":false}")...)
	r, srv := startRouter(t, Options{Keys: keys{"fk-ci": "ci", "fk-burst": "burst"}, OnUsage: func(u Usage) { mu.Lock(); usages = append(usages, u); mu.Unlock() }},
		Backend{Name: "ultra/qwen3-4b", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, Addr: llama.Listener.Addr().String(), Context: 16384, Slots: 4})
	r.SetKeyLimits(map[string]fleet.KeyLimits{"ci": {TokensPerDay: 60}, "burst": {RequestsPerMinute: 3}})
	long := strings.Repeat("count these words please ", 40)
	counting := []struct{ path, body string }{
		{"/v1/messages/count_tokens", `{"model":"qwen3-4b","messages":[{"role":"user","content":"` + long + `"}]}`},
		{"/tokenize", `{"model":"qwen3-4b","content":"` + long + `"}`},
		{"/detokenize", `{"model":"qwen3-4b","tokens":[1,2,3,4,5,6,7,8]}`},
	}
	send := func(key, path, body string) (*http.Response, string) { return doKeyPath(t, srv.URL, path, key, body) }
	for _, c := range counting {
		resp, b := send("fk-ci", c.path, c.body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: HTTP %d %s", c.path, resp.StatusCode, b)
		}
		mu.Lock()
		u := usages[len(usages)-1]
		n := len(usages)
		mu.Unlock()
		if n == 0 || u.Key != "ci" || u.PromptTokens != 0 || u.CachedTokens != 0 || u.CompletionTokens != 0 {
			t.Errorf("%s: usage %+v, want a request of ci with no tokens", c.path, u)
		}
	}
	if got := len(usages); got != len(counting) {
		t.Errorf("%d usage records for %d counting requests: each is a request", got, len(counting))
	}
	chat := `{"model":"qwen3-4b","max_tokens":30,"messages":[{"role":"user","content":"` + long + `"}]}`
	resp, b := send("fk-ci", "/v1/chat/completions", chat)
	if resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-remaining-tokens") != "60" {
		t.Fatalf("ci's first generation: HTTP %d, remaining tokens %q, want 200 and all 60 (counting spent none): %s", resp.StatusCode, resp.Header.Get("x-ratelimit-remaining-tokens"), b)
	}
	if resp, _ := send("fk-ci", "/v1/chat/completions", chat); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("ci's generation past its day's tokens: HTTP %d, want 429", resp.StatusCode)
	}
	for _, c := range counting {
		if resp, b := send("fk-ci", c.path, c.body); resp.StatusCode != 200 {
			t.Errorf("%s with the day's tokens spent: HTTP %d %s, want 200 (it spends none)", c.path, resp.StatusCode, b)
		}
	}
	// The requests limit holds for them as for any request.
	for i := range 4 {
		resp, _ := send("fk-burst", "/tokenize", counting[1].body)
		if want := map[bool]int{true: 200, false: http.StatusTooManyRequests}[i < 3]; resp.StatusCode != want {
			t.Errorf("burst's /tokenize %d: HTTP %d, want %d", i+1, resp.StatusCode, want)
		}
	}
}
