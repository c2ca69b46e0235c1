package router

import (
	"slices"
	"sync"

	"fleet"
	"fleet/router/reasoning"
)

// The parts of the Router, each with its own lock, so that a request takes
// only the ones it needs and no lock guards two parts:
//   - catalog (here): the models by name and their normalisation, set by
//     SetModels, read by every request;
//   - the scheduler (sched.go): the queues, the outlooks and the policy's
//     random source and state;
//   - reach (here): which models the ready set serves and the largest
//     context each may be given, a snapshot the scheduler publishes on
//     every change of the ready set or outlook, read without a lock;
//   - the pool (pool.go): the ready set, each worker's state and the
//     suspicions, which a choice of worker sees at one instant;
//   - outputs (here): the per-model estimates of output tokens;
//   - the hedge's requests waiting for a first byte (hedge.go);
//   - key limits (keylimit/), engine metrics (enginemetrics.go), the
//     request bodies in flight (bodymem.go) and the cache-aware policy's
//     trees (policy_peers.go).
// Where two are held at once, the scheduler's is taken before the pool's,
// and the pool's before the others'; those take none. The Router holds no
// lock of its own, and no part locks another's: TestPartsKeepToTheirLocks.

// catalog is the models the router knows by name.
type catalog struct {
	mu     sync.RWMutex
	models []fleet.Model
	names  map[string]string // ID or alias → model ID
	// modes holds the models whose responses are normalised; absent is Off.
	modes map[string]reasoning.Mode
}

func (c *catalog) set(models []fleet.Model, names map[string]string, modes map[string]reasoning.Mode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.models, c.names, c.modes = slices.Clone(models), names, modes
}

func (c *catalog) lookup(name string) (string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	id, ok := c.names[name]
	return id, ok
}

// normalisation is the shape path's answers from model are rewritten to,
// Off for every endpoint but chat completions.
func (c *catalog) normalisation(model, path string) reasoning.Mode {
	if path != chatPath {
		return reasoning.Off
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.modes[model]
}

// list is the known models, as SetModels gave them.
func (c *catalog) list() []fleet.Model {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.models
}

// reach is, per model ID, what the ready set and the outlook offer it: an
// immutable snapshot, replaced whole.
type reach map[string]modelReach

type modelReach struct {
	// served: a worker of the ready set serves it.
	served bool
	// largest is the largest context among its workers in the ready set
	// (drained and cooling ones included) or coming; 0 when none says.
	largest int
}

// publishReachLocked replaces the reach snapshot from the ready set and
// the outlooks.
func (s *scheduler) publishReachLocked(ready []Backend) {
	next := make(reach, len(s.outlooks))
	for model, o := range s.outlooks {
		next[model] = modelReach{largest: o.ComingContext}
	}
	for _, b := range ready {
		mr := next[b.Model]
		mr.served = true
		mr.largest = max(mr.largest, b.Context)
		next[b.Model] = mr
	}
	s.reach.Store(&next)
}

func (s *scheduler) reachOf(model string) modelReach {
	if p := s.reach.Load(); p != nil {
		return (*p)[model]
	}
	return modelReach{}
}

// modelID maps a requested name to a model ID. Models known only from a
// backend (no SetModels yet) resolve to themselves.
func (r *Router) modelID(name string) (string, bool) {
	if id, ok := r.catalog.lookup(name); ok {
		return id, true
	}
	if r.sched.reachOf(name).served {
		return name, true
	}
	return "", false
}

// largestContext is the largest context among model's workers that are in
// the ready set (drained and cooling ones included) or coming (the
// model's Outlook); 0 when none says its context.
func (r *Router) largestContext(model string) int { return r.sched.reachOf(model).largest }

// outputEstimates are the per-model running estimates of output tokens,
// for requests that do not say max_tokens.
type outputEstimates struct {
	mu sync.Mutex
	by map[string]*estimate
}

func (o *outputEstimates) add(model string, tokens int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	est := o.by[model]
	if est == nil {
		if o.by == nil {
			o.by = map[string]*estimate{}
		}
		est = &estimate{}
		o.by[model] = est
	}
	est.add(float64(tokens))
}

// expected is the output length the scheduler plans for.
func (o *outputEstimates) expected(model string, maxTokens int) int {
	usual := 256.0
	o.mu.Lock()
	if est := o.by[model]; est != nil && est.n > 0 {
		usual = est.v
	}
	o.mu.Unlock()
	if maxTokens > 0 && float64(maxTokens) < usual {
		return maxTokens
	}
	return int(usual)
}
