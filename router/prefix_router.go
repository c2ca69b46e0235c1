package router

import (
	"bytes"
	"math"
	"strconv"
)

// promptCache is what an engine reports of a request's prompt: llama-server
// in timings (cache_n, prompt_n, prompt_ms) and both engines in
// usage.prompt_tokens_details.cached_tokens (vLLM when launched with
// --enable-prompt-tokens-details). Negative fields were not reported.
type promptCache struct {
	promptTokens int     // usage.prompt_tokens
	cached       int     // cached_tokens, else cache_n
	computedN    int     // timings.prompt_n: tokens computed
	computedMs   float64 // timings.prompt_ms
}

func unknownPromptCache() promptCache { return promptCache{-1, -1, -1, -1} }

var (
	promptTokensField = []byte(`"prompt_tokens":`)
	cachedTokensField = []byte(`"cached_tokens":`)
	cacheNField       = []byte(`"cache_n":`)
	promptNField      = []byte(`"prompt_n":`)
)

// scan reads the fields out of a usage or timings payload; fields absent
// from p keep their value.
func (c *promptCache) scan(p []byte) {
	if n := intField(p, promptTokensField); n >= 0 {
		c.promptTokens = n
	}
	if n := intField(p, cachedTokensField); n >= 0 {
		c.cached = n
	} else if n := intField(p, cacheNField); n >= 0 && c.cached < 0 {
		c.cached = n
	}
	if n := intField(p, promptNField); n >= 0 {
		c.computedN = n
	}
	if v := floatField(p, promptMsField); v >= 0 {
		c.computedMs = v
	}
}

// intField finds "name":N in p, or -1.
func intField(p, field []byte) int {
	i := lastIndex(p, field)
	if i < 0 {
		return -1
	}
	rest := bytes.TrimLeft(p[i+len(field):], " ")
	n, digits := 0, 0
	for _, c := range rest {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
		digits++
	}
	if digits == 0 {
		return -1
	}
	return n
}

// floatField finds "name":X in p, or -1.
func floatField(p, field []byte) float64 {
	i := lastIndex(p, field)
	if i < 0 {
		return -1
	}
	rest := bytes.TrimLeft(p[i+len(field):], " ")
	end := 0
	for end < len(rest) && (rest[end] >= '0' && rest[end] <= '9' || rest[end] == '.' || rest[end] == 'e' || rest[end] == 'E' || rest[end] == '-' || rest[end] == '+') {
		end++
	}
	v, err := strconv.ParseFloat(string(rest[:end]), 64)
	if err != nil || v < 0 {
		return -1
	}
	return v
}

// promptCache is what the response reported.
func (m *meter) promptCache() promptCache {
	if !m.sse {
		m.readTail()
		return m.tailCache
	}
	return m.cache
}

// minPrefillSample is the fewest computed tokens whose prompt_ms teaches the
// prefill rate: below it the engine's fixed per-request cost dominates.
const minPrefillSample = 512

// observeCacheLocked corrects the worker's prefix index with what the engine
// reported, learns its prefill rate from its timings, and returns the prompt
// tokens the request computed (in the router's estimate) for the speed
// model: the engine's cached count where it reported one, else the index's
// prediction.
func (w *worker) observeCache(f *flight, c promptCache) int {
	prompt := f.job.PromptTokens
	if c.computedN >= minPrefillSample && c.computedMs > 0 {
		// The speed model's tokens are the router's estimate (bytes /
		// 4), which the scheduler multiplies by the rate; the engine's
		// tokenizer may count two or four times as many (code, JSON, a
		// byte-level vocabulary). Learned per engine token, a prefill
		// would be predicted that many times too fast, and the prefix a
		// worker holds worth that much less than the time it saves.
		computed := float64(c.computedN)
		if c.promptTokens > 0 {
			computed *= float64(prompt) / float64(c.promptTokens)
		}
		w.speed.ObservePrefill(f.startConcurrency, max(int(math.Round(computed)), 1), c.computedMs)
	}
	if c.cached >= 0 && c.promptTokens > 0 {
		w.prefix.Observe(f.job.Prefix, f.predicted, c.promptTokens, c.cached)
		frac := float64(min(c.cached, c.promptTokens)) / float64(c.promptTokens)
		return max(int(float64(prompt)*(1-frac)), 1)
	}
	return max(prompt-predictedCached(f.job, f.predicted), 1)
}
