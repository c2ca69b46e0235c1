package router

import (
	"context"
	"fmt"
	"net/http"
	"slices"
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

func (r *Router) memberLocked(b *backend, now time.Time) member {
	return member{b: b, w: r.workerLocked(b.cfg.Name), suspect: r.suspectLocked(b.cfg.Name, now)}
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
func (r *Router) candidateLocked(m member, job Job, now time.Time) Candidate {
	c := Candidate{Name: m.b.cfg.Name, InFlight: m.w.load(now), Slots: m.w.slots(m.b.cfg.Slots, now), Speed: m.w.speed}
	c.Cached, _ = m.w.prefix.Predict(job)
	if !c.free() {
		c.NextFree = r.nextFreeLocked(m.b, m.w, job, c.InFlight, c.Slots, now)
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
// others. When there are none, it says why (noCandidateLocked).
func (r *Router) candidatesLocked(model string, job Job, excluded []string, now time.Time, buf []Candidate, bs []*backend) ([]Candidate, []*backend, *schedError) {
	var t memberTally
	var sbuf [8]*backend
	cands, backs, suspects := buf[:0], bs[:0], sbuf[:0]
	for _, b := range r.backends {
		if b.cfg.Model != model {
			continue
		}
		m := r.memberLocked(b, now)
		ok, why := m.available(now, job)
		t.add(m, job, why)
		switch {
		case slices.Contains(excluded, b.cfg.Name):
		case ok:
			cands = append(cands, r.candidateLocked(m, job, now))
			backs = append(backs, b)
		case why == whySuspect:
			suspects = append(suspects, b)
		}
	}
	if len(cands) == 0 {
		for _, b := range suspects {
			cands = append(cands, r.candidateLocked(r.memberLocked(b, now), job, now))
			backs = append(backs, b)
		}
	}
	if len(cands) > 0 {
		return cands, backs, nil
	}
	return nil, nil, r.noCandidateLocked(model, job, t)
}

// noCandidateLocked says why no worker of model can take job now: no ready
// backend for the model, or none with the context. A job too long for
// every serving worker waits for a drained or coming one that holds it;
// only when no worker that is or can become ready holds it is it refused
// for its length.
func (r *Router) noCandidateLocked(model string, job Job, t memberTally) *schedError {
	o := r.outlooks[model]
	comingFitting := 0
	if o.ComingContext <= 0 || job.NeedContext <= o.ComingContext {
		// A coming worker's context is its placement's; one that does
		// not say may hold the job.
		comingFitting = o.Coming
	}
	switch {
	case t.serving == 0 && t.drained == 0 && o.Coming == 0:
		return r.noWorkerLocked(model)
	case t.fitting == 0 && t.drainedFitting == 0 && comingFitting == 0:
		return &schedError{status: http.StatusBadRequest, typ: errTypeInvalidRequest, code: codeContextTooLong,
			msg: fmt.Sprintf("the request needs about %d tokens (prompt estimate %d + max_tokens %d) and no worker of %q that is ready or can become ready holds that many (the largest context is %d); shorten the prompt or lower max_tokens",
				job.NeedContext, job.PromptTokens, job.NeedContext-job.PromptTokens, model, r.largestContext(model))}
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
func (r *Router) nextFreeLocked(b *backend, w *worker, job Job, load, slots int, now time.Time) time.Duration {
	soonest := time.Duration(-1)
	for f := range b.active {
		if left := f.predictedEnd.Sub(now); soonest < 0 || left < soonest {
			soonest = left
		}
	}
	return NextFree(soonest, load, w.inFlight, slots, w.speed, job)
}

// takeLocked starts a flight on b.
func (r *Router) takeLocked(b *backend, model string, job Job, now time.Time) *flight {
	w := r.workerLocked(b.cfg.Name)
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
	b.active[f] = struct{}{}
	return f
}

// acquire finds a backend for the job now, or queues until one frees, the
// queue times out, or ctx ends.
func (r *Router) acquire(ctx context.Context, model string, job Job, excluded []string) (*flight, error) {
	now := time.Now()
	var cbuf [8]Candidate
	var bbuf [8]*backend
	r.mu.Lock()
	cands, backs, serr := r.candidatesLocked(model, job, excluded, now, cbuf[:], bbuf[:])
	if serr != nil && !serr.wait {
		r.mu.Unlock()
		return nil, serr
	}
	q := r.queues[model]
	if q == nil {
		q = &queue{}
		r.queues[model] = q
	}
	if serr == nil {
		if i := q.Choose(r.policy, r.rng, job, cands); i >= 0 {
			f := r.takeLocked(backs[i], model, job, now)
			r.mu.Unlock()
			return f, nil
		}
	}
	wt := &waiter{job: job, excluded: excluded, enqueued: now, done: make(chan *flight, 1)}
	q.Push(wt)
	if q.Len() > 1 {
		// It may take a slot the waiters ahead of it declined.
		r.dispatchLocked(model, q, now)
	}
	// A full queue turns away a request that would wait, not one that a
	// worker the waiters declined has just taken.
	if q.Len() > r.opts.QueueSize && q.Remove(wt) {
		r.metrics.queueDepth.WithLabelValues(model).Set(float64(q.Len()))
		r.mu.Unlock()
		return nil, &schedError{status: http.StatusTooManyRequests, typ: errTypeRateLimit, code: codeQueueFull, retryAfter: true,
			msg: fmt.Sprintf("model %q has %d requests waiting already; retry later", model, q.Len())}
	}
	r.metrics.queueDepth.WithLabelValues(model).Set(float64(q.Len()))
	r.mu.Unlock()
	return r.await(ctx, model, job, excluded, q, wt)
}

// await waits for wt's slot in q (a dispatch sends it), until the queue
// times out or ctx ends; job and excluded are the request's as it queued
// (a dispatch rewrites wt's under the lock).
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
	r.mu.Lock()
	if q.Remove(wt) {
		r.metrics.queueDepth.WithLabelValues(model).Set(float64(q.Len()))
		r.mu.Unlock()
		r.metrics.queueWait.WithLabelValues(model).Observe(time.Since(now).Seconds())
		return nil, cause
	}
	r.mu.Unlock()
	// Dispatched while we were giving up: hand the slot back.
	if f := <-wt.done; f != nil {
		r.release(f, nil)
	}
	return nil, cause
}

// queueTimeout is the answer to a request that waited QueueTimeout: 503 when
// the worker it waited for never became ready, else 429 (the fleet is busy).
func (r *Router) queueTimeout(model string, job Job, excluded []string) *schedError {
	var cbuf [8]Candidate
	var bbuf [8]*backend
	r.mu.Lock()
	_, _, serr := r.candidatesLocked(model, job, excluded, time.Now(), cbuf[:], bbuf[:])
	r.mu.Unlock()
	if serr != nil && serr.wait {
		return &schedError{status: http.StatusServiceUnavailable, typ: errTypeServer, code: codeNoWorker, retryAfter: true,
			msg: fmt.Sprintf("%s and none became ready within the queue timeout of %s; retry later (fleet serve --queue-timeout sets it)", serr.msg, r.opts.QueueTimeout)}
	}
	return &schedError{status: http.StatusTooManyRequests, typ: errTypeRateLimit, code: codeQueueTimeout, retryAfter: true,
		msg: fmt.Sprintf("model %q: no worker slot freed within %s; retry later or add workers", model, r.opts.QueueTimeout)}
}

// dispatch gives freed slots to queued requests by the queue's rules
// (queue.go): oldest first, none taking a slot an earlier one waits for.
func (r *Router) dispatch(model string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queues[model]
	if q == nil {
		return
	}
	r.dispatchLocked(model, q, time.Now())
	r.metrics.queueDepth.WithLabelValues(model).Set(float64(q.Len()))
}

func (r *Router) dispatchLocked(model string, q *queue, now time.Time) {
	seats := &routerSeats{r: r, model: model, now: now}
	q.Dispatch(r.policy, r.rng, seats)
}

// routerSeats is the router's side of a queue dispatch, under its lock.
type routerSeats struct {
	r     *Router
	model string
	now   time.Time
	cbuf  [8]Candidate
	bbuf  [8]*backend
	backs []*backend
}

func (s *routerSeats) Job(w *waiter) Job { return w.job }

func (s *routerSeats) Candidates(w *waiter, job Job) ([]Candidate, error) {
	cands, backs, serr := s.r.candidatesLocked(s.model, job, w.excluded, s.now, s.cbuf[:], s.bbuf[:])
	s.backs = backs
	if serr != nil {
		if serr.wait && serr.alone {
			return nil, ErrKeep // waits for a worker the others do not need
		}
		if serr.wait {
			return nil, ErrHold // still coming: the queue keeps waiting
		}
		return nil, serr
	}
	return cands, nil
}

func (s *routerSeats) Take(w *waiter, job Job, i int) {
	w.job = job
	w.done <- s.r.takeLocked(s.backs[i], s.model, job, s.now)
}

func (s *routerSeats) Fail(w *waiter, err error) {
	w.err, _ = err.(*schedError)
	w.done <- nil
}

func (r *Router) queuedModelsLocked() []string {
	var models []string
	for m, q := range r.queues {
		if q.Len() > 0 {
			models = append(models, m)
		}
	}
	return models
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
func (r *Router) release(f *flight, o *outcome) {
	now := time.Now()
	r.mu.Lock()
	w := r.workerLocked(f.b.cfg.Name)
	w.advanceArea(now)
	mean := float64(f.startConcurrency)
	if d := now.Sub(f.start).Seconds(); d > 0 {
		mean = (w.area - f.area0) / d
	}
	w.inFlight--
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
		w.speed.Observe(f.startConcurrency, mean, r.observeCacheLocked(w, f, o.cache), o.ttft, o.itl)
		if o.outputTokens > 0 {
			r.outputs.add(f.model, o.outputTokens)
		}
	}
	close(r.changed)
	r.changed = make(chan struct{})
	// The freed slot goes to the queue in the same hold of the lock.
	if q := r.queues[f.model]; q != nil {
		r.dispatchLocked(f.model, q, now)
		r.metrics.queueDepth.WithLabelValues(f.model).Set(float64(q.Len()))
	}
	r.mu.Unlock()
}

// recordFailure counts a backend failure; a refused connection, or
// FailureThreshold failures within FailureWindow, cool it down until a
// health check passes.
func (r *Router) recordFailure(b *backend, refused bool, err error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.workerLocked(b.cfg.Name)
	cut := now.Add(-r.opts.FailureWindow)
	w.failures = slices.DeleteFunc(w.failures, func(t time.Time) bool { return t.Before(cut) })
	w.failures = append(w.failures, now)
	if (refused || len(w.failures) >= r.opts.FailureThreshold) && w.coolingUntil.IsZero() {
		w.coolingUntil = now.Add(r.opts.Cooldown)
		r.log.Warn("backend cooled down after failures; it gets no traffic until a health check passes",
			"backend", b.cfg.Name, "failures", len(w.failures), "window", r.opts.FailureWindow, "cooldown", r.opts.Cooldown, "err", err)
		r.startHealthCheckLocked(b)
	}
}
