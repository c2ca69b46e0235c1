package router

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Policy names.
const (
	PolicyFleet          = "fleet"
	PolicyFleetNoPrefix  = "fleet-no-prefix"
	PolicySessionSticky  = "session-sticky"
	PolicyCacheAware     = "cache-aware"
	PolicyP2CLeastLoaded = "p2c-least-loaded"
	PolicyRoundRobin     = "round-robin"
	PolicyRandom         = "random"
	PolicyLeastLoaded    = "least-loaded"
)

// PolicyNames lists the policies NewPolicy knows, the recommended one first.
var PolicyNames = []string{PolicyFleet, PolicyFleetNoPrefix, PolicyP2CLeastLoaded, PolicyRoundRobin, PolicyRandom,
	PolicySessionSticky, PolicyCacheAware, PolicyLeastLoaded}

// Job is what the scheduler knows about a request before it runs.
type Job struct {
	PromptTokens int
	// OutputTokens is the expected output: max_tokens when it is smaller
	// than what the model usually answers, else that usual length.
	OutputTokens int
	// NeedContext is what the worker must hold: prompt + max_tokens.
	NeedContext int
	// KVOutput is the output it is counted to hold in a worker's shared
	// KV pool: max_tokens, or a bounded reserve without (kvpool.go).
	KVOutput int
	// Behind is how many requests wait in the queue behind this one: while
	// it waits for a fast slot, they wait too.
	Behind int
	// Prefix is the prompt's chunk hash chain (PrefixChain); nil when the
	// request has no prompt to reuse.
	Prefix []uint64
}

// Candidate is an eligible backend as a policy sees it: it serves the model,
// is not draining or cooling down, and the request fits its context. It may
// be full (InFlight >= Slots); a policy may choose to wait for it.
type Candidate struct {
	Name string
	// InFlight is the requests on the backend: the router's own plus, while
	// the engine's report is fresh, those it holds beyond them.
	InFlight int
	// Slots is the usable slots, capped by the engine's own count.
	Slots int
	Speed *SpeedModel
	// NextFree is the predicted time until one of its requests ends; it
	// matters only when the backend is full.
	NextFree time.Duration
	// Cached is the prompt tokens the backend is predicted to hold in its
	// prompt cache, from the router's prefix index of it.
	Cached int
}

func (c Candidate) free() bool { return c.InFlight < c.Slots }

// Uncached is the job as an engine holding cached of its prompt tokens
// runs it: only the rest is prefilled.
func (job Job) Uncached(cached int) Job {
	if cached > 0 {
		job.PromptTokens = max(job.PromptTokens-cached, 1)
	}
	return job
}

// Policy picks a backend for a job. It is called under the scheduler's
// lock, with the pool's held too (or by the simulator in virtual time), and
// must not block nor keep cands.
type Policy interface {
	Name() string
	// Choose returns the index in cands to send the job to now, or -1 to
	// leave it waiting until a slot frees. It must not return a full
	// candidate.
	Choose(job Job, cands []Candidate, rng *rand.Rand) int
}

// NewPolicy returns a fresh policy by name (policies may keep state, like
// round-robin's cursor, so each router or simulation run needs its own).
func NewPolicy(name string) (Policy, error) {
	switch name {
	case PolicyFleet, "":
		return &fleetPolicy{p2cAbove: 16, prefix: true}, nil
	case PolicyFleetNoPrefix:
		return &fleetPolicy{p2cAbove: 16}, nil
	case PolicySessionSticky:
		return sessionStickyPolicy{}, nil
	case PolicyCacheAware:
		return newCacheAwarePolicy(), nil
	case PolicyP2CLeastLoaded:
		return p2cPolicy{}, nil
	case PolicyRoundRobin:
		return &roundRobinPolicy{}, nil
	case PolicyRandom:
		return randomPolicy{}, nil
	case PolicyLeastLoaded:
		return leastLoadedPolicy{}, nil
	}
	return nil, fmt.Errorf("unknown scheduling policy %q; use one of %v", name, PolicyNames)
}

func newRNG(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// countFree is how many candidates have a free slot. With nthFree it
// draws among them without listing them: a list would be on the heap for
// every decision of a model with more than a few workers.
func countFree(cands []Candidate) int {
	n := 0
	for _, c := range cands {
		if c.free() {
			n++
		}
	}
	return n
}

// nthFree is the index in cands of the candidate with a free slot that has
// n before it.
func nthFree(cands []Candidate, n int) int {
	for i, c := range cands {
		if c.free() {
			if n == 0 {
				return i
			}
			n--
		}
	}
	return -1
}

func loadRatio(c Candidate) float64 { return float64(c.InFlight) / float64(max(c.Slots, 1)) }

// leastLoadedPolicy takes the backend with the lowest in-flight/slots.
type leastLoadedPolicy struct{}

func (leastLoadedPolicy) Name() string { return PolicyLeastLoaded }

func (leastLoadedPolicy) Choose(_ Job, cands []Candidate, _ *rand.Rand) int {
	best := -1
	for i, c := range cands {
		if c.free() && (best < 0 || loadRatio(c) < loadRatio(cands[best])) {
			best = i
		}
	}
	return best
}

// p2cPolicy is the seed's router: two random backends with a free slot, the
// less loaded one wins, whatever its speed.
type p2cPolicy struct{}

func (p2cPolicy) Name() string { return PolicyP2CLeastLoaded }

func (p2cPolicy) Choose(_ Job, cands []Candidate, rng *rand.Rand) int {
	free := countFree(cands)
	switch free {
	case 0:
		return -1
	case 1:
		return nthFree(cands, 0)
	}
	a := rng.IntN(free)
	b := rng.IntN(free - 1)
	if b >= a {
		b++
	}
	a, b = nthFree(cands, a), nthFree(cands, b)
	if loadRatio(cands[b]) < loadRatio(cands[a]) {
		return b
	}
	return a
}

// roundRobinPolicy cycles through the backends with a free slot.
type roundRobinPolicy struct{ next int }

func (*roundRobinPolicy) Name() string { return PolicyRoundRobin }

func (p *roundRobinPolicy) Choose(_ Job, cands []Candidate, _ *rand.Rand) int {
	for k := range cands {
		i := (p.next + k) % len(cands)
		if cands[i].free() {
			p.next = i + 1
			return i
		}
	}
	return -1
}

// randomPolicy picks uniformly among backends with a free slot.
type randomPolicy struct{}

func (randomPolicy) Name() string { return PolicyRandom }

func (randomPolicy) Choose(_ Job, cands []Candidate, rng *rand.Rand) int {
	free := countFree(cands)
	if free == 0 {
		return -1
	}
	return nthFree(cands, rng.IntN(free))
}

// fleetPolicy sends a job where it is predicted to finish first. A full
// backend competes too, at the time until its next slot frees plus its
// completion time at full load: when that wins, the job waits for it rather
// than going to a slow idle worker (the seed's 27B-at-8-tok/s failure).
// Above p2cAbove candidates it compares two random ones, keeping the
// decision O(1) for large pools. With prefix, a backend's prefill counts
// only the prompt tokens its prompt cache is predicted not to hold, at its
// learned prefill rate: the prefix is worth exactly the time it saves, so
// affinity never outweighs a queue or a slow decode.
type fleetPolicy struct {
	p2cAbove int
	prefix   bool
}

func (p *fleetPolicy) Name() string {
	if p.prefix {
		return PolicyFleet
	}
	return PolicyFleetNoPrefix
}

// cost is the job's predicted completion on c. With affinity (some backend
// holds part of the prompt) a free backend also pays a load price.
func (p *fleetPolicy) cost(job Job, c Candidate, affinity bool) time.Duration {
	if p.prefix {
		job = job.Uncached(c.Cached)
	}
	if c.free() {
		d := c.Speed.Completion(c.InFlight+1, job)
		if p.prefix && affinity {
			d += loadPrice(job, c)
		}
		return d
	}
	// Waiting also holds up everyone queued behind: each slot this job
	// takes from the pool later pushes them back by about one slot
	// interval (the time a slot takes divided by the slots sharing it).
	full := c.Speed.Completion(c.Slots, job)
	return c.NextFree + full + time.Duration(job.Behind)*full/time.Duration(max(c.Slots, 1))
}

func (p *fleetPolicy) Choose(job Job, cands []Candidate, rng *rand.Rand) int {
	i, _ := p.chooseOrWait(job, cands, rng)
	return i
}

// chooseOrWait is Choose, and when the job is to wait, the full backend it
// waits for (-1 when it waits for none in particular).
func (p *fleetPolicy) chooseOrWait(job Job, cands []Candidate, rng *rand.Rand) (take, waitFor int) {
	if len(cands) > p.p2cAbove {
		free := countFree(cands)
		switch free {
		case 0:
			return -1, -1
		case 1:
			return nthFree(cands, 0), -1
		}
		a := nthFree(cands, rng.IntN(free))
		b := nthFree(cands, rng.IntN(free))
		if p.cost(job, cands[b], false) < p.cost(job, cands[a], false) {
			return b, -1
		}
		return a, -1
	}
	best, bestFree := -1, -1
	var bestCost, bestFreeCost time.Duration
	affinity := slices.ContainsFunc(cands, func(c Candidate) bool { return c.Cached > 0 })
	for i, c := range cands {
		cost := p.cost(job, c, affinity)
		if best < 0 || cost < bestCost {
			best, bestCost = i, cost
		}
		if c.free() && (bestFree < 0 || cost < bestFreeCost) {
			bestFree, bestFreeCost = i, cost
		}
	}
	// Prefix-aware, a full backend is waited for only when it is predicted
	// to finish sooner than the best free one by its speed advantage
	// (waitMargin). Waiting for a faster worker is what piles the fleet's
	// sessions into its queue while the others idle (issue 10: "affinity
	// must not pile a popular prefix onto one worker"): each turn that
	// waits there keeps its conversation there, so the next turn wants it
	// too. Waiting for a worker no faster than the free one is waiting for
	// the conversation alone, and is worth what it is predicted to save.
	// Where no backend holds any of the prompt, the choice is
	// fleet-no-prefix's.
	switch {
	case best < 0:
		return -1, -1
	case cands[best].free():
		return best, -1
	case p.prefix && affinity && bestFree >= 0 && float64(bestFreeCost) < waitMargin(job, cands[best], cands[bestFree])*float64(bestCost):
		return bestFree, -1
	}
	return -1, best
}

// waitMargin is how many times sooner the full backend must be predicted
// to finish the job than the free one for the job to wait for it: how much
// faster it runs the whole prompt alone, from 1 (as fast or slower) to
// maxWaitMargin. Between equal workers a turn waits for its conversation
// whenever that is predicted sooner; for a faster worker it must win by as
// much as that worker is faster (docs/measurements.md: two equal
// llama-servers, and the simulator's fast worker beside three slow ones).
func waitMargin(job Job, full, free Candidate) float64 {
	alone := float64(full.Speed.Completion(1, job))
	return min(max(float64(free.Speed.Completion(1, job))/max(alone, 1), 1), maxWaitMargin)
}

// maxWaitMargin: see waitMargin.
const maxWaitMargin = 2

// loadPrice is what taking a free slot of c costs the requests that come
// after: a share of the time a request takes at full slots, growing with the
// square of how full c would be. Without it the prefix cache feeds itself:
// the fastest worker holds the most conversations, so every turn is
// predicted to finish first there, until it is full and turns queue for it
// while the slower workers' slots, holding conversations of their own,
// idle. With it, a worker that holds the conversation and has room keeps
// the turn when its prediction is close, and its cache stays warm. A full
// backend needs no price: its cost already holds its queue (NextFree,
// Behind). Measured when it was added, over the agent-sessions seeds 1–10
// and 42 (today's figures: docs/measurements.md): p99 E2E better or equal on every seed, cache hit on all but
// one (0.3 points lower), p50 TTFT better, equal or within 3 ms on all but
// one (seed 7); chat is untouched (no affinity, no price).
func loadPrice(job Job, c Candidate) time.Duration {
	u := float64(c.InFlight+1) / float64(max(c.Slots, 1))
	return time.Duration(loadPriceWeight * u * u * float64(c.Speed.Completion(c.Slots, job)))
}

// loadPriceWeight: see loadPrice.
const loadPriceWeight = 0.3
