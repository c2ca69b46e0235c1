package simulate

import "fleet/internal/promptcache"

// The engines' prompt caches in virtual time, as `fleet sim` keeps them
// (sim/prefix.go): llama-server's slots plus host-RAM cache, and vLLM's
// 16-token prefix blocks. The simulator does not hold token lists: a prompt
// is a seq, and two seqs share a prefix by construction: a session's turns
// extend one another, sessions of one agent kind share the kind's system
// prefix, and nothing else is shared.
type seq struct {
	kind    int // agent kind, -1 for a prompt that shares nothing
	session int
	n       int // tokens
}

// caches holds what seqs of a scenario share: each agent kind's system
// prefix length.
type caches struct{ system []int }

// common is the length of the longest common prefix of a and b.
func (c *caches) common(a, b seq) int {
	switch {
	case a.kind < 0 || b.kind < 0:
		if a.kind == b.kind && a.session == b.session {
			return min(a.n, b.n)
		}
		return 0
	case a.session == b.session:
		return min(a.n, b.n)
	case a.kind == b.kind:
		return min(c.system[a.kind], a.n, b.n)
	}
	return 0
}

// evaluateOne is both engines' rule: the last prompt token is always
// computed, to get the logits of the first generated one.
func evaluateOne(cached, prompt int) int { return promptcache.EvaluateOne(cached, prompt) }

// llamaCache is llama-server's prompt reuse on seqs: the same model as
// `fleet sim`'s (fleet/internal/promptcache), with the flags fleet launches
// it with: --slot-prompt-similarity 0.10, the host cache on, idle slots
// saved to it and, as fleet passes --kv-unified, cleared.
type llamaCache struct {
	*promptcache.Llama[seq]
}

func newLlamaCache(c *caches, slots, hostTokens int) *llamaCache {
	ops := promptcache.Ops[seq]{
		Len:    func(s seq) int { return s.n },
		Common: c.common,
		Prefix: func(s seq, n int) seq { return seq{s.kind, s.session, n} },
	}
	return &llamaCache{promptcache.NewLlama(ops, promptcache.Config{Slots: slots, Enabled: hostTokens > 0,
		LimitTokens: hostTokens, Similarity: 0.10, CacheIdle: true, Unified: true})}
}

// choose picks an idle slot for prompt; -1 when none is idle.
func (l *llamaCache) choose(prompt seq) int { return l.Choose(l.Idle(), prompt) }

// start takes slot for prompt and returns the prompt tokens reused.
func (l *llamaCache) start(slot int, prompt seq) int { return l.Start(slot, prompt) }

func (l *llamaCache) prefilled(slot int, prompt seq) { l.Prefilled(slot, prompt) }

// finish leaves the slot holding the prompt and its answer.
func (l *llamaCache) finish(slot int, all seq) { l.Finish(slot, all, false) }

// blockCache is vLLM's automatic prefix caching on seqs: the same model as
// `fleet sim`'s (fleet/internal/promptcache's Blocks), with a block named by
// where its tokens come from instead of their hash.
type blockCache struct {
	c  *caches
	pc *promptcache.Blocks[blockKey]
}

const vllmBlockSize = promptcache.BlockSize

// blockKey names a block: a block wholly inside the kind's system prefix is
// the kind's, any other is its session's.
type blockKey struct{ kind, session, i int }

func newBlockCache(c *caches, kvTokens int) *blockCache {
	return &blockCache{c: c, pc: promptcache.NewBlocks[blockKey](kvTokens)}
}

// keys names the first n blocks of s.
func (b *blockCache) keys(s seq, n int) []blockKey {
	out := make([]blockKey, n)
	for i := range out {
		if s.kind >= 0 && (i+1)*vllmBlockSize <= b.c.system[s.kind] {
			out[i] = blockKey{s.kind, -1, i}
		} else {
			out[i] = blockKey{s.kind, s.session, i}
		}
	}
	return out
}

// start pins the cached full blocks of prompt[:n-1] and returns the tokens
// they hold and the pinned count.
func (b *blockCache) start(prompt seq) (int, int) {
	n := b.pc.Start(b.keys(prompt, max(prompt.n-1, 0)/vllmBlockSize))
	return n * vllmBlockSize, n
}

// prefilled caches and pins the prompt's full blocks; it returns the pinned
// count.
func (b *blockCache) prefilled(prompt seq, pinned int) int {
	return b.pc.Prefilled(b.keys(prompt, prompt.n/vllmBlockSize), pinned)
}

// finish unpins the request's blocks and caches the full blocks of its
// prompt and answer (all).
func (b *blockCache) finish(prompt, all seq, pinned int) {
	var answer []blockKey
	if all.n > 0 {
		answer = b.keys(all, all.n/vllmBlockSize)
	}
	b.pc.Finish(b.keys(prompt, pinned), answer)
}
