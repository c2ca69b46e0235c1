package sim

import (
	"hash/fnv"
	"sync"

	"fleet/internal/promptcache"
)

// bytesPerToken is the sim's tokenizer: every 4 bytes of the rendered prompt
// are one token (the last one may be shorter), about what BPE vocabularies
// give English text and code. The same text prefix is therefore the same
// token prefix, which is all prompt caching needs, and the count matches
// promptTokens.
const bytesPerToken = 4

// tokenize splits text into tokens, each the hash of its 4-byte chunk. An
// empty text is one token, as promptTokens counts it.
func tokenize(text string) []uint64 {
	n := (len(text) + bytesPerToken - 1) / bytesPerToken
	if n < 1 {
		return []uint64{chunkHash("")}
	}
	out := make([]uint64, n)
	for i := range out {
		end := min((i+1)*bytesPerToken, len(text))
		out[i] = chunkHash(text[i*bytesPerToken : end])
	}
	return out
}

func chunkHash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []uint64) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// cacheUse is one request's use of its engine's prompt cache: llama-server's
// slot and host cache, or vLLM's prefix blocks.
type cacheUse struct {
	s       *Server
	slot    int
	tokens  []uint64
	pinned  []uint64 // vLLM blocks the request holds
	cached  int      // prompt tokens reused
	prefill bool     // the prompt has been computed
}

// startCache looks the prompt up for a request that holds slot.
func (s *Server) startCache(slot int, tokens []uint64) *cacheUse {
	u := &cacheUse{s: s, slot: slot, tokens: tokens}
	if s.llamaCache != nil {
		u.cached = s.llamaCache.start(slot, tokens)
	} else {
		u.cached, u.pinned = s.blocks.start(tokens)
	}
	return u
}

// computed records that the whole prompt is now in the KV cache.
func (u *cacheUse) computed() {
	u.prefill = true
	if u.s.llamaCache != nil {
		u.s.llamaCache.prefilled(u.slot, u.tokens)
	} else {
		u.pinned = u.s.blocks.prefilled(u.tokens, u.pinned)
	}
}

// end leaves the prompt and what was generated (text) in the cache, or
// only what was reused when the request ended before its prefill did.
func (u *cacheUse) end(text string) {
	var all []uint64
	if u.prefill {
		all = tokenize(text)
	}
	if u.s.llamaCache != nil {
		u.s.llamaCache.finish(u.slot, all)
	} else {
		u.s.blocks.finish(all, u.pinned)
	}
}

// llamaCache is llama-server's prompt reuse, the model fleet/internal/promptcache
// keeps for the sim and the virtual-time simulator alike, with what /slots
// shows of each slot. The host cache's bound is --cache-ram over the
// profile's KV bytes per token.
type llamaCache struct {
	mu    sync.Mutex
	pc    *promptcache.Llama[[]uint64]
	slots []llamaSlot
}

// llamaSlot is what the slot's last request reported, for /slots.
type llamaSlot struct {
	hadTask             bool
	nPrompt, nProcessed int
	nCached             int
}

var tokenOps = promptcache.Ops[[]uint64]{
	Len:    func(t []uint64) int { return len(t) },
	Common: commonPrefix,
	Prefix: func(t []uint64, n int) []uint64 { return t[:n:n] },
}

// newLlamaCache is a server's cache: slots, --cache-ram in MiB (-1 no
// limit, 0 off), the KV size of a token, --slot-prompt-similarity,
// --cache-idle-slots and --kv-unified.
func newLlamaCache(slots, cacheRAMMiB int, tokenBytes uint64, similarity float64, cacheIdle, unified bool) *llamaCache {
	cfg := promptcache.Config{Slots: slots, Enabled: cacheRAMMiB != 0, Similarity: similarity,
		CacheIdle: cacheIdle, Unified: unified}
	if cacheRAMMiB > 0 {
		cfg.LimitTokens = int(uint64(cacheRAMMiB) * mib / max(tokenBytes, 1))
	}
	return &llamaCache{pc: promptcache.NewLlama(tokenOps, cfg), slots: make([]llamaSlot, slots)}
}

// choose picks among idle slots the way llama-server's get_available_slot
// does: best similarity above the threshold, else least recently used.
func (c *llamaCache) choose(idle []int, prompt []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pc.Choose(idle, prompt)
}

// start is a request taking slot: it runs the prompt cache update when
// llama-server would and returns how many prompt tokens are reused.
func (c *llamaCache) start(slot int, prompt []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	cached := c.pc.Start(slot, prompt)
	s := &c.slots[slot]
	s.hadTask, s.nPrompt, s.nCached, s.nProcessed = true, len(prompt), cached, 0
	return cached
}

// prefilled records that the slot computed its whole prompt.
func (c *llamaCache) prefilled(slot int, prompt []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.slots[slot]
	s.nProcessed = len(prompt) - s.nCached
	c.pc.Prefilled(slot, prompt)
}

// finish leaves the slot holding its prompt and answer (all); nil keeps
// what it holds, for a request that ended before its prefill did.
func (c *llamaCache) finish(slot int, all []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pc.Finish(slot, all, all == nil)
	// The real server resets a slot's prompt statistics when it is
	// released: /slots shows them only while the request runs.
	c.slots[slot].nProcessed, c.slots[slot].nCached = 0, 0
}

// slotView is what /slots shows of a slot's cache.
type slotView struct {
	hadTask                     bool
	nTokens, nProcessed, nCache int
}

func (c *llamaCache) view(slot int) slotView {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[slot]
	return slotView{hadTask: s.hadTask, nTokens: c.pc.Held(slot), nProcessed: s.nProcessed, nCache: s.nCached}
}

// vllmBlockSize is vLLM's default KV block size (--block-size 16).
const vllmBlockSize = promptcache.BlockSize

// blockCache is vLLM's automatic prefix caching on token lists: the model
// fleet/internal/promptcache keeps for the sim and the virtual-time
// simulator alike (Blocks), each full block named by the hash of its tokens
// and of the block before it. The KV cache is the profile's KVCacheTokens.
type blockCache struct {
	mu      sync.Mutex
	enabled bool
	pc      *promptcache.Blocks[uint64]
}

func newBlockCache(kvTokens int, enabled bool) *blockCache {
	return &blockCache{enabled: enabled, pc: promptcache.NewBlocks[uint64](kvTokens)}
}

// blockHashes chains the hashes of the full blocks of tokens.
func blockHashes(tokens []uint64) []uint64 {
	out := make([]uint64, 0, len(tokens)/vllmBlockSize)
	var prev uint64
	h := fnv.New64a()
	var buf [8]byte
	for i := 0; i+vllmBlockSize <= len(tokens); i += vllmBlockSize {
		h.Reset()
		for _, v := range append([]uint64{prev}, tokens[i:i+vllmBlockSize]...) {
			for k := range buf {
				buf[k] = byte(v >> (8 * k))
			}
			h.Write(buf[:])
		}
		prev = h.Sum64()
		out = append(out, prev)
	}
	return out
}

// start matches the prompt against cached blocks and pins what it uses: the
// hit is whole blocks, at most len-1 tokens (the last is always computed).
// It returns the cached token count and the pinned hashes, for finish.
func (b *blockCache) start(prompt []uint64) (int, []uint64) {
	if !b.enabled {
		return 0, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	hashes := blockHashes(prompt[:max(len(prompt)-1, 0)])
	n := b.pc.Start(hashes)
	return n * vllmBlockSize, hashes[:n]
}

// prefilled caches the prompt's full blocks as soon as they are computed,
// pinned for the request's life. It returns every block the request pins.
func (b *blockCache) prefilled(prompt []uint64, pinned []uint64) []uint64 {
	if !b.enabled {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	hashes := blockHashes(prompt)
	b.pc.Prefilled(hashes, len(pinned))
	return hashes
}

// finish caches the full blocks of the answer too (all: prompt and answer),
// unpins the request's blocks and evicts beyond the capacity.
func (b *blockCache) finish(all []uint64, pinned []uint64) {
	if !b.enabled {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pc.Finish(pinned, blockHashes(all))
}

// size is how many blocks the cache holds.
func (b *blockCache) size() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pc.Len()
}
