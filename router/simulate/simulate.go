// Package simulate runs the router's scheduling policies in virtual time
// against simulated workers whose speed curves come from the field reports'
// tables (docs/field-reports.md), so policies can be compared on thousands
// of requests in a fraction of a second, with no sleeping and the router's
// own Policy and SpeedModel code.
package simulate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"fleet/router"
)

// WorkerSpec is one simulated worker's true behaviour.
type WorkerSpec struct {
	Name  string `json:"name"`
	Slots int    `json:"slots"`
	// TokPerSec are (concurrency, per-request decode tok/s) points; between
	// them speed is interpolated, beyond the last the total stays flat.
	TokPerSec []CurvePoint `json:"tok_per_sec"`
	// PrefillTokPerSec is prompt processing speed.
	PrefillTokPerSec float64 `json:"prefill_tok_per_sec"`
	// Overhead is the fixed part of TTFT (scheduling, first decode step).
	Overhead time.Duration `json:"overhead"`
	// Engine is the prompt cache the worker keeps, as `fleet sim` mimics
	// it: "llamacpp" (slots plus a host-RAM cache of CacheTokens), "vllm"
	// (prefix blocks in a KV cache of CacheTokens), or "" for none.
	Engine      string `json:"engine,omitempty"`
	CacheTokens int    `json:"cache_tokens,omitempty"`
}

// CurvePoint is per-request decode speed at a concurrency.
type CurvePoint struct {
	Concurrency int     `json:"concurrency"`
	TokPerSec   float64 `json:"tok_per_sec"`
}

// Dist is a clipped log-normal length distribution: median, spread (sigma
// of the log), and bounds.
type Dist struct {
	Median float64 `json:"median"`
	Sigma  float64 `json:"sigma"`
	Min    int     `json:"min"`
	Max    int     `json:"max"`
}

// Sample draws one length: a log-normal around Median, clipped to [Min, Max].
func (d Dist) Sample(rng *rand.Rand) int {
	v := d.Median * math.Exp(d.Sigma*rng.NormFloat64())
	return min(max(int(v), d.Min), d.Max)
}

// Mean estimates the clipped distribution's mean by sampling, which is
// simpler than the closed form and exact enough for sizing the load.
func (d Dist) Mean() float64 {
	rng := rand.New(rand.NewPCG(1, 2))
	sum := 0
	for range 20000 {
		sum += d.Sample(rng)
	}
	return float64(sum) / 20000
}

// Scenario is a fleet and the traffic offered to it.
type Scenario struct {
	Name    string       `json:"name"`
	Workers []WorkerSpec `json:"workers"`
	// Load is the offered load as a fraction of the fleet's capacity
	// (the sum over workers of their best total throughput).
	Load     float64 `json:"load"`
	Requests int     `json:"requests"`
	Prompt   Dist    `json:"prompt"`
	Output   Dist    `json:"output"`
	// BurstSize > 1 makes arrivals come in bursts of that many at once,
	// bursts spaced so the mean rate is the same as Poisson at Load.
	BurstSize int `json:"burst_size,omitempty"`
	// QueueTimeout is the router's queue limit (default 30 s); requests
	// waiting longer are rejected with 429 and counted, not measured.
	QueueTimeout time.Duration `json:"queue_timeout,omitempty"`
	Seed         uint64        `json:"seed"`
	// Agent, when set, replaces the independent requests by agent
	// sessions (Prompt and BurstSize are then unused; Output is each
	// turn's answer). Load is then a fraction of turnCapacity.
	Agent *AgentWorkload `json:"agent,omitempty"`
}

// Result is one policy's outcome on a scenario.
type Result struct {
	Policy    string             `json:"policy"`
	Requests  int                `json:"requests"`
	Rejected  int                `json:"rejected"`
	P50TTFTms float64            `json:"p50_ttft_ms"`
	P90TTFTms float64            `json:"p90_ttft_ms"`
	P99TTFTms float64            `json:"p99_ttft_ms"`
	P50E2Ems  float64            `json:"p50_e2e_ms"`
	P90E2Ems  float64            `json:"p90_e2e_ms"`
	P99E2Ems  float64            `json:"p99_e2e_ms"`
	Share     map[string]float64 `json:"share"`
	// CacheHit is cached over prompt tokens, as the engines reuse them;
	// CacheHitCeiling the most the workload allows (agent scenarios).
	CacheHit        float64            `json:"cache_hit"`
	CacheHitCeiling float64            `json:"cache_hit_ceiling,omitempty"`
	WorkerCacheHit  map[string]float64 `json:"worker_cache_hit,omitempty"`
}

// Scenarios lists the built-in scenario names.
func Scenarios() []string {
	return []string{"seed-mixed", "homogeneous", "burst", "agent-sessions", "agent-sessions-homogeneous"}
}

// The first field report's curves: per-request tok/s at 1, 2 and 4 concurrent requests
// (total / concurrency from the first field report's table) and prompt tok/s. The
// RTX 5060 Ti row has only "96 at one request"; its higher-concurrency
// points are an assumption in line with vLLM's continuous batching.
var (
	rtx5060ti = WorkerSpec{Name: "wsl/qwen3-4b", Slots: 8, PrefillTokPerSec: 4000, Overhead: 30 * time.Millisecond,
		TokPerSec: []CurvePoint{{1, 96}, {2, 92}, {4, 86}, {8, 74}}, Engine: engineVLLM, CacheTokens: 131072}
	m1ultra = WorkerSpec{Name: "ultra/qwen3-4b", Slots: 4, PrefillTokPerSec: 250, Overhead: 40 * time.Millisecond,
		TokPerSec: []CurvePoint{{1, 80}, {2, 51}, {4, 34.75}}, Engine: engineLlama, CacheTokens: 58254}
	m4max = WorkerSpec{Name: "max/qwen3-4b", Slots: 4, PrefillTokPerSec: 600, Overhead: 40 * time.Millisecond,
		TokPerSec: []CurvePoint{{1, 87}, {2, 65}, {4, 34}}, Engine: engineLlama, CacheTokens: 58254}
	starved27b = WorkerSpec{Name: "ultra27/qwen3-4b", Slots: 4, PrefillTokPerSec: 50, Overhead: 200 * time.Millisecond,
		TokPerSec: []CurvePoint{{1, 10.7}, {2, 6.4}, {4, 3.75}}, Engine: engineLlama, CacheTokens: 32768}
)

// Builtin returns a built-in scenario at the given load fraction.
func Builtin(name string, load float64) (Scenario, error) {
	if load <= 0 || load >= 1.5 {
		return Scenario{}, fmt.Errorf("load %.2f is out of range; give a fraction of fleet capacity such as 0.7", load)
	}
	s := Scenario{Name: name, Load: load, Requests: 4000, Seed: 42,
		Prompt: Dist{Median: 200, Sigma: 0.8, Min: 16, Max: 4000},
		Output: Dist{Median: 220, Sigma: 0.5, Min: 16, Max: 1024}}
	switch name {
	case "seed-mixed":
		s.Workers = []WorkerSpec{rtx5060ti, m1ultra, m4max, starved27b}
	case "homogeneous":
		for i := range 4 {
			w := m4max
			w.Name = fmt.Sprintf("max%d/qwen3-4b", i+1)
			s.Workers = append(s.Workers, w)
		}
	case "burst":
		s.Workers = []WorkerSpec{rtx5060ti, m1ultra, m4max, starved27b}
		s.BurstSize = 12
	case "agent-sessions":
		s = agentScenario(name, load, []WorkerSpec{agentRTX5060ti, agentM1Ultra, agentM4Max, agentStarved27b})
	case "agent-sessions-homogeneous":
		var ws []WorkerSpec
		for i := range 4 {
			w := agentM4Max
			w.Name = fmt.Sprintf("max%d/qwen3-4b", i+1)
			ws = append(ws, w)
		}
		s = agentScenario(name, load, ws)
	default:
		return Scenario{}, fmt.Errorf("unknown scenario %q; built-in scenarios are %v", name, Scenarios())
	}
	return s, nil
}

// rate is the per-request decode speed with c requests running.
func (w *WorkerSpec) rate(c int) float64 {
	pts := w.TokPerSec
	c = max(c, 1)
	if c <= pts[0].Concurrency {
		return pts[0].TokPerSec
	}
	for i := 1; i < len(pts); i++ {
		if c <= pts[i].Concurrency {
			a, b := pts[i-1], pts[i]
			f := float64(c-a.Concurrency) / float64(b.Concurrency-a.Concurrency)
			return a.TokPerSec + f*(b.TokPerSec-a.TokPerSec)
		}
	}
	last := pts[len(pts)-1]
	return last.TokPerSec * float64(last.Concurrency) / float64(c)
}

// Capacity is the fleet's best total decode throughput in tok/s: the sum
// over workers of the best a worker reaches within its slots. Load is a
// fraction of it.
func (s Scenario) Capacity() float64 {
	total := 0.0
	for i := range s.Workers {
		total += s.Workers[i].capacity()
	}
	return total
}

// capacity is the worker's best total decode throughput in tok/s.
func (w *WorkerSpec) capacity() float64 {
	best := 0.0
	for c := 1; c <= w.Slots; c++ {
		best = max(best, float64(c)*w.rate(c))
	}
	return best
}

func (s Scenario) validate() error {
	if len(s.Workers) == 0 {
		return fmt.Errorf("scenario %q has no workers", s.Name)
	}
	if s.Requests <= 0 {
		return fmt.Errorf("scenario %q: requests must be positive", s.Name)
	}
	if s.Load <= 0 {
		return fmt.Errorf("scenario %q: load must be a positive fraction of capacity", s.Name)
	}
	for _, w := range s.Workers {
		if w.Slots <= 0 || len(w.TokPerSec) == 0 || w.PrefillTokPerSec <= 0 {
			return fmt.Errorf("scenario %q: worker %q needs slots, tok_per_sec points and prefill_tok_per_sec", s.Name, w.Name)
		}
		if !slices.IsSortedFunc(w.TokPerSec, func(a, b CurvePoint) int { return a.Concurrency - b.Concurrency }) || w.TokPerSec[0].Concurrency < 1 {
			return fmt.Errorf("scenario %q: worker %q: tok_per_sec points must start at concurrency ≥ 1 and ascend", s.Name, w.Name)
		}
	}
	if s.Agent != nil {
		return s.Agent.validate(s)
	}
	return nil
}

// Run simulates the scenario once per policy, with the same arrivals for
// each, and returns one result per policy in the order given.
func Run(s Scenario, policies []string) ([]Result, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if s.Agent != nil {
		return runPolicies(s, policies, nil, s.sessionPlans())
	}
	return runPolicies(s, policies, s.arrivals(), nil)
}

// runPolicies runs one workload, arrivals (chat) or session plans (agent),
// once per policy on a validated scenario.
func runPolicies(s Scenario, policies []string, arrivals []arrival, plans []sessionPlan) ([]Result, error) {
	if s.QueueTimeout <= 0 {
		s.QueueTimeout = 30 * time.Second
	}
	ceiling := 0.0
	if s.Agent != nil {
		ceiling = math.Round(cacheCeiling(plans, s.Agent.System)*1000) / 1000
	}
	out := make([]Result, 0, len(policies))
	for _, name := range policies {
		p, err := router.NewPolicy(name)
		if err != nil {
			return nil, err
		}
		r := s.runOne(p, arrivals, plans)
		r.CacheHitCeiling = ceiling
		out = append(out, r)
	}
	return out, nil
}

// arrival is a request as the client sends it: on its own (session -1) or
// as a turn of an agent session.
type arrival struct {
	at     time.Duration
	prompt int
	output int
	id     int
	// session indexes the run's session plans; -1 for a lone request.
	session, kind, turn int
}

func (s Scenario) arrivals() []arrival {
	rng := rand.New(rand.NewPCG(s.Seed, s.Seed+1))
	reqPerSec := s.Load * s.Capacity() / s.Output.Mean()
	burst := max(s.BurstSize, 1)
	out := make([]arrival, 0, s.Requests)
	var t float64
	for len(out) < s.Requests {
		t += rng.ExpFloat64() / (reqPerSec / float64(burst))
		for range burst {
			if len(out) == s.Requests {
				break
			}
			out = append(out, arrival{at: time.Duration(t * float64(time.Second)), prompt: s.Prompt.Sample(rng), output: s.Output.Sample(rng), session: -1})
		}
	}
	return out
}
