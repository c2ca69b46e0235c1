package router

import "time"

// Usage is one answered request's tokens (or a cut-short answer's so far),
// as the engine reported them, for the hub's per-key accounting
// (Options.OnUsage).
type Usage struct {
	At time.Time
	// Key is the API key's name; "" when the router takes no keys.
	Key    string
	Model  string
	Worker string
	// PromptTokens is the engine's usage.prompt_tokens, else the router's
	// estimate of the prompt (a stream without include_usage reports none,
	// and it must not go uncounted against a token limit).
	PromptTokens int
	// CachedTokens is the prompt's part the engine reused (cached_tokens,
	// llama-server's timings.cache_n); 0 when it did not say.
	CachedTokens int
	// CompletionTokens is usage.completion_tokens, else the streamed token
	// events counted.
	CompletionTokens int
}

// recordUsage counts an answered request's tokens: the metrics by model
// and worker, the key's day for its token limit, and the hub's accounting.
// It never blocks on the hub (OnUsage must not). A request that counts
// tokens (/tokenize, count_tokens) is a request with none: counting tokens
// is not making them, and a key whose day is spent may still count.
func (r *Router) recordUsage(f *flight, c *call, m *meter, end time.Time) {
	u := Usage{At: end, Key: c.key, Model: f.model, Worker: f.b.cfg.Name}
	if !endpointTable[c.path].countsTokens {
		pc := m.promptCache()
		u.PromptTokens, u.CachedTokens, u.CompletionTokens = pc.promptTokens, max(pc.cached, 0), m.outputTokens()
		if u.PromptTokens < 0 {
			u.PromptTokens = f.job.PromptTokens
		}
		u.CachedTokens = min(u.CachedTokens, u.PromptTokens)
	}
	f.b.observers.tokens.prompt.Add(float64(u.PromptTokens))
	f.b.observers.tokens.cached.Add(float64(u.CachedTokens))
	f.b.observers.tokens.completion.Add(float64(u.CompletionTokens))
	r.limits.Spend(u.Key, int64(u.PromptTokens+u.CompletionTokens), end)
	if r.opts.OnUsage != nil {
		r.opts.OnUsage(u)
	}
}
