// Package sweep measures one worker (or a model through the router) with a
// closed-loop concurrency sweep: at each level C, exactly C requests are in
// flight until the level's requests are done, every machine gets the same
// prompts, and a warm-up request is sent first and discarded.
//
// Metrics are defined as vLLM's `vllm bench serve` defines them, measured on
// the client from the arrival of SSE events:
//
//   - TTFT: from sending the request to the first event that carries a
//     content or reasoning token (content, reasoning_content, reasoning, a
//     tool call or completion text), by the router's rule (tokenchunk), so
//     bench and router time it alike. A reasoning model's thinking counts:
//     it is output.
//   - E2E: from sending the request to the end of the stream.
//   - TPOT: (E2E − TTFT) / (n − 1) per request, n its output tokens.
//   - ITL: the gaps between consecutive token-carrying events, pooled over
//     all requests of the level (an event may carry several tokens, so ITL
//     and TPOT differ when an engine bundles them).
//   - Output tokens n: the server's usage.completion_tokens (the request
//     asks for stream_options.include_usage); when a server sends no usage,
//     the count of token-carrying events, and the result says so.
//   - Per-request tok/s: n / E2E of each request, averaged.
//   - Total tok/s: Σ n over the level / the level's wall time (first send
//     to last stream end).
package sweep

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"fleet"
	"fleet/bench"
	"fleet/internal/tokenchunk"
)

// Splits: the shape of the benchmark's requests.
const (
	// SplitChat is short prompts with 256-token answers, the first field
	// report's benchmark: per-request decode speed is what it shows.
	SplitChat = "chat"
	// SplitAgent is prompts of about 4.6K tokens with about 70-token
	// answers, the second field report's agent split: TTFT is what the
	// user feels.
	SplitAgent = "agent"
)

// Definitions states how each metric is measured, for --help and Text.
const Definitions = `Metrics (as vLLM's "bench serve" defines them, measured at the client):
  TTFT     send → first event carrying a token (content, reasoning or a tool call), as the router times it
  E2E      send → end of stream
  TPOT     (E2E − TTFT) / (output tokens − 1), per request
  ITL      gaps between token-carrying events, pooled over the level's requests
  tokens   the server's usage.completion_tokens (stream_options.include_usage)
  per req  output tokens / E2E, averaged over requests
  total    Σ output tokens / wall time of the level (closed loop, C in flight)`

// Options configure a sweep. Zero values take the defaults.
type Options struct {
	// Levels are the concurrency levels, in order (default 1, 2, 4).
	Levels []int
	// OutputTokens is max_tokens, with ignore_eos so every answer is that
	// long (default 256 for chat, 70 for agent).
	OutputTokens int
	// Split is SplitChat (default) or SplitAgent.
	Split string
	// Turns is how many turns an agent session runs (agent split only,
	// default 1): each turn resends the conversation with the previous
	// answer and a new tool result, so an engine that kept the session's
	// prompt reuses it, which the levels' cache hit ratio shows.
	Turns int
	// RequestsPerLevel is how many requests each level runs (default
	// 2×level, at least 3); with Turns above 1, rounded up to whole
	// sessions, at least one per concurrent client.
	RequestsPerLevel int
	// Warmup is how many requests are sent first and discarded (default 1;
	// negative for none).
	Warmup int
	// Progress is called after each request, warm-up included.
	Progress func(done, total int)
	Logger   *slog.Logger
}

// Stats summarises durations, in milliseconds.
type Stats struct {
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	N    int     `json:"n"`
}

// Level is the outcome of one concurrency level.
type Level struct {
	Concurrency int `json:"concurrency"`
	Requests    int `json:"requests"`
	Failed      int `json:"failed"`
	// Errors holds the distinct failure messages (at most a few).
	Errors       []string `json:"errors,omitempty"`
	WallMS       float64  `json:"wall_ms"`
	OutputTokens int      `json:"output_tokens"`
	PromptTokens int      `json:"prompt_tokens"`
	// CachedTokens is the mean of the engines' usage cached_tokens (or
	// llama-server's timings.cache_n) over the requests whose engine
	// reported one; CacheHit is their sum over those requests' prompt
	// tokens. Both are nil (JSON null) when no engine reported a count, as
	// vLLM without --enable-prompt-tokens-details: unknown is not 0%.
	CachedTokens *int     `json:"cached_tokens"`
	CacheHit     *float64 `json:"cache_hit"`
	// CacheReported is how many of the level's answered requests carried
	// a cached-token count (through the router, workers may differ).
	CacheReported     int     `json:"cache_reported"`
	TotalTokPerSec    float64 `json:"total_tok_s"`
	PerRequestTokPerS float64 `json:"per_request_tok_s"`
	TTFT              Stats   `json:"ttft"`
	TPOT              Stats   `json:"tpot"`
	ITL               Stats   `json:"itl"`
	E2E               Stats   `json:"e2e"`
	// CountedEvents is set when the server sent no usage and output tokens
	// were counted from stream events instead.
	CountedEvents bool `json:"counted_events,omitempty"`
}

// Result is a whole sweep.
type Result struct {
	Target       string    `json:"target"`
	Model        string    `json:"model"`
	Split        string    `json:"split"`
	Turns        int       `json:"turns,omitempty"`
	OutputTokens int       `json:"output_tokens"`
	StartedAt    time.Time `json:"started_at"`
	Levels       []Level   `json:"levels"`
}

// request is what one benchmark request measured.
type request struct {
	ttft, e2e    time.Duration
	gaps         []time.Duration
	outputTokens int
	promptTokens int
	cachedTokens int
	// cacheReported is set when the engine said how many prompt tokens it
	// reused (a count of 0 included).
	cacheReported bool
	// answer is the generated content, for the next turn of a session.
	answer  string
	counted bool
	err     error
}

// Sweep runs the closed-loop sweep against target. It fails when the
// options are wrong, when the warm-up request fails (nothing would be
// measured), or when ctx ends; failed requests inside a level are counted
// and reported in the level instead.
func Sweep(ctx context.Context, target bench.Target, opts Options) (Result, error) {
	if err := target.Validate(); err != nil {
		return Result{}, err
	}
	opts, err := withDefaults(opts)
	if err != nil {
		return Result{}, err
	}
	log := opts.Logger
	r := Result{Target: target.Label(), Model: target.Model, Split: opts.Split, OutputTokens: opts.OutputTokens, StartedAt: time.Now()}
	if opts.Turns > 1 {
		r.Turns = opts.Turns
	}
	client := target.Client()

	total := opts.Warmup
	for _, c := range opts.Levels {
		total += requestsAt(opts, c)
	}
	var progressMu sync.Mutex
	done := 0
	tick := func() {
		if opts.Progress == nil {
			return
		}
		progressMu.Lock()
		defer progressMu.Unlock()
		done++
		opts.Progress(done, total)
	}

	seq := 0
	for i := range opts.Warmup {
		res := send(ctx, client, target, opts, firstTurn(opts.Split, -1-i))
		tick()
		if res.err != nil {
			return Result{}, fmt.Errorf("warm-up request to %s failed, so nothing would be measured: %w", target.Label(), res.err)
		}
	}
	for _, c := range opts.Levels {
		n := requestsAt(opts, c)
		lvl, err := runLevel(ctx, client, target, opts, c, n, seq, tick)
		if err != nil {
			return Result{}, err
		}
		seq += n / opts.Turns
		log.Info("bench level done", "target", target.Label(), "concurrency", c, "total_tok_s", lvl.TotalTokPerSec,
			"per_request_tok_s", lvl.PerRequestTokPerS, "ttft_p50_ms", lvl.TTFT.P50, "failed", lvl.Failed)
		r.Levels = append(r.Levels, lvl)
	}
	return r, nil
}

func withDefaults(o Options) (Options, error) {
	if o.Split == "" {
		o.Split = SplitChat
	}
	if o.Split != SplitChat && o.Split != SplitAgent {
		return o, fmt.Errorf("bench split %q is not known: use %q (short prompts, 256-token answers) or %q (4.6K-token prompts, 70-token answers)", o.Split, SplitChat, SplitAgent)
	}
	if len(o.Levels) == 0 {
		o.Levels = []int{1, 2, 4}
	}
	for _, c := range o.Levels {
		if c < 1 || c > 1024 {
			return o, fmt.Errorf("concurrency level %d is out of range: use levels from 1 to 1024, e.g. 1,2,4", c)
		}
	}
	if o.OutputTokens < 0 {
		return o, fmt.Errorf("output tokens %d is negative: use a positive count such as 256", o.OutputTokens)
	}
	if o.OutputTokens == 0 {
		o.OutputTokens = 256
		if o.Split == SplitAgent {
			o.OutputTokens = 70
		}
	}
	if o.Turns < 0 || o.Turns > 1 && o.Split != SplitAgent {
		return o, fmt.Errorf("%d turns per session: multi-turn sessions are an agent split mode; use --split agent with 2 or more turns, or leave turns at 1", o.Turns)
	}
	if o.Turns == 0 {
		o.Turns = 1
	}
	if o.RequestsPerLevel < 0 {
		return o, fmt.Errorf("requests per level %d is negative: leave it 0 for 2×level (at least 3)", o.RequestsPerLevel)
	}
	if o.Warmup == 0 {
		o.Warmup = 1
	}
	if o.Warmup < 0 {
		o.Warmup = 0
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// requestsAt is how many requests the level at concurrency sends: the
// requests per level asked for (default 2×level, at least 3), and with
// multi-turn sessions rounded up to whole sessions, at least one per client
// (a cut session would measure a conversation no agent holds).
func requestsAt(o Options, concurrency int) int {
	n := max(2*concurrency, 3)
	if o.RequestsPerLevel > 0 {
		n = max(o.RequestsPerLevel, concurrency)
	}
	if o.Turns > 1 {
		sessions := max((n+o.Turns-1)/o.Turns, concurrency)
		n = sessions * o.Turns
	}
	return n
}

// runLevel keeps exactly c sessions in flight until the level's n requests
// (n/turns sessions) have been sent. A client takes a whole session and runs
// its turns one after another, each resending the conversation so far.
func runLevel(ctx context.Context, client *http.Client, target bench.Target, opts Options, c, n, seq int, tick func()) (Level, error) {
	results := make([]request, n)
	sessions := n / opts.Turns
	var next int
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range c {
		wg.Go(func() {
			for {
				mu.Lock()
				s := next
				next++
				mu.Unlock()
				if s >= sessions {
					return
				}
				session := seq + s
				msgs := firstTurn(opts.Split, session)
				for turn := range opts.Turns {
					if ctx.Err() != nil {
						return
					}
					if turn > 0 {
						msgs = append(msgs, map[string]string{"role": "user", "content": toolResult(session, turn)})
					}
					i := s*opts.Turns + turn
					results[i] = send(ctx, client, target, opts, msgs)
					msgs = append(msgs, map[string]string{"role": "assistant", "content": results[i].answer})
					tick()
				}
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	if err := ctx.Err(); err != nil {
		return Level{}, fmt.Errorf("bench of %s interrupted at concurrency %d: %w", target.Label(), c, err)
	}
	return summarise(c, wall, results), nil
}

// summarise computes a level's metrics from its requests.
func summarise(c int, wall time.Duration, results []request) Level {
	lvl := Level{Concurrency: c, Requests: len(results), WallMS: ms(wall)}
	var ttft, tpot, itl, e2e []time.Duration
	var perReq []float64
	var cached, cachedPrompt int
	for _, r := range results {
		if r.err != nil {
			lvl.Failed++
			if msg := r.err.Error(); len(lvl.Errors) < 3 && !slices.Contains(lvl.Errors, msg) {
				lvl.Errors = append(lvl.Errors, msg)
			}
			continue
		}
		lvl.OutputTokens += r.outputTokens
		lvl.PromptTokens += r.promptTokens
		if r.cacheReported {
			lvl.CacheReported++
			cached += r.cachedTokens
			cachedPrompt += r.promptTokens
		}
		lvl.CountedEvents = lvl.CountedEvents || r.counted
		ttft = append(ttft, r.ttft)
		e2e = append(e2e, r.e2e)
		itl = append(itl, r.gaps...)
		if r.outputTokens > 1 {
			tpot = append(tpot, (r.e2e-r.ttft)/time.Duration(r.outputTokens-1))
		}
		if r.e2e > 0 {
			perReq = append(perReq, float64(r.outputTokens)/r.e2e.Seconds())
		}
	}
	if lvl.CacheReported > 0 {
		mean := cached / lvl.CacheReported
		hit := 0.0
		if cachedPrompt > 0 {
			hit = float64(cached) / float64(cachedPrompt)
		}
		lvl.CachedTokens, lvl.CacheHit = &mean, &hit
	}
	if ok := lvl.Requests - lvl.Failed; ok > 0 {
		lvl.PromptTokens /= ok
	}
	if wall > 0 {
		lvl.TotalTokPerSec = float64(lvl.OutputTokens) / wall.Seconds()
	}
	for _, v := range perReq {
		lvl.PerRequestTokPerS += v / float64(len(perReq))
	}
	lvl.TTFT, lvl.TPOT, lvl.ITL, lvl.E2E = stats(ttft), stats(tpot), stats(itl), stats(e2e)
	return lvl
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// stats computes mean and percentiles with linear interpolation between
// closest ranks (numpy's default, which vLLM's bench uses).
func stats(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	v := make([]float64, len(ds))
	sum := 0.0
	for i, d := range ds {
		v[i] = ms(d)
		sum += v[i]
	}
	slices.Sort(v)
	return Stats{Mean: sum / float64(len(v)), P50: percentile(v, 50), P90: percentile(v, 90), P99: percentile(v, 99), N: len(v)}
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 1 {
		return sorted[0]
	}
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (rank-float64(lo))*(sorted[hi]-sorted[lo])
}

// send makes one streamed request and times its events. It uses a plain
// HTTP client rather than go-openai: the request carries ignore_eos (which
// go-openai cannot send) and the timing needs vLLM's reasoning deltas,
// which go-openai's structs drop.
func send(ctx context.Context, client *http.Client, target bench.Target, opts Options, messages []map[string]string) request {
	body, _ := json.Marshal(map[string]any{
		"model":          target.Model,
		"messages":       messages,
		"max_tokens":     opts.OutputTokens,
		"ignore_eos":     true,
		"temperature":    0,
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.ChatURL(), bytes.NewReader(body))
	if err != nil {
		return request{err: fmt.Errorf("build request: %w", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if target.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+target.APIKey)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return request{err: fmt.Errorf("send to %s: %w", target.ChatURL(), err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return request{err: fmt.Errorf("HTTP %d from %s: %s", resp.StatusCode, target.ChatURL(), strings.TrimSpace(string(msg)))}
	}
	return readStream(resp.Body, start, time.Now)
}

// streamChunk is the part of a chunk the timing needs: whether it carries a
// token is tokenchunk's rule, the router's own, so bench and router time
// TTFT at the same event.
type streamChunk struct {
	tokenchunk.Chunk
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		Details          *struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Timings *struct {
		CacheN *int `json:"cache_n"`
	} `json:"timings"`
	Error json.RawMessage `json:"error"`
}

// readStream reads SSE events as they arrive, stamping each with now().
func readStream(body io.Reader, start time.Time, now func() time.Time) request {
	var r request
	var answer strings.Builder
	var last time.Time
	events := 0
	usage := false
	br := bufio.NewReader(body)
	for {
		line, err := br.ReadBytes('\n')
		if payload, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			payload = bytes.TrimSpace(payload)
			if string(payload) == "[DONE]" {
				break
			}
			at := now()
			var c streamChunk
			if jerr := json.Unmarshal(payload, &c); jerr != nil {
				r.err = fmt.Errorf("stream event is not JSON (%w): %.80s", jerr, payload)
				return r
			}
			if len(c.Error) > 0 && string(c.Error) != "null" {
				r.err = fmt.Errorf("error event in stream: %.200s", payload)
				return r
			}
			if c.Usage != nil && c.Usage.CompletionTokens > 0 {
				usage = true
				r.outputTokens = c.Usage.CompletionTokens
				r.promptTokens = c.Usage.PromptTokens
				if c.Usage.Details != nil && c.Usage.Details.CachedTokens != nil {
					r.cachedTokens, r.cacheReported = *c.Usage.Details.CachedTokens, true
				}
			} else if c.Timings != nil && c.Timings.CacheN != nil && r.cachedTokens == 0 {
				r.cachedTokens, r.cacheReported = *c.Timings.CacheN, true
			}
			for _, ch := range c.Choices {
				answer.WriteString(ch.Delta.Content)
			}
			if c.CarriesToken() {
				if events == 0 {
					r.ttft = at.Sub(start)
				} else {
					r.gaps = append(r.gaps, at.Sub(last))
				}
				last = at
				events++
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				r.err = fmt.Errorf("stream broke after %d events: %w", events, err)
				return r
			}
			break
		}
	}
	r.e2e = now().Sub(start)
	if events == 0 {
		r.err = errors.New("stream carried no tokens")
		return r
	}
	if !usage {
		r.outputTokens, r.counted = events, true
	}
	r.answer = answer.String()
	return r
}

// Samples turns the sweep into one bench sample per level, for the store
// and the scheduler's speed model.
func (r Result) Samples(worker string) []fleet.Sample {
	var out []fleet.Sample
	for _, l := range r.Levels {
		if l.Requests == l.Failed {
			continue
		}
		out = append(out, fleet.Sample{
			Worker:       worker,
			At:           r.StartedAt,
			Kind:         "bench",
			TTFT:         time.Duration(l.TTFT.P50 * float64(time.Millisecond)),
			ITL:          time.Duration(l.ITL.P50 * float64(time.Millisecond)),
			E2E:          time.Duration(l.E2E.P50 * float64(time.Millisecond)),
			OutputTokens: l.OutputTokens,
			TokPerSec:    l.PerRequestTokPerS,
			Detail: fmt.Sprintf("split=%s concurrency=%d total_tok_s=%.1f requests=%d failed=%d",
				r.Split, l.Concurrency, l.TotalTokPerSec, l.Requests, l.Failed),
		})
	}
	return out
}
