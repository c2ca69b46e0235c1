package sweep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"fleet/bench"
)

// fakeClock advances 10 ms at every reading, so stream timing is exact.
func fakeClock(start time.Time) func() time.Time {
	t := start
	return func() time.Time {
		t = t.Add(10 * time.Millisecond)
		return t
	}
}

func TestReadStream(t *testing.T) {
	const (
		role      = `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`
		reasoning = `data: {"choices":[{"index":0,"delta":{"reasoning_content":"Hmm"}}]}`
		vllmReas  = `data: {"choices":[{"index":0,"delta":{"reasoning":"Hmm"}}]}`
		content   = `data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}`
		tool      = `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}`
		text      = `data: {"choices":[{"index":0,"text":"Hi"}]}`
		usage     = `data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":5}}`
		done      = `data: [DONE]`
	)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name       string
		events     []string
		wantTTFT   time.Duration
		wantGaps   int
		wantE2E    time.Duration
		wantTokens int
		wantCount  bool
		wantErr    string
	}{
		// Clock reads: role 10, first token 20, 30, 40, usage 50, end 60.
		{"reasoning starts TTFT", []string{role, reasoning, content, content, usage, done}, ms(20), 2, ms(60), 5, false, ""},
		{"vLLM reasoning field starts TTFT", []string{role, vllmReas, content, content, usage, done}, ms(20), 2, ms(60), 5, false, ""},
		{"tool call deltas are tokens", []string{role, tool, tool, usage, done}, ms(20), 1, ms(50), 5, false, ""},
		// The router times a worker's TTFT at a completion chunk's text;
		// the bench must time it at the same event, not at the next one.
		{"completion text starts TTFT, as in the router", []string{role, text, content, usage, done}, ms(20), 1, ms(50), 5, false, ""},
		{"no usage: events counted", []string{role, content, content, content, done}, ms(20), 2, ms(50), 3, true, ""},
		{"comments and blank lines ignored", []string{": ping", role, "", content, usage, done}, ms(20), 0, ms(40), 5, false, ""},
		{"error event", []string{role, `data: {"error":{"message":"boom"}}`}, 0, 0, 0, 0, false, "error event in stream"},
		{"garbage", []string{"data: {nope"}, 0, 0, 0, 0, false, "not JSON"},
		{"no tokens", []string{role, usage, done}, 0, 0, 0, 0, false, "no tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Unix(1000, 0)
			body := strings.Join(tt.events, "\n\n") + "\n\n"
			r := readStream(strings.NewReader(body), start, fakeClock(start))
			if tt.wantErr != "" {
				if r.err == nil || !strings.Contains(r.err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", r.err, tt.wantErr)
				}
				return
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.ttft != tt.wantTTFT || len(r.gaps) != tt.wantGaps || r.e2e != tt.wantE2E || r.outputTokens != tt.wantTokens || r.counted != tt.wantCount {
				t.Errorf("ttft %v gaps %d e2e %v tokens %d counted %v; want %v %d %v %d %v",
					r.ttft, len(r.gaps), r.e2e, r.outputTokens, r.counted, tt.wantTTFT, tt.wantGaps, tt.wantE2E, tt.wantTokens, tt.wantCount)
			}
			for _, g := range r.gaps {
				if g != ms(10) {
					t.Errorf("gap %v, want 10ms", g)
				}
			}
		})
	}
}

func TestSummarise(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	reqs := []request{
		{ttft: ms(100), e2e: ms(1100), outputTokens: 101, gaps: []time.Duration{ms(10), ms(10)}},
		{ttft: ms(300), e2e: ms(2300), outputTokens: 201, gaps: []time.Duration{ms(10), ms(10), ms(20)}},
		{err: errors.New("HTTP 503: busy")},
		{err: errors.New("HTTP 503: busy")},
	}
	l := summarise(2, ms(2500), reqs)
	checks := []struct {
		name      string
		got, want float64
	}{
		{"requests", float64(l.Requests), 4},
		{"failed", float64(l.Failed), 2},
		{"output tokens", float64(l.OutputTokens), 302},
		{"total tok/s = Σout/wall", l.TotalTokPerSec, 302 / 2.5},
		{"per request tok/s = mean(n/E2E)", l.PerRequestTokPerS, (101/1.1 + 201/2.3) / 2},
		{"TPOT = (E2E−TTFT)/(n−1), mean", l.TPOT.Mean, 10},
		{"ITL pooled count", float64(l.ITL.N), 5},
		{"ITL p50", l.ITL.P50, 10},
		{"TTFT p50", l.TTFT.P50, 200},
		{"E2E mean", l.E2E.Mean, 1700},
	}
	for _, c := range checks {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if len(l.Errors) != 1 {
		t.Errorf("errors %q, want the one distinct message", l.Errors)
	}
}

func TestPercentile(t *testing.T) {
	tests := []struct {
		v    []float64
		p    float64
		want float64
	}{
		{[]float64{1, 2, 3, 4}, 50, 2.5},
		{[]float64{1, 2, 3, 4}, 90, 3.7},
		{[]float64{7}, 99, 7},
		{[]float64{1, 2, 3, 4, 5}, 50, 3},
	}
	for _, tt := range tests {
		if got := percentile(tt.v, tt.p); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("p%v of %v = %v, want %v", tt.p, tt.v, got, tt.want)
		}
	}
}

// sseEngine streams a fixed number of token events with a fixed spacing,
// and reports usage of its own (completion_tokens may differ from the event
// count, as when an engine bundles tokens).
type sseEngine struct {
	reasoningEvents, contentEvents int
	completionTokens               int
	spacing                        time.Duration

	mu          sync.Mutex
	bodies      []map[string]any
	inFlight    int
	maxInFlight int
	failAfter   int // fail every request after this many (0: never)
	// usageExtra is appended to the usage object, as
	// `,"prompt_tokens_details":…` (empty: usage without it).
	usageExtra string
}

func (e *sseEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	raw, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(raw, &body)
	e.mu.Lock()
	e.bodies = append(e.bodies, body)
	n := len(e.bodies)
	e.inFlight++
	e.maxInFlight = max(e.maxInFlight, e.inFlight)
	e.mu.Unlock()
	// A request leaves the count before its last event is written: once the
	// client has read [DONE] it may send the next one while this handler
	// is still returning, and that overlap is not concurrency it asked for.
	var leave sync.Once
	left := func() {
		leave.Do(func() {
			e.mu.Lock()
			e.inFlight--
			e.mu.Unlock()
		})
	}
	defer left()
	if e.failAfter > 0 && n > e.failAfter {
		left()
		http.Error(w, `{"error":{"message":"no free slot","type":"server_error","code":503}}`, http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	emit := func(s string) {
		fmt.Fprintf(w, "data: %s\n\n", s)
		f.Flush()
	}
	emit(`{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`)
	for range e.reasoningEvents {
		time.Sleep(e.spacing)
		emit(`{"choices":[{"index":0,"delta":{"reasoning_content":"hm"},"finish_reason":null}]}`)
	}
	for range e.contentEvents {
		time.Sleep(e.spacing)
		emit(`{"choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}`)
	}
	emit(`{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`)
	emit(fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":45,"completion_tokens":%d,"total_tokens":%d%s}}`, e.completionTokens, 45+e.completionTokens, e.usageExtra))
	left()
	emit("[DONE]")
}

func TestSweepAgainstFakeEngine(t *testing.T) {
	engine := &sseEngine{reasoningEvents: 3, contentEvents: 5, completionTokens: 256, spacing: time.Millisecond}
	srv := httptest.NewServer(engine)
	defer srv.Close()
	var progress [][2]int
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := Sweep(ctx, bench.Target{Name: "fake", BaseURL: srv.URL + "/v1", Model: "qwen3-4b"},
		Options{Progress: func(done, total int) { progress = append(progress, [2]int{done, total}) }})
	if err != nil {
		t.Fatal(err)
	}
	wantRequests := map[int]int{1: 3, 2: 4, 4: 8}
	if len(res.Levels) != 3 {
		t.Fatalf("levels %+v, want 1, 2, 4", res.Levels)
	}
	for _, l := range res.Levels {
		n := wantRequests[l.Concurrency]
		if l.Requests != n || l.Failed != 0 {
			t.Errorf("concurrency %d: %d requests, %d failed; want %d, 0", l.Concurrency, l.Requests, l.Failed, n)
		}
		if l.OutputTokens != n*256 {
			t.Errorf("concurrency %d: %d output tokens, want the server's usage %d", l.Concurrency, l.OutputTokens, n*256)
		}
		if l.ITL.N != n*7 || l.TTFT.N != n || l.TPOT.N != n {
			t.Errorf("concurrency %d: %d ITL gaps (want %d: reasoning events count), %d TTFTs, %d TPOTs",
				l.Concurrency, l.ITL.N, n*7, l.TTFT.N, l.TPOT.N)
		}
		if got := float64(l.OutputTokens) / (l.WallMS / 1000); math.Abs(got-l.TotalTokPerSec) > 1e-6*got {
			t.Errorf("total tok/s %v is not Σout/wall %v", l.TotalTokPerSec, got)
		}
		if l.PromptTokens != 45 {
			t.Errorf("prompt tokens %d, want 45", l.PromptTokens)
		}
	}
	total := 1 + 3 + 4 + 8
	if len(engine.bodies) != total {
		t.Errorf("engine got %d requests, want %d (one warm-up)", len(engine.bodies), total)
	}
	if engine.maxInFlight > 4 {
		t.Errorf("%d requests in flight at once, more than the top level", engine.maxInFlight)
	}
	if len(progress) != total || progress[len(progress)-1] != [2]int{total, total} {
		t.Errorf("progress %v", progress)
	}
	b := engine.bodies[0]
	if b["stream"] != true || b["ignore_eos"] != true || b["max_tokens"] != float64(256) {
		t.Errorf("request body %v", b)
	}
	if so, _ := b["stream_options"].(map[string]any); so["include_usage"] != true {
		t.Errorf("usage not asked for: %v", b)
	}
	text := res.Text()
	for _, want := range []string{"1 request tok/s", "2 concurrent total", "4 concurrent total", "per request at 4", "TTFT p50", "TPOT", "Σ output tokens"} {
		if !strings.Contains(text, want) {
			t.Errorf("Text lacks %q:\n%s", want, text)
		}
	}
	raw, err := json.Marshal(res)
	if err != nil || !strings.Contains(string(raw), `"total_tok_s"`) {
		t.Errorf("JSON: %v %s", err, raw)
	}
	if s := res.Samples("fake/qwen3-4b"); len(s) != 3 || s[0].Kind != "bench" || s[2].OutputTokens != 8*256 {
		t.Errorf("samples %+v", s)
	}
}

func TestSweepAgentSplit(t *testing.T) {
	engine := &sseEngine{contentEvents: 2, completionTokens: 70}
	srv := httptest.NewServer(engine)
	defer srv.Close()
	res, err := Sweep(context.Background(), bench.Target{Name: "fake", BaseURL: srv.URL + "/v1", Model: "m"},
		Options{Split: SplitAgent, Levels: []int{2}, Warmup: -1})
	if err != nil {
		t.Fatal(err)
	}
	if res.OutputTokens != 70 || len(engine.bodies) != 4 {
		t.Fatalf("output tokens %d, %d requests", res.OutputTokens, len(engine.bodies))
	}
	seen := map[string]bool{}
	for _, b := range engine.bodies {
		msgs, _ := b["messages"].([]any)
		m, _ := msgs[0].(map[string]any)
		content, _ := m["content"].(string)
		// About 4.6K tokens: 3,500 words at ~1.3 tokens a word.
		if words := len(strings.Fields(content)); words < 3400 || words > 3700 {
			t.Errorf("agent prompt has %d words, want about 3,500", words)
		}
		if b["max_tokens"] != float64(70) {
			t.Errorf("max_tokens %v, want 70", b["max_tokens"])
		}
		seen[content[:40]] = true
	}
	if len(seen) != 4 {
		t.Errorf("agent prompts share their start (%d distinct of 4): prefix caching would hide prefill", len(seen))
	}
}

func TestSweepFailures(t *testing.T) {
	t.Run("bad options change nothing", func(t *testing.T) {
		engine := &sseEngine{contentEvents: 1, completionTokens: 1}
		srv := httptest.NewServer(engine)
		defer srv.Close()
		target := bench.Target{Name: "x", BaseURL: srv.URL + "/v1", Model: "m"}
		for _, o := range []Options{{Split: "bogus"}, {Levels: []int{0}}, {OutputTokens: -1}, {RequestsPerLevel: -2}} {
			if _, err := Sweep(context.Background(), target, o); err == nil {
				t.Errorf("options %+v accepted", o)
			}
		}
		if len(engine.bodies) != 0 {
			t.Errorf("%d requests sent with bad options", len(engine.bodies))
		}
	})
	t.Run("warm-up fails", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "loading", http.StatusServiceUnavailable)
		}))
		defer srv.Close()
		_, err := Sweep(context.Background(), bench.Target{Name: "x", BaseURL: srv.URL + "/v1", Model: "m"}, Options{})
		if err == nil || !strings.Contains(err.Error(), "warm-up") || !strings.Contains(err.Error(), "503") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("failures inside a level are counted", func(t *testing.T) {
		engine := &sseEngine{contentEvents: 2, completionTokens: 2, failAfter: 3}
		srv := httptest.NewServer(engine)
		defer srv.Close()
		res, err := Sweep(context.Background(), bench.Target{Name: "x", BaseURL: srv.URL + "/v1", Model: "m"},
			Options{Levels: []int{1}, RequestsPerLevel: 4})
		if err != nil {
			t.Fatal(err)
		}
		l := res.Levels[0]
		if l.Requests != 4 || l.Failed != 2 || len(l.Errors) != 1 || !strings.Contains(l.Errors[0], "503") {
			t.Errorf("level %+v", l)
		}
		if !strings.Contains(res.Text(), "HTTP 503") {
			t.Errorf("Text hides the failures:\n%s", res.Text())
		}
	})
}

// TestSweepRunsWholeSessions: with --turns, every level runs whole sessions,
// one client per session at a time: at concurrency 1 the default three
// requests were one session cut after its third turn, and at concurrency 2
// the clients took turns of whatever session index came next.
func TestSweepRunsWholeSessions(t *testing.T) {
	engine := &sseEngine{contentEvents: 2, completionTokens: 8}
	srv := httptest.NewServer(engine)
	defer srv.Close()
	res, err := Sweep(context.Background(), bench.Target{Name: "fake", BaseURL: srv.URL + "/v1", Model: "m"},
		Options{Split: SplitAgent, Turns: 4, Levels: []int{1, 2}, Warmup: -1, OutputTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	// Level 1: the default 3 requests round up to one session of 4 turns;
	// level 2: 4 requests are one session, but each of the 2 clients runs
	// one, so 8.
	for i, want := range []int{4, 8} {
		if l := res.Levels[i]; l.Requests != want || l.Failed != 0 {
			t.Errorf("concurrency %d: %d requests (%d failed), want %d: whole sessions of 4 turns", l.Concurrency, l.Requests, l.Failed, want)
		}
	}
	// Each session (named by its first message) must have sent turns of 1,
	// 3, 5 and 7 messages: the first prompt, then each answer and tool result.
	turns := map[string][]int{}
	for _, b := range engine.bodies {
		msgs, _ := b["messages"].([]any)
		first, _ := msgs[0].(map[string]any)
		content, _ := first["content"].(string)
		turns[content] = append(turns[content], len(msgs))
	}
	if len(turns) != 3 {
		t.Errorf("%d sessions, want 3 (one at concurrency 1, two at 2)", len(turns))
	}
	for content, lens := range turns {
		slices.Sort(lens)
		if !slices.Equal(lens, []int{1, 3, 5, 7}) {
			t.Errorf("session %.40q sent turns of %v messages, want [1 3 5 7]: a whole session", content, lens)
		}
	}
}

// TestSweepCacheHitUnknownIsNotZero: an engine that reports no cached-token
// count (vLLM without --enable-prompt-tokens-details sends
// "prompt_tokens_details": null) has an unknown cache hit, not 0%: the text
// says n/a and why, the JSON null; a reported 0 stays 0%.
func TestSweepCacheHitUnknownIsNotZero(t *testing.T) {
	tests := []struct {
		name     string
		extra    string
		wantHit  string // the JSON of cache_hit
		wantText []string
	}{
		{"vLLM without the details flag", `,"prompt_tokens_details":null`, "null", []string{"n/a", "--enable-prompt-tokens-details"}},
		{"no details at all", ``, "null", []string{"n/a", "--enable-prompt-tokens-details"}},
		{"reported zero", `,"prompt_tokens_details":{"cached_tokens":0}`, "0", []string{"| 0%"}},
		{"reported 30 of 45", `,"prompt_tokens_details":{"cached_tokens":30}`, "0.6666666666666666", []string{"| 67%"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			engine := &sseEngine{contentEvents: 2, completionTokens: 2, usageExtra: tt.extra}
			srv := httptest.NewServer(engine)
			defer srv.Close()
			res, err := Sweep(context.Background(), bench.Target{Name: "x", BaseURL: srv.URL + "/v1", Model: "m"},
				Options{Levels: []int{1}, OutputTokens: 2, Warmup: -1})
			if err != nil {
				t.Fatal(err)
			}
			raw, err := json.Marshal(res.Levels[0])
			if err != nil {
				t.Fatal(err)
			}
			var lvl map[string]json.RawMessage
			if err := json.Unmarshal(raw, &lvl); err != nil {
				t.Fatal(err)
			}
			if got := string(lvl["cache_hit"]); got != tt.wantHit {
				t.Errorf("cache_hit %s, want %s", got, tt.wantHit)
			}
			text := res.Text()
			for _, w := range tt.wantText {
				if !strings.Contains(text, w) {
					t.Errorf("text lacks %q:\n%s", w, text)
				}
			}
			if tt.wantHit != "null" && strings.Contains(text, "n/a") {
				t.Errorf("a reported count printed as n/a:\n%s", text)
			}
		})
	}
}

// Through the router a level's requests may land on engines that report
// cached tokens and on some that do not: the hit is over those that did,
// and the text says how many.
func TestSummarisePartlyReportedCache(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	reqs := []request{
		{ttft: ms(10), e2e: ms(20), outputTokens: 2, promptTokens: 100, cachedTokens: 80, cacheReported: true},
		{ttft: ms(10), e2e: ms(20), outputTokens: 2, promptTokens: 100, cachedTokens: 40, cacheReported: true},
		{ttft: ms(10), e2e: ms(20), outputTokens: 2, promptTokens: 400},
	}
	l := summarise(1, ms(60), reqs)
	if l.CacheHit == nil || *l.CacheHit != 0.6 || l.CachedTokens == nil || *l.CachedTokens != 60 || l.CacheReported != 2 {
		t.Fatalf("cache hit %v, cached %v, reported %d; want 0.6 over the two that reported, mean 60, 2", l.CacheHit, l.CachedTokens, l.CacheReported)
	}
	if text := (Result{Levels: []Level{l}}).Detail(); !strings.Contains(text, "| 60%") || !strings.Contains(text, "over the 2 of 3 requests") {
		t.Errorf("detail does not say the hit covers 2 of 3 requests:\n%s", text)
	}
}
