package simulate

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// AgentWorkload is coding-agent traffic: sessions of one growing
// conversation each, of a few agent kinds that each start every prompt with
// their own system and tools prefix. A turn appends a tool result and the
// previous answer, asks for a short answer, and the next turn comes a think
// time (the tool running) after it.
type AgentWorkload struct {
	// System is each kind's shared prefix, in tokens.
	System []int `json:"system"`
	// MinTurns and MaxTurns bound a session's turns (uniform).
	MinTurns int `json:"min_turns"`
	MaxTurns int `json:"max_turns"`
	// Task is the first turn's own message, in tokens.
	Task Dist `json:"task"`
	// Append is what each later turn adds: the previous answer and a tool
	// result, in tokens.
	Append Dist `json:"append"`
	// ThinkMs is the pause between a turn's answer and the next turn.
	ThinkMs Dist `json:"think_ms"`
}

// The agent-sessions fleets. Prefill is a fixed per-request cost plus the
// uncached tokens at the long-prompt rate, as `fleet sim`'s profiles have it
// (sim/profile.go, where the sources are cited): M1 Ultra 146 ms + 1,340
// tok/s, M4 Max 39 ms + 1,200 tok/s, the starved 27B 810 ms + 500 tok/s, the
// RTX 5060 Ti under vLLM 5,000 tok/s. Caches: vLLM's KV cache (131,072
// tokens on the 5060 Ti); llama-server's 4 slots plus its 8 GiB host cache,
// 58,254 tokens of a 4B model's f16 KV (147,456 bytes a token) or 32,768 of
// a 27B's (262,144).
var (
	agentRTX5060ti = WorkerSpec{Name: "wsl/qwen3-4b", Slots: 8, PrefillTokPerSec: 5000, Overhead: 30 * time.Millisecond,
		TokPerSec: []CurvePoint{{1, 96}, {2, 92}, {4, 86}, {8, 74}}, Engine: engineVLLM, CacheTokens: 131072}
	agentM1Ultra = WorkerSpec{Name: "ultra/qwen3-4b", Slots: 4, PrefillTokPerSec: 1340, Overhead: 146 * time.Millisecond,
		TokPerSec: []CurvePoint{{1, 80}, {2, 51}, {4, 34.75}}, Engine: engineLlama, CacheTokens: 58254}
	agentM4Max = WorkerSpec{Name: "max/qwen3-4b", Slots: 4, PrefillTokPerSec: 1200, Overhead: 39 * time.Millisecond,
		TokPerSec: []CurvePoint{{1, 87}, {2, 65}, {4, 34}}, Engine: engineLlama, CacheTokens: 58254}
	agentStarved27b = WorkerSpec{Name: "ultra27/qwen3-4b", Slots: 4, PrefillTokPerSec: 500, Overhead: 810 * time.Millisecond,
		TokPerSec: []CurvePoint{{1, 10.7}, {2, 6.4}, {4, 3.75}}, Engine: engineLlama, CacheTokens: 32768}
)

const (
	engineLlama = "llamacpp"
	engineVLLM  = "vllm"
)

// agentScenario is the agent split: two kinds of about 4,000-token
// prefixes, 10–20 turns of 400–600 appended tokens and about 70 out.
func agentScenario(name string, load float64, workers []WorkerSpec) Scenario {
	return Scenario{Name: name, Load: load, Requests: 3000, Seed: 42, Workers: workers,
		Output: Dist{Median: 70, Sigma: 0.3, Min: 16, Max: 200},
		Agent: &AgentWorkload{
			System:   []int{3900, 4100},
			MinTurns: 10, MaxTurns: 20,
			Task:    Dist{Median: 200, Sigma: 0.5, Min: 50, Max: 800},
			Append:  Dist{Median: 500, Sigma: 0.1, Min: 400, Max: 600},
			ThinkMs: Dist{Median: 2000, Sigma: 0.8, Min: 200, Max: 30000},
		}}
}

func (a *AgentWorkload) validate(s Scenario) error {
	if len(a.System) == 0 || a.MinTurns < 1 || a.MaxTurns < a.MinTurns {
		return fmt.Errorf("scenario %q: the agent workload needs system prefixes and 1 ≤ min_turns ≤ max_turns", s.Name)
	}
	for _, w := range s.Workers {
		switch w.Engine {
		case "", engineLlama, engineVLLM:
		default:
			return fmt.Errorf("scenario %q: worker %q: engine %q is not %q or %q", s.Name, w.Name, w.Engine, engineLlama, engineVLLM)
		}
	}
	return nil
}

// turnPlan is one turn of a session, fixed before any policy runs so every
// policy sees the same conversations.
type turnPlan struct {
	prompt, output int
	think          time.Duration // before the next turn
}

type sessionPlan struct {
	start time.Duration
	kind  int
	turns []turnPlan
}

// turnCapacity is how many turns a second the fleet serves at full slots
// when every turn reuses its conversation: the agent workload's 100% load.
func (s Scenario) turnCapacity() float64 {
	a := s.Agent
	newTokens, out := a.Append.Mean(), s.Output.Mean()
	total := 0.0
	for i := range s.Workers {
		w := &s.Workers[i]
		turn := w.Overhead.Seconds() + newTokens/w.PrefillTokPerSec + out/w.rate(w.Slots)
		total += float64(w.Slots) / turn
	}
	return total
}

// sessionPlans draws sessions until they hold s.Requests turns, starting as
// a Poisson process whose rate makes the turn rate Load × turnCapacity.
func (s Scenario) sessionPlans() []sessionPlan {
	a := s.Agent
	rng := rand.New(rand.NewPCG(s.Seed, s.Seed+7))
	meanTurns := float64(a.MinTurns+a.MaxTurns) / 2
	sessionsPerSec := s.Load * s.turnCapacity() / meanTurns
	var out []sessionPlan
	var t float64
	for n := 0; n < s.Requests; {
		t += rng.ExpFloat64() / sessionsPerSec
		sp := sessionPlan{start: time.Duration(t * float64(time.Second)), kind: rng.IntN(len(a.System))}
		turns := a.MinTurns + rng.IntN(a.MaxTurns-a.MinTurns+1)
		turns = min(turns, s.Requests-n)
		prompt := a.System[sp.kind] + a.Task.Sample(rng)
		for k := range turns {
			tp := turnPlan{prompt: prompt, output: s.Output.Sample(rng),
				think: time.Duration(a.ThinkMs.Sample(rng)) * time.Millisecond}
			sp.turns = append(sp.turns, tp)
			if k+1 < turns {
				// The next prompt holds this one, its answer and a tool
				// result: Append tokens in all.
				prompt += max(a.Append.Sample(rng), tp.output)
			}
		}
		n += turns
		out = append(out, sp)
	}
	return out
}

// cacheCeiling is the cache hit ratio the workload allows: every turn
// reuses all of its session's previous turn (prompt and answer), and a
// session's first turn its kind's prefix unless it is the kind's first.
func cacheCeiling(plans []sessionPlan, system []int) float64 {
	seen := map[int]bool{}
	var cached, prompt float64
	for _, sp := range plans {
		for k, tp := range sp.turns {
			prompt += float64(tp.prompt)
			switch {
			case k > 0:
				prev := sp.turns[k-1]
				cached += float64(evaluateOne(prev.prompt+prev.output, tp.prompt))
			case seen[sp.kind]:
				cached += float64(evaluateOne(system[sp.kind], tp.prompt))
			}
		}
		seen[sp.kind] = true
	}
	if prompt == 0 {
		return 0
	}
	return cached / prompt
}

// chain is the router's chunk hash chain of a seq, built the way
// router.PrefixChain builds it from text: chunk i names the prefix up to its
// end, so it is the kind's while it lies in the kind's system prefix, else
// the session's; a partial last chunk names the exact length.
func (c *caches) chain(s seq) []uint64 {
	chunk := routerChunkTokens
	n := (s.n + chunk - 1) / chunk
	out := make([]uint64, n)
	for i := range n {
		end := (i + 1) * chunk
		var h uint64
		switch {
		case end > s.n:
			h = mix(3, uint64(s.session), uint64(s.n))
		case s.kind >= 0 && end <= c.system[s.kind]:
			h = mix(1, uint64(s.kind), uint64(i))
		default:
			h = mix(2, uint64(s.session), uint64(i))
		}
		out[i] = h
	}
	return out
}

// mix is splitmix64 over three words: distinct inputs give distinct names.
func mix(a, b, c uint64) uint64 {
	x := a*0x9e3779b97f4a7c15 ^ b*0xbf58476d1ce4e5b9 ^ c*0x94d049bb133111eb
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// Session is one agent session of a scenario, for running it against real
// workers: when it starts, its kind (index into Agent.System) and its turns.
type Session struct {
	Start time.Duration
	Kind  int
	Turns []Turn
}

// Turn is one request of a session: its prompt and answer lengths in
// tokens, and the pause after its answer before the next turn.
type Turn struct {
	Prompt, Output int
	Think          time.Duration
}

// Sessions returns the sessions an agent scenario runs, the same for every
// policy and every run of the same seed; nil for a scenario without agents.
func (s Scenario) Sessions() []Session {
	if s.Agent == nil {
		return nil
	}
	var out []Session
	for _, sp := range s.sessionPlans() {
		ss := Session{Start: sp.start, Kind: sp.kind}
		for _, tp := range sp.turns {
			ss.Turns = append(ss.Turns, Turn{Prompt: tp.prompt, Output: tp.output, Think: tp.think})
		}
		out = append(out, ss)
	}
	return out
}

// RunSessions runs the given sessions (Sessions' shape, perhaps cut or
// compressed, as the real-time test does) on the scenario's workers in
// virtual time, once per policy: the virtual figures of a real-time run.
func RunSessions(s Scenario, sessions []Session, policies []string) ([]Result, error) {
	if s.Agent == nil {
		return nil, fmt.Errorf("scenario %q has no agent workload to run sessions on", s.Name)
	}
	plans := make([]sessionPlan, 0, len(sessions))
	s.Requests = 0
	for _, ss := range sessions {
		if ss.Kind < 0 || ss.Kind >= len(s.Agent.System) || len(ss.Turns) == 0 {
			return nil, fmt.Errorf("a session of kind %d with %d turns: the scenario has %d kinds and a session needs a turn", ss.Kind, len(ss.Turns), len(s.Agent.System))
		}
		sp := sessionPlan{start: ss.Start, kind: ss.Kind}
		for _, t := range ss.Turns {
			sp.turns = append(sp.turns, turnPlan{prompt: t.Prompt, output: t.Output, think: t.Think})
		}
		s.Requests += len(sp.turns)
		plans = append(plans, sp)
	}
	if err := s.validate(); err != nil {
		return nil, err
	}
	return runPolicies(s, policies, nil, plans)
}
