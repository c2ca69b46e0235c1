package sim

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
)

type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative
	sum    float64
	count  uint64
}

func newHistogram(bounds ...float64) histogram {
	return histogram{bounds: bounds, counts: make([]uint64, len(bounds))}
}

func (h *histogram) observe(v float64) {
	h.sum += v
	h.count++
	for i, b := range h.bounds {
		if v <= b {
			h.counts[i]++
			return
		}
	}
}

// Bucket bounds as vLLM defines them.
var (
	ttftBuckets    = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	latencyBuckets = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	tokenBuckets   = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000}
)

// engineMetrics accumulates what both engines' /metrics expose.
type engineMetrics struct {
	mu sync.Mutex

	promptTokens, generatedTokens uint64
	// cachedTokens are prompt tokens served from the prompt cache;
	// prefixQueries the prompt tokens looked up in vLLM's prefix cache.
	cachedTokens, prefixQueries  uint64
	promptSeconds, decodeSeconds float64
	nDecode                      uint64
	busySlotsAtDecode            uint64
	maxTokensSeen                int
	finished                     map[string]uint64

	ttft, itl, e2e, queue, prefill, decode, promptHist, genHist histogram
}

func newEngineMetrics() *engineMetrics {
	return &engineMetrics{
		finished:   map[string]uint64{},
		ttft:       newHistogram(ttftBuckets...),
		itl:        newHistogram(itlBuckets...),
		e2e:        newHistogram(latencyBuckets...),
		queue:      newHistogram(latencyBuckets...),
		prefill:    newHistogram(latencyBuckets...),
		decode:     newHistogram(latencyBuckets...),
		promptHist: newHistogram(tokenBuckets...),
		genHist:    newHistogram(tokenBuckets...),
	}
}

// prefilled records a prompt of tokens tokens, cached of them from the
// prompt cache (always looked up: both engines cache by default).
func (m *engineMetrics) prefilled(tokens, cached int, queueSec, prefillSec, ttftSec float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.promptTokens += uint64(tokens)
	m.cachedTokens += uint64(cached)
	m.prefixQueries += uint64(tokens)
	m.promptSeconds += prefillSec
	m.queue.observe(queueSec)
	m.prefill.observe(prefillSec)
	m.ttft.observe(ttftSec)
	m.promptHist.observe(float64(tokens))
}

func (m *engineMetrics) token(gapSec float64, busy int, first bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.generatedTokens++
	m.nDecode++
	m.busySlotsAtDecode += uint64(busy)
	if !first {
		m.itl.observe(gapSec)
	}
}

// finish records a request's end; reason is stop, length, tool_calls or abort.
func (m *engineMetrics) finish(reason string, promptTokens, generated int, decodeSec, e2eSec float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.finished[reason]++
	m.decodeSeconds += decodeSec
	m.decode.observe(decodeSec)
	m.e2e.observe(e2eSec)
	m.genHist.observe(float64(generated))
	if n := promptTokens + generated; n > m.maxTokensSeen {
		m.maxTokensSeen = n
	}
}

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

type expo struct {
	w   io.Writer
	err error
}

func (e *expo) printf(format string, a ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, a...)
	}
}

func (e *expo) header(name, typ, help string) {
	e.printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func (e *expo) sample(name, labels string, v float64) {
	if labels != "" {
		e.printf("%s{%s} %s\n", name, labels, fmtFloat(v))
		return
	}
	e.printf("%s %s\n", name, fmtFloat(v))
}

func (e *expo) hist(name, help, labels string, h histogram) {
	e.header(name, "histogram", help)
	sep := ""
	if labels != "" {
		sep = ","
	}
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i]
		e.printf("%s_bucket{%s%sle=\"%s\"} %d\n", name, labels, sep, fmtFloat(b), cum)
	}
	e.printf("%s_bucket{%s%sle=\"+Inf\"} %d\n", name, labels, sep, h.count)
	e.sample(name+"_count", labels, float64(h.count))
	e.sample(name+"_sum", labels, h.sum)
}

func labelValue(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// writeVLLM writes the metrics under vLLM's V1 names.
func (m *engineMetrics) writeVLLM(w io.Writer, model string, st poolStats, kvCapacity int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := &expo{w: w}
	lb := fmt.Sprintf(`model_name="%s",engine="0"`, labelValue(model))
	e.header("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
	e.sample("vllm:num_requests_running", lb, float64(st.busy))
	e.header("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
	e.sample("vllm:num_requests_waiting", lb, float64(st.waiting))
	usage := 0.0
	if kvCapacity > 0 {
		usage = float64(st.tokensInUse) / float64(kvCapacity)
		if usage > 1 {
			usage = 1
		}
	}
	e.header("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
	e.sample("vllm:kv_cache_usage_perc", lb, usage)
	e.header("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.")
	e.sample("vllm:num_preemptions_total", lb, 0)
	e.header("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
	e.sample("vllm:prompt_tokens_total", lb, float64(m.promptTokens))
	e.header("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.")
	e.sample("vllm:prefix_cache_queries_total", lb, float64(m.prefixQueries))
	e.header("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.")
	e.sample("vllm:prefix_cache_hits_total", lb, float64(m.cachedTokens))
	e.header("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.")
	e.sample("vllm:generation_tokens_total", lb, float64(m.generatedTokens))
	e.header("vllm:request_success_total", "counter", "Count of successfully processed requests.")
	for _, reason := range []string{"stop", "length", "abort", "tool_calls"} {
		e.sample("vllm:request_success_total", lb+fmt.Sprintf(`,finished_reason="%s"`, reason), float64(m.finished[reason]))
	}
	e.hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lb, m.ttft)
	e.hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lb, m.itl)
	e.hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lb, m.e2e)
	e.hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", lb, m.queue)
	e.hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", lb, m.prefill)
	e.hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", lb, m.decode)
	e.hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", lb, m.promptHist)
	e.hist("vllm:request_generation_tokens", "Number of generation tokens processed.", lb, m.genHist)
	e.header("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
	e.sample("vllm:cache_config_info", `block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.92"`, 1)
	return e.err
}

// writeLlama writes the metrics under llama-server's names (no labels).
func (m *engineMetrics) writeLlama(w io.Writer, st poolStats) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := &expo{w: w}
	rate := func(tokens uint64, sec float64) float64 {
		if sec <= 0 {
			return 0
		}
		return float64(tokens) / sec
	}
	busyPerDecode := 0.0
	if m.nDecode > 0 {
		busyPerDecode = float64(m.busySlotsAtDecode) / float64(m.nDecode)
	}
	for _, s := range []struct {
		name, typ, help string
		v               float64
	}{
		{"llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens", float64(m.promptTokens - m.cachedTokens)},
		{"llamacpp:prompt_seconds_total", "counter", "Prompt process time", m.promptSeconds},
		{"llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.", float64(m.generatedTokens)},
		{"llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time", m.decodeSeconds},
		{"llamacpp:prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache", float64(m.cachedTokens)},
		{"llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls", float64(m.nDecode)},
		{"llamacpp:n_tokens_max", "counter", "Largest observed n_tokens.", float64(m.maxTokensSeen)},
		{"llamacpp:n_busy_slots_per_decode", "counter", "Average number of busy slots per llama_decode() call", busyPerDecode},
		{"llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", rate(m.promptTokens-m.cachedTokens, m.promptSeconds)},
		{"llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", rate(m.generatedTokens, m.decodeSeconds)},
		{"llamacpp:requests_processing", "gauge", "Number of requests processing.", float64(st.busy)},
		{"llamacpp:requests_deferred", "gauge", "Number of requests deferred.", float64(st.waiting)},
	} {
		e.header(s.name, s.typ, s.help)
		e.sample(s.name, "", s.v)
	}
	return e.err
}
