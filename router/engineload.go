package router

import "time"

// EngineLoad is what a worker's engine reports about its own load, scraped
// by the hub (vLLM's num_requests_running/waiting, llama-server's /slots).
type EngineLoad struct {
	// Running and Waiting are the requests the engine is decoding and the
	// ones it has queued; they include the router's own.
	Running, Waiting int
	// Slots is how many requests the engine serves at once; 0 when it does
	// not say (vLLM), which leaves the configured slots alone.
	Slots int
	// At is when the figures were read (the scrape's start); zero means now.
	At time.Time
}

// engineView is a worker's last engine observation, reduced to what the
// scheduler needs.
type engineView struct {
	load EngineLoad
	// external is the requests the engine held at At beyond the router's
	// own that were already out then: another hub's or client's, ones the
	// router gave up on that the engine still decodes, vLLM's queue. It
	// stays constant until the next observation while the router's own
	// count moves, so the router's requests ending do not leave the worker
	// looking busy for a whole scrape interval.
	external int
	// until is when the observation goes stale and is ignored.
	until time.Time
	// expiry re-runs dispatch when the observation goes stale, so a
	// request waiting on a worker that only the engine's figures made
	// look full does not wait for an unrelated event.
	expiry *time.Timer
}

func (v *engineView) fresh(now time.Time) bool { return now.Before(v.until) }

// load is the requests the scheduler assumes on the worker: the router's
// own plus the external ones while the observation is fresh. At the moment
// of observation it is at least max(router in-flight, engine running+waiting).
func (w *worker) load(now time.Time) int {
	if w.engine.fresh(now) {
		return w.inFlight + w.engine.external
	}
	return w.inFlight
}

// slots is the worker's usable slots: the configured count, capped by the
// engine's own when it reports one.
func (w *worker) slots(configured int, now time.Time) int {
	if w.engine.fresh(now) && w.engine.load.Slots > 0 {
		return min(configured, w.engine.load.Slots)
	}
	return configured
}

// ObserveEngineLoad tells the scheduler what the named worker's engine
// reports about its load. Until it is older than Options.EngineLoadMaxAge,
// the scheduler plans with the router's in-flight count plus the requests
// the engine held beyond the router's own, and caps the worker's slots at
// the engine's slot count when that is known. An observation already stale,
// with negative counts, or of a worker outside the ready set is ignored.
func (r *Router) ObserveEngineLoad(name string, l EngineLoad) {
	now := time.Now()
	if l.At.IsZero() || l.At.After(now) {
		l.At = now
	}
	if l.Running < 0 || l.Waiting < 0 || l.Slots < 0 {
		r.log.Warn("ignoring an engine load with negative figures", "backend", name, "running", l.Running, "waiting", l.Waiting, "slots", l.Slots)
		return
	}
	until := l.At.Add(r.opts.EngineLoadMaxAge)
	if !now.Before(until) {
		return
	}
	if !r.pool.observeEngineLoad(name, l, now, until, r.dispatchQueued) {
		return
	}
	// The engine may have freed slots the router did not know were taken.
	r.dispatchQueued()
}

// observeEngineLoad records l for the named worker of the ready set until
// until; false when it is not in the set. onStale runs when the
// observation goes stale.
func (p *pool) observeEngineLoad(name string, l EngineLoad, now, until time.Time, onStale func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.workers[name]
	if !ok || !w.ready {
		// Not routed to: nothing to plan with it, and a scrape that ends
		// after its worker left must not keep state for it.
		return false
	}
	// The router's requests the engine could have counted: those already
	// out when it was read. Any started since are on top of its figures.
	own := 0
	for _, b := range p.backends {
		if b.cfg.Name != name {
			continue
		}
		for f := range b.active {
			if !f.start.After(l.At) {
				own++
			}
		}
	}
	w.advanceArea(now)
	w.engine.load = l
	w.engine.external = max(l.Running+l.Waiting-own, 0)
	w.engine.until = until
	if w.engine.expiry == nil {
		w.engine.expiry = time.AfterFunc(until.Sub(now), onStale)
	} else {
		w.engine.expiry.Reset(until.Sub(now))
	}
	return true
}
