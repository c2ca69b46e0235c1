package sim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// job is one generation request: it waits for a slot, prefills, decodes at
// the profile's pace and writes the answer in the mimicked engine's shape.
type job struct {
	s            *Server
	w            http.ResponseWriter
	r            *http.Request
	plan         plan
	promptTokens int
	// promptText is the prompt as the cache sees it (tools, then every
	// message's text, in order), so a conversation that grows by appending
	// messages keeps its token prefix.
	promptText string
	// cached is how many prompt tokens came from the engine's prompt cache.
	cached       int
	stream       bool
	includeUsage bool
	chat         bool
	placement    reasoningPlacement
	// api is the wire format the answer is written in; apiOpenAI covers
	// chat and text completions.
	api apiKind
	// apiStream is the state of an Anthropic or Responses stream.
	apiStream apiStreamState
	// maxTokens is the request's limit (0 none), which a Responses answer repeats.
	maxTokens int
	// index is the choice this job writes; extra are the other choices of
	// a request for n > 1 (vLLM), generated in the same engine steps and
	// written by this job.
	index int
	extra []*job

	id      string
	created int64

	content, reasoning, toolArgs strings.Builder
	// generatedText is every generated piece as the model produced it
	// (thoughts, tags, tool calls included): what the slot's KV holds.
	generatedText strings.Builder
	generated     int
	toolStarted   bool
	streaming     bool
	writeErr      error

	prefill, decode time.Duration
}

func (j *job) run() {
	s := j.s
	// ctx also ends when the slots' shared KV pool overflows (errKVFull).
	ctx, fail := context.WithCancelCause(j.r.Context())
	defer fail(nil)
	arrival := time.Now()
	j.created = arrival.Unix()
	j.id = j.newID()
	if j.stream && !s.llama() {
		// vLLM sends its headers before the request is scheduled, but its
		// role chunk only with the first token: the same engine step makes
		// both (see the first token below).
		j.writeHeaders()
	}
	tokens := tokenize(j.promptText)
	var choose func([]int) int
	if s.llamaCache != nil {
		choose = func(idle []int) int { return s.llamaCache.choose(idle, tokens) }
	}
	slot, err := s.pool.acquire(ctx, j.promptTokens, len(j.plan.pieces), choose, fail)
	if err != nil {
		s.metrics.finish("abort", j.promptTokens, 0, 0, time.Since(arrival).Seconds())
		s.log.Debug("request gave up while queued", "id", j.id, "err", err)
		return
	}
	defer s.pool.release(slot)
	queued := time.Since(arrival)

	// Only the tokens the prompt cache does not hold are computed.
	cache := s.startCache(slot, tokens)
	j.cached = cache.cached
	defer func() { cache.end(j.promptText + j.generatedText.String()) }()
	// A cold engine's first batch is slow: the wait is prompt time, as in
	// the first request's timings of a real engine.
	cold, err := s.warmUp(ctx)
	if err != nil {
		j.abort(ctx, arrival, "client gone while the engine warmed up")
		return
	}
	j.prefill = s.opts.Profile.PrefillDelay(j.promptTokens - j.cached)
	if err := sleepCtx(ctx, j.prefill); err != nil {
		j.abort(ctx, arrival, "client gone during prefill")
		return
	}
	cache.computed()
	j.prefill += cold
	// Every token, the first included, costs one step at the concurrency of
	// the moment, so llama's predicted_per_second reads the profile's speed.
	decodeStart := time.Now()
	var pc pacer
	last := decodeStart
	steps := len(j.plan.pieces)
	for _, e := range j.extra {
		steps = max(steps, len(e.plan.pieces))
	}
	for i := range steps {
		busy := s.pool.busy()
		if err := pc.wait(ctx, s.opts.Profile.TokenDelay(busy)); err != nil {
			j.abort(ctx, arrival, "client gone while decoding")
			return
		}
		now := time.Now()
		if i == 0 {
			s.metrics.prefilled(j.promptTokens, j.cached, queued.Seconds(), j.prefill.Seconds(), now.Sub(arrival).Seconds())
			if j.stream {
				// Both engines send the role chunk with the first token;
				// llama-server its headers too.
				if s.llama() {
					j.writeHeaders()
				}
				if j.api != apiOpenAI {
					j.apiStart()
				} else {
					j.sendRole()
					for _, e := range j.extra {
						e.sendRole()
					}
				}
			}
		}
		s.metrics.token(now.Sub(last).Seconds(), busy, i == 0)
		last = now
		s.pool.progress(slot)
		for _, c := range j.choices() {
			if i < len(c.plan.pieces) {
				c.generated++
				c.emit(c.plan.pieces[i], i == len(c.plan.pieces)-1)
			}
			if c.writeErr != nil {
				j.abort(ctx, arrival, "write failed: "+c.writeErr.Error())
				return
			}
		}
	}
	j.decode = time.Since(decodeStart)
	s.pool.generated(slot)
	j.finish()
	s.metrics.finish(j.plan.finish, j.promptTokens, j.totalGenerated(), j.decode.Seconds(), time.Since(arrival).Seconds())
}

// abort ends the job early: its client gone (why), or the shared KV pool
// full (ctx's cause), which llama-server answers with an error.
func (j *job) abort(ctx context.Context, arrival time.Time, why string) {
	j.s.metrics.finish("abort", j.promptTokens, j.generated, time.Since(arrival).Seconds(), time.Since(arrival).Seconds())
	if cause := context.Cause(ctx); errors.Is(cause, errKVFull) && j.r.Context().Err() == nil {
		j.s.log.Warn("decode() failed: Context size has been exceeded", "id", j.id, "kv_pool", j.s.pool.kvPool)
		j.failKVFull()
		return
	}
	j.s.log.Debug("request aborted", "id", j.id, "reason", why, "generated", j.generated)
}

// failKVFull answers as llama-server does a request it ended for a full
// KV pool: HTTP 500 server_error before its stream started, an error event
// (data: {"error": …}, or Anthropic's event: error) and no [DONE] after.
func (j *job) failKVFull() {
	e := obj{{"code", http.StatusInternalServerError}, {"message", kvFullMessage}, {"type", "server_error"}}
	switch {
	case !j.streaming:
		writeJSON(j.w, http.StatusInternalServerError, obj{{"error", e}})
	case j.api == apiMessages:
		if _, err := fmt.Fprintf(j.w, "event: error\ndata: %s\n\n", marshal(e)); err == nil {
			j.flush()
		}
	default:
		j.sendEvent(marshal(obj{{"error", e}}))
	}
}

func (j *job) newID() string {
	prefix := "cmpl-"
	switch {
	case j.api == apiResponses:
		prefix = "resp_"
	case j.chat:
		prefix = "chatcmpl-"
	}
	if j.s.llama() {
		return prefix + j.s.newID(32, false)
	}
	return prefix + j.s.newID(32, true)
}

func (j *job) object() string {
	switch {
	case j.chat && j.stream:
		return "chat.completion.chunk"
	case j.chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (j *job) writeHeaders() {
	h := j.w.Header()
	if j.s.llama() {
		h.Set("Content-Type", "text/event-stream")
	} else {
		h.Set("Content-Type", "text/event-stream; charset=utf-8")
	}
	h.Set("Cache-Control", "no-cache")
	j.w.WriteHeader(http.StatusOK)
	j.streaming = true
	j.flush()
}

// sendRole sends a chat stream's first chunk, the role-only one.
func (j *job) sendRole() {
	if j.chat {
		role := obj{{"role", "assistant"}, {"content", ""}}
		if j.s.llama() {
			role = obj{{"role", "assistant"}, {"content", nil}}
		}
		j.sendChoice(role, "")
	}
}

// sendEvent writes one SSE event and flushes it at once: the router is
// tested for not buffering, so the sim must not buffer either.
func (j *job) sendEvent(payload []byte) {
	if j.writeErr != nil {
		return
	}
	if _, err := fmt.Fprintf(j.w, "data: %s\n\n", payload); err != nil {
		j.writeErr = err
		return
	}
	j.flush()
}

func (j *job) flush() {
	if err := http.NewResponseController(j.w).Flush(); err != nil && j.writeErr == nil {
		j.writeErr = err
	}
}

// envelope wraps choices in the engine's chunk or response object.
func (j *job) envelope(choices []any, extra obj) obj {
	s := j.s
	if s.llama() {
		o := obj{{"choices", choices}, {"created", j.created}, {"id", j.id}, {"model", s.opts.ModelID()},
			{"system_fingerprint", s.fingerprint()}, {"object", j.object()}}
		return append(o, extra...)
	}
	o := obj{{"id", j.id}, {"object", j.object()}, {"created", j.created}, {"model", s.opts.ModelID()},
		{"system_fingerprint", s.fingerprint()}, {"choices", choices}}
	return append(o, extra...)
}

// sendChoice streams one chunk whose choice carries delta (chat) or text
// (completions) and, when finish is set, the finish reason.
func (j *job) sendChoice(delta obj, finish string) {
	var fr any
	if finish != "" {
		fr = finish
	}
	var choice obj
	switch {
	case j.s.llama() && j.chat:
		choice = obj{{"finish_reason", fr}, {"index", 0}, {"delta", delta}}
	case j.s.llama():
		choice = obj{{"text", deltaText(delta)}, {"index", 0}, {"logprobs", nil}, {"finish_reason", fr}}
	case j.chat:
		choice = obj{{"index", j.index}, {"delta", delta}, {"logprobs", nil}, {"finish_reason", fr}}
		if finish != "" {
			choice = append(choice, field{"stop_reason", nil})
		}
	default:
		choice = obj{{"index", j.index}, {"text", deltaText(delta)}, {"logprobs", nil}, {"finish_reason", fr}, {"stop_reason", nil}}
	}
	var extra obj
	if finish != "" && j.s.llama() {
		extra = obj{{"timings", j.timings()}}
	}
	j.sendEvent(marshal(j.envelope([]any{choice}, extra)))
}

func deltaText(delta obj) string {
	for _, f := range delta {
		if f.k == "content" {
			if s, ok := f.v.(string); ok {
				return s
			}
		}
	}
	return ""
}

// delta renders one piece for the stream; nil when the piece shows nothing
// (a <think> tag when thoughts go to their own field).
func (j *job) delta(p piece) obj {
	switch p.kind {
	case pieceThinkTag:
		if j.placement == thoughtsField {
			return nil
		}
		return obj{{"content", p.text}}
	case pieceReasoning:
		switch j.placement {
		case thoughtsInline:
			return obj{{"content", p.text}}
		case thoughtsBoth:
			return obj{{"content", p.text}, {"reasoning_content", p.text}}
		}
		return obj{{j.s.reasoningKey(), p.text}}
	case pieceToolArgs:
		call := obj{{"index", 0}, {"function", obj{{"arguments", p.text}}}}
		if !j.toolStarted {
			j.toolStarted = true
			call = obj{{"index", 0}, {"id", j.plan.tool.id}, {"type", "function"},
				{"function", obj{{"name", j.plan.tool.name}, {"arguments", p.text}}}}
		}
		return obj{{"tool_calls", []any{call}}}
	}
	return obj{{"content", p.text}}
}

func (j *job) accumulate(p piece) {
	j.generatedText.WriteString(p.text)
	switch p.kind {
	case pieceThinkTag:
		if j.placement != thoughtsField {
			j.content.WriteString(p.text)
		}
	case pieceReasoning:
		if j.placement != thoughtsField {
			j.content.WriteString(p.text)
		}
		if j.placement != thoughtsInline {
			j.reasoning.WriteString(p.text)
		}
	case pieceToolArgs:
		j.toolArgs.WriteString(p.text)
	default:
		j.content.WriteString(p.text)
	}
}

func (j *job) emit(p piece, last bool) {
	j.accumulate(p)
	if !j.stream {
		return
	}
	if j.api != apiOpenAI {
		j.apiPiece(p)
		return
	}
	d := j.delta(p)
	if !j.s.llama() && last {
		// vLLM carries the finish reason on the chunk of the last token.
		if d == nil {
			d = obj{}
		}
		j.sendChoice(d, j.plan.finish)
		return
	}
	if d != nil {
		j.sendChoice(d, "")
	}
}

// choices is the job and its extra choices, in index order.
func (j *job) choices() []*job { return append([]*job{j}, j.extra...) }

// totalGenerated counts the tokens of every choice, as usage does.
func (j *job) totalGenerated() int {
	n := 0
	for _, c := range j.choices() {
		n += c.generated
	}
	return n
}

func (j *job) usage() obj {
	gen := j.totalGenerated()
	if j.s.llama() {
		return obj{{"completion_tokens", gen}, {"prompt_tokens", j.promptTokens},
			{"total_tokens", j.promptTokens + gen}, {"prompt_tokens_details", obj{{"cached_tokens", j.cached}}}}
	}
	// vLLM details the cached tokens only when asked to at launch.
	var details any
	if j.s.opts.PromptTokensDetails {
		details = obj{{"cached_tokens", j.cached}}
	}
	return obj{{"prompt_tokens", j.promptTokens}, {"total_tokens", j.promptTokens + gen},
		{"completion_tokens", gen}, {"prompt_tokens_details", details}}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func perSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func perTokenMS(n int, d time.Duration) float64 {
	if n <= 0 {
		return 0
	}
	return ms(d) / float64(n)
}

func (j *job) timings() obj {
	computed := j.promptTokens - j.cached
	return obj{
		{"cache_n", j.cached},
		{"prompt_n", computed}, {"prompt_ms", ms(j.prefill)},
		{"prompt_per_token_ms", perTokenMS(computed, j.prefill)},
		{"prompt_per_second", perSecond(computed, j.prefill)},
		{"predicted_n", j.generated}, {"predicted_ms", ms(j.decode)},
		{"predicted_per_token_ms", perTokenMS(j.generated, j.decode)},
		{"predicted_per_second", perSecond(j.generated, j.decode)},
	}
}

func (j *job) finish() {
	if j.api != apiOpenAI {
		j.apiFinish()
		return
	}
	if j.stream {
		j.finishStream()
		return
	}
	llama := j.s.llama()
	choices := make([]any, 0, 1+len(j.extra))
	for _, c := range j.choices() {
		choices = append(choices, c.wholeChoice())
	}
	extra := obj{{"usage", j.usage()}}
	if llama {
		extra = append(extra, field{"timings", j.timings()})
	}
	writeJSON(j.w, http.StatusOK, j.envelope(choices, extra))
}

// wholeChoice is the job's choice in a non-streamed answer.
func (j *job) wholeChoice() obj {
	var choice obj
	llama := j.s.llama()
	if j.chat {
		choice = j.chatChoice()
	} else if llama {
		choice = obj{{"text", j.content.String()}, {"index", 0}, {"logprobs", nil}, {"finish_reason", j.plan.finish}}
	} else {
		choice = obj{{"index", j.index}, {"text", j.content.String()}, {"logprobs", nil}, {"finish_reason", j.plan.finish},
			{"stop_reason", nil}, {"prompt_logprobs", nil}}
	}
	return choice
}

func (j *job) chatChoice() obj {
	var calls []any
	if j.plan.tool != nil && j.plan.structuredTool {
		calls = []any{obj{{"id", j.plan.tool.id}, {"type", "function"},
			{"function", obj{{"name", j.plan.tool.name}, {"arguments", j.toolArgs.String()}}}}}
	}
	content := j.content.String()
	if j.s.llama() {
		msg := obj{{"role", "assistant"}}
		if content == "" && calls != nil {
			msg = append(msg, field{"content", nil})
		} else {
			msg = append(msg, field{"content", content})
		}
		if j.placement != thoughtsInline && j.reasoning.Len() > 0 {
			msg = append(msg, field{"reasoning_content", j.reasoning.String()})
		}
		if calls != nil {
			msg = append(msg, field{"tool_calls", calls})
		}
		return obj{{"finish_reason", j.plan.finish}, {"index", 0}, {"message", msg}}
	}
	var c, r any
	if content != "" {
		c = content
	}
	if j.reasoning.Len() > 0 {
		r = j.reasoning.String()
	}
	if calls == nil {
		calls = []any{}
	}
	msg := obj{{"role", "assistant"}, {"content", c}, {"refusal", nil}, {"annotations", nil}, {"audio", nil},
		{"function_call", nil}, {"tool_calls", calls}, {"reasoning", r}}
	return obj{{"index", j.index}, {"message", msg}, {"logprobs", nil}, {"finish_reason", j.plan.finish}, {"stop_reason", nil}}
}

func (j *job) finishStream() {
	if j.s.llama() {
		j.sendChoice(obj{}, j.plan.finish)
	}
	if j.includeUsage {
		extra := obj{{"usage", j.usage()}}
		if j.s.llama() {
			extra = append(extra, field{"timings", j.timings()})
		}
		j.sendEvent(marshal(j.envelope([]any{}, extra)))
	}
	if j.writeErr == nil {
		if _, err := fmt.Fprint(j.w, "data: [DONE]\n\n"); err == nil {
			j.flush()
		}
	}
}
