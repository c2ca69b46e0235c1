package router

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestSpeedModelLearnsAndInterpolates(t *testing.T) {
	m := NewSpeedModel(SpeedPrior{})
	if m.Measured() {
		t.Fatal("fresh model claims measurements")
	}
	// The seed's M1 Ultra: 80, 51, 35 tok/s per request at 1, 2, 4.
	for range 20 {
		m.Observe(1, 1, 0, 100*time.Millisecond, 12500*time.Microsecond)
		m.Observe(4, 4, 0, 300*time.Millisecond, 28600*time.Microsecond)
	}
	cases := []struct {
		name   string
		got    time.Duration
		lo, hi time.Duration
	}{
		{"itl at 1", m.ITL(1), 12 * time.Millisecond, 13 * time.Millisecond},
		{"itl at 4", m.ITL(4), 28 * time.Millisecond, 29 * time.Millisecond},
		{"itl at 2 interpolated", m.ITL(2), 17 * time.Millisecond, 19 * time.Millisecond},
		{"itl at 8 extrapolated above 4", m.ITL(8), 29 * time.Millisecond, 60 * time.Millisecond},
		{"ttft at 1", m.TTFT(1, 0), 99 * time.Millisecond, 101 * time.Millisecond},
	}
	for _, tc := range cases {
		if tc.got < tc.lo || tc.got > tc.hi {
			t.Errorf("%s: %v, want within [%v, %v]", tc.name, tc.got, tc.lo, tc.hi)
		}
	}
}

func TestSpeedModelIsRobustAndDecays(t *testing.T) {
	m := NewSpeedModel(SpeedPrior{})
	for range 50 {
		m.Observe(1, 1, 0, 0, 10*time.Millisecond)
	}
	// One stalled request moves the estimate by at most a clipped step.
	m.Observe(1, 1, 0, 0, 10*time.Second)
	if got := m.ITL(1); got > 14*time.Millisecond {
		t.Errorf("one outlier pulled ITL to %v", got)
	}
	// A lasting change (the worker got slower) is learned within tens of requests.
	for range 40 {
		m.Observe(1, 1, 0, 0, 40*time.Millisecond)
	}
	if got := m.ITL(1); got < 35*time.Millisecond {
		t.Errorf("ITL %v after 40 slow requests, want near 40ms", got)
	}
}

func TestSpeedModelSeedAndPrefill(t *testing.T) {
	m := NewSpeedModel(SpeedPrior{})
	m.Seed(SpeedPoint{Concurrency: 1, PromptTokens: 45, TTFT: 220 * time.Millisecond, ITL: 93 * time.Millisecond, PrefillTokPerSec: 500})
	if got := m.ITL(1); got != 93*time.Millisecond {
		t.Errorf("seeded ITL %v", got)
	}
	// Base 220 ms − 45×2 ms = 130 ms; 1000 prompt tokens at 500 tok/s add 2 s.
	if got := m.TTFT(1, 1000); got < 2120*time.Millisecond || got > 2140*time.Millisecond {
		t.Errorf("TTFT for a long prompt %v, want about 2.13s", got)
	}
	if c := m.Completion(1, Job{PromptTokens: 45, OutputTokens: 11}); c < 1100*time.Millisecond || c > 1200*time.Millisecond {
		t.Errorf("completion %v", c)
	}
}

// A prefill shares its engine with the requests beside it: a one-thread
// llama-server computing two 4,000-token prompts at once took 1.0-2.3 ms a
// token for each against 0.9-1.1 alone. Learned as one rate, the mix priced
// a long prefill beside another request as if it ran alone, and a session
// taking a busy worker's last slot looked cheaper than waiting for the
// worker holding its conversation.
func TestSpeedModelPricesPrefillAtItsConcurrency(t *testing.T) {
	const prompt = 4000
	alone, beside := 1.0, 1.8 // ms a prompt token
	cases := []struct {
		name  string
		learn func(m *SpeedModel)
	}{
		{"from the turns' TTFT", func(m *SpeedModel) {
			for range 20 {
				m.Observe(1, 1, prompt, 100*time.Millisecond+fromMs(prompt*alone), 0)
				m.Observe(2, 2, prompt, 150*time.Millisecond+fromMs(prompt*beside), 0)
			}
		}},
		{"from the engine's timings", func(m *SpeedModel) {
			for range 20 {
				m.ObservePrefill(1, prompt, prompt*alone)
				m.ObservePrefill(2, prompt, prompt*beside)
				m.Observe(1, 1, prompt, 100*time.Millisecond+fromMs(prompt*alone), 0)
				m.Observe(2, 2, prompt, 150*time.Millisecond+fromMs(prompt*beside), 0)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := NewSpeedModel(SpeedPrior{})
			// Short prompts teach each level's fixed cost first.
			for range 5 {
				m.Observe(1, 1, 10, 100*time.Millisecond, 0)
				m.Observe(2, 2, 10, 150*time.Millisecond, 0)
			}
			tc.learn(m)
			for _, want := range []struct {
				c    int
				ttft time.Duration
			}{
				{1, 100*time.Millisecond + fromMs(prompt*alone)},
				{2, 150*time.Millisecond + fromMs(prompt*beside)},
			} {
				if got := m.TTFT(want.c, prompt); got < want.ttft*95/100 || got > want.ttft*105/100 {
					t.Errorf("TTFT of a %d-token prompt at concurrency %d: %v, want about %v", prompt, want.c, got, want.ttft)
				}
			}
		})
	}
}

// A level never measured takes the rate of the nearest measured one: how
// much a prefill slows beside others is the engine's to show, not a guess.
func TestSpeedModelPrefillAtUnmeasuredLevels(t *testing.T) {
	m := NewSpeedModel(SpeedPrior{PrefillTokPerSec: 500})
	if got := m.TTFT(3, 1000) - m.TTFT(3, 0); got != 2*time.Second {
		t.Errorf("a fresh model's prefill of 1000 tokens at concurrency 3: %v, want the prior's 2s", got)
	}
	m.ObservePrefill(1, 1000, 1000)
	m.ObservePrefill(3, 1000, 3000)
	for _, tc := range []struct {
		c    int
		want time.Duration
	}{
		{1, time.Second}, {2, 2 * time.Second}, {3, 3 * time.Second}, {8, 3 * time.Second},
	} {
		if got := m.TTFT(tc.c, 1000) - m.TTFT(tc.c, 0); got != tc.want {
			t.Errorf("prefill of 1000 tokens at concurrency %d: %v, want %v", tc.c, got, tc.want)
		}
	}
}

func fastSlow() (fast, slow *SpeedModel) {
	fast, slow = NewSpeedModel(SpeedPrior{}), NewSpeedModel(SpeedPrior{})
	fast.Seed(SpeedPoint{Concurrency: 1, TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond})
	fast.Seed(SpeedPoint{Concurrency: 4, TTFT: 80 * time.Millisecond, ITL: 25 * time.Millisecond})
	slow.Seed(SpeedPoint{Concurrency: 1, TTFT: 500 * time.Millisecond, ITL: 93 * time.Millisecond})
	return fast, slow
}

func TestPolicies(t *testing.T) {
	fast, slow := fastSlow()
	job := Job{PromptTokens: 100, OutputTokens: 256}
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []struct {
		name   string
		policy string
		job    Job
		cands  []Candidate
		want   int
	}{
		{"fleet prefers a busy fast worker to an idle slow one", PolicyFleet, job, []Candidate{
			{Name: "slow", InFlight: 0, Slots: 4, Speed: slow}, {Name: "fast", InFlight: 2, Slots: 4, Speed: fast}}, 1},
		{"fleet waits for a fast slot that frees soon", PolicyFleet, job, []Candidate{
			{Name: "slow", InFlight: 0, Slots: 4, Speed: slow}, {Name: "fast", InFlight: 4, Slots: 4, Speed: fast, NextFree: 500 * time.Millisecond}}, -1},
		{"fleet takes the slow worker when the fast one frees too late", PolicyFleet, job, []Candidate{
			{Name: "slow", InFlight: 0, Slots: 4, Speed: slow}, {Name: "fast", InFlight: 4, Slots: 4, Speed: fast, NextFree: 60 * time.Second}}, 0},
		{"fleet takes the slow worker when a long queue waits behind", PolicyFleet, Job{PromptTokens: 100, OutputTokens: 256, Behind: 200}, []Candidate{
			{Name: "slow", InFlight: 0, Slots: 4, Speed: slow}, {Name: "fast", InFlight: 4, Slots: 4, Speed: fast, NextFree: 500 * time.Millisecond}}, 0},
		{"fleet spreads over equal workers", PolicyFleet, job, []Candidate{
			{Name: "a", InFlight: 2, Slots: 4, Speed: fast}, {Name: "b", InFlight: 1, Slots: 4, Speed: fast}}, 1},
		{"least-loaded by ratio", PolicyLeastLoaded, job, []Candidate{
			{Name: "a", InFlight: 2, Slots: 4, Speed: fast}, {Name: "b", InFlight: 3, Slots: 8, Speed: fast}}, 1},
		{"baselines never pick a full backend", PolicyLeastLoaded, job, []Candidate{
			{Name: "a", InFlight: 4, Slots: 4, Speed: fast}}, -1},
		{"p2c with one free", PolicyP2CLeastLoaded, job, []Candidate{
			{Name: "a", InFlight: 4, Slots: 4, Speed: fast}, {Name: "b", InFlight: 3, Slots: 4, Speed: fast}}, 1},
		{"random with none free", PolicyRandom, job, []Candidate{{Name: "a", InFlight: 1, Slots: 1, Speed: fast}}, -1},
		{"round-robin starts at the first free", PolicyRoundRobin, job, []Candidate{
			{Name: "a", InFlight: 1, Slots: 1, Speed: fast}, {Name: "b", InFlight: 0, Slots: 1, Speed: fast}}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPolicy(tc.policy)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Choose(tc.job, tc.cands, rng); got != tc.want {
				t.Errorf("chose %d, want %d", got, tc.want)
			}
		})
	}
	if _, err := NewPolicy("fastest"); err == nil {
		t.Error("unknown policy accepted")
	}
}

// The p2c baseline must reproduce the seed's failure: an idle slow worker
// beats a busy fast one whenever both are drawn.
func TestP2CFallsForTheIdleSlowWorker(t *testing.T) {
	fast, slow := fastSlow()
	p, _ := NewPolicy(PolicyP2CLeastLoaded)
	rng := rand.New(rand.NewPCG(3, 4))
	cands := []Candidate{{Name: "slow", Slots: 4, Speed: slow}, {Name: "fast", InFlight: 1, Slots: 4, Speed: fast}}
	for range 20 {
		if got := p.Choose(Job{OutputTokens: 256}, cands, rng); got != 0 {
			t.Fatalf("p2c chose %d", got)
		}
	}
}

func TestFleetPolicyUsesP2CForLargePools(t *testing.T) {
	fast, _ := fastSlow()
	var cands []Candidate
	for range 40 {
		cands = append(cands, Candidate{Slots: 4, Speed: fast})
	}
	p, _ := NewPolicy(PolicyFleet)
	rng := rand.New(rand.NewPCG(5, 6))
	seen := map[int]bool{}
	for range 200 {
		i := p.Choose(Job{OutputTokens: 10}, cands, rng)
		if i < 0 || i >= len(cands) {
			t.Fatalf("chose %d", i)
		}
		seen[i] = true
	}
	if len(seen) < 20 {
		t.Errorf("only %d of 40 equal backends ever chosen", len(seen))
	}
}
