package promptcache

import "testing"

// TestBlocks: vLLM's block cache as both the sim and the simulator use it,
// step by step on a cache of 4 blocks. A block's key stands for its prefix,
// so a prompt is the list of its blocks' keys.
func TestBlocks(t *testing.T) {
	type step struct {
		name string
		// do runs on the cache and returns the leading blocks reused.
		do   func(b *Blocks[string]) int
		want int
		held int // blocks held after the step
	}
	// run serves a whole request: start, prefill, finish with its answer.
	run := func(prompt, all []string) func(b *Blocks[string]) int {
		return func(b *Blocks[string]) int {
			n := b.Start(prompt)
			pinned := b.Prefilled(prompt, n)
			b.Finish(prompt[:pinned], all)
			return n
		}
	}
	a, c, d := []string{"a0", "a1"}, []string{"c0", "c1"}, []string{"d0", "d1"}
	b := NewBlocks[string](4 * BlockSize)
	var heldA int
	for _, s := range []step{
		{"cold", run(a, a), 0, 2},
		{"another prompt, cold", run(c, c), 0, 4},
		{"a again reuses both blocks", run(a, a), 2, 4},
		{"d evicts the least recently used (c's)", run(d, d), 0, 4},
		{"c is gone", func(b *Blocks[string]) int { n := b.Start(c); b.Finish(c[:n], nil); return n }, 0, 4},
		{"a stayed", func(b *Blocks[string]) int { n := b.Start(a); b.Finish(a[:n], nil); return n }, 2, 4},
		{"a prefix of a shared, its own tail not", run([]string{"a0", "x1"}, []string{"a0", "x1", "x2"}), 1, 4},
		// a runs while three other prompts pass: its pinned blocks stay,
		// the cache grows past its capacity rather than drop them.
		{"pinned blocks survive", func(b *Blocks[string]) int {
			n := b.Start(a)
			heldA = b.Prefilled(a, n)
			for _, p := range [][]string{{"e0", "e1"}, {"f0", "f1"}, {"g0", "g1"}} {
				run(p, p)(b)
			}
			return n
		}, 2, 4},
		{"and are reused while pinned", func(b *Blocks[string]) int { n := b.Start(a); b.Finish(a[:n], nil); return n }, 2, 4},
		// Their last use was the step above, so two more prompts push
		// them out once unpinned.
		{"unpinned, they are evicted as any other", func(b *Blocks[string]) int {
			b.Finish(a[:heldA], nil)
			run([]string{"h0", "h1"}, []string{"h0", "h1"})(b)
			run([]string{"i0", "i1"}, []string{"i0", "i1"})(b)
			n := b.Start(a)
			b.Finish(a[:n], nil)
			return n
		}, 0, 4},
		{"an answer's blocks are cached too", func(b *Blocks[string]) int {
			run([]string{"s0"}, []string{"s0", "s1", "s2"})(b)
			n := b.Start([]string{"s0", "s1", "s2"})
			b.Finish([]string{"s0", "s1", "s2"}[:n], nil)
			return n
		}, 3, 4},
	} {
		if got := s.do(b); got != s.want {
			t.Errorf("%s: %d blocks reused, want %d", s.name, got, s.want)
		}
		if b.Len() != s.held {
			t.Errorf("%s: %d blocks held, want %d", s.name, b.Len(), s.held)
		}
	}
}

// TestBlocksCapacity: a cache smaller than a block still holds one.
func TestBlocksCapacity(t *testing.T) {
	for _, tc := range []struct{ tokens, want int }{{0, 1}, {BlockSize - 1, 1}, {BlockSize, 1}, {10 * BlockSize, 10}, {10*BlockSize + 5, 10}} {
		if got := NewBlocks[int](tc.tokens).Capacity(); got != tc.want {
			t.Errorf("NewBlocks(%d).Capacity() = %d, want %d", tc.tokens, got, tc.want)
		}
	}
}
