// Package promptcache is the engines' prompt reuse, shared by the real-time
// sim (sim/) and the virtual-time simulator (router/simulate/): vLLM's
// prefix blocks (Blocks, blocks.go) and llama-server's slots and host cache
// (Llama, below: tools/server, server-context.cpp and server-task.cpp at
// commit de3ff81). The two callers hold prompts differently: token lists in
// one, (kind, session, length) triples in the other. Both models are
// generic over it: Llama's Ops say how long a prompt is and how much two
// share, Blocks' keys name a block and every token before it.
//
// Every slot keeps the tokens of its last request (prompt and answer) in
// its KV cache, and a host-RAM prompt cache (--cache-ram MiB, 8192 by
// default, -1 unlimited, 0 off) keeps more, oldest evicted first. When a
// request starts (get_available_slot):
//   - it takes the idle slot whose tokens share the largest fraction of its
//     prompt above --slot-prompt-similarity (0.10 by default), else the least
//     recently used idle slot;
//   - in the second case, or when the chosen slot would keep less than half
//     of its tokens, the slot's tokens are saved to the host cache
//     (prompt_save) and the cached prompt that keeps more of both comes back
//     in its place, leaving the host cache (prompt_load);
//   - then, with --cache-idle-slots (on by default whenever the host cache
//     is), every other idle slot's tokens are saved too, and with a unified
//     KV cache (--kv-unified, which fleet passes, or -np auto) those slots
//     are cleared (launch_slot_with_task's caller, process_single_task).
//
// A conversation therefore survives another one of the same system prompt
// taking its slot when any request started while its slot was idle; and on
// a unified KV cache a request mostly finds its own conversation in the host
// cache, not in a slot.
package promptcache

import "container/list"

// Ops are what the cache needs to know of a prompt P.
type Ops[P any] struct {
	// Len is the prompt's length in tokens.
	Len func(P) int
	// Common is the length of the longest common prefix of a and b.
	Common func(a, b P) int
	// Prefix is the first n tokens of p.
	Prefix func(p P, n int) P
}

// Config is the server's flags.
type Config struct {
	Slots int
	// Enabled is --cache-ram other than 0.
	Enabled bool
	// LimitTokens bounds the host cache (0: no bound), the size limit over
	// the per-token KV size.
	LimitTokens int
	// Similarity is --slot-prompt-similarity; 0 turns the choice by
	// similarity off.
	Similarity float64
	// CacheIdle is --cache-idle-slots; it needs Enabled.
	CacheIdle bool
	// Unified is --kv-unified: idle slots saved are also cleared.
	Unified bool
}

// Llama is one llama-server's slots and host cache. It is not safe for
// concurrent use.
type Llama[P any] struct {
	ops   Ops[P]
	cfg   Config
	slots []slot[P]
	host  *list.List // of P, oldest at the front
	clock uint64
}

type slot[P any] struct {
	tokens   P
	lastUsed uint64
	busy     bool
}

// NewLlama makes an empty cache.
func NewLlama[P any](ops Ops[P], cfg Config) *Llama[P] {
	cfg.CacheIdle = cfg.CacheIdle && cfg.Enabled
	return &Llama[P]{ops: ops, cfg: cfg, slots: make([]slot[P], cfg.Slots), host: list.New()}
}

// Idle lists the slots not running a request.
func (l *Llama[P]) Idle() []int {
	var idle []int
	for i, s := range l.slots {
		if !s.busy {
			idle = append(idle, i)
		}
	}
	return idle
}

// Choose picks among idle slots: best similarity above the threshold, else
// least recently used; -1 when none is idle.
func (l *Llama[P]) Choose(idle []int, prompt P) int {
	best, bestSim := -1, 0.0
	n := float64(max(l.ops.Len(prompt), 1))
	if l.cfg.Similarity != 0 {
		for _, i := range idle {
			if l.ops.Len(l.slots[i].tokens) == 0 {
				continue
			}
			sim := float64(l.ops.Common(l.slots[i].tokens, prompt)) / n
			if sim > bestSim && sim > l.cfg.Similarity {
				best, bestSim = i, sim
			}
		}
	}
	if best >= 0 {
		return best
	}
	for _, i := range idle {
		if best < 0 || l.slots[i].lastUsed < l.slots[best].lastUsed {
			best = i
		}
	}
	return best
}

// Start is a request taking slot: it runs the prompt cache update when
// llama-server would and returns how many prompt tokens are reused. The
// slot then holds the reused prefix until Prefilled.
func (l *Llama[P]) Start(i int, prompt P) int {
	s := &l.slots[i]
	n := l.ops.Len(prompt)
	held := l.ops.Len(s.tokens)
	lcp := l.ops.Common(s.tokens, prompt)
	bySimilarity := l.cfg.Similarity != 0 && held > 0 && float64(lcp)/float64(max(n, 1)) > l.cfg.Similarity
	if (!bySimilarity || float64(lcp)/float64(max(held, 1)) < 0.5) && l.cfg.Enabled {
		l.Save(s.tokens)
		l.load(i, prompt)
	}
	cached := EvaluateOne(l.ops.Common(s.tokens, prompt), n)
	s.tokens, s.busy = l.ops.Prefix(prompt, cached), true
	if l.cfg.CacheIdle {
		for j := range l.slots {
			if o := &l.slots[j]; !o.busy {
				l.Save(o.tokens)
				if l.cfg.Unified {
					o.tokens = l.ops.Prefix(o.tokens, 0)
				}
			}
		}
	}
	return cached
}

// Prefilled records that slot i computed its whole prompt.
func (l *Llama[P]) Prefilled(i int, prompt P) { l.slots[i].tokens = prompt }

// Finish frees slot i, holding all (its prompt and answer), or what it
// holds when keep is set, for a request that ended before its prefill did.
func (l *Llama[P]) Finish(i int, all P, keep bool) {
	l.clock++
	s := &l.slots[i]
	if !keep {
		s.tokens = all
	}
	s.busy, s.lastUsed = false, l.clock
}

// Held is how many tokens slot i holds.
func (l *Llama[P]) Held(i int) int { return l.ops.Len(l.slots[i].tokens) }

// Host lists the host cache's prompts, oldest first.
func (l *Llama[P]) Host() []P {
	out := make([]P, 0, l.host.Len())
	for e := l.host.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(P))
	}
	return out
}

func (l *Llama[P]) hostTokens() int {
	n := 0
	for e := l.host.Front(); e != nil; e = e.Next() {
		n += l.ops.Len(e.Value.(P))
	}
	return n
}

// Save stores a prompt in the host cache (server_prompt_cache::alloc):
// nothing when a cached prompt holds it whole or it exceeds the whole
// limit; cached prompts it holds whole are dropped, then the oldest until
// it fits.
func (l *Llama[P]) Save(tokens P) {
	n := l.ops.Len(tokens)
	if n == 0 || !l.cfg.Enabled {
		return
	}
	for e := l.host.Front(); e != nil; e = e.Next() {
		if l.ops.Common(e.Value.(P), tokens) == n {
			return
		}
	}
	limit := l.cfg.LimitTokens
	if limit > 0 && n > limit {
		return
	}
	for e := l.host.Front(); e != nil; {
		next := e.Next()
		if t := e.Value.(P); l.ops.Common(t, tokens) == l.ops.Len(t) {
			l.host.Remove(e)
		}
		e = next
	}
	for limit > 0 && l.host.Len() > 0 && l.hostTokens()+n > limit {
		l.host.Remove(l.host.Front())
	}
	l.host.PushBack(tokens)
}

// load replaces slot i's tokens by the cached prompt that keeps more of
// both (server_prompt_cache::load), taking it out of the cache.
func (l *Llama[P]) load(i int, prompt P) {
	cur := l.slots[i].tokens
	n := float64(max(l.ops.Len(prompt), 1))
	lcp := l.ops.Common(cur, prompt)
	keepBest := -1.0 // an empty slot: any cached prompt wins
	if held := l.ops.Len(cur); held > 0 {
		keepBest = float64(lcp) / float64(held)
	}
	simBest := float64(lcp) / n
	var found *list.Element
	for e := l.host.Front(); e != nil; e = e.Next() {
		t := e.Value.(P)
		m := l.ops.Common(t, prompt)
		keep, sim := float64(m)/float64(max(l.ops.Len(t), 1)), float64(m)/n
		if keep < 0.25 {
			continue // do not trash a large prompt for a small overlap
		}
		if keepBest < keep && simBest < sim {
			keepBest, simBest, found = keep, sim, e
		}
	}
	if found != nil {
		l.slots[i].tokens = found.Value.(P)
		l.host.Remove(found)
	}
}

// EvaluateOne is both engines' rule: the last prompt token is always
// computed, to get the logits of the first generated one.
func EvaluateOne(cached, prompt int) int {
	if cached >= prompt {
		return max(prompt-1, 0)
	}
	return cached
}
