package router

import (
	"hash/fnv"
	"math/rand/v2"
	"sync"
)

// The prefix-routing peers fleet is measured against, written from their
// documentation. Both send every request on at once and let the engine queue
// it, as a proxy in front of engines does; fleet's own policies wait in the
// router instead.

// EngineQueued is implemented by policies that may choose a full backend:
// the request is sent to it at once and waits in the engine's queue.
type EngineQueued interface {
	QueuesAtEngine() bool
}

// sessionStickyPolicy is what a consistent-hash proxy does for prompt
// caching: the first chunk of the prompt (in practice the system prompt)
// picks the backend by rendezvous hashing, whatever the load.
type sessionStickyPolicy struct{}

func (sessionStickyPolicy) Name() string         { return PolicySessionSticky }
func (sessionStickyPolicy) QueuesAtEngine() bool { return true }

func (sessionStickyPolicy) Choose(job Job, cands []Candidate, rng *rand.Rand) int {
	if len(cands) == 0 {
		return -1
	}
	if len(job.Prefix) == 0 {
		return rng.IntN(len(cands))
	}
	best, bestScore := -1, uint64(0)
	for i, c := range cands {
		h := fnv.New64a()
		var key [8]byte
		for k := range key {
			key[k] = byte(job.Prefix[0] >> (8 * k))
		}
		h.Write(key[:])
		h.Write([]byte(c.Name))
		if s := h.Sum64(); best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

// SGLang model gateway's cache_aware defaults (sgl-router / smg
// documentation: --cache-threshold 0.3, --balance-abs-threshold 64,
// --balance-rel-threshold 1.5, --max-tree-size 2^26 characters).
const (
	cacheAwareThreshold = 0.3
	cacheAwareAbs       = 64
	cacheAwareRel       = 1.5
	// cacheAwareTreeChunks is --max-tree-size (2^26 characters) in chunks.
	cacheAwareTreeChunks = (1 << 26) / PrefixChunkBytes
)

// cacheAwarePolicy is SGLang's cache_aware routing for HTTP workers: an
// approximate tree per worker of the prompt text sent to it, kept by the
// policy from its own decisions (the engines are not asked), LRU-evicted
// beyond --max-tree-size. When the system is imbalanced (the most loaded
// worker has more than balance-abs-threshold requests beyond the least
// loaded and more than balance-rel-threshold times its load) it sends to
// the least loaded worker. Otherwise it sends to the worker with the
// longest prefix match when that match covers more than cache-threshold of
// the prompt, else to the worker with the smallest tree. The prompt is
// inserted in the chosen worker's tree either way.
type cacheAwarePolicy struct {
	// mu guards the trees: Choose runs under the scheduler's lock, and
	// forgetWorker under the pool's, which the scheduler takes after its
	// own (catalog.go).
	mu    sync.Mutex
	trees map[string]*PrefixIndex
}

func newCacheAwarePolicy() *cacheAwarePolicy {
	return &cacheAwarePolicy{trees: map[string]*PrefixIndex{}}
}

func (*cacheAwarePolicy) Name() string         { return PolicyCacheAware }
func (*cacheAwarePolicy) QueuesAtEngine() bool { return true }

func (p *cacheAwarePolicy) treeLocked(name string) *PrefixIndex {
	t := p.trees[name]
	if t == nil {
		t = NewPrefixIndex(cacheAwareTreeChunks)
		p.trees[name] = t
	}
	return t
}

// forgetWorker drops a worker's tree when the router forgets the worker
// (sweepLocked): a restarted engine holds no cache, and a gone one never
// comes back under its name.
func (p *cacheAwarePolicy) forgetWorker(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.trees, name)
}

func (p *cacheAwarePolicy) Choose(job Job, cands []Candidate, rng *rand.Rand) int {
	if len(cands) == 0 {
		return -1
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	minI, maxLoad := 0, 0
	for i, c := range cands {
		if c.InFlight < cands[minI].InFlight {
			minI = i
		}
		maxLoad = max(maxLoad, c.InFlight)
	}
	minLoad := cands[minI].InFlight
	chosen := -1
	if maxLoad-minLoad > cacheAwareAbs && float64(maxLoad) > float64(minLoad)*cacheAwareRel {
		chosen = minI
	} else {
		best, bestMatch, ties := -1, -1, 0
		for i, c := range cands {
			m := p.treeLocked(c.Name).Match(job.Prefix)
			switch {
			case m > bestMatch:
				best, bestMatch, ties = i, m, 1
			case m == bestMatch:
				// The radix tree names whichever tenant it meets first
				// at the deepest node: no preference among equals.
				ties++
				if rng.IntN(ties) == 0 {
					best = i
				}
			}
		}
		if len(job.Prefix) > 0 && float64(bestMatch)/float64(len(job.Prefix)) > cacheAwareThreshold {
			chosen = best
		} else {
			// get_smallest_tenant takes the first minimum of a hash map's
			// iteration, whose order Rust randomises per process: among
			// equal trees (the empty ones at start) any may win, not the
			// first in our list (which made the outcome depend on the
			// order the hub lists its workers).
			ties := 0
			for i, c := range cands {
				switch {
				case chosen < 0 || p.treeLocked(c.Name).Len() < p.treeLocked(cands[chosen].Name).Len():
					chosen, ties = i, 1
				case p.treeLocked(c.Name).Len() == p.treeLocked(cands[chosen].Name).Len():
					ties++
					if rng.IntN(ties) == 0 {
						chosen = i
					}
				}
			}
		}
	}
	p.treeLocked(cands[chosen].Name).Insert(job.Prefix)
	return chosen
}
