package simulate

import (
	"container/list"
	"slices"
)

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
func evaluateOne(cached, prompt int) int {
	if cached >= prompt {
		return max(prompt-1, 0)
	}
	return cached
}

// llamaCache mirrors sim's llama-server prompt reuse: slots keep their last
// request's prompt and answer; the host cache (--cache-ram) keeps more,
// oldest evicted first; a request takes the idle slot most similar to it
// (above --slot-prompt-similarity 0.10), else the least recently used one,
// whose tokens then go to the host cache while the best cached prompt comes
// back in its place; then every other idle slot's tokens are copied to the
// host cache and the slot cleared (--cache-idle-slots, on with the host
// cache, and fleet's --kv-unified), so a conversation survives another
// taking its slot.
type llamaCache struct {
	c          *caches
	slots      []llamaSlot
	host       []seq // oldest first
	limit      int   // host cache in tokens; 0 off
	clock      uint64
	similarity float64
}

type llamaSlot struct {
	tokens   seq
	has      bool
	busy     bool
	lastUsed uint64
}

func newLlamaCache(c *caches, slots, hostTokens int) *llamaCache {
	return &llamaCache{c: c, slots: make([]llamaSlot, slots), limit: hostTokens, similarity: 0.10}
}

// choose picks an idle slot for prompt; -1 when none is idle.
func (l *llamaCache) choose(prompt seq) int {
	best, bestSim := -1, 0.0
	for i, s := range l.slots {
		if s.busy || !s.has {
			continue
		}
		sim := float64(l.c.common(s.tokens, prompt)) / float64(max(prompt.n, 1))
		if sim > bestSim && sim > l.similarity {
			best, bestSim = i, sim
		}
	}
	if best >= 0 {
		return best
	}
	for i, s := range l.slots {
		if !s.busy && (best < 0 || s.lastUsed < l.slots[best].lastUsed) {
			best = i
		}
	}
	return best
}

func (l *llamaCache) hostTokens() int {
	n := 0
	for _, t := range l.host {
		n += t.n
	}
	return n
}

func (l *llamaCache) save(t seq) {
	if t.n == 0 || l.limit == 0 {
		return
	}
	for _, h := range l.host {
		if l.c.common(h, t) == t.n {
			return
		}
	}
	if t.n > l.limit {
		return
	}
	l.host = slices.DeleteFunc(l.host, func(h seq) bool { return l.c.common(h, t) == h.n })
	for len(l.host) > 0 && l.hostTokens()+t.n > l.limit {
		l.host = l.host[1:]
	}
	l.host = append(l.host, t)
}

func (l *llamaCache) load(slot int, prompt seq) {
	s := &l.slots[slot]
	lcp := 0
	keepBest := -1.0
	if s.has {
		lcp = l.c.common(s.tokens, prompt)
		if s.tokens.n > 0 {
			keepBest = float64(lcp) / float64(s.tokens.n)
		}
	}
	simBest := float64(lcp) / float64(max(prompt.n, 1))
	found := -1
	for i, t := range l.host {
		m := l.c.common(t, prompt)
		keep, sim := float64(m)/float64(t.n), float64(m)/float64(max(prompt.n, 1))
		if keep < 0.25 {
			continue
		}
		if keepBest < keep && simBest < sim {
			keepBest, simBest, found = keep, sim, i
		}
	}
	if found >= 0 {
		s.tokens, s.has = l.host[found], true
		l.host = slices.Delete(l.host, found, found+1)
	}
}

// start takes slot for prompt and returns the prompt tokens reused.
func (l *llamaCache) start(slot int, prompt seq) int {
	s := &l.slots[slot]
	s.busy = true
	lcp := 0
	if s.has {
		lcp = l.c.common(s.tokens, prompt)
	}
	bySimilarity := s.has && s.tokens.n > 0 && float64(lcp)/float64(max(prompt.n, 1)) > l.similarity
	if !bySimilarity || float64(lcp)/float64(max(s.tokens.n, 1)) < 0.5 {
		if s.has {
			l.save(s.tokens)
		}
		l.load(slot, prompt)
	}
	cached := 0
	if s.has {
		cached = evaluateOne(l.c.common(s.tokens, prompt), prompt.n)
	}
	s.tokens, s.has = seq{prompt.kind, prompt.session, cached}, true
	if l.limit > 0 {
		for i := range l.slots {
			if o := &l.slots[i]; !o.busy && o.has {
				l.save(o.tokens)
				o.tokens, o.has = seq{}, false
			}
		}
	}
	return cached
}

func (l *llamaCache) prefilled(slot int, prompt seq) { l.slots[slot].tokens = prompt }

// finish leaves the slot holding the prompt and its answer.
func (l *llamaCache) finish(slot int, all seq) {
	l.clock++
	s := &l.slots[slot]
	s.tokens, s.has, s.busy, s.lastUsed = all, true, false, l.clock
}

// blockCache mirrors sim's vLLM automatic prefix caching: 16-token blocks
// named by their prefix, shared by all requests, pinned while a request
// uses them, least recently used evicted beyond the KV cache.
type blockCache struct {
	c        *caches
	capacity int
	blocks   map[blockKey]*list.Element
	lru      list.List // of *simBlock
}

const vllmBlockSize = 16

// blockKey names a block: a block wholly inside the kind's system prefix is
// the kind's, any other is its session's.
type blockKey struct{ kind, session, i int }

type simBlock struct {
	key  blockKey
	refs int
}

func newBlockCache(c *caches, kvTokens int) *blockCache {
	b := &blockCache{c: c, capacity: max(kvTokens/vllmBlockSize, 1), blocks: map[blockKey]*list.Element{}}
	b.lru.Init()
	return b
}

func (b *blockCache) key(s seq, i int) blockKey {
	if s.kind >= 0 && (i+1)*vllmBlockSize <= b.c.system[s.kind] {
		return blockKey{s.kind, -1, i}
	}
	return blockKey{s.kind, s.session, i}
}

// start pins the cached full blocks of prompt[:n-1] and returns the tokens
// they hold and the pinned count.
func (b *blockCache) start(prompt seq) (int, int) {
	full := max(prompt.n-1, 0) / vllmBlockSize
	i := 0
	for ; i < full; i++ {
		e, ok := b.blocks[b.key(prompt, i)]
		if !ok {
			break
		}
		e.Value.(*simBlock).refs++
		b.lru.MoveToBack(e)
	}
	return i * vllmBlockSize, i
}

// prefilled caches and pins the prompt's full blocks; it returns the pinned
// count.
func (b *blockCache) prefilled(prompt seq, pinned int) int {
	full := prompt.n / vllmBlockSize
	for i := pinned; i < full; i++ {
		k := b.key(prompt, i)
		e, ok := b.blocks[k]
		if !ok {
			e = b.lru.PushBack(&simBlock{key: k})
			b.blocks[k] = e
		}
		e.Value.(*simBlock).refs++
		b.lru.MoveToBack(e)
	}
	b.evict()
	return max(full, pinned)
}

// finish unpins the request's blocks and caches the answer's full blocks.
func (b *blockCache) finish(prompt, all seq, pinned int) {
	for i := range pinned {
		if e, ok := b.blocks[b.key(prompt, i)]; ok {
			e.Value.(*simBlock).refs--
		}
	}
	if all.n > 0 {
		for i := range all.n / vllmBlockSize {
			k := b.key(all, i)
			if e, ok := b.blocks[k]; ok {
				b.lru.MoveToBack(e)
				continue
			}
			b.blocks[k] = b.lru.PushBack(&simBlock{key: k})
		}
	}
	b.evict()
}

func (b *blockCache) evict() {
	for e := b.lru.Front(); e != nil && b.lru.Len() > b.capacity; {
		next := e.Next()
		if blk := e.Value.(*simBlock); blk.refs == 0 {
			delete(b.blocks, blk.key)
			b.lru.Remove(e)
		}
		e = next
	}
}
