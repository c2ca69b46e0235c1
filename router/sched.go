package router

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// flight is one request forwarded to one backend.
type flight struct {
	b     *backend
	model string
	job   Job
	start time.Time
	// predictedEnd feeds the scheduler's "next free slot" estimate.
	predictedEnd time.Time
	// startConcurrency and area0 let the speed model see the load this
	// request ran under: the backend's in-flight count at start, and the
	// integral of in-flight over time at start.
	startConcurrency int
	area0            float64
	// predicted is how many chunks of the job's prefix the worker's prefix
	// index held when it was sent.
	predicted int
	// kv is the KV tokens it is counted to hold on its worker (kvpool.go).
	kv int
}

// waiter is a request queued for a slot.
type waiter struct {
	job      Job
	excluded []string
	enqueued time.Time
	// done receives the flight, or nil when no backend can take the
	// request any more; err then says why.
	done chan *flight
	err  *schedError
}

// queue is a model's waiting requests (queue.go holds the rules).
type queue = Queue[*waiter]

// schedError is a reason no backend could be given, with the answer it maps to.
type schedError struct {
	status     int
	typ, code  string
	msg        string
	retryAfter bool
	// wait marks no worker ready yet but one coming: the request queues.
	wait bool
	// alone marks a wait of this request only (for a worker that holds its
	// context): the requests behind it are still served meanwhile.
	alone bool
}

func (e *schedError) Error() string { return e.msg }

// loadArea tracks ∫in-flight dt per worker (in request-seconds) so a request
// can learn the mean concurrency it ran under.
func (w *worker) advanceArea(now time.Time) {
	if !w.areaAt.IsZero() {
		w.area += float64(w.load(now)) * now.Sub(w.areaAt).Seconds()
	}
	w.areaAt = now
}

// member is one worker of the ready set as selection sees it: its engine's
// configuration and connections (backend), what the router remembers of it
// (worker), and whether it is suspect (hedge.go).
type member struct {
	b       *backend
	w       *worker
	suspect bool
}

func (p *pool) memberLocked(b *backend, now time.Time) member {
	return member{b: b, w: p.workerLocked(b.cfg.Name), suspect: p.suspectLocked(b.cfg.Name, now)}
}

// Why a member is not available.
const (
	whyDrained = "drained"
	whyContext = "context too small"
	whyCooling = "cooling down after failures"
	whySuspect = "suspect"
)

// available is the one rule of whether m may take job now, and if not,
// why: not while drained, nor when its context cannot hold what the job
// may ask for, nor while it cools down after failures, nor while suspect.
// A suspicion is a hint: selection falls back to suspect members when no
// other is available, as a request better waits on a suspect worker than
// is refused. The endpoints a worker's engine does not serve are left out
// per request (route, endpoints.go).
func (m member) available(now time.Time, job Job) (ok bool, why string) {
	switch {
	case m.w.drained:
		return false, whyDrained
	case !m.fits(job):
		return false, whyContext
	case m.w.cooling():
		return false, whyCooling
	case m.suspect:
		return false, whySuspect
	}
	return true, ""
}

func (m member) fits(job Job) bool { return m.b.cfg.Context <= 0 || job.NeedContext <= m.b.cfg.Context }

// candidate is what selection scores of an available member.
func (p *pool) candidateLocked(m member, job Job, now time.Time) Candidate {
	c := Candidate{Name: m.b.cfg.Name, InFlight: m.w.load(now), Slots: m.w.slots(m.b.cfg.Slots, now), Speed: m.w.speed}
	if !m.w.kvRoom(m.b, job) {
		// Its pool would overflow: full for this job, which may wait for
		// it as for a busy worker or go to one with room.
		c.Slots = min(c.Slots, c.InFlight)
	}
	c.Cached, _ = m.w.prefix.Predict(job)
	if !c.free() {
		c.NextFree = p.nextFreeLocked(m.b, m.w, job, c.InFlight, c.Slots, now)
	}
	return c
}

// memberTally counts a model's members by why they cannot take a job, for
// the answer when none can.
type memberTally struct {
	serving, fitting, drained, drainedFitting, largest int
}

func (t *memberTally) add(m member, job Job, why string) {
	if why == whyDrained {
		t.drained++
		if m.fits(job) {
			t.drainedFitting++
		}
		return
	}
	t.serving++
	t.largest = max(t.largest, m.b.cfg.Context)
	if why != whyContext {
		t.fitting++
	}
}

// candidatesLocked lists the backends a job may go to: the model's
// available members not excluded, or the suspect ones when there are no
// others. When there are none, the tally says why (noCandidateLocked).
// The lists are the pool's own (p.cands, p.backs), good until the next
// call.
func (p *pool) candidatesLocked(model string, job Job, excluded []string, now time.Time) ([]Candidate, []*backend, memberTally) {
	var t memberTally
	var sbuf [8]*backend
	cands, backs, suspects := p.cands[:0], p.backs[:0], sbuf[:0]
	for _, b := range p.byModel[model] {
		m := p.memberLocked(b, now)
		ok, why := m.available(now, job)
		t.add(m, job, why)
		switch {
		case slices.Contains(excluded, b.cfg.Name):
		case ok:
			cands = append(cands, p.candidateLocked(m, job, now))
			backs = append(backs, b)
		case why == whySuspect:
			suspects = append(suspects, b)
		}
	}
	if len(cands) == 0 {
		for _, b := range suspects {
			cands = append(cands, p.candidateLocked(p.memberLocked(b, now), job, now))
			backs = append(backs, b)
		}
	}
	p.cands, p.backs = cands, backs
	return cands, backs, t
}

// pick offers job's candidates to choose, which the scheduler calls under
// its lock (the queue, the policy), and starts a flight on the one it
// takes. With no candidate, the tally says why; with candidates but none
// taken, f is nil.
func (p *pool) pick(model string, job Job, excluded []string, now time.Time, choose func([]Candidate) int) (f *flight, none bool, t memberTally) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cands, backs, t := p.candidatesLocked(model, job, excluded, now)
	if len(cands) == 0 {
		return nil, true, t
	}
	if i := choose(cands); i >= 0 {
		return p.takeLocked(backs[i], model, job, now), false, t
	}
	return nil, false, t
}

// tally counts model's members for job by why they cannot take it; none
// says no member can.
func (p *pool) tally(model string, job Job, excluded []string, now time.Time) (none bool, t memberTally) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cands, _, t := p.candidatesLocked(model, job, excluded, now)
	return len(cands) == 0, t
}

// noCandidateLocked says why no worker of model can take job now: no ready
// backend for the model, or none with the context. A job too long for
// every serving worker waits for a drained or coming one that holds it;
// only when no worker that is or can become ready holds it is it refused
// for its length.
func (s *scheduler) noCandidateLocked(model string, job Job, t memberTally) *schedError {
	o := s.outlooks[model]
	comingFitting := 0
	if o.ComingContext <= 0 || job.NeedContext <= o.ComingContext {
		// A coming worker's context is its placement's; one that does
		// not say may hold the job.
		comingFitting = o.Coming
	}
	switch {
	case t.serving == 0 && t.drained == 0 && o.Coming == 0:
		return s.noWorkerLocked(model)
	case t.fitting == 0 && t.drainedFitting == 0 && comingFitting == 0:
		return &schedError{status: http.StatusBadRequest, typ: errTypeInvalidRequest, code: codeContextTooLong,
			msg: fmt.Sprintf("the request needs about %d tokens (prompt estimate %d + max_tokens %d) and no worker of %q that is ready or can become ready holds that many (the largest context is %d); shorten the prompt or lower max_tokens",
				job.NeedContext, job.PromptTokens, job.NeedContext-job.PromptTokens, model, s.reachOf(model).largest)}
	case t.serving == 0:
		// Workers on their way, or draining ones an undrain or a restart
		// brings back, are worth waiting for.
		return waitForWorker(model, o.Coming, t.drained)
	case t.fitting == 0:
		// Only a drained or coming worker holds it: the job waits for
		// one, as for a busy worker, while shorter ones are served.
		return &schedError{status: http.StatusServiceUnavailable, typ: errTypeServer, code: codeNoWorker, retryAfter: true, wait: true, alone: true,
			msg: fmt.Sprintf("the request needs about %d tokens and no ready worker of %q holds that many (the largest ready context is %d); it waits for a worker that does (%s)",
				job.NeedContext, model, t.largest, comingText(comingFitting, t.drainedFitting))}
	}
	return &schedError{status: http.StatusServiceUnavailable, typ: errTypeServer, code: codeNoWorker, retryAfter: true,
		msg: fmt.Sprintf("every worker of model %q is failing or was already tried for this request; retry later", model)}
}

// nextFreeLocked predicts when a slot frees for job on a full backend that
// holds load requests in slots slots.
func (p *pool) nextFreeLocked(b *backend, w *worker, job Job, load, slots int, now time.Time) time.Duration {
	soonest := time.Duration(-1)
	for f := range b.active {
		if left := f.predictedEnd.Sub(now); soonest < 0 || left < soonest {
			soonest = left
		}
	}
	return NextFree(soonest, load, w.inFlight, slots, w.speed, job)
}

// takeLocked starts a flight on b.
func (p *pool) takeLocked(b *backend, model string, job Job, now time.Time) *flight {
	w := p.workerLocked(b.cfg.Name)
	w.advanceArea(now)
	w.inFlight++
	w.lastUsed = now
	b.observers.inFlight.Inc()
	load := w.load(now)
	f := &flight{b: b, model: model, job: job, start: now, startConcurrency: load, area0: w.area}
	var cached int
	cached, f.predicted = w.prefix.Predict(job)
	w.prefix.Insert(job.Prefix)
	// The engine prefills only what it does not hold: priced at the whole
	// prompt, a turn whose conversation its worker holds was predicted to
	// keep its slot for seconds it frees in a fraction of one, and fleet
	// sent the next turn of a busy holder's session to the other worker to
	// compute it all again (issue 21, two real llama-servers).
	f.predictedEnd = now.Add(w.speed.Completion(load, job.Uncached(cached)))
	f.kv = w.kvTokens(job)
	w.kvHeld += f.kv
	b.active[f] = struct{}{}
	return f
}

// scheduler is the models' queues, the outlooks (which workers outside the
// ready set may still come) and the policy's random source; the policy's
// own state (a round-robin counter) is guarded by mu too. It takes the
// pool's lock after its own to see the ready set while it decides.
type scheduler struct {
	policy  Policy
	pool    *pool
	metrics *metrics
	opts    *Options
	// reach is published under mu from the ready set and the outlooks,
	// and read without a lock (catalog.go).
	reach atomic.Pointer[reach]

	mu     sync.Mutex
	queues map[string]*queue // by model ID
	// outlooks say, per model ID, which of its workers outside the ready
	// set may still come (see SetOutlook).
	outlooks map[string]Outlook
	rng      *rand.Rand
}

func newScheduler(policy Policy, rng *rand.Rand, p *pool, m *metrics, opts *Options) *scheduler {
	return &scheduler{policy: policy, pool: p, metrics: m, opts: opts, queues: map[string]*queue{}, rng: rng}
}

// replace makes bs the pool's ready set and, with outlook, byModel the
// outlooks, at one instant for the scheduler. It returns the backends that
// left the set and the models with requests waiting.
func (s *scheduler) replace(bs []Backend, byModel map[string]Outlook, outlook bool) (left []*backend, queued []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if outlook {
		s.outlooks = maps.Clone(byModel)
	}
	left, ready := s.pool.replace(bs)
	s.publishReachLocked(ready)
	return left, s.queuedLocked()
}

// setOutlook replaces the outlooks and returns the models with requests
// waiting.
func (s *scheduler) setOutlook(byModel map[string]Outlook) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outlooks = maps.Clone(byModel)
	s.publishReachLocked(s.pool.ready())
	return s.queuedLocked()
}

// place gives job a worker now, or queues it: f when it has one, else the
// waiter to await in q.
func (s *scheduler) place(model string, job Job, excluded []string, now time.Time) (*flight, *queue, *waiter, *schedError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[model]
	if q == nil {
		q = &queue{}
		s.queues[model] = q
	}
	f, none, t := s.pool.pick(model, job, excluded, now, func(cands []Candidate) int { return q.Choose(s.policy, s.rng, job, cands) })
	if f != nil {
		return f, nil, nil, nil
	}
	if none {
		if serr := s.noCandidateLocked(model, job, t); !serr.wait {
			return nil, nil, nil, serr
		}
	}
	wt := &waiter{job: job, excluded: excluded, enqueued: now, done: make(chan *flight, 1)}
	q.Push(wt)
	if q.Len() > 1 {
		// It may take a slot the waiters ahead of it declined.
		s.dispatchLocked(model, q, now)
	}
	// A full queue turns away a request that would wait, not one that a
	// worker the waiters declined has just taken.
	if q.Len() > s.opts.QueueSize && q.Remove(wt) {
		s.metrics.queueDepth.WithLabelValues(model).Set(float64(q.Len()))
		return nil, nil, nil, &schedError{status: http.StatusTooManyRequests, typ: errTypeRateLimit, code: codeQueueFull, retryAfter: true,
			msg: fmt.Sprintf("model %q has %d requests waiting already; retry later", model, q.Len())}
	}
	s.metrics.queueDepth.WithLabelValues(model).Set(float64(q.Len()))
	return nil, q, wt, nil
}

// withdraw takes wt out of q, the queue of model; false means a dispatch
// gave it a slot first.
func (s *scheduler) withdraw(model string, q *queue, wt *waiter) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !q.Remove(wt) {
		return false
	}
	s.metrics.queueDepth.WithLabelValues(model).Set(float64(q.Len()))
	return true
}

// whyWaiting is why no worker of model can take job now, nil when one can.
func (s *scheduler) whyWaiting(model string, job Job, excluded []string, now time.Time) *schedError {
	s.mu.Lock()
	defer s.mu.Unlock()
	none, t := s.pool.tally(model, job, excluded, now)
	if !none {
		return nil
	}
	return s.noCandidateLocked(model, job, t)
}

// dispatch gives freed slots to queued requests by the queue's rules
// (queue.go): oldest first, none taking a slot an earlier one waits for.
func (s *scheduler) dispatch(model string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[model]
	if q == nil || q.Len() == 0 {
		// Nothing waits, and the depth gauge says so since the last
		// change of the queue.
		return
	}
	s.dispatchLocked(model, q, time.Now())
	s.metrics.queueDepth.WithLabelValues(model).Set(float64(q.Len()))
}

func (s *scheduler) dispatchLocked(model string, q *queue, now time.Time) {
	judge := func(job Job, t memberTally) *schedError { return s.noCandidateLocked(model, job, t) }
	s.pool.seat(model, now, judge, func(seats Seats[*waiter]) { q.Dispatch(s.policy, s.rng, seats) })
}

// seat runs a queue's dispatch (run) with the pool's side of it, seats,
// under the pool's lock; judge says why a waiter has no candidate.
func (p *pool) seat(model string, now time.Time, judge func(Job, memberTally) *schedError, run func(Seats[*waiter])) {
	p.mu.Lock()
	defer p.mu.Unlock()
	run(&poolSeats{p: p, model: model, now: now, judge: judge})
}

// poolSeats is the pool's side of a queue dispatch; it lives only within
// seat, under the pool's lock.
type poolSeats struct {
	p     *pool
	model string
	now   time.Time
	judge func(Job, memberTally) *schedError
	backs []*backend
}

func (s *poolSeats) Job(w *waiter) Job { return w.job }

func (s *poolSeats) Candidates(w *waiter, job Job) ([]Candidate, error) {
	cands, backs, t := s.p.candidatesLocked(s.model, job, w.excluded, s.now)
	s.backs = backs
	if len(cands) > 0 {
		return cands, nil
	}
	serr := s.judge(job, t)
	if serr.wait && serr.alone {
		return nil, ErrKeep // waits for a worker the others do not need
	}
	if serr.wait {
		return nil, ErrHold // still coming: the queue keeps waiting
	}
	return nil, serr
}

func (s *poolSeats) Take(w *waiter, job Job, i int) {
	w.job = job
	w.done <- s.p.takeLocked(s.backs[i], s.model, job, s.now)
}

func (s *poolSeats) Fail(w *waiter, err error) {
	w.err, _ = err.(*schedError)
	w.done <- nil
}

// queued is the models with requests waiting.
func (s *scheduler) queued() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queuedLocked()
}

func (s *scheduler) queuedLocked() []string {
	var models []string
	for m, q := range s.queues {
		if q.Len() > 0 {
			models = append(models, m)
		}
	}
	return models
}

// acquire finds a backend for the job now, or queues until one frees, the
// queue times out, or ctx ends.
func (r *Router) acquire(ctx context.Context, model string, job Job, excluded []string) (*flight, error) {
	f, q, wt, serr := r.sched.place(model, job, excluded, time.Now())
	switch {
	case serr != nil:
		return nil, serr
	case f != nil:
		return f, nil
	}
	return r.await(ctx, model, job, excluded, q, wt)
}

// await waits for wt's slot in q (a dispatch sends it), until the queue
// times out or ctx ends; job and excluded are the request's as it queued
// (a dispatch rewrites wt's under the scheduler's lock).
func (r *Router) await(ctx context.Context, model string, job Job, excluded []string, q *queue, wt *waiter) (*flight, error) {
	now := wt.enqueued
	timer := time.NewTimer(r.opts.QueueTimeout)
	defer timer.Stop()
	var cause error
	select {
	case f := <-wt.done:
		r.metrics.queueWait.WithLabelValues(model).Observe(time.Since(now).Seconds())
		if f == nil {
			if wt.err != nil {
				return nil, wt.err
			}
			return nil, &schedError{status: http.StatusServiceUnavailable, typ: errTypeServer, code: codeNoWorker, retryAfter: true,
				msg: fmt.Sprintf("the workers of model %q went away while the request waited; retry later", model)}
		}
		return f, nil
	case <-ctx.Done():
		cause = ctx.Err()
	case <-timer.C:
		cause = r.queueTimeout(model, job, excluded)
	}
	if r.sched.withdraw(model, q, wt) {
		r.metrics.queueWait.WithLabelValues(model).Observe(time.Since(now).Seconds())
		return nil, cause
	}
	// Dispatched while we were giving up: hand the slot back.
	if f := <-wt.done; f != nil {
		r.release(f, nil)
	}
	return nil, cause
}

// queueTimeout is the answer to a request that waited QueueTimeout: 503 when
// the worker it waited for never became ready, else 429 (the fleet is busy).
func (r *Router) queueTimeout(model string, job Job, excluded []string) *schedError {
	if serr := r.sched.whyWaiting(model, job, excluded, time.Now()); serr != nil && serr.wait {
		return &schedError{status: http.StatusServiceUnavailable, typ: errTypeServer, code: codeNoWorker, retryAfter: true,
			msg: fmt.Sprintf("%s and none became ready within the queue timeout of %s; retry later (fleet serve --queue-timeout sets it)", serr.msg, r.opts.QueueTimeout)}
	}
	return &schedError{status: http.StatusTooManyRequests, typ: errTypeRateLimit, code: codeQueueTimeout, retryAfter: true,
		msg: fmt.Sprintf("model %q: no worker slot freed within %s; retry later or add workers", model, r.opts.QueueTimeout)}
}

// dispatchQueued gives freed slots to the requests waiting for any model.
func (r *Router) dispatchQueued() {
	for _, m := range r.sched.queued() {
		r.sched.dispatch(m)
	}
}

// outcome is what a finished flight tells the scheduler.
type outcome struct {
	ok           bool
	ttft         time.Duration // from dispatch to first byte
	itl          time.Duration
	outputTokens int
	// cache is what the engine reported of its prompt cache, if anything.
	cache promptCache
}

// release ends a flight, teaches the speed model and the worker's
// histories what it saw and lets the next queued request have the slot.
// A request arriving meanwhile cannot take the freed slot from a waiting
// one: it queues behind it (Queue.Choose).
func (r *Router) release(f *flight, o *outcome) {
	r.pool.finish(f, o, &r.outputs, time.Now())
	r.sched.dispatch(f.model)
}

// finish ends f on its worker and teaches the worker what o says.
func (p *pool) finish(f *flight, o *outcome, outputs *outputEstimates, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workerLocked(f.b.cfg.Name)
	w.advanceArea(now)
	mean := float64(f.startConcurrency)
	if d := now.Sub(f.start).Seconds(); d > 0 {
		mean = (w.area - f.area0) / d
	}
	w.inFlight--
	w.kvHeld -= f.kv
	delete(f.b.active, f)
	f.b.observers.inFlight.Dec()
	if o != nil && o.ok {
		// The worker's own TTFT, from the moment it was sent the request:
		// a wait in the router's queue is the fleet's, not the worker's.
		if o.ttft > 0 {
			w.ttftHistory.add(ms(o.ttft))
		}
		if o.itl > 0 {
			w.itlHistory.add(ms(o.itl))
		}
		w.speed.Observe(f.startConcurrency, mean, w.observeCache(f, o.cache), o.ttft, o.itl)
		w.learnTokenScale(f.job.PromptTokens, o.cache.engineTokens())
		w.kvRefusing = false
		if o.outputTokens > 0 {
			outputs.add(f.model, o.outputTokens)
		}
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// recordFailure counts a backend failure; a refused connection, or
// FailureThreshold failures within FailureWindow, cool it down until a
// health check passes.
func (r *Router) recordFailure(b *backend, refused bool, err error) {
	if r.pool.recordFailure(b, refused, err, time.Now()) {
		go r.checkHealth(b)
	}
}
