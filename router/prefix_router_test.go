package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// cachingEngine answers chat completions and reports, as llama-server does,
// how much of each prompt its one slot already held: the common prefix of
// this body's messages with the last one's, at the router's 4 bytes a token. gate, when
// set, holds every answer until it is closed.
type cachingEngine struct {
	mu    sync.Mutex
	last  string
	calls int
	gate  chan struct{}
}

func (e *cachingEngine) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var wr struct {
		Messages json.RawMessage `json:"messages"`
	}
	_ = json.Unmarshal(body, &wr)
	prompt := string(wr.Messages)
	e.mu.Lock()
	e.calls++
	common := 0
	for common < len(prompt) && common < len(e.last) && prompt[common] == e.last[common] {
		common++
	}
	e.last = prompt
	gate := e.gate
	e.mu.Unlock()
	if gate != nil {
		<-gate
	}
	// Tokens counted as the router estimates them, and 1 ms each to
	// prefill, so that two workers that served different prompts have
	// learned the same speed.
	tokens, cached := (len(prompt)+bytesPerToken-1)/bytesPerToken, common/bytesPerToken
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":%d,"completion_tokens":2,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}},"timings":{"cache_n":%d,"prompt_n":%d,"prompt_ms":%d}}`,
		tokens, tokens+2, cached, cached, tokens-cached, tokens-cached)
}

func (e *cachingEngine) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}

func conversation(session string, turns int) string {
	msgs := []string{`{"role":"system","content":"` + strings.Repeat("agent instructions "+session+" ", 400) + `"}`}
	for i := range turns {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"%s"}`, strings.Repeat(fmt.Sprintf("tool result %d ", i), 200)))
	}
	return `{"model":"qwen3-4b","max_tokens":2,"messages":[` + strings.Join(msgs, ",") + `]}`
}

// A conversation's next turn goes back to the worker that holds it under
// fleet, and to the first idle worker under fleet-no-prefix; the engine's
// cached_tokens report reaches the index, and a restarted worker's index is
// cleared.
func TestRouterRoutesTurnsToTheirPrefix(t *testing.T) {
	for _, tc := range []struct {
		policy     string
		wantSecond bool // turn 2 on the worker that served turn 1
	}{{PolicyFleet, true}, {PolicyFleetNoPrefix, false}} {
		t.Run(tc.policy, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			a, b := &cachingEngine{gate: make(chan struct{})}, &cachingEngine{}
			_, ba := startBackend(t, "a/qwen3-4b", 1, a.serve)
			_, bb := startBackend(t, "b/qwen3-4b", 1, b.serve)
			r, rsrv := startRouter(t, Options{Policy: tc.policy, Seed: 1}, ba, bb)
			for _, name := range []string{ba.Name, bb.Name} {
				r.SeedSpeed(name, SpeedPoint{Concurrency: 1, TTFT: 20 * time.Millisecond, ITL: 5 * time.Millisecond, PrefillTokPerSec: 1000})
			}
			// a is busy with another request: turn 1 goes to b.
			busy := make(chan struct{})
			go func() {
				defer close(busy)
				resp := post(t, ctx, rsrv.URL, conversation("other", 1))
				resp.Body.Close()
			}()
			for a.count() == 0 {
				time.Sleep(5 * time.Millisecond)
			}
			resp := post(t, ctx, rsrv.URL, conversation("s", 1))
			resp.Body.Close()
			if b.count() != 1 {
				t.Fatalf("turn 1 did not go to the idle worker b")
			}
			close(a.gate)
			<-busy
			resp = post(t, ctx, rsrv.URL, conversation("s", 2))
			resp.Body.Close()
			if got := b.count() == 2; got != tc.wantSecond {
				t.Errorf("turn 2 on b (the worker holding turn 1): %v, want %v", got, tc.wantSecond)
			}
			r.pool.mu.Lock()
			wb := r.pool.workerLocked(bb.Name)
			ratio, ok := wb.prefix.HitRatio()
			held := wb.prefix.Len()
			r.pool.mu.Unlock()
			if tc.wantSecond && (!ok || ratio < 0.3) {
				t.Errorf("b's reported hit ratio %.2f (%v), want the second turn's reuse counted", ratio, ok)
			}
			if held == 0 {
				t.Fatal("b's prefix index is empty after serving a conversation")
			}
			// What the console and workers --json show.
			for _, st := range r.Stats() {
				if st.Name == bb.Name && (!st.CacheHitKnown || st.CacheHit != ratio) {
					t.Errorf("b's stats show cache hit %.2f (%v), want the engine-reported %.2f", st.CacheHit, st.CacheHitKnown, ratio)
				}
			}
			// b restarts on another port: its cache, and the index, are gone.
			bb.Addr = "127.0.0.1:1"
			r.SetBackends([]Backend{ba, bb})
			r.pool.mu.Lock()
			held = r.pool.workerLocked(bb.Name).prefix.Len()
			r.pool.mu.Unlock()
			if held != 0 {
				t.Errorf("a restarted worker's index still holds %d chunks", held)
			}
		})
	}
}

func TestMeterReadsPromptCache(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name string
		sse  bool
		body string
		want promptCache
	}{
		{"llama streamed", true,
			"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
				"data: {\"choices\":[{\"finish_reason\":\"stop\",\"delta\":{}}],\"timings\":{\"cache_n\":125,\"prompt_n\":1,\"prompt_ms\":12.5}}\n\n" +
				"data: {\"choices\":[],\"usage\":{\"completion_tokens\":1,\"prompt_tokens\":126,\"prompt_tokens_details\":{\"cached_tokens\":125}}}\n\ndata: [DONE]\n\n",
			promptCache{126, 125, 1, 12.5}},
		{"vllm plain", false,
			`{"choices":[],"usage":{"prompt_tokens":900,"total_tokens":910,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":880}}}`,
			promptCache{900, 880, -1, -1}},
		{"vllm without details", false,
			`{"choices":[],"usage":{"prompt_tokens":900,"total_tokens":910,"completion_tokens":10,"prompt_tokens_details":null}}`,
			promptCache{900, -1, -1, -1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newMeter(tc.sse)
			m.feed([]byte(tc.body), now)
			if got := m.promptCache(); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The prefill rate learned from llama-server's timings is per engine token,
// but the scheduler multiplies it by its own estimate of the prompt (4 bytes
// a token). An engine whose tokenizer counts otherwise (the tests' byte-level
// model: one token a byte) must still be predicted to take the prefill time
// it reported for the prompt, not a quarter of it: the prefix a worker holds
// is worth exactly that time to the fleet policy.
func TestRouterLearnsPrefillInItsOwnTokens(t *testing.T) {
	const msPerEngineToken = 0.25
	for _, bytesPerEngineToken := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("%d bytes a token", bytesPerEngineToken), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			reported := make(chan float64, 1)
			_, b := startBackend(t, "a/qwen3-4b", 1, func(w http.ResponseWriter, req *http.Request) {
				body, _ := io.ReadAll(req.Body)
				var wr struct {
					Messages json.RawMessage `json:"messages"`
				}
				_ = json.Unmarshal(body, &wr)
				n := len(wr.Messages) / bytesPerEngineToken
				ms := float64(n) * msPerEngineToken
				reported <- ms
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":%d,"completion_tokens":2,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}},"timings":{"cache_n":0,"prompt_n":%d,"prompt_ms":%.1f}}`,
					n, n+2, n, ms)
			})
			r, rsrv := startRouter(t, Options{Policy: PolicyFleet, Seed: 1}, b)
			body := conversation("s", 3)
			resp := post(t, ctx, rsrv.URL, body)
			resp.Body.Close()
			reportedMs := <-reported
			info, err := parseRequest([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			r.pool.mu.Lock()
			m := r.pool.workerLocked(b.Name).speed
			predicted := float64(info.PromptTokens) * m.prefillMs(1)
			r.pool.mu.Unlock()
			if predicted < 0.9*reportedMs || predicted > 1.1*reportedMs {
				t.Errorf("predicted prefill of the prompt (%d tokens by the router's estimate) %.0f ms, the engine took %.0f ms", info.PromptTokens, predicted, reportedMs)
			}
		})
	}
}
