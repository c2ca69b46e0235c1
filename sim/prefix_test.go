package sim

import (
	"fmt"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestTokenizeKeepsPrefixes(t *testing.T) {
	a := strings.Repeat("system prompt and tools. ", 40)
	b := a + "the next user turn"
	ta, tb := tokenize(a), tokenize(b)
	if len(ta) != promptTokens(a) || len(tb) != promptTokens(b) {
		t.Errorf("token counts %d, %d; promptTokens says %d, %d", len(ta), len(tb), promptTokens(a), promptTokens(b))
	}
	// len(a) is a multiple of 4, so a's tokens are all a prefix of b's.
	if got := commonPrefix(ta, tb); got != len(ta) {
		t.Errorf("common prefix %d of %d tokens", got, len(ta))
	}
	if got := commonPrefix(tokenize("x"+a), ta); got != 0 {
		t.Errorf("a shifted text shares %d tokens", got)
	}
	if len(tokenize("")) != 1 {
		t.Error("an empty prompt is not one token")
	}
}

// usageOf reads cache_n, prompt_n (llama timings) and cached_tokens.
func cacheFields(t *testing.T, resp map[string]any) (cacheN, promptN, cached, prompt int) {
	t.Helper()
	tm, _ := resp["timings"].(map[string]any)
	u, _ := resp["usage"].(map[string]any)
	d, _ := u["prompt_tokens_details"].(map[string]any)
	num := func(m map[string]any, k string) int {
		v, ok := m[k].(float64)
		if !ok {
			return -1
		}
		return int(v)
	}
	return num(tm, "cache_n"), num(tm, "prompt_n"), num(d, "cached_tokens"), num(u, "prompt_tokens")
}

// conversation renders a growing agent session: a system prompt, then
// turns of user text and the previous answers.
func conversation(system string, turns ...string) []any {
	msgs := []any{map[string]any{"role": "system", "content": system}}
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": t})
	}
	return msgs
}

func TestLlamaPromptCacheReuse(t *testing.T) {
	_, ts := startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b --metrics -np 1")
	url := ts.URL + "/v1/chat/completions"
	prompt := strings.Repeat("A repeated prompt of some length. ", 15) // 510 bytes
	code, first := post(t, url, chat(prompt, map[string]any{"max_tokens": 4}))
	if code != 200 {
		t.Fatal(code)
	}
	n := promptTokens(prompt)
	if c, p, ct, pt := cacheFields(t, first); c != 0 || p != n || ct != 0 || pt != n {
		t.Errorf("first request: cache_n %d prompt_n %d cached_tokens %d prompt_tokens %d, want 0 %d 0 %d", c, p, ct, pt, n, n)
	}
	// The same prompt again: everything but the last token is reused, as a
	// real llama-server answers (126 tokens: cache_n 125, prompt_n 1).
	_, again := post(t, url, chat(prompt, map[string]any{"max_tokens": 4}))
	if c, p, ct, pt := cacheFields(t, again); c != n-1 || p != 1 || ct != n-1 || pt != n {
		t.Errorf("repeat: cache_n %d prompt_n %d cached_tokens %d prompt_tokens %d, want %d 1 %d %d", c, p, ct, pt, n-1, n-1, n)
	}
	// The streamed usage chunk says the same.
	chunks, _ := stream(t, url, chat(prompt, map[string]any{"max_tokens": 4, "stream_options": map[string]any{"include_usage": true}}))
	last := chunks[len(chunks)-1]
	if c, p, ct, _ := cacheFields(t, last); c != n-1 || p != 1 || ct != n-1 {
		t.Errorf("streamed repeat: cache_n %d prompt_n %d cached_tokens %d", c, p, ct)
	}
	// /slots shows the idle slot holding the prompt and its answer (its
	// per-request figures reset on release, as on the real server).
	_, slots := getJSON(t, ts.URL+"/slots")
	s0 := slots.([]any)[0].(map[string]any)
	if held, _ := s0["n_prompt_tokens"].(float64); int(held) <= n || s0["n_prompt_tokens_cache"] != 0.0 || s0["n_prompt_tokens_processed"] != 0.0 {
		t.Errorf("/slots: %v", s0)
	}
	_, text := getText(t, ts.URL+"/metrics")
	for _, want := range []string{
		fmt.Sprintf("llamacpp:prompt_tokens_cached_total %d\n", 2*(n-1)),
		fmt.Sprintf("llamacpp:prompt_tokens_total %d\n", n+2),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestLlamaConversationGrows(t *testing.T) {
	_, ts := startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b -np 2")
	url := ts.URL + "/v1/chat/completions"
	system := strings.Repeat("You are a coding agent with tools. ", 30)
	turn := func(msgs []any) (map[string]any, string) {
		code, resp := post(t, url, map[string]any{"model": "q", "max_tokens": 12, "messages": msgs,
			"chat_template_kwargs": map[string]any{"enable_thinking": false}})
		if code != 200 {
			t.Fatal(code, resp)
		}
		return resp, message(t, resp)["content"].(string)
	}
	// Two sessions interleave on two slots: each turn lands on the slot
	// holding its session (llama-server's choice by similarity).
	r1a, ans1a := turn(conversation(system+"session A", "read main.go"))
	turn(conversation(strings.Repeat("Another agent, another prompt. ", 30), "list files"))
	msgs := conversation(system+"session A", "read main.go", ans1a, "tool result: 400 lines of code")
	r2a, _ := turn(msgs)
	c, p, _, pt := cacheFields(t, r2a)
	_, _, _, pt1 := cacheFields(t, r1a)
	// The whole first turn and its answer are reused, but for the chunk
	// where the answer ended and the new message begins.
	if c < pt1 || c >= pt || c+p != pt {
		t.Errorf("second turn of A: cache_n %d prompt_n %d of %d tokens; the first turn had %d", c, p, pt, pt1)
	}
}

func TestLlamaHostCacheKeepsEvictedPrompts(t *testing.T) {
	for _, tt := range []struct {
		name     string
		args     string
		wantHits bool
	}{
		// One slot: B replaces A in the slot, but A's tokens wait in the
		// host-RAM cache and come back for A's next turn.
		{"default cache-ram", "-np 1", true},
		{"cache-ram off", "-np 1 --cache-ram 0", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, ts := startSim(t, "--mimic llamacpp --profile instant -- -a qwen3-4b "+tt.args)
			url := ts.URL + "/v1/chat/completions"
			a := strings.Repeat("Apple pie. ", 60)
			b := strings.Repeat("Berry tart ", 60)
			post(t, url, chat(a, map[string]any{"max_tokens": 2}))
			post(t, url, chat(b, map[string]any{"max_tokens": 2}))
			_, resp := post(t, url, chat(a, map[string]any{"max_tokens": 2}))
			c, _, _, pt := cacheFields(t, resp)
			if tt.wantHits && c != pt-1 {
				t.Errorf("A after B: cache_n %d of %d, want %d from the host cache", c, pt, pt-1)
			}
			if !tt.wantHits && c != 0 {
				t.Errorf("A after B without a host cache: cache_n %d, want 0", c)
			}
		})
	}
}

func TestLlamaHostCacheIsBounded(t *testing.T) {
	// 100 bytes a token, 1 MiB: 10,485 tokens. Prompts of 4,000 tokens: two
	// fit, a third evicts the oldest.
	c := newLlamaCache(1, 1, 100, 0.10, true, true)
	prompt := func(tag string) []uint64 { return tokenize(strings.Repeat(tag, 4000)) }
	a, b, d := prompt("aaaa"), prompt("bbbb"), prompt("dddd")
	for _, p := range [][]uint64{a, b, d} {
		c.pc.Save(p)
	}
	held := func(c *llamaCache) (n int, bytes uint64) {
		for _, p := range c.pc.Host() {
			n, bytes = n+1, bytes+uint64(len(p))*100
		}
		return n, bytes
	}
	if n, bytes := held(c); n != 2 || bytes > mib {
		t.Fatalf("%d prompts, %d bytes held; want 2 within 1 MiB", n, bytes)
	}
	if got := c.pc.Host()[0]; commonPrefix(got, b) != len(b) {
		t.Error("the oldest prompt (a) was not the one evicted")
	}
	// A prompt larger than the whole cache is not stored.
	c.pc.Save(tokenize(strings.Repeat("e", 4*20000)))
	if n, _ := held(c); n != 2 {
		t.Errorf("an oversized prompt changed the cache: %d entries", n)
	}
	// Unlimited (-1) keeps everything.
	u := newLlamaCache(1, -1, 100, 0.10, true, true)
	for _, p := range [][]uint64{a, b, d} {
		u.pc.Save(p)
	}
	if n, _ := held(u); n != 3 {
		t.Errorf("unlimited cache holds %d", n)
	}
}

func TestVLLMPrefixCache(t *testing.T) {
	for _, tt := range []struct {
		name    string
		args    string
		details bool
	}{
		{"with --enable-prompt-tokens-details", "--enable-prompt-tokens-details", true},
		{"without", "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, ts := startSim(t, "--mimic vllm --profile instant -- serve qwen3-4b "+tt.args)
			url := ts.URL + "/v1/chat/completions"
			prompt := strings.Repeat("A shared prefix for the block cache. ", 20) // 740 bytes, 185 tokens
			n := promptTokens(prompt)
			post(t, url, chat(prompt, map[string]any{"max_tokens": 3}))
			_, resp := post(t, url, chat(prompt, map[string]any{"max_tokens": 3}))
			u := resp["usage"].(map[string]any)
			// Whole 16-token blocks of the first n-1 tokens.
			want := (n - 1) / vllmBlockSize * vllmBlockSize
			switch d := u["prompt_tokens_details"].(type) {
			case map[string]any:
				if !tt.details || d["cached_tokens"] != float64(want) {
					t.Errorf("prompt_tokens_details %v, want cached_tokens %d (details on: %v)", d, want, tt.details)
				}
			case nil:
				if tt.details {
					t.Error("no prompt_tokens_details with --enable-prompt-tokens-details")
				}
			}
			_, text := getText(t, ts.URL+"/metrics")
			for _, w := range []string{
				fmt.Sprintf(`vllm:prefix_cache_queries_total{model_name="qwen3-4b",engine="0"} %d`, 2*n),
				fmt.Sprintf(`vllm:prefix_cache_hits_total{model_name="qwen3-4b",engine="0"} %d`, want),
			} {
				if !strings.Contains(text, w) {
					t.Errorf("/metrics lacks %q", w)
				}
			}
		})
	}
}

func TestVLLMBlockCacheLRU(t *testing.T) {
	// Room for 4 blocks of 16 tokens.
	b := newBlockCache(64, true)
	seq := func(tag string, n int) []uint64 { return tokenize(strings.Repeat(tag, n)) }
	a := seq("aaaa", 33) // 33 tokens: 2 full blocks
	c := seq("cccc", 33)
	d := seq("dddd", 33)
	for _, p := range [][]uint64{a, c} {
		got, pinned := b.start(p)
		pinned = b.prefilled(p, pinned)
		b.finish(p, pinned)
		if got != 0 {
			t.Errorf("cold start hit %d", got)
		}
	}
	if hit, pinned := b.start(a); hit != 32 {
		t.Errorf("a again: %d cached, want 32", hit)
	} else {
		b.finish(a, b.prefilled(a, pinned))
	}
	// d needs 2 blocks: the least recently used (c's) go, a's stay.
	_, pinned := b.start(d)
	b.finish(d, b.prefilled(d, pinned))
	if b.size() != 4 {
		t.Errorf("%d blocks held, capacity 4", b.size())
	}
	if hit, p := b.start(c); hit != 0 {
		t.Errorf("c was evicted but hit %d", hit)
	} else {
		b.finish(nil, p)
	}
	if hit, p := b.start(a); hit != 32 {
		t.Errorf("a was used more recently than c but hit %d", hit)
	} else {
		b.finish(nil, p)
	}
	// Pinned blocks are not evicted while a request runs.
	hit, p := b.start(a)
	p = b.prefilled(a, p)
	for _, s := range []string{"eeee", "ffff", "gggg"} {
		x := seq(s, 33)
		_, q := b.start(x)
		b.finish(x, b.prefilled(x, q))
	}
	if again, q := b.start(a); again != hit {
		t.Errorf("a's pinned blocks were evicted: %d cached, was %d", again, hit)
	} else {
		b.finish(nil, q)
	}
	b.finish(a, p)
}

func TestPrefillModel(t *testing.T) {
	for _, tt := range []struct {
		profile string
		tokens  int
		want    time.Duration
	}{
		// The first field report's short prompts (45 tokens) keep their prefill:
		// 250 tok/s on the M1 Ultra, 590 on the M4 Max, 50 on the 27B.
		{"m1ultra-llamacpp", 45, 180 * time.Millisecond},
		{"m4max-llamacpp", 45, 76 * time.Millisecond},
		{"m1ultra-27b-starved", 45, 900 * time.Millisecond},
		{"rtx3060-vllm", 45, 11 * time.Millisecond},
		// The second field report: about 10 s TTFT for its 4.6K-token agent prompts
		// on a 27B at concurrency 1.
		{"m1ultra-27b-starved", 4600, 10 * time.Second},
	} {
		p, err := LookupProfile(tt.profile)
		if err != nil {
			t.Fatal(err)
		}
		got := p.PrefillDelay(tt.tokens)
		if r := float64(got) / float64(tt.want); math.Abs(r-1) > 0.1 {
			t.Errorf("%s, %d tokens: prefill %v, want about %v", tt.profile, tt.tokens, got, tt.want)
		}
	}
	// A long prompt is dominated by the rate, not the fixed cost: 4.6K
	// tokens on the M1 Ultra take well under the 18 s that 250 tok/s gave.
	p, _ := LookupProfile("m1ultra-llamacpp")
	if d := p.PrefillDelay(4600); d > 4*time.Second {
		t.Errorf("M1 Ultra 4.6K prefill %v: the short-prompt rate is still applied to long prompts", d)
	}
}

// TestPrefillOnlyUncached: the prefill time a llama mimic reports (and
// sleeps) counts only the tokens its cache did not hold.
func TestPrefillOnlyUncached(t *testing.T) {
	prof := Profile{Name: "fast-prefill", Mimic: "llamacpp", PrefillFixed: 5 * time.Millisecond, PromptTokPerSec: 10000,
		Slots: 1, KVCacheTokens: 65536, KVBytesPerToken: 1000}
	srv, err := NewServer(Options{Mimic: "llamacpp", Profile: prof, ServedNames: []string{"q"}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptestServer(t, srv)
	prompt := strings.Repeat("0123456789abcdef", 500) // 2,000 tokens
	_, first := post(t, ts+"/v1/chat/completions", chat(prompt, map[string]any{"max_tokens": 1}))
	_, again := post(t, ts+"/v1/chat/completions", chat(prompt, map[string]any{"max_tokens": 1}))
	ms := func(r map[string]any) float64 { return r["timings"].(map[string]any)["prompt_ms"].(float64) }
	if got := ms(first); math.Abs(got-205) > 1 {
		t.Errorf("first prefill %.1f ms, want 5 + 2000/10000 s = 205 ms", got)
	}
	if got := ms(again); math.Abs(got-5.1) > 0.5 {
		t.Errorf("cached prefill %.1f ms, want the fixed 5 ms and one token", got)
	}
}

func httptestServer(t *testing.T, srv *Server) string {
	t.Helper()
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}

func TestCacheFlags(t *testing.T) {
	for _, tt := range []struct {
		args, want string
	}{
		{"--mimic llamacpp --profile instant -- --cache-ram -5", "not a size in MiB"},
		{"--mimic llamacpp --profile instant -- -cram lots", "not a size in MiB"},
		{"--mimic llamacpp --profile instant -- --slot-prompt-similarity 1.5", "between 0 and 1"},
	} {
		if _, err := ParseArgs(strings.Fields(tt.args)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want %q", tt.args, err, tt.want)
		}
	}
	// vLLM with prefix caching off reuses nothing.
	_, ts := startSim(t, "--mimic vllm --profile instant -- serve qwen3-4b --no-enable-prefix-caching --enable-prompt-tokens-details")
	prompt := strings.Repeat("no cache here ", 40)
	post(t, ts.URL+"/v1/chat/completions", chat(prompt, map[string]any{"max_tokens": 2}))
	_, resp := post(t, ts.URL+"/v1/chat/completions", chat(prompt, map[string]any{"max_tokens": 2}))
	if d := resp["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any); d["cached_tokens"] != 0.0 {
		t.Errorf("prefix caching off, yet cached_tokens %v", d["cached_tokens"])
	}
	// Similarity 0 turns the choice by similarity off: slots go by LRU.
	_, ts = startSim(t, "--mimic llamacpp --profile instant -- -np 2 --slot-prompt-similarity 0 --cache-ram 0")
	a := strings.Repeat("first prompt ", 40)
	post(t, ts.URL+"/v1/chat/completions", chat(a, map[string]any{"max_tokens": 2}))
	post(t, ts.URL+"/v1/chat/completions", chat(strings.Repeat("other words ", 40), map[string]any{"max_tokens": 2}))
	post(t, ts.URL+"/v1/chat/completions", chat(strings.Repeat("third thing ", 40), map[string]any{"max_tokens": 2}))
	// a's slot was the least recently used and went to the third prompt.
	_, resp = post(t, ts.URL+"/v1/chat/completions", chat(a, map[string]any{"max_tokens": 2}))
	if c, _, _, _ := cacheFields(t, resp); c != 0 {
		t.Errorf("LRU slot choice kept a's prompt: cache_n %d", c)
	}
}
