package router

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestPrefixChainSharesCommonPrefix(t *testing.T) {
	system := strings.Repeat("you are a coding agent. ", 100) // 2,400 bytes
	a := PrefixChain([]byte(system + "turn one"))
	b := PrefixChain([]byte(system), []byte("turn one and more text"))
	full := len(system) / PrefixChunkBytes
	for i := range full {
		if a[i] != b[i] {
			t.Fatalf("chunk %d of a shared prefix differs", i)
		}
	}
	if a[len(a)-1] == b[len(a)-1] {
		t.Error("a partial last chunk named the same as a longer prompt's chunk")
	}
	c := PrefixChain([]byte("x" + system))
	if c[0] == a[0] {
		t.Error("different prompts share a first chunk")
	}
	if PrefixChain(nil) != nil {
		t.Error("an empty prompt has a chain")
	}
}

func TestPrefixIndexLRUAndCorrections(t *testing.T) {
	x := NewPrefixIndex(100)
	chain := func(tag byte, n int) []uint64 {
		return PrefixChain([]byte(strings.Repeat(string(tag), n*PrefixChunkBytes)))
	}
	a, b := chain('a', 60), chain('b', 60)
	x.Insert(a)
	if got := x.Match(a); got != 60 {
		t.Fatalf("match %d, want 60", got)
	}
	x.Insert(b)
	if x.Len() != 100 {
		t.Fatalf("index holds %d chunks, bound 100", x.Len())
	}
	if got := x.Match(a); got != 0 {
		t.Errorf("the least recently used chain still matches %d chunks", got)
	}
	// The engine reused less than predicted: the bound shrinks.
	x.Observe(b, 60, 60*PrefixChunkTokens, 10*PrefixChunkTokens)
	if x.limit >= 100 || x.Len() > x.limit {
		t.Errorf("bound %d, len %d after an over-prediction", x.limit, x.Len())
	}
	// The engine held more than the index knew: the index learns it.
	c := chain('c', 20)
	x.Observe(c, 0, 20*PrefixChunkTokens, 20*PrefixChunkTokens)
	if got := x.Match(c); got != 20 {
		t.Errorf("after the engine reported 20 chunks cached the index matches %d", got)
	}
	if r, ok := x.HitRatio(); !ok || r <= 0 {
		t.Errorf("hit ratio %v %v", r, ok)
	}
	x.Clear()
	if x.Len() != 0 || x.Match(c) != 0 {
		t.Error("Clear left chunks")
	}
}

func prefixJob(prompt int, chain []uint64) Job {
	return Job{PromptTokens: prompt, OutputTokens: 70, Prefix: chain}
}

func TestFleetPolicyUsesPrefix(t *testing.T) {
	chain := PrefixChain([]byte(strings.Repeat("z", 8000*bytesPerToken)))
	job := prefixJob(8000, chain)
	mk := func() *SpeedModel {
		m := NewSpeedModel(SpeedPrior{})
		m.Seed(SpeedPoint{Concurrency: 1, TTFT: 50 * time.Millisecond, ITL: 12 * time.Millisecond, PrefillTokPerSec: 1200})
		return m
	}
	cands := []Candidate{
		{Name: "cold", Slots: 4, Speed: mk()},
		{Name: "warm", Slots: 4, InFlight: 1, Speed: mk(), Cached: 7900},
	}
	rng := newRNG(1)
	p, _ := NewPolicy(PolicyFleet)
	if i := p.Choose(job, cands, rng); i != 1 {
		t.Errorf("fleet chose %d, want the worker holding the prefix", i)
	}
	np, _ := NewPolicy(PolicyFleetNoPrefix)
	if i := np.Choose(job, cands, rng); i != 0 {
		t.Errorf("fleet-no-prefix chose %d, want the idle worker", i)
	}
}

// A turn waits for the full worker holding its conversation when that is
// predicted sooner than a free worker by the holder's speed advantage:
// between equal workers, whenever it is sooner (on two real llama-servers a
// margin of two sent sessions off the worker holding their files to one
// predicted up to twice as slow, issue 21); for a worker faster than the
// free one, by as much as it is faster, up to twice, so that affinity does
// not pile a fleet's turns onto its fastest worker (issue 10).
func TestFleetWaitsForTheConversationByItsSpeedAdvantage(t *testing.T) {
	chain := PrefixChain([]byte(strings.Repeat("w", 8000*bytesPerToken)))
	job := prefixJob(8000, chain)
	seeded := func(prefill float64) *SpeedModel {
		m := NewSpeedModel(SpeedPrior{})
		m.Seed(SpeedPoint{Concurrency: 1, TTFT: 50 * time.Millisecond, ITL: 12 * time.Millisecond, PrefillTokPerSec: prefill})
		return m
	}
	for _, tc := range []struct {
		name string
		// holderFaster is how many times the free worker's prefill rate
		// the holder's is; waitShare the holder's predicted completion
		// over the free worker's.
		holderFaster, waitShare float64
		wait                    bool
	}{
		{name: "equal workers, waiting a little sooner", holderFaster: 1, waitShare: 0.9, wait: true},
		{name: "equal workers, waiting later", holderFaster: 1, waitShare: 1.1, wait: false},
		{name: "slower holder, waiting sooner", holderFaster: 0.5, waitShare: 0.9, wait: true},
		{name: "holder 1.5x faster, waiting 0.75x", holderFaster: 1.5, waitShare: 0.75, wait: false},
		{name: "holder 1.5x faster, waiting 0.6x", holderFaster: 1.5, waitShare: 0.6, wait: true},
		{name: "holder 4x faster, waiting 0.6x", holderFaster: 4, waitShare: 0.6, wait: false},
		{name: "holder 4x faster, waiting 0.4x", holderFaster: 4, waitShare: 0.4, wait: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fleetPolicy{p2cAbove: 8, prefix: true}
			cands := []Candidate{
				{Name: "free", Slots: 4, Speed: seeded(1000)},
				{Name: "holder", Slots: 4, InFlight: 4, Speed: seeded(1000 * tc.holderFaster), Cached: 7900},
			}
			free := p.cost(job, cands[0], true)
			cands[1].NextFree = time.Duration(tc.waitShare*float64(free)) - p.cost(job, cands[1], true)
			if cands[1].NextFree <= 0 {
				t.Fatalf("setup: the holder's completion alone is %v against the free worker's %v", p.cost(job, cands[1], true), free)
			}
			i, waitFor := p.chooseOrWait(job, cands, newRNG(1))
			if got := i < 0 && waitFor == 1; got != tc.wait {
				t.Errorf("took %d, waited for %d; want waiting for the holder %v (its completion %v against the free worker's %v)",
					i, waitFor, tc.wait, p.cost(job, cands[1], true), free)
			}
		})
	}
}

func TestCacheAwarePolicy(t *testing.T) {
	p := newCacheAwarePolicy()
	rng := rand.New(rand.NewPCG(1, 2))
	cands := []Candidate{{Name: "a", Slots: 4}, {Name: "b", Slots: 4}, {Name: "c", Slots: 4}}
	sys := strings.Repeat("s", 40*PrefixChunkBytes)
	first := PrefixChain([]byte(sys + "session one"))
	i := p.Choose(prefixJob(10000, first), cands, rng)
	// A new prompt sharing the worker's prefix above cache-threshold 0.3
	// goes to it, full or not (the engine queues).
	cands[i].InFlight = 9
	second := PrefixChain([]byte(sys+"session one"), []byte(strings.Repeat("t", 20*PrefixChunkBytes)))
	if j := p.Choose(prefixJob(15000, second), cands, rng); j != i {
		t.Errorf("cache-aware sent a matching prompt to %d, not %d", j, i)
	}
	// Below the threshold it takes the smallest tree: one not yet used.
	other := PrefixChain([]byte(strings.Repeat("o", 40*PrefixChunkBytes)))
	if j := p.Choose(prefixJob(10000, other), cands, rng); j == i {
		t.Errorf("cache-aware sent an unmatched prompt to the largest tree")
	}
	// Imbalanced beyond 64 and 1.5×: the least loaded worker.
	cands[0].InFlight, cands[1].InFlight, cands[2].InFlight = 100, 10, 90
	if j := p.Choose(prefixJob(15000, second), cands, rng); j != 1 {
		t.Errorf("imbalanced cache-aware chose %d, want the least loaded 1", j)
	}
}

// Among equal smallest trees (all empty at start) cache-aware picks any, as
// SGLang's hash-map scan does: not always the first worker listed.
func TestCacheAwareSmallestTreeTieIsNotListOrder(t *testing.T) {
	cands := []Candidate{{Name: "a", Slots: 4}, {Name: "b", Slots: 4}, {Name: "c", Slots: 4}}
	firsts := map[int]int{}
	for seed := range uint64(30) {
		p := newCacheAwarePolicy()
		firsts[p.Choose(prefixJob(1000, PrefixChain([]byte("the first prompt"))), cands, rand.New(rand.NewPCG(seed, 7)))]++
	}
	if len(firsts) < 3 {
		t.Errorf("the first prompt to empty trees went to %v over 30 seeds; want every worker sometimes", firsts)
	}
}

func TestSessionStickyIsStable(t *testing.T) {
	p, _ := NewPolicy(PolicySessionSticky)
	cands := []Candidate{{Name: "a", Slots: 1}, {Name: "b", Slots: 1}, {Name: "c", Slots: 1}}
	job := prefixJob(100, PrefixChain([]byte("system prompt")))
	rng := newRNG(1)
	first := p.Choose(job, cands, rng)
	cands[first].InFlight = 5
	for range 10 {
		if i := p.Choose(job, cands, rng); i != first {
			t.Fatalf("session-sticky moved the prefix from %d to %d", first, i)
		}
	}
}

// The load price: a worker that holds the conversation and has room keeps
// the turn when the fastest worker, about to be full, is predicted to finish
// it only a little sooner; with nothing held anywhere (chat) the choice is
// fleet-no-prefix's.
func TestFleetLoadPriceKeepsTheTurnWhereItsConversationIs(t *testing.T) {
	chain := PrefixChain([]byte(strings.Repeat("y", 6000*bytesPerToken)))
	job := prefixJob(6000, chain)
	job.OutputTokens = 70
	fast := NewSpeedModel(SpeedPrior{})
	fast.Seed(SpeedPoint{Concurrency: 1, TTFT: 30 * time.Millisecond, ITL: 12 * time.Millisecond, PrefillTokPerSec: 5000})
	fast.Seed(SpeedPoint{Concurrency: 8, ITL: 13500 * time.Microsecond})
	mac := NewSpeedModel(SpeedPrior{})
	mac.Seed(SpeedPoint{Concurrency: 1, TTFT: 40 * time.Millisecond, ITL: 11500 * time.Microsecond, PrefillTokPerSec: 1200})
	cands := []Candidate{
		// The fast worker holds the agent kind's system prompt, one slot left.
		{Name: "fast", Slots: 8, InFlight: 7, Speed: fast, Cached: 4000},
		{Name: "mac", Slots: 4, InFlight: 1, Speed: mac, Cached: 5500},
	}
	onFast := fast.Completion(8, Job{PromptTokens: 2000, OutputTokens: 70})
	onMac := mac.Completion(2, Job{PromptTokens: 500, OutputTokens: 70})
	if onFast >= onMac {
		t.Fatalf("setup: the fast worker should be predicted first without the price (%v against %v)", onFast, onMac)
	}
	p, _ := NewPolicy(PolicyFleet)
	if i := p.Choose(job, cands, newRNG(1)); i != 1 {
		t.Errorf("fleet chose %s (%v against %v without the price), want the Mac holding the conversation with room", cands[i].Name, onFast, onMac)
	}
	// Chat: nothing held, no price; the fast worker's last slot wins.
	chat := Job{PromptTokens: 500, OutputTokens: 70}
	cands[0].Cached, cands[1].Cached = 0, 0
	np, _ := NewPolicy(PolicyFleetNoPrefix)
	want := np.Choose(chat, cands, newRNG(1))
	if i := p.Choose(chat, cands, newRNG(1)); i != want || want != 0 {
		t.Errorf("chat: fleet chose %d, fleet-no-prefix %d; want both the fast worker (0)", i, want)
	}
}

// A turn whose conversation its worker holds frees its slot in about the
// time of its uncached tokens, and the scheduler predicts it so: the next
// turn of a session whose worker is full waits for that worker rather than
// computing the whole conversation again on the idle one. Priced at its
// whole prompt, the held turn looked like seconds of prefill, and on two
// real llama-servers (issue 21) fleet sent sessions away from the worker
// holding their 3,000-token read about as often as fleet-no-prefix did.
func TestHeldTurnFreesItsSlotSoon(t *testing.T) {
	r := twins(t, 1)
	for _, n := range []string{"busy/qwen3-4b", "idle/qwen3-4b"} {
		r.SeedSpeed(n, SpeedPoint{Concurrency: 1, TTFT: 80 * time.Millisecond, PromptTokens: 1000, ITL: 12 * time.Millisecond, PrefillTokPerSec: 1000})
	}
	conversation := strings.Repeat("a session's conversation so far ", 6000*bytesPerToken/32)
	turn := func(more string) Job {
		text := conversation + more
		return Job{PromptTokens: len(text) / bytesPerToken, OutputTokens: 8, NeedContext: 8000, Prefix: PrefixChain([]byte(text))}
	}
	now := time.Now()
	r.pool.mu.Lock()
	// The session's earlier turns ran on busy, which holds them.
	r.pool.workerLocked("busy/qwen3-4b").prefix.Insert(turn("").Prefix)
	var busy *backend
	for _, b := range r.pool.backends {
		if b.cfg.Name == "busy/qwen3-4b" {
			busy = b
		}
	}
	// Another of the session's requests (a subagent, a retry) takes
	// busy's one slot, with a short tool result on top of what it holds.
	f := r.pool.takeLocked(busy, "qwen3-4b", turn(strings.Repeat("tool result ", 80)), now)
	whole := r.pool.workerLocked("busy/qwen3-4b").speed.Completion(1, f.job)
	r.pool.mu.Unlock()
	if left := f.predictedEnd.Sub(now); left > whole/4 {
		t.Errorf("a turn whose 6,000-token conversation busy holds is predicted to end in %v, as if it computed it all (%v)", left, whole)
	}
	next := turn(strings.Repeat("tool result ", 80) + strings.Repeat("next tool result ", 60))
	if i, cands := r.choose(t, next, now); i >= 0 {
		t.Errorf("fleet sent the next turn to %s (candidates %+v), want it to wait for busy, which holds its conversation and frees soon", cands[i].Name, cands)
	}
}
