package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	v, rv := r.limits.Admit("alice", time.Now(), true, 0)
	r.limits.Settle(rv)
	if got := v.Header.Get("x-ratelimit-remaining-tokens"); got == "1000000" {
		t.Errorf("remaining tokens %s: the left stream was not spent against the key", got)
	}
}

// An engine that makes every token a request allows: its usage reports
// max_tokens of completion. It holds each request until release closes,
// and tells arrived of each; "fail" in the body gets a 500.
func allowanceEngine(arrived chan<- struct{}, release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		var body struct {
			MaxTokens int `json:"max_tokens"`
		}
		raw, _ := io.ReadAll(req.Body)
		_ = json.Unmarshal(raw, &body)
		arrived <- struct{}{}
		if strings.Contains(string(raw), "fail") {
			http.Error(w, "engine failed", http.StatusInternalServerError)
			return
		}
		select {
		case <-release:
		case <-req.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}}`,
			body.MaxTokens, body.MaxTokens+5)
	}
}

// Ten parallel requests of 1,000 tokens each on a key with 2,000 tokens a
// day: each reserves its max_tokens when admitted, so the burst crosses the
// day's limit by one request at most (before, all ten were admitted against
// an unspent day and 10,070 tokens were served). The refused ones are told
// the rest is reserved by requests in flight, not that the day is spent.
func TestParallelRequestsCannotCrossTheTokenLimit(t *testing.T) {
	arrived, release := make(chan struct{}, 64), make(chan struct{})
	_, b := startBackend(t, "ultra/qwen3-4b", 16, allowanceEngine(arrived, release))
	var spent atomic.Int64
	r, rsrv := startRouter(t, Options{Keys: keys{"sk-a": "alice"}, OnUsage: func(u Usage) {
		spent.Add(int64(u.PromptTokens + u.CompletionTokens))
	}}, b)
	const limit, maxTokens, burst = 2000, 1000, 10
	r.SetKeyLimits(map[string]fleet.KeyLimits{"alice": {TokensPerDay: limit}})
	body := fmt.Sprintf(`{"model":"qwen3-4b","max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens)

	type answer struct {
		status int
		body   string
	}
	answers := make(chan answer, burst)
	for range burst {
		go func() {
			resp, raw := doKey(t, rsrv.URL, "sk-a", body)
			answers <- answer{resp.StatusCode, raw}
		}()
	}
	// Every request either reached the engine (held there) or was refused.
	var got []answer
	reached := 0
	guard := time.After(hangGuard)
	for reached+len(got) < burst {
		select {
		case <-arrived:
			reached++
		case a := <-answers:
			got = append(got, a)
		case <-guard:
			t.Fatalf("%d requests reached the engine and %d were answered of %d", reached, len(got), burst)
		}
	}
	close(release)
	for len(got) < burst {
		got = append(got, <-answers)
	}
	served := 0
	for _, a := range got {
		switch {
		case a.status == http.StatusOK:
			served++
		case a.status == http.StatusTooManyRequests:
			if !strings.Contains(a.body, "reserved by its requests in flight") {
				t.Errorf("a burst's refusal says %s; want that the rest is reserved by requests in flight", a.body)
			}
		default:
			t.Errorf("status %d: %s", a.status, a.body)
		}
	}
	t.Logf("%d parallel requests of %d tokens on %d a day: %d served, %d tokens spent", burst, maxTokens, limit, served, spent.Load())
	oneRequest := int64(maxTokens + 5)
	if n := spent.Load(); n > limit+oneRequest || served == 0 {
		t.Errorf("%d parallel requests on %d tokens a day: %d served, %d tokens spent; want at most the limit plus one request (%d)",
			burst, limit, served, n, limit+oneRequest)
	}
}

// A reservation is given back however its request ends: a client that
// hangs up while its request is at the engine, or an engine that fails,
// frees the tokens it held for the key's next request.
func TestTokenReservationSettledOnFailureAndDisconnect(t *testing.T) {
	arrived, release := make(chan struct{}, 8), make(chan struct{})
	_, b := startBackend(t, "ultra/qwen3-4b", 4, allowanceEngine(arrived, release))
	r, rsrv := startRouter(t, Options{Keys: keys{"sk-a": "alice"}, MaxRetries: -1}, b)
	r.SetKeyLimits(map[string]fleet.KeyLimits{"alice": {TokensPerDay: 1000}})
	long := `{"model":"qwen3-4b","max_tokens":1400,"messages":[{"role":"user","content":"hi"}]}`

	ctx, cancel := context.WithCancel(t.Context())
	left := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rsrv.URL+"/v1/chat/completions", strings.NewReader(long))
		req.Header.Set("Authorization", "Bearer sk-a")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		left <- err
	}()
	select {
	case <-arrived:
	case <-time.After(hangGuard):
		t.Fatal("the first request never reached the engine")
	}
	// While it is held, it reserves the whole day: no room for another. (A
	// request admitted would wait at the engine: the client gives up.)
	second, err := http.NewRequest(http.MethodPost, rsrv.URL+"/v1/chat/completions", strings.NewReader(long))
	if err != nil {
		t.Fatal(err)
	}
	second.Header.Set("Authorization", "Bearer sk-a")
	resp, err := (&http.Client{Timeout: hangGuard}).Do(second)
	if err != nil {
		t.Fatalf("a second request while the first holds the day was admitted and held at the engine (%v); want 429", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a second request while the first holds the day: %d, want 429", resp.StatusCode)
	}
	cancel()
	<-left
	// The hung-up request's reservation is given back as its handler ends,
	// which may be a moment after the client saw its connection close: until
	// then the next request is refused, after it the engine takes it.
	failing := `{"model":"qwen3-4b","max_tokens":1400,"messages":[{"role":"user","content":"fail"}]}`
	deadline := time.Now().Add(hangGuard)
	for {
		resp, body := doKey(t, rsrv.URL, "sk-a", failing)
		if resp.StatusCode == http.StatusTooManyRequests && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		// The engine failing gives its reservation back too (below).
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("a request the engine fails, once the hung-up one had ended: %d %s, want 502", resp.StatusCode, body)
		}
		break
	}
	<-arrived
	close(release)
	// The failed request's reservation is given back as its handler ends.
	deadline = time.Now().Add(hangGuard)
	for {
		resp, body := doKey(t, rsrv.URL, "sk-a", long)
		if resp.StatusCode == http.StatusOK {
			break
		}
		if resp.StatusCode != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("after the first request was left and the second failed: %d %s, want 200", resp.StatusCode, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Refusals are counted under the model the request named, so that a
// dashboard's 429s and 401s by model name one: a key's limit (counted with
// model="" before) and a missing or wrong key (not counted at all before).
// A name the fleet does not serve is counted as unknownModel, whatever it
// is, and so is a request whose body names none.
func TestRefusalsCountedByModel(t *testing.T) {
	_, b := startBackend(t, "ultra/qwen3-4b", 4, okJSON)
	r, rsrv := startRouter(t, Options{Keys: keys{"sk-a": "alice", "sk-c": "carol"}}, b)
	r.SetKeyLimits(map[string]fleet.KeyLimits{"alice": {RequestsPerMinute: 1}})
	for _, c := range []struct {
		key, body string
		want      int
	}{
		{"", `{"model":"qwen3","messages":[]}`, http.StatusUnauthorized},
		{"sk-wrong", `{"messages":[{"role":"user","content":"hi"}],"stream":false,"model":"qwen3-4b"}`, http.StatusUnauthorized},
		{"sk-wrong", `{"model":"made-up-1"}`, http.StatusUnauthorized},
		{"sk-wrong", `not json`, http.StatusUnauthorized},
		{"sk-a", `{"model":"qwen3-4b"}`, http.StatusOK},
		{"sk-a", `{"model":"qwen3"}`, http.StatusTooManyRequests},
	} {
		if resp, body := doKey(t, rsrv.URL, c.key, c.body); resp.StatusCode != c.want {
			t.Fatalf("key %q body %s: %d %s, want %d", c.key, c.body, resp.StatusCode, body, c.want)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, rsrv.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer sk-c")
	got := map[string]float64{}
	for _, s := range scrapeValues(t, req)["fleet_router_requests_total"] {
		if st := s.labels["status"]; st != "200" {
			got[s.labels["model"]+" "+st] += s.value
		}
	}
	want := map[string]float64{"qwen3-4b 401": 2, unknownModel + " 401": 2, "qwen3-4b 429": 1}
	if !maps.Equal(got, want) {
		t.Errorf("refusals by model and status = %v, want %v", got, want)
	}
}
