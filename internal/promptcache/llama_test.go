package promptcache

import (
	"fmt"
	"testing"
)

// Prompts are strings, a byte a token.
var byteOps = Ops[string]{
	Len: func(s string) int { return len(s) },
	Common: func(a, b string) int {
		n := 0
		for n < len(a) && n < len(b) && a[n] == b[n] {
			n++
		}
		return n
	},
	Prefix: func(s string, n int) string { return s[:n] },
}

func text(tag string, n int) string {
	s := ""
	for i := 0; len(s) < n; i++ {
		s += fmt.Sprintf("%s %d. ", tag, i)
	}
	return s[:n]
}

// The sequences sim.TestHostCacheMatchesRealLlamaServer replays against the
// real llama-server, with the reuse it reported, in tokens here.
func TestLlamaIdleSlotsGoToTheHostCache(t *testing.T) {
	system := text("system", 600)
	prompts := map[string]string{
		"A": system + text("apples", 150),
		"B": system + text("birds", 900),
		"C": text("other", 800),
	}
	const answer = "ok."
	for _, tc := range []struct {
		name string
		cfg  Config
		seq  string
		want []int
	}{
		// A is copied to the host cache when C starts; A again, taking
		// B's slot (keeping under half of it), loads it whole.
		{"two slots", Config{Slots: 2, Enabled: true, Similarity: 0.1, CacheIdle: true}, "ACBA", []int{0, 0, 600, 749}},
		{"two slots, no --cache-idle-slots", Config{Slots: 2, Enabled: true, Similarity: 0.1}, "ACBA", []int{0, 0, 600, 600}},
		// Unified: C clears A's slot into the host cache, so B again
		// takes the empty least recently used slot and loads itself.
		{"two slots unified", Config{Slots: 2, Enabled: true, Similarity: 0.1, CacheIdle: true, Unified: true}, "ABACB", []int{0, 600, 600, 0, 1499}},
		{"two slots unified, no --cache-idle-slots", Config{Slots: 2, Enabled: true, Similarity: 0.1, Unified: true}, "ABACB", []int{0, 600, 600, 0, 600}},
		// One slot: nothing is idle when a task starts.
		{"one slot", Config{Slots: 1, Enabled: true, Similarity: 0.1, CacheIdle: true}, "ABA", []int{0, 600, 600}},
		{"one slot, unrelated between", Config{Slots: 1, Enabled: true, Similarity: 0.1, CacheIdle: true}, "ACA", []int{0, 0, 749}},
		// No host cache: idle slots are neither saved nor cleared.
		{"cache off", Config{Slots: 2, Similarity: 0.1, CacheIdle: true, Unified: true}, "ACA", []int{0, 0, 749}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLlama(byteOps, tc.cfg)
			for i, name := range tc.seq {
				p := prompts[string(name)]
				slot := l.Choose(l.Idle(), p)
				got := l.Start(slot, p)
				l.Prefilled(slot, p)
				l.Finish(slot, p+answer, false)
				if got != tc.want[i] {
					t.Errorf("request %d (%c) reused %d tokens, want %d", i+1, name, got, tc.want[i])
				}
			}
		})
	}
}
