package router

import (
	"container/list"
	"hash/fnv"
)

// The router's view of which worker holds which prompt prefix. Like llm-d's
// prefix scorer and SGLang's cache-aware router, it does not see the
// engines' KV caches: it remembers what it sent where. The prompt is cut in
// fixed-size chunks and each chunk is named by a hash chained through the
// chunks before it, so one hash names a whole prefix and two prompts share
// the chunks of their common prefix.

// PrefixChunkBytes is the chunk size in bytes of the request body's prompt
// fields: 64 tokens at the router's 4 bytes per token estimate.
const PrefixChunkBytes = 256

// PrefixChunkTokens is a chunk's size in the router's token estimate.
const PrefixChunkTokens = PrefixChunkBytes / bytesPerToken

// PrefixChain hashes each full or final partial chunk of the concatenated
// parts, chained: the i-th hash is FNV-1a of everything up to the end of
// chunk i, so it names the whole prefix. FNV is unkeyed on purpose: the
// same prompt hashes the same in every run, which session-sticky routing
// and reproducible simulations need.
func PrefixChain(parts ...[]byte) []uint64 {
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	if total == 0 {
		return nil
	}
	out := make([]uint64, 0, (total+PrefixChunkBytes-1)/PrefixChunkBytes)
	h := fnv.New64a()
	n := 0
	for _, p := range parts {
		for len(p) > 0 {
			take := min(PrefixChunkBytes-n, len(p))
			h.Write(p[:take])
			p = p[take:]
			n += take
			if n == PrefixChunkBytes {
				out = append(out, h.Sum64())
				n = 0
			}
		}
	}
	if n > 0 {
		out = append(out, h.Sum64())
	}
	return out
}

// Prefix index sizes, in chunks. The default is about 256K tokens, the
// order of a 4B model's KV cache on one GPU or llama-server's 8 GiB host
// prompt cache: the index starts there and learns each engine's real
// retention from what it reports.
const (
	prefixDefaultChunks = 4096
	prefixMinChunks     = 64
	prefixMaxChunks     = 1 << 16
)

// PrefixIndex is one worker's approximate prefix cache: chunk hashes in LRU
// order, bounded. Its bound adapts to the engine: when the engine reports
// fewer cached tokens than the index predicted, the engine had evicted them
// and the bound shrinks to below what the index holds; when it reports more,
// the engine kept them and the bound grows. It has no lock: the router
// uses it under its own, the simulator in virtual time.
type PrefixIndex struct {
	limit   int
	entries map[uint64]*list.Element
	lru     list.List // of uint64; front = least recently used
	// Figures of what the engine reported, for the console.
	reportedPrompt, reportedCached int64
}

// NewPrefixIndex returns an empty index bounded at limit chunks (0: default).
func NewPrefixIndex(limit int) *PrefixIndex {
	if limit <= 0 {
		limit = prefixDefaultChunks
	}
	x := &PrefixIndex{limit: limit, entries: map[uint64]*list.Element{}}
	x.lru.Init()
	return x
}

// Match is how many leading chunks of chain the index holds.
func (x *PrefixIndex) Match(chain []uint64) int {
	for i, h := range chain {
		if _, ok := x.entries[h]; !ok {
			return i
		}
	}
	return len(chain)
}

// Insert records that the worker now holds chain, most recently used.
func (x *PrefixIndex) Insert(chain []uint64) {
	for _, h := range chain {
		if e, ok := x.entries[h]; ok {
			x.lru.MoveToBack(e)
			continue
		}
		x.entries[h] = x.lru.PushBack(h)
	}
	x.evict()
}

func (x *PrefixIndex) evict() {
	for x.lru.Len() > x.limit {
		e := x.lru.Front()
		delete(x.entries, e.Value.(uint64))
		x.lru.Remove(e)
	}
}

// Clear forgets everything: the worker's engine restarted with an empty cache.
func (x *PrefixIndex) Clear() {
	clear(x.entries)
	x.lru.Init()
}

// Len is the number of chunks held.
func (x *PrefixIndex) Len() int { return x.lru.Len() }

// Observe corrects the index with what the engine reported for a request
// whose chain was predicted to hit predicted chunks: cached prompt tokens out
// of promptTokens (the engine's own count). The chain has been inserted
// since (the engine now holds it all).
func (x *PrefixIndex) Observe(chain []uint64, predicted, promptTokens, cached int) {
	if promptTokens <= 0 || cached < 0 {
		return
	}
	x.reportedPrompt += int64(promptTokens)
	x.reportedCached += int64(cached)
	// The engine's tokens are not the router's estimate: scale its count
	// into chunks of this chain.
	held := int(float64(cached) / float64(promptTokens) * float64(len(chain)))
	switch {
	case held+1 < predicted:
		// The engine had evicted what the index still held: it retains
		// less than the index's bound. Shrink it below the index's size.
		x.limit = max(prefixMinChunks, min(x.limit, x.lru.Len())*9/10)
		x.evict()
	case held > predicted+2:
		// The engine kept more than the index knew: traffic from before
		// this router, or a bound smaller than the engine's cache when the
		// index is full. (One or two chunks more is the previous answer,
		// which the engine holds and the router never hashed.)
		if x.lru.Len() >= x.limit {
			x.limit = min(prefixMaxChunks, x.limit+max(x.limit/10, 1))
		}
		x.Insert(chain[:min(held, len(chain))])
	}
}

// HitRatio is cached over prompt tokens as the engine reported them, and
// whether it reported any.
func (x *PrefixIndex) HitRatio() (float64, bool) {
	if x.reportedPrompt == 0 {
		return 0, false
	}
	return float64(x.reportedCached) / float64(x.reportedPrompt), true
}

// predictedCached is the prompt tokens a worker whose index matches matched
// chunks of the job's chain is expected to have cached: the engines always
// compute the last prompt token.
func predictedCached(job Job, matched int) int {
	if matched <= 0 || len(job.Prefix) == 0 {
		return 0
	}
	if matched >= len(job.Prefix) {
		return max(job.PromptTokens-1, 0)
	}
	return min(matched*job.PromptTokens/len(job.Prefix), max(job.PromptTokens-1, 0))
}

// Predict is what the index expects the worker's engine to reuse of the
// job's prompt: the cached tokens and the matched chunks.
func (x *PrefixIndex) Predict(job Job) (cached, matched int) {
	if len(job.Prefix) == 0 {
		return 0, 0
	}
	matched = x.Match(job.Prefix)
	return predictedCached(job, matched), matched
}
