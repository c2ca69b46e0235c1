package simulate

import (
	"reflect"
	"strings"
	"testing"

	"fleet/router"
)

var agentPolicies = []string{router.PolicyFleet, router.PolicyFleetNoPrefix, router.PolicyP2CLeastLoaded,
	router.PolicyRoundRobin, router.PolicyRandom, router.PolicySessionSticky, router.PolicyCacheAware}

func runAgent(t *testing.T, name string) map[string]Result {
	t.Helper()
	s, err := Builtin(name, 0.7)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(s, agentPolicies)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Result{}
	for _, r := range res {
		out[r.Policy] = r
		t.Logf("%s %-17s p50/p99 TTFT %7.0f/%7.0f ms  p50/p99 E2E %7.0f/%7.0f ms  cache hit %.3f of %.3f  share %v",
			name, r.Policy, r.P50TTFTms, r.P99TTFTms, r.P50E2Ems, r.P99E2Ems, r.CacheHit, r.CacheHitCeiling, r.Share)
		if r.Requests+r.Rejected != s.Requests {
			t.Errorf("%s: %d served + %d rejected of %d turns", r.Policy, r.Requests, r.Rejected, s.Requests)
		}
	}
	for _, p := range agentPolicies {
		if out[p].Requests == 0 {
			t.Fatalf("no result for policy %s", p)
		}
	}
	return out
}

// The goals on the seed-mixed fleet's agent sessions at 70% load.
// All but one are asserted. p50 TTFT ≤ cache-aware's is logged: at seed 42
// cache-aware's median is a 5060 Ti turn that found its whole conversation
// and no queue (137 ms, the fixed cost plus ~500 new tokens at 5,000 tok/s),
// because 53.7% of its turns land there while a third wait 60–80 s on the M1
// Ultra. Matching it needs half of all turns served that way, so the Macs
// would carry the other half at about their full capacity, which no tail
// goal survives (docs/measurements.md).
func TestAgentSessionsTargets(t *testing.T) {
	res := runAgent(t, "agent-sessions")
	f := res[router.PolicyFleet]
	np, ca := res[router.PolicyFleetNoPrefix], res[router.PolicyCacheAware]
	t.Logf("fleet p50 TTFT %.2f× fleet-no-prefix's (goal 0.3), %.2f× cache-aware's (goal 1); cache hit %.1f%% of the ceiling (goal 90%%)",
		f.P50TTFTms/np.P50TTFTms, f.P50TTFTms/ca.P50TTFTms, 100*f.CacheHit/f.CacheHitCeiling)
	if f.P50TTFTms > 0.3*np.P50TTFTms {
		t.Errorf("fleet p50 TTFT %.0f ms > 0.3 × fleet-no-prefix's %.0f ms", f.P50TTFTms, np.P50TTFTms)
	}
	if ss := res[router.PolicySessionSticky]; f.P50TTFTms > 0.7*ss.P50TTFTms {
		t.Errorf("fleet p50 TTFT %.0f ms > 0.7 × session-sticky's %.0f ms", f.P50TTFTms, ss.P50TTFTms)
	}
	if f.P99E2Ems > 0.6*ca.P99E2Ems {
		t.Errorf("fleet p99 E2E %.0f ms > 0.6 × cache-aware's %.0f ms", f.P99E2Ems, ca.P99E2Ems)
	}
	for _, p := range agentPolicies[1:] {
		if f.P99E2Ems > res[p].P99E2Ems {
			t.Errorf("fleet p99 E2E %.0f ms worse than %s's %.0f ms", f.P99E2Ems, p, res[p].P99E2Ems)
		}
	}
	if f.CacheHit < 0.9*f.CacheHitCeiling {
		t.Errorf("fleet cache hit %.3f < 90%% of the workload's ceiling %.3f", f.CacheHit, f.CacheHitCeiling)
	}
	if f.Share["ultra27/qwen3-4b"] > 0.01 {
		t.Errorf("fleet sent %.1f%% of turns to the starved 27B", 100*f.Share["ultra27/qwen3-4b"])
	}
}

// On four equal workers fleet must be within 5% of cache-aware, or better.
func TestAgentSessionsHomogeneous(t *testing.T) {
	res := runAgent(t, "agent-sessions-homogeneous")
	f, ca := res[router.PolicyFleet], res[router.PolicyCacheAware]
	if f.P50TTFTms > 1.05*ca.P50TTFTms || f.P99E2Ems > 1.05*ca.P99E2Ems {
		t.Errorf("fleet p50 TTFT %.0f / p99 E2E %.0f ms against cache-aware's %.0f / %.0f ms", f.P50TTFTms, f.P99E2Ems, ca.P50TTFTms, ca.P99E2Ems)
	}
}

// Chat prompts share nothing: the prefix-aware fleet must schedule them
// as fleet-no-prefix does.
func TestChatUnchangedByPrefix(t *testing.T) {
	s, _ := Builtin("seed-mixed", 0.7)
	res, err := Run(s, []string{router.PolicyFleet, router.PolicyFleetNoPrefix})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].P99E2Ems > 1.05*res[1].P99E2Ems {
		t.Errorf("seed-mixed: fleet p99 E2E %.0f ms > 1.05 × fleet-no-prefix's %.0f ms", res[0].P99E2Ems, res[1].P99E2Ems)
	}
}

func TestLlamaCacheModel(t *testing.T) {
	c := &caches{system: []int{4000}}
	l := newLlamaCache(c, 2, 20000)
	first := seq{0, 1, 4500}
	slot := l.choose(first)
	if got := l.start(slot, first); got != 0 {
		t.Fatalf("a cold prompt reused %d tokens", got)
	}
	l.prefilled(slot, first)
	l.finish(slot, seq{0, 1, 4570})
	// The next turn holds the previous prompt and answer: it takes the same
	// slot by similarity and reuses all of it.
	second := seq{0, 1, 5100}
	if s := l.choose(second); s != slot {
		t.Fatalf("the next turn took slot %d, not its conversation's %d", s, slot)
	}
	if got := l.start(slot, second); got != 4570 {
		t.Errorf("the next turn reused %d tokens, want 4570", got)
	}
	l.prefilled(slot, second)
	l.finish(slot, seq{0, 1, 5170})
	// Another session of the kind shares only the system prefix.
	other := seq{0, 2, 4300}
	s := l.choose(other)
	if got := l.start(s, other); got != 4000 {
		t.Errorf("another session reused %d tokens, want the 4000-token system prefix", got)
	}
	// A repeated prompt computes its last token.
	l.finish(s, seq{0, 2, 4300})
	if got := l.start(l.choose(other), other); got != 4299 {
		t.Errorf("a repeated prompt reused %d tokens, want 4299", got)
	}
}

// TestLlamaCacheSavesIdleSlots replays the sequence the sim checks against
// the real llama-server (sim.TestHostCacheMatchesRealLlamaServer, "two
// slots unified, shared system between"): A, then B of the same kind taking
// A's slot by similarity, A again, an unrelated C, then B again. The real
// server copies idle slots to its host cache and clears them when a task
// starts (--cache-idle-slots with --kv-unified), so B comes back whole.
func TestLlamaCacheSavesIdleSlots(t *testing.T) {
	c := &caches{system: []int{4000, 4000}}
	l := newLlamaCache(c, 2, 20000)
	a, b, other := seq{0, 1, 5000}, seq{0, 2, 10000}, seq{1, 3, 4500}
	turn := func(p seq) int {
		slot := l.choose(p)
		got := l.start(slot, p)
		l.prefilled(slot, p)
		l.finish(slot, seq{p.kind, p.session, p.n + 70})
		return got
	}
	want := []struct {
		p      seq
		cached int
	}{{a, 0}, {b, 4000}, {a, 4000}, {other, 0}, {b, 9999}}
	for i, w := range want {
		if got := turn(w.p); got != w.cached {
			t.Errorf("request %d (session %d, %d tokens) reused %d tokens, want %d", i+1, w.p.session, w.p.n, got, w.cached)
		}
	}
}

func TestVLLMBlockCacheModel(t *testing.T) {
	c := &caches{system: []int{4000}}
	b := newBlockCache(c, 16*400) // 6,400 tokens
	p := seq{0, 1, 4500}
	got, pinned := b.start(p)
	if got != 0 {
		t.Fatalf("a cold prompt reused %d tokens", got)
	}
	pinned = b.prefilled(p, pinned)
	b.finish(p, seq{0, 1, 4570}, pinned)
	// Same session, longer: whole blocks of everything before.
	next := seq{0, 1, 5000}
	if got, pinned = b.start(next); got != 4560 {
		t.Errorf("the next turn reused %d tokens, want 4560 (whole 16-token blocks)", got)
	}
	b.finish(next, seq{}, pinned)
	// Another session shares the system prefix's whole blocks.
	if got, pinned = b.start(seq{0, 2, 4300}); got != 4000 {
		t.Errorf("another session reused %d tokens, want 4000", got)
	}
	b.finish(seq{0, 2, 4300}, seq{}, pinned)
	// Beyond the KV cache the least recently used blocks go.
	for s := 3; s < 8; s++ {
		p := seq{-1, s, 3000}
		_, pin := b.start(p)
		pin = b.prefilled(p, pin)
		b.finish(p, p, pin)
	}
	if got, _ := b.start(seq{0, 1, 5000}); got != 0 {
		t.Errorf("after filling the cache with other prompts the session still reused %d tokens", got)
	}
	if b.pc.Len() > b.pc.Capacity() {
		t.Errorf("cache holds %d blocks, capacity %d", b.pc.Len(), b.pc.Capacity())
	}
}

func TestSessionPlansGrow(t *testing.T) {
	s, _ := Builtin("agent-sessions", 0.7)
	plans := s.sessionPlans()
	n := 0
	for _, sp := range plans {
		n += len(sp.turns)
		for k := 1; k < len(sp.turns); k++ {
			grow := sp.turns[k].prompt - sp.turns[k-1].prompt
			if grow < 400 || grow > 600 && grow != sp.turns[k-1].output {
				t.Fatalf("a turn grew by %d tokens, want 400–600", grow)
			}
		}
		if sp.turns[0].prompt < s.Agent.System[sp.kind] {
			t.Fatalf("a first turn of %d tokens is shorter than its kind's prefix", sp.turns[0].prompt)
		}
	}
	if n != s.Requests {
		t.Errorf("plans hold %d turns, want %d", n, s.Requests)
	}
	if c := cacheCeiling(plans, s.Agent.System); c < 0.8 || c > 0.99 {
		t.Errorf("cache ceiling %.3f is implausible", c)
	}
}

// The goals over seeds 1–10 (virtual time is deterministic). Those
// that hold on every seed are asserted on every seed; the others are
// logged per seed, with why they miss where they do (docs/measurements.md):
// p50 TTFT ≤ cache-aware's misses where the fleet runs its fast worker at
// saturation (seeds 2, 5, 7, 9), p99 E2E ≤ fleet-no-prefix's and p50 TTFT
// ≤ 0.3× its where the load is light enough that fleet-no-prefix keeps
// every session on the vLLM worker, whose shared cache holds them anyway.
func TestAgentSessionsGoalsAcrossSeeds(t *testing.T) {
	if testing.Short() {
		t.Skip("ten seeds of seven policies")
	}
	for seed := uint64(1); seed <= 10; seed++ {
		s, err := Builtin("agent-sessions", 0.7)
		if err != nil {
			t.Fatal(err)
		}
		s.Seed = seed
		out, err := Run(s, agentPolicies)
		if err != nil {
			t.Fatal(err)
		}
		res := map[string]Result{}
		for _, r := range out {
			res[r.Policy] = r
		}
		f, ca, np := res[router.PolicyFleet], res[router.PolicyCacheAware], res[router.PolicyFleetNoPrefix]
		t.Logf("seed %2d: fleet/cache-aware p50 TTFT %.2f, p99 E2E %.2f; fleet/fleet-no-prefix p50 TTFT %.2f, p99 E2E %.2f; cache hit %.1f%% of the ceiling",
			seed, f.P50TTFTms/ca.P50TTFTms, f.P99E2Ems/ca.P99E2Ems, f.P50TTFTms/np.P50TTFTms, f.P99E2Ems/np.P99E2Ems, 100*f.CacheHit/f.CacheHitCeiling)
		if ss := res[router.PolicySessionSticky]; f.P50TTFTms > 0.7*ss.P50TTFTms {
			t.Errorf("seed %d: fleet p50 TTFT %.0f ms > 0.7 × session-sticky's %.0f ms", seed, f.P50TTFTms, ss.P50TTFTms)
		}
		if f.P99E2Ems > 0.6*ca.P99E2Ems {
			t.Errorf("seed %d: fleet p99 E2E %.0f ms > 0.6 × cache-aware's %.0f ms", seed, f.P99E2Ems, ca.P99E2Ems)
		}
		if f.P50TTFTms >= np.P50TTFTms {
			t.Errorf("seed %d: fleet p50 TTFT %.0f ms not below fleet-no-prefix's %.0f ms", seed, f.P50TTFTms, np.P50TTFTms)
		}
		for _, p := range []string{router.PolicyP2CLeastLoaded, router.PolicyRoundRobin, router.PolicyRandom, router.PolicySessionSticky, router.PolicyCacheAware} {
			if f.P99E2Ems > res[p].P99E2Ems {
				t.Errorf("seed %d: fleet p99 E2E %.0f ms worse than %s's %.0f ms", seed, f.P99E2Ems, p, res[p].P99E2Ems)
			}
		}
		for _, p := range []string{router.PolicyP2CLeastLoaded, router.PolicyRoundRobin, router.PolicyRandom} {
			if f.P50TTFTms > res[p].P50TTFTms {
				t.Errorf("seed %d: fleet p50 TTFT %.0f ms worse than %s's %.0f ms", seed, f.P50TTFTms, p, res[p].P50TTFTms)
			}
		}
	}
}

// RunSessions of a scenario's own sessions is the scenario's run: the
// real-time test's virtual figures come from the same simulation.
func TestRunSessionsIsTheScenarioRun(t *testing.T) {
	s, err := Builtin("agent-sessions", 0.7)
	if err != nil {
		t.Fatal(err)
	}
	s.Requests = 600
	policies := []string{router.PolicyFleet, router.PolicyCacheAware}
	want, err := Run(s, policies)
	if err != nil {
		t.Fatal(err)
	}
	got, err := RunSessions(s, s.Sessions(), policies)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("%s: RunSessions %+v, Run %+v", want[i].Policy, got[i], want[i])
		}
	}
	bad := s.Sessions()[:1]
	bad[0].Kind = len(s.Agent.System)
	if _, err := RunSessions(s, bad, policies); err == nil || !strings.Contains(err.Error(), "kinds") {
		t.Errorf("a session of an unknown kind: err %v, want one that names the scenario's kinds", err)
	}
}
