package router

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// pool is the ready set and what the router remembers of each worker: its
// backend (configuration, connections, the flights on it, the paths it
// does not serve) and its worker state (load, drain, failures and
// cooldown, measured speed, prompt prefixes, the engine's own load), and
// the suspicions (hedge.go). A choice of worker sees all of it at one
// instant, under mu. The scheduler (sched.go) takes mu after its own lock;
// the pool takes no other part's lock but leaves' (the hedge's waits, the
// output estimates, a policy's own state).
type pool struct {
	opts    *Options
	log     *slog.Logger
	metrics *metrics
	// forgotten is told each worker whose state the pool drops, for the
	// parts that keep their own per worker (engine metrics, the policy).
	forgotten func(name string)

	mu       sync.Mutex
	backends []*backend // the ready set, in the order given
	// byModel is the ready set by model, each in the set's order: a
	// decision looks at its model's workers only, whatever the others.
	byModel map[string][]*backend
	workers map[string]*worker
	// suspects are the workers that get no new requests for now.
	suspects map[string]suspicion
	// changed is closed (and replaced) whenever a request finishes, so
	// WaitIdle can sleep without polling.
	changed chan struct{}
	// cands and backs are candidatesLocked's lists, kept at the largest
	// size needed: a decision among many workers would otherwise put new
	// ones on the heap.
	cands []Candidate
	backs []*backend
}

func newPool(opts *Options, log *slog.Logger, m *metrics, forgotten func(string)) *pool {
	return &pool{opts: opts, log: log, metrics: m, forgotten: forgotten, workers: map[string]*worker{}, changed: make(chan struct{})}
}

// replace makes bs the ready set. It returns the backends that left it,
// whose idle connections the caller closes, and the ready set's
// configurations.
func (p *pool) replace(bs []Backend) (left []*backend, ready []Backend) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := map[string]*backend{}
	for _, b := range p.backends {
		old[b.cfg.Name] = b
	}
	p.sweepLocked(bs, time.Now())
	next := make([]*backend, 0, len(bs))
	for _, cfg := range bs {
		if cfg.Slots <= 0 {
			cfg.Slots = 1
		}
		if b, ok := old[cfg.Name]; ok && sameEngine(b.cfg, cfg) {
			// Same engine: keep its connections, but dial new ones through
			// the Dial given now (an SSH tunnel may have been re-established).
			// b.cfg is left alone: requests in flight read it unlocked.
			b.setDial(cfg.Dial)
			next = append(next, b)
			delete(old, cfg.Name)
			continue
		}
		// A worker that joins or comes back from the hub is ready by the
		// hub's own readiness check, which is at least as good as ours. One that
		// stayed keeps its cooldown: the hub resyncs on any worker's change.
		w := p.workerLocked(cfg.Name)
		w.coolingUntil = time.Time{}
		w.failures = w.failures[:0]
		w.kvRefusedAt, w.kvRefusing = 0, false
		// A new or restarted engine starts with an empty prompt cache.
		w.prefix.Clear()
		next = append(next, p.newBackend(cfg))
	}
	for _, b := range next {
		w := p.workerLocked(b.cfg.Name)
		w.ready, w.seeded, w.outside = true, false, time.Time{}
	}
	for _, b := range old {
		b.gone.Store(true) // under p.mu: a request ending now sees it
		left = append(left, b)
	}
	p.backends = next
	p.byModel = map[string][]*backend{}
	for _, b := range next {
		p.byModel[b.cfg.Model] = append(p.byModel[b.cfg.Model], b)
	}
	return left, p.readyLocked()
}

// ready is the ready set's configurations.
func (p *pool) ready() []Backend {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.readyLocked()
}

func (p *pool) readyLocked() []Backend {
	out := make([]Backend, len(p.backends))
	for i, b := range p.backends {
		out[i] = b.cfg
	}
	return out
}

func (p *pool) newBackend(cfg Backend) *backend {
	b := &backend{}
	b.setDial(cfg.Dial)
	conns := cfg.Slots + p.opts.ExtraConns
	t := newEngineTransport(cfg.Addr, conns, func(ctx context.Context, network, addr string) (net.Conn, error) {
		return (*b.dial.Load())(ctx, network, addr)
	})
	labels := prometheus.Labels{"model": cfg.Model, "backend": cfg.Name}
	b.cfg = cfg
	b.base = url.URL{Scheme: "http", Host: cfg.Addr}
	b.transport = t
	b.active = map[*flight]struct{}{}
	b.observers = backendObservers{
		ttft:     p.metrics.ttft.With(labels),
		itl:      p.metrics.itl.With(labels),
		e2e:      p.metrics.e2e.With(labels),
		inFlight: p.metrics.inFlight.WithLabelValues(cfg.Name),
		tokens:   p.metrics.tokenCounters(cfg),
	}
	return b
}

func (p *pool) workerLocked(name string) *worker {
	w, ok := p.workers[name]
	if !ok {
		w = &worker{speed: NewSpeedModel(SpeedPrior{}), prefix: NewPrefixIndex(0)}
		p.workers[name] = w
	}
	return w
}

// sweepLocked drops what the router keeps of workers that are not in bs (the
// next ready set): their state, once nothing is in flight on them, and
// their series on /metrics. A worker that comes back starts fresh, as its
// restarted engine does, but for its drain and a speed measured for it
// before it joined. Kept outside the set: drained workers (a drain holds
// across SetBackends) and ones seeded before they joined, at most maxParked
// of them, the oldest dropped first.
func (p *pool) sweepLocked(bs []Backend, now time.Time) {
	next := make(map[string]bool, len(bs))
	for _, b := range bs {
		next[b.Name] = true
	}
	var parked, back []string
	for name, w := range p.workers {
		if w.ready && !next[name] {
			w.ready, w.outside = false, now
		}
		switch {
		case w.ready || w.inFlight > 0 || w.seeded && next[name]:
		case next[name]:
			back = append(back, name)
		case w.drained || w.seeded:
			parked = append(parked, name)
		default:
			p.forgetLocked(name)
		}
	}
	for _, name := range back {
		p.renewLocked(name)
	}
	if len(parked) > maxParked {
		slices.SortFunc(parked, func(a, b string) int { return p.workers[a].outside.Compare(p.workers[b].outside) })
		for _, name := range parked[:len(parked)-maxParked] {
			p.forgetLocked(name)
		}
	}
	// The series of every name outside the set with nothing in flight go:
	// a drained or seeded one's state stays, its series do not, nor do
	// those of a name with no state left (a request's status counted after
	// its worker was forgotten).
	for _, name := range p.metrics.backendNames() {
		if w, kept := p.workers[name]; !next[name] && (!kept || w.inFlight == 0) {
			p.metrics.forgetBackend(name)
		}
	}
}

// forgetIfGone drops the state of b's worker when b has left the ready set
// and the worker's last request has ended (sweepLocked's rule), so that a
// worker that left the fleet with requests in flight is not kept until the
// next change of the set. It is called as each request on b ends; a b
// still routed to costs no lock.
func (p *pool) forgetIfGone(b *backend) {
	if !b.gone.Load() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.workers[b.cfg.Name]
	switch {
	case !ok || w.ready || w.inFlight > 0:
	case w.drained || w.seeded:
		p.metrics.forgetBackend(b.cfg.Name)
	default:
		p.forgetLocked(b.cfg.Name)
	}
}

// renewLocked gives an idle worker outside the ready set a fresh state, as
// for a new engine; its drain holds.
func (p *pool) renewLocked(name string) *worker {
	drained := p.workers[name].drained
	p.forgetLocked(name)
	w := p.workerLocked(name)
	w.drained = drained
	return w
}

// forgetLocked drops a worker's state, its series and its engine's
// metrics; a suspicion the router raised itself goes with it (one the hub
// set stays until the hub clears it).
func (p *pool) forgetLocked(name string) {
	if w := p.workers[name]; w != nil && w.engine.expiry != nil {
		w.engine.expiry.Stop()
	}
	delete(p.workers, name)
	if s, ok := p.suspects[name]; ok && !s.until.IsZero() {
		delete(p.suspects, name)
	}
	p.metrics.forgetBackend(name)
	p.forgotten(name)
}

// drain stops new requests to the named worker until undrain.
func (p *pool) drain(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workerLocked(name)
	w.drained = true
	if !w.ready {
		w.outside = time.Now()
	}
}

func (p *pool) undrain(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w, ok := p.workers[name]; ok {
		w.drained = false
	}
}

// inFlight is the named worker's requests in flight, and a channel closed
// when any request ends.
func (p *pool) inFlight(name string) (int, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	if w, ok := p.workers[name]; ok {
		n = w.inFlight
	}
	return n, p.changed
}

// stats are the live figures of every backend of the ready set.
func (p *pool) stats(now time.Time) []BackendStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]BackendStats, 0, len(p.backends))
	for _, b := range p.backends {
		out = append(out, p.workerLocked(b.cfg.Name).stats(b, now))
	}
	return out
}

// stats are the worker's live figures, b its backend.
func (w *worker) stats(b *backend, now time.Time) BackendStats {
	load := max(w.load(now), 1)
	ttft := w.speed.TTFT(load, 0)
	itl := w.speed.ITL(load)
	st := BackendStats{
		Name:            b.cfg.Name,
		Model:           b.cfg.Model,
		InFlight:        w.inFlight,
		Slots:           w.slots(b.cfg.Slots, now),
		Draining:        w.drained,
		Cooling:         w.cooling(),
		TTFTms:          median(w.ttftHistory.values()),
		PredictedTTFTms: ms(ttft),
		ITLms:           ms(itl),
		TTFTHistory:     w.ttftHistory.values(),
		ITLHistory:      w.itlHistory.values(),
		SpeedMeasured:   w.speed.Measured(),
	}
	if itl > 0 {
		st.TokPerSec = float64(time.Second) / float64(itl)
	}
	if w.engine.fresh(now) {
		st.EngineRunning, st.EngineWaiting = w.engine.load.Running, w.engine.load.Waiting
	}
	st.CacheHit, st.CacheHitKnown = w.prefix.HitRatio()
	return st
}

// seedSpeed teaches the named worker's speed model points.
func (p *pool) seedSpeed(name string, points []SpeedPoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workerLocked(name)
	if !w.ready {
		// Measured before it joins (admission): a new engine, whose
		// measurement waits for it to join.
		if !w.seeded && w.inFlight == 0 {
			w = p.renewLocked(name)
		}
		w.seeded, w.outside = true, time.Now()
	}
	for _, pt := range points {
		w.speed.Seed(pt)
	}
}

// models are the models the ready set serves, in its order, repeated.
func (p *pool) models() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, len(p.backends))
	for i, b := range p.backends {
		out[i] = b.cfg.Model
	}
	return out
}

// hold starts a flight of job on the named worker of the ready set, nil
// when it is not in it.
func (p *pool) hold(name string, job func(model string) Job, now time.Time) *flight {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.backends {
		if b.cfg.Name == name {
			return p.takeLocked(b, b.cfg.Model, job(b.cfg.Model), now)
		}
	}
	return nil
}

// ttft is the speed model's time to first token of f's worker for a
// prompt of tokens at the load f started under.
func (p *pool) ttft(f *flight, tokens int) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.workerLocked(f.b.cfg.Name).speed.TTFT(f.startConcurrency, tokens)
}

// recordFailure counts a backend failure; a refused connection, or
// FailureThreshold failures within FailureWindow, cool it down until a
// health check passes. check says the caller starts b's health checker.
func (p *pool) recordFailure(b *backend, refused bool, err error, now time.Time) (check bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workerLocked(b.cfg.Name)
	cut := now.Add(-p.opts.FailureWindow)
	w.failures = slices.DeleteFunc(w.failures, func(t time.Time) bool { return t.Before(cut) })
	w.failures = append(w.failures, now)
	if (!refused && len(w.failures) < p.opts.FailureThreshold) || !w.coolingUntil.IsZero() {
		return false
	}
	w.coolingUntil = now.Add(p.opts.Cooldown)
	p.log.Warn("backend cooled down after failures; it gets no traffic until a health check passes",
		"backend", b.cfg.Name, "failures", len(w.failures), "window", p.opts.FailureWindow, "cooldown", p.opts.Cooldown, "err", err)
	if b.checking {
		return false
	}
	b.checking = true
	return true
}

// cooling says how long b's cooldown has left, and false when b no longer
// needs its checker (it passed, or left the ready set), which ends it.
func (p *pool) cooling(b *backend) (left time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workerLocked(b.cfg.Name)
	if w.coolingUntil.IsZero() || !slices.Contains(p.backends, b) {
		b.checking = false
		return 0, false
	}
	return time.Until(w.coolingUntil), true
}

// checked records a health check of b: a failed one (err) rests it
// another Cooldown, a passed one gives it back to selection.
func (p *pool) checked(b *backend, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workerLocked(b.cfg.Name)
	if err != nil {
		w.coolingUntil = time.Now().Add(p.opts.Cooldown)
		return
	}
	w.coolingUntil = time.Time{}
	w.failures = w.failures[:0]
	b.checking = false
}

// learnNotServed remembers that b's engine does not serve path.
func (p *pool) learnNotServed(b *backend, path string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b.notServed == nil {
		b.notServed = map[string]bool{}
	}
	b.notServed[path] = true
}
