package promptcache

import "container/list"

// BlockSize is vLLM's default KV block size (--block-size 16).
const BlockSize = 16

// Blocks is vLLM's automatic prefix caching, shared by the real-time sim and
// the virtual-time simulator: the KV cache is split in BlockSize-token
// blocks, each full block named by a key that stands for its tokens and
// every token before it (a chained hash in the sim, a (kind, session,
// index) triple in the simulator), so a block is shared by every request
// whose prompt has the same prefix up to it. Blocks in use by a running
// request are pinned; the rest are evicted least recently used first when
// the cache holds more than its capacity. Callers pass the keys of a
// prompt's full blocks, in order; Blocks is not safe for concurrent use.
type Blocks[K comparable] struct {
	capacity int
	blocks   map[K]*list.Element
	lru      list.List // of *cachedBlock[K]; front = least recently used
}

type cachedBlock[K comparable] struct {
	key  K
	refs int
}

// NewBlocks is a cache of kvTokens tokens (at least one block).
func NewBlocks[K comparable](kvTokens int) *Blocks[K] {
	b := &Blocks[K]{capacity: max(kvTokens/BlockSize, 1), blocks: map[K]*list.Element{}}
	b.lru.Init()
	return b
}

// Start matches a request's prompt against the cache and pins the blocks it
// reuses. keys are the full blocks of the prompt but its last token (the
// last token is always computed, to get the logits of the first generated
// one). It returns how many leading blocks are cached, now pinned.
func (b *Blocks[K]) Start(keys []K) int {
	i := 0
	for ; i < len(keys); i++ {
		e, ok := b.blocks[keys[i]]
		if !ok {
			break
		}
		e.Value.(*cachedBlock[K]).refs++
		b.lru.MoveToBack(e)
	}
	return i
}

// Prefilled caches the prompt's full blocks as soon as they are computed,
// pinned for the request's life, so a request with the same prefix that
// arrives meanwhile shares them. keys are the whole prompt's full blocks,
// pinned how many of them Start pinned; it returns how many leading blocks
// of keys the request now pins.
func (b *Blocks[K]) Prefilled(keys []K, pinned int) int {
	for _, k := range keys[min(pinned, len(keys)):] {
		e, ok := b.blocks[k]
		if !ok {
			e = b.lru.PushBack(&cachedBlock[K]{key: k})
			b.blocks[k] = e
		}
		e.Value.(*cachedBlock[K]).refs++
		b.lru.MoveToBack(e)
	}
	b.evict()
	return max(len(keys), pinned)
}

// Finish unpins the blocks a request pinned, caches the full blocks of its
// prompt and answer (all; none for a request that ended before its
// prefill did) and evicts beyond the capacity.
func (b *Blocks[K]) Finish(pinned, all []K) {
	for _, k := range pinned {
		if e, ok := b.blocks[k]; ok {
			e.Value.(*cachedBlock[K]).refs--
		}
	}
	for _, k := range all {
		if e, ok := b.blocks[k]; ok {
			b.lru.MoveToBack(e)
			continue
		}
		b.blocks[k] = b.lru.PushBack(&cachedBlock[K]{key: k})
	}
	b.evict()
}

// evict drops unpinned blocks, least recently used first, until the cache
// fits its capacity (pinned blocks may exceed it: vLLM would preempt).
func (b *Blocks[K]) evict() {
	for e := b.lru.Front(); e != nil && b.lru.Len() > b.capacity; {
		next := e.Next()
		if blk := e.Value.(*cachedBlock[K]); blk.refs == 0 {
			delete(b.blocks, blk.key)
			b.lru.Remove(e)
		}
		e = next
	}
}

// Len is how many blocks the cache holds.
func (b *Blocks[K]) Len() int { return b.lru.Len() }

// Capacity is how many blocks the cache keeps when none is pinned.
func (b *Blocks[K]) Capacity() int { return b.capacity }
