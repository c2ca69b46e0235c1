package router

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"fleet"
)

// doKey posts body to the router's chat completions with API key key,
// through a real HTTP client on a real socket, and returns the response
// with its body read.
func doKey(t *testing.T, url, key, body string) (*http.Response, string) {
	t.Helper()
	return doKeyPath(t, url, "/v1/chat/completions", key, body)
}

// doKeyPath is doKey to path.
func doKeyPath(t *testing.T, url, path, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(raw)
}

// Every answered request reports its key, model, worker and tokens, from
// the usage of a plain answer and of a stream's usage chunk alike; the
// token counters on /metrics (cache hits among them) add up the same.
func TestUsagePerKeyStreamedOrNot(t *testing.T) {
	_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		raw, _ := io.ReadAll(req.Body)
		if strings.Contains(string(raw), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, sseEvent("a")+sseEvent("b"))
			_, _ = io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":2,"total_tokens":52,"prompt_tokens_details":{"cached_tokens":32}}}`+"\n\ndata: [DONE]\n\n")
			return
		}
		okJSON(w, req)
	})
	var mu sync.Mutex
	var got []Usage
	_, rsrv := startRouter(t, Options{Keys: keys{"sk-a": "alice", "sk-b": "bob"}, OnUsage: func(u Usage) {
		mu.Lock()
		got = append(got, u)
		mu.Unlock()
	}}, b)
	if resp, body := doKey(t, rsrv.URL, "sk-a", `{"model":"qwen3","stream":true}`); resp.StatusCode != 200 {
		t.Fatalf("stream: %d %s", resp.StatusCode, body)
	}
	if resp, body := doKey(t, rsrv.URL, "sk-b", `{"model":"qwen3-4b"}`); resp.StatusCode != 200 {
		t.Fatalf("plain: %d %s", resp.StatusCode, body)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []Usage{
		{Key: "alice", Model: "qwen3-4b", Worker: "ultra/qwen3-4b", PromptTokens: 50, CachedTokens: 32, CompletionTokens: 2},
		{Key: "bob", Model: "qwen3-4b", Worker: "ultra/qwen3-4b", PromptTokens: 3, CachedTokens: 0, CompletionTokens: 7},
	}
	if len(got) != len(want) {
		t.Fatalf("usage reports = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].At.IsZero() {
			t.Errorf("usage %d has no time", i)
		}
		got[i].At = time.Time{}
		if got[i] != want[i] {
			t.Errorf("usage %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	req, _ := http.NewRequest(http.MethodGet, rsrv.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer sk-a")
	tokens := map[string]float64{}
	for _, s := range scrapeValues(t, req)["fleet_router_tokens_total"] {
		tokens[s.labels["type"]] += s.value
	}
	if tokens["prompt"] != 53 || tokens["cached"] != 32 || tokens["completion"] != 9 {
		t.Errorf("fleet_router_tokens_total by type = %v, want prompt 53, cached 32, completion 9", tokens)
	}
}

// A key's limits are answered with 429 and the headers OpenAI clients read
// (x-ratelimit-*, retry-after); a key without limits is not slowed, and an
// allowed request carries the remaining allowance.
func TestKeyLimitsAnswer429WithRateLimitHeaders(t *testing.T) {
	_, b := startBackend(t, "ultra/qwen3-4b", 4, okJSON)
	r, rsrv := startRouter(t, Options{Keys: keys{"sk-a": "alice", "sk-b": "bob", "sk-c": "carol"}}, b)
	r.SetKeyLimits(map[string]fleet.KeyLimits{
		"alice": {RequestsPerMinute: 2},
		"bob":   {TokensPerDay: 15},
	})
	// alice: two a minute, the third is refused.
	for i, wantRemaining := range []string{"1", "0"} {
		resp, body := doKey(t, rsrv.URL, "sk-a", `{"model":"qwen3-4b"}`)
		if resp.StatusCode != 200 {
			t.Fatalf("alice's request %d: %d %s", i+1, resp.StatusCode, body)
		}
		if h := resp.Header; h.Get("x-ratelimit-limit-requests") != "2" || h.Get("x-ratelimit-remaining-requests") != wantRemaining {
			t.Errorf("alice's request %d: limit %q remaining %q, want 2 and %s", i+1, h.Get("x-ratelimit-limit-requests"), h.Get("x-ratelimit-remaining-requests"), wantRemaining)
		}
	}
	resp, body := doKey(t, rsrv.URL, "sk-a", `{"model":"qwen3-4b"}`)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("alice's third request in a minute: %d %s, want 429", resp.StatusCode, body)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("retry-after")); err != nil || ra < 1 || ra > 30 {
		t.Errorf("retry-after %q, want 1 to 30 s (one request comes back every 30 s)", resp.Header.Get("retry-after"))
	}
	if resp.Header.Get("x-ratelimit-remaining-requests") != "0" || !strings.Contains(body, `"rate_limit_exceeded"`) || !strings.Contains(body, "2 requests a minute") {
		t.Errorf("429 headers %v body %s", resp.Header, body)
	}
	// bob: 15 tokens a day; each answer reports 10, so the second request
	// may cross the limit (it is known only after), the third is refused.
	for i := range 2 {
		if resp, body := doKey(t, rsrv.URL, "sk-b", `{"model":"qwen3-4b"}`); resp.StatusCode != 200 {
			t.Fatalf("bob's request %d: %d %s", i+1, resp.StatusCode, body)
		} else if i == 1 && resp.Header.Get("x-ratelimit-remaining-tokens") != "5" {
			t.Errorf("bob's second request: remaining tokens %q, want 5", resp.Header.Get("x-ratelimit-remaining-tokens"))
		}
	}
	resp, body = doKey(t, rsrv.URL, "sk-b", `{"model":"qwen3-4b"}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("x-ratelimit-limit-tokens") != "15" || resp.Header.Get("x-ratelimit-remaining-tokens") != "0" {
		t.Fatalf("bob past his tokens: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if ra, _ := strconv.Atoi(resp.Header.Get("retry-after")); ra < 1 || ra > 86400 {
		t.Errorf("retry-after %q, want until the next UTC day", resp.Header.Get("retry-after"))
	}
	// carol has no limits and gets no headers.
	for range 5 {
		if resp, _ := doKey(t, rsrv.URL, "sk-c", `{"model":"qwen3-4b"}`); resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-limit-requests") != "" {
			t.Fatalf("carol, without limits: %d %v", resp.StatusCode, resp.Header)
		}
	}
	// Raising alice's limit lets her in again at once; the refusals were counted.
	r.SetKeyLimits(map[string]fleet.KeyLimits{"alice": {RequestsPerMinute: 100}})
	if resp, body := doKey(t, rsrv.URL, "sk-b", `{"model":"qwen3-4b"}`); resp.StatusCode != 200 {
		t.Errorf("bob after his limit was removed: %d %s", resp.StatusCode, body)
	}
	req, _ := http.NewRequest(http.MethodGet, rsrv.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer sk-c")
	limited := map[string]float64{}
	for _, s := range scrapeValues(t, req)["fleet_router_key_limited_total"] {
		limited[s.labels["limit"]] = s.value
	}
	if limited["requests"] != 1 || limited["tokens"] != 1 {
		t.Errorf("fleet_router_key_limited_total = %v, want one of each", limited)
	}
}

// The token bucket refills at the limit's pace, and the day's tokens renew
// at the next UTC midnight.
func TestKeyLimitsRefill(t *testing.T) {
	r := &Router{}
	r.SetKeyLimits(map[string]fleet.KeyLimits{"a": {RequestsPerMinute: 60, TokensPerDay: 100}})
	now := time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC)
	r.limits.state["a"].at = now
	for i := range 60 {
		if v := r.limits.admit("a", now, true); v.limited {
			t.Fatalf("request %d of a full bucket refused", i+1)
		}
	}
	v := r.limits.admit("a", now, true)
	if !v.limited || v.which != "requests" || v.retryAfter != time.Second {
		t.Fatalf("61st request: %+v, want refused for 1 s", v)
	}
	if v := r.limits.admit("a", now.Add(time.Second), true); v.limited {
		t.Errorf("a second later one request is back, but it was refused: %+v", v)
	}
	r.limits.spend("a", 100, now)
	v = r.limits.admit("a", now.Add(10*time.Second), true)
	if !v.limited || v.which != "tokens" || v.retryAfter != 50*time.Second {
		t.Errorf("after the day's tokens: %+v, want refused until midnight (50 s)", v)
	}
	if v := r.limits.admit("a", now.Add(61*time.Second), true); v.limited {
		t.Errorf("a new UTC day, still refused: %+v", v)
	}
	r.SeedKeyTokens(now.Add(62*time.Second), map[string]int64{"a": 100, "ghost": 5})
	if v := r.limits.admit("a", now.Add(62*time.Second), true); !v.limited {
		t.Errorf("seeded with the day's tokens, admitted: %+v", v)
	}
	if _, ok := r.limits.state["ghost"]; ok {
		t.Error("a key without limits got state")
	}
}

// A stream the client leaves part way still spent the tokens the engine
// made before it noticed: they count against the key, or a client could
// read any number of tokens past its daily limit by hanging up before the
// end of each answer.
func TestUsageCountedWhenClientLeavesMidStream(t *testing.T) {
	_, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, sseEvent("a")+sseEvent("b")+sseEvent("c"))
		w.(http.Flusher).Flush()
		<-req.Context().Done() // the router hangs up when its client does
	})
	used := make(chan Usage, 1)
	r, rsrv := startRouter(t, Options{Keys: keys{"sk-a": "alice"}, OnUsage: func(u Usage) { used <- u }}, b)
	r.SetKeyLimits(map[string]fleet.KeyLimits{"alice": {TokensPerDay: 1_000_000}})
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rsrv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"qwen3-4b","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, len(sseEvent("a")))); err != nil {
		t.Fatalf("reading the first event: %v", err)
	}
	resp.Body.Close() // the client leaves
	select {
	case u := <-used:
		if u.Key != "alice" || u.CompletionTokens < 1 || u.CompletionTokens > 3 || u.PromptTokens <= 0 {
			t.Errorf("usage %+v, want alice's streamed tokens (1 to 3) and the prompt estimate", u)
		}
	case <-ctx.Done():
		t.Fatal("a stream the client left was never counted")
	}
	v := r.limits.admit("alice", time.Now(), true)
	if got := v.header.Get("x-ratelimit-remaining-tokens"); got == "1000000" {
		t.Errorf("remaining tokens %s: the left stream was not spent against the key", got)
	}
}

// The hub seeds the day's tokens from its store whenever a key's limits
// change, and the store lags the router by the usage not yet written: a
// seed lower than what the router counted today must not forget the rest.
func TestSeedKeyTokensKeepsWhatTheRouterCounted(t *testing.T) {
	r := &Router{}
	r.SetKeyLimits(map[string]fleet.KeyLimits{"a": {TokensPerDay: 1000}})
	now := time.Now()
	r.limits.spend("a", 300, now)
	r.SeedKeyTokens(now, map[string]int64{"a": 200}) // 100 still on their way to the store
	if got := r.limits.admit("a", now, true).header.Get("x-ratelimit-remaining-tokens"); got != "700" {
		t.Errorf("remaining tokens %s after a lagging seed, want 700", got)
	}
	r.SeedKeyTokens(now, map[string]int64{"a": 400}) // a restarted hub knows more
	if got := r.limits.admit("a", now, true).header.Get("x-ratelimit-remaining-tokens"); got != "600" {
		t.Errorf("remaining tokens %s after a seed above the count, want 600", got)
	}
}
