package router

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestLongPromptsGoOnlyWhereTheyFit: two workers of one model, one placed
// with a smaller context; a prompt that needs more than the small one holds
// goes only to the large one, a short one may go to either, and one that
// fits neither gets a 400 that gives the sizes.
func TestLongPromptsGoOnlyWhereTheyFit(t *testing.T) {
	var bigHits, smallHits atomic.Int64
	count := func(n *atomic.Int64) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { n.Add(1); okJSON(w, r) }
	}
	_, big := startBackend(t, "rig/qwen3-4b", 4, count(&bigHits))
	_, small := startBackend(t, "max/qwen3-4b", 4, count(&smallHits))
	big.Context, small.Context = 16384, 2048
	_, srv := startRouter(t, Options{Policy: PolicyRoundRobin}, big, small)

	// ~3000 tokens of prompt at the router's 4 bytes a token, + 100 out.
	long := `{"model":"qwen3-4b","max_tokens":100,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 2400) + `"}]}`
	for range 6 {
		resp := post(t, t.Context(), srv.URL, long)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("long prompt: status %d", resp.StatusCode)
		}
	}
	if bigHits.Load() != 6 || smallHits.Load() != 0 {
		t.Errorf("6 prompts of ~3100 tokens: %d to the 16384 worker, %d to the 2048 one; want all to the large one", bigHits.Load(), smallHits.Load())
	}
	short := `{"model":"qwen3-4b","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	for range 4 {
		resp := post(t, t.Context(), srv.URL, short)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if smallHits.Load() == 0 {
		t.Errorf("short prompts never reached the small-context worker under round-robin (%d to the large)", bigHits.Load())
	}

	resp := post(t, t.Context(), srv.URL, `{"model":"qwen3-4b","max_tokens":20000,"messages":[{"role":"user","content":"hi"}]}`)
	defer resp.Body.Close()
	var body struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusBadRequest || body.Error.Code != codeContextTooLong ||
		!strings.Contains(body.Error.Message, "max_tokens 20000") || !strings.Contains(body.Error.Message, "the largest context is 16384") {
		t.Errorf("a request no worker holds: %d %+v; want 400 %s giving the request's and the largest worker's sizes", resp.StatusCode, body.Error, codeContextTooLong)
	}
}

// A max_tokens of 2^63-1 (or any that, added to the prompt, passes the
// largest int) is refused as too long, in the endpoint's own error shape,
// and reaches no engine: the sum wrapped negative before and fitted every
// worker, whose engine then planned an endless answer (issue 19).
func TestHugeMaxTokensDoesNotOverflowTheContextCheck(t *testing.T) {
	var hits atomic.Int64
	_, b := startBackend(t, "rig/qwen3-4b", 4, func(w http.ResponseWriter, r *http.Request) { hits.Add(1); okJSON(w, r) })
	_, srv := startRouter(t, Options{}, b)
	for _, tc := range []struct {
		name, path, body string
		anthropic        bool
	}{
		{"chat max_tokens 2^63-1", "/v1/chat/completions",
			`{"model":"qwen3-4b","max_tokens":9223372036854775807,"messages":[{"role":"user","content":"hi"}]}`, false},
		{"chat max_completion_tokens 2^63-2", "/v1/chat/completions",
			`{"model":"qwen3-4b","max_completion_tokens":9223372036854775806,"messages":[{"role":"user","content":"hi"}]}`, false},
		{"completions", "/v1/completions", `{"model":"qwen3-4b","max_tokens":9223372036854775807,"prompt":"hi"}`, false},
		{"anthropic messages", "/v1/messages",
			`{"model":"qwen3-4b","max_tokens":9223372036854775807,"messages":[{"role":"user","content":"hi"}]}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", resp.StatusCode, raw)
			}
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatalf("error body is not JSON: %s", raw)
			}
			if tc.anthropic {
				if e.Type != "error" || e.Error.Type != "invalid_request_error" {
					t.Errorf("not Anthropic's error shape: %s", raw)
				}
			} else if e.Error.Code != codeContextTooLong {
				t.Errorf("code %q, want %s: %s", e.Error.Code, codeContextTooLong, raw)
			}
			if !strings.Contains(e.Error.Message, "lower max_tokens") {
				t.Errorf("the error does not say what to do: %s", raw)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d request(s) with an impossible max_tokens reached the engine", n)
	}
}

// statusOf posts body and sends the answer's status on got.
func statusOf(t *testing.T, ctx context.Context, url, body string, got chan<- int) {
	resp := post(t, ctx, url, body)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	got <- resp.StatusCode
}

// A prompt too long for the ready workers while the large ones are only
// drained waits in the queue, as for a busy worker, and is served when one
// is undrained: a 400 context_length_exceeded there read as permanent, and
// agent clients truncated or gave up over a drain (issue 21.4). Shorter
// requests behind it are served meanwhile; one that no worker, drained or
// not, could hold is refused at once, with the largest context of all.
func TestLongPromptWaitsForADrainedWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	var bigHits, smallHits atomic.Int64
	count := func(n *atomic.Int64) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { n.Add(1); okJSON(w, r) }
	}
	_, big := startBackend(t, "rig/qwen3-4b", 4, count(&bigHits))
	_, small := startBackend(t, "max/qwen3-4b", 4, count(&smallHits))
	big.Context, small.Context = 16384, 4096
	r, srv := startRouter(t, Options{QueueTimeout: time.Hour}, big, small)
	r.Drain("rig/qwen3-4b")

	// ~6,000 tokens of prompt at the router's 4 bytes a token.
	long := `{"model":"qwen3-4b","max_tokens":100,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 4800) + `"}]}`
	got := make(chan int, 1)
	go statusOf(t, ctx, srv.URL, long, got)
	waitFor(t, func() bool {
		select {
		case status := <-got:
			t.Fatalf("a prompt only the drained worker holds got %d at once; want it to wait in the queue", status)
		default:
		}
		return r.queueLen("qwen3-4b") == 1
	})
	short := make(chan int, 1)
	go statusOf(t, ctx, srv.URL, `{"model":"qwen3-4b","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`, short)
	if status := <-short; status != http.StatusOK || smallHits.Load() != 1 {
		t.Fatalf("a short request behind the waiting long one: %d, %d on the small worker; want 200 there", status, smallHits.Load())
	}
	resp := post(t, ctx, srv.URL, `{"model":"qwen3-4b","max_tokens":20000,"messages":[{"role":"user","content":"hi"}]}`)
	if e := decodeError(t, resp); resp.StatusCode != http.StatusBadRequest || e.Error.Code == nil || *e.Error.Code != codeContextTooLong ||
		!strings.Contains(e.Error.Message, "the largest context is 16384") {
		t.Errorf("a request no worker could ever hold: %d %+v; want 400 %s naming the drained worker's 16384", resp.StatusCode, e.Error, codeContextTooLong)
	}
	r.Undrain("rig/qwen3-4b")
	if status := <-got; status != http.StatusOK || bigHits.Load() != 1 {
		t.Fatalf("the long prompt after the large worker was undrained: %d, %d on it; want 200 there", status, bigHits.Load())
	}
}

// The same for workers that are still starting: a long prompt waits for a
// coming worker whose placement holds it, and is refused at once when the
// coming workers are as small as the ready ones.
func TestLongPromptWaitsForAComingWorkerThatHoldsIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	_, big := startBackend(t, "rig/qwen3-4b", 4, okJSON)
	_, small := startBackend(t, "max/qwen3-4b", 4, okJSON)
	big.Context, small.Context = 16384, 4096
	r, srv := startRouter(t, Options{QueueTimeout: time.Hour}, small)
	long := `{"model":"qwen3-4b","max_tokens":100,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 4800) + `"}]}`

	r.SetOutlook(map[string]Outlook{"qwen3-4b": {Coming: 1, ComingContext: 4096}})
	resp := post(t, ctx, srv.URL, long)
	if e := decodeError(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Error.Message, "the largest context is 4096") {
		t.Errorf("a long prompt with only small workers, ready and coming: %d %+v; want 400 at once", resp.StatusCode, e.Error)
	}

	r.SetOutlook(map[string]Outlook{"qwen3-4b": {Coming: 1, ComingContext: 16384}})
	got := make(chan int, 1)
	go statusOf(t, ctx, srv.URL, long, got)
	waitFor(t, func() bool {
		select {
		case status := <-got:
			t.Fatalf("a prompt only the starting worker holds got %d at once; want it to wait in the queue", status)
		default:
		}
		return r.queueLen("qwen3-4b") == 1
	})
	r.SetBackendsAndOutlook([]Backend{big, small}, map[string]Outlook{"qwen3-4b": {}})
	if status := <-got; status != http.StatusOK {
		t.Fatalf("the long prompt once the large worker was ready: %d, want 200", status)
	}
}
