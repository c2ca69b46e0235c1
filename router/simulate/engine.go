package simulate

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"fleet/router"
)

const routerChunkTokens = router.PrefixChunkTokens

// simReq is one request's life in the simulation.
type simReq struct {
	arr        arrival
	job        router.Job
	prompt     seq
	enqueued   time.Duration
	dispatched time.Duration
	prefillEnd time.Duration
	computed   bool
	// remaining decode tokens after the first.
	remaining    float64
	predictedEnd time.Duration
	startConc    int
	area0        float64
	// cached is what the engine reused; predicted the router's index match
	// in chunks when it was sent, predictedCached the prompt tokens the
	// index expected the engine to hold then.
	cached, predicted, predictedCached int
	slot, pinned                       int
}

type simWorker struct {
	spec   *WorkerSpec
	active []*simReq
	// pending is the engine's own queue, for policies that send to a full
	// worker (router.EngineQueued).
	pending []*simReq
	speed   *router.SpeedModel
	index   *router.PrefixIndex
	llama   *llamaCache
	blocks  *blockCache
	area    float64 // ∫active dt in request-seconds, as the router keeps it
	served  int
	// prompt and cached tokens of its finished requests.
	promptTok, cachedTok float64
}

// benchPromptTokens is the admission bench's prompt length (the field report's
// 45-token prompts); the hub primes each worker's speed model from it.
const benchPromptTokens = 45

func newSimWorker(spec *WorkerSpec, c *caches) *simWorker {
	w := &simWorker{spec: spec, speed: router.NewSpeedModel(router.SpeedPrior{}), index: router.NewPrefixIndex(0)}
	// What the hub's admission bench measures on every worker before it
	// takes traffic: one request alone. Everything else is learned online.
	w.speed.Seed(router.SpeedPoint{
		Concurrency:      1,
		PromptTokens:     benchPromptTokens,
		TTFT:             spec.Overhead + secs(benchPromptTokens/spec.PrefillTokPerSec),
		ITL:              secs(1 / spec.rate(1)),
		PrefillTokPerSec: spec.PrefillTokPerSec,
	})
	switch spec.Engine {
	case engineLlama:
		w.llama = newLlamaCache(c, spec.Slots, spec.CacheTokens)
	case engineVLLM:
		w.blocks = newBlockCache(c, spec.CacheTokens)
	}
	return w
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// arrivalHeap orders arrivals by time, then by their order of creation.
type arrivalHeap []arrival

func (h arrivalHeap) Len() int { return len(h) }
func (h arrivalHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].id < h[j].id
}
func (h arrivalHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *arrivalHeap) Push(x any)   { *h = append(*h, x.(arrival)) }
func (h *arrivalHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// sim is one policy's run. It drives the router's own queue (router.Queue)
// in virtual time: a new request goes straight to the policy when nobody
// waits, else joins the queue, whose waiters are offered to the policy each
// time a slot frees or a request arrives.
type sim struct {
	s       *Scenario
	policy  router.Policy
	engineQ bool
	rng     *rand.Rand
	now     time.Duration
	workers []*simWorker
	queue   router.Queue[*simReq]
	caches  *caches
	// future arrivals; sessions add their next turn as a turn ends.
	pending arrivalHeap
	plans   []sessionPlan
	nextID  int
	// outputMean mirrors the router's per-model output estimate.
	outputMean, outputN float64
	cands               []router.Candidate

	ttft, e2e            []float64
	rejected             int
	promptTok, cachedTok float64
}

func (s Scenario) runOne(p router.Policy, arrivals []arrival, plans []sessionPlan) Result {
	sm := &sim{s: &s, policy: p, rng: rand.New(rand.NewPCG(s.Seed^0xfeed, s.Seed)), outputMean: 256, plans: plans,
		caches: &caches{}}
	if eq, ok := p.(router.EngineQueued); ok && eq.QueuesAtEngine() {
		sm.engineQ = true
	}
	if s.Agent != nil {
		sm.caches.system = s.Agent.System
	}
	for i := range s.Workers {
		sm.workers = append(sm.workers, newSimWorker(&s.Workers[i], sm.caches))
	}
	for _, a := range arrivals {
		sm.push(a)
	}
	for i, sp := range plans {
		sm.push(arrival{at: sp.start, session: i, kind: sp.kind, turn: 0, prompt: sp.turns[0].prompt, output: sp.turns[0].output})
	}
	total := len(arrivals)
	for _, sp := range plans {
		total += len(sp.turns)
	}
	done := 0
	for done < total {
		t := time.Duration(math.MaxInt64)
		if len(sm.pending) > 0 {
			t = sm.pending[0].at
		}
		for _, w := range sm.workers {
			r := w.spec.rate(len(w.active))
			for _, q := range w.active {
				if sm.now < q.prefillEnd {
					t = min(t, q.prefillEnd)
				} else {
					t = min(t, sm.now+secs(q.remaining/r))
				}
			}
		}
		if q, ok := sm.queue.Oldest(); ok {
			t = min(t, q.enqueued+s.QueueTimeout)
		}
		sm.advance(t)
		done += sm.finishDue()
		done += sm.expireQueue()
		for len(sm.pending) > 0 && sm.pending[0].at <= sm.now {
			sm.arrive(heap.Pop(&sm.pending).(arrival))
		}
	}
	return sm.result()
}

func (sm *sim) push(a arrival) {
	a.id = sm.nextID
	sm.nextID++
	heap.Push(&sm.pending, a)
}

func (sm *sim) advance(t time.Duration) {
	dt := (t - sm.now).Seconds()
	for _, w := range sm.workers {
		n := len(w.active)
		r := w.spec.rate(n)
		for _, q := range w.active {
			if sm.now >= q.prefillEnd {
				q.remaining -= dt * r
			}
		}
		w.area += float64(n) * dt
	}
	sm.now = t
}

// finishDue ends requests whose last token is out and lets queued requests in.
func (sm *sim) finishDue() int {
	finished := 0
	for _, w := range sm.workers {
		for i := 0; i < len(w.active); {
			q := w.active[i]
			if !q.computed && sm.now >= q.prefillEnd {
				q.computed = true
				sm.prefilled(w, q)
			}
			if sm.now < q.prefillEnd || q.remaining > 1e-6 {
				i++
				continue
			}
			w.active = append(w.active[:i], w.active[i+1:]...)
			sm.record(w, q)
			finished++
			for len(w.pending) > 0 && len(w.active) < w.spec.Slots {
				next := w.pending[0]
				w.pending = w.pending[1:]
				sm.run(w, next)
			}
		}
	}
	if finished > 0 {
		sm.dispatch()
	}
	return finished
}

func (sm *sim) prefilled(w *simWorker, q *simReq) {
	switch {
	case w.llama != nil:
		w.llama.prefilled(q.slot, q.prompt)
	case w.blocks != nil:
		q.pinned = w.blocks.prefilled(q.prompt, q.pinned)
	}
}

func (sm *sim) record(w *simWorker, q *simReq) {
	all := q.prompt
	all.n += q.arr.output
	switch {
	case w.llama != nil:
		w.llama.finish(q.slot, all)
	case w.blocks != nil:
		w.blocks.finish(q.prompt, all, q.pinned)
	}
	w.served++
	sm.ttft = append(sm.ttft, ms(q.prefillEnd-q.arr.at))
	sm.e2e = append(sm.e2e, ms(sm.now-q.arr.at))
	sm.promptTok += float64(q.arr.prompt)
	sm.cachedTok += float64(q.cached)
	w.promptTok += float64(q.arr.prompt)
	w.cachedTok += float64(q.cached)
	life := (sm.now - q.dispatched).Seconds()
	mean := float64(q.startConc)
	if life > 0 {
		mean = (w.area - q.area0) / life
	}
	var itl time.Duration
	if q.arr.output > 1 {
		itl = (sm.now - q.prefillEnd) / time.Duration(q.arr.output-1)
	}
	// The engines report the cached tokens (llama-server always, vLLM with
	// --enable-prompt-tokens-details): the speed model learns prefill on
	// what was computed, and the prefix index corrects itself.
	w.speed.Observe(q.startConc, mean, q.arr.prompt-q.cached, q.prefillEnd-q.dispatched, itl)
	if w.spec.Engine != "" {
		w.index.Observe(q.job.Prefix, q.predicted, q.arr.prompt, q.cached)
	}
	sm.outputN++
	alpha := max(1/sm.outputN, 0.1)
	sm.outputMean += alpha * (float64(q.arr.output) - sm.outputMean)
	sm.nextTurn(q.arr)
}

// nextTurn schedules the session's next turn a think time after this one.
func (sm *sim) nextTurn(a arrival) {
	if a.session < 0 {
		return
	}
	sp := sm.plans[a.session]
	if a.turn+1 >= len(sp.turns) {
		return
	}
	tp := sp.turns[a.turn+1]
	sm.push(arrival{at: sm.now + sp.turns[a.turn].think, session: a.session, kind: a.kind, turn: a.turn + 1,
		prompt: tp.prompt, output: tp.output})
}

func (sm *sim) expireQueue() int {
	n := 0
	for {
		q, ok := sm.queue.Oldest()
		if !ok || sm.now-q.enqueued < sm.s.QueueTimeout {
			return n
		}
		sm.nextTurn(q.arr)
		sm.queue.Remove(q)
		sm.rejected++
		n++
	}
}

func (sm *sim) arrive(a arrival) {
	q := &simReq{arr: a, enqueued: sm.now, job: router.Job{PromptTokens: a.prompt, OutputTokens: int(sm.outputMean)}}
	if a.session >= 0 {
		q.prompt = seq{kind: a.kind, session: a.session, n: a.prompt}
	} else {
		// A lone prompt shares nothing with any other.
		q.prompt = seq{kind: -1, session: -1 - a.id, n: a.prompt}
	}
	q.job.Prefix = sm.caches.chain(q.prompt)
	if i := sm.queue.Choose(sm.policy, sm.rng, q.job, sm.candidates(q.job)); i >= 0 {
		sm.start(sm.workers[i], q)
		return
	}
	sm.queue.Push(q)
	if sm.queue.Len() > 1 {
		sm.dispatch()
	}
	if sm.queue.Len() > 1000000 {
		sm.dispatch()
	}
}

func (sm *sim) dispatch() { sm.queue.Dispatch(sm.policy, sm.rng, sm) }

// Job, Candidates, Take and Fail are the simulation's router.Seats.
func (sm *sim) Job(q *simReq) router.Job {
	job := q.job
	job.OutputTokens = int(sm.outputMean)
	return job
}

func (sm *sim) Candidates(_ *simReq, job router.Job) ([]router.Candidate, error) {
	return sm.candidates(job), nil
}

func (sm *sim) Take(q *simReq, job router.Job, i int) {
	q.job = job
	sm.start(sm.workers[i], q)
}

func (sm *sim) Fail(*simReq, error) {} // every simulated worker is always eligible

func (sm *sim) candidates(job router.Job) []router.Candidate {
	sm.cands = sm.cands[:0]
	for _, w := range sm.workers {
		load := len(w.active) + len(w.pending)
		c := router.Candidate{Name: w.spec.Name, InFlight: load, Slots: w.spec.Slots, Speed: w.speed}
		c.Cached, _ = w.index.Predict(job)
		if c.InFlight >= c.Slots {
			soonest := time.Duration(-1)
			for _, q := range w.active {
				if left := q.predictedEnd - sm.now; soonest < 0 || left < soonest {
					soonest = left
				}
			}
			c.NextFree = router.NextFree(soonest, load, load, c.Slots, w.speed, job)
		}
		sm.cands = append(sm.cands, c)
	}
	return sm.cands
}

// start sends q to w, as the router does: its prefix goes in w's index.
func (sm *sim) start(w *simWorker, q *simReq) {
	q.dispatched = sm.now
	q.predictedCached, q.predicted = w.index.Predict(q.job)
	w.index.Insert(q.job.Prefix)
	if len(w.active) >= w.spec.Slots {
		w.pending = append(w.pending, q)
		return
	}
	sm.run(w, q)
}

// run starts q on one of w's engine slots.
func (sm *sim) run(w *simWorker, q *simReq) {
	w.active = append(w.active, q)
	q.startConc = len(w.active)
	q.area0 = w.area
	q.predictedEnd = sm.now + w.speed.Completion(q.startConc, q.job.Uncached(q.predictedCached))
	switch {
	case w.llama != nil:
		q.slot = w.llama.choose(q.prompt)
		q.cached = w.llama.start(q.slot, q.prompt)
	case w.blocks != nil:
		q.cached, q.pinned = w.blocks.start(q.prompt)
	}
	q.prefillEnd = sm.now + w.spec.Overhead + secs(float64(q.arr.prompt-q.cached)/w.spec.PrefillTokPerSec)
	q.remaining = float64(max(q.arr.output-1, 0))
}

func (sm *sim) result() Result {
	r := Result{Policy: sm.policy.Name(), Requests: len(sm.e2e), Rejected: sm.rejected, Share: map[string]float64{}}
	sort.Float64s(sm.ttft)
	sort.Float64s(sm.e2e)
	r.P50TTFTms, r.P90TTFTms, r.P99TTFTms = pct(sm.ttft, .5), pct(sm.ttft, .9), pct(sm.ttft, .99)
	r.P50E2Ems, r.P90E2Ems, r.P99E2Ems = pct(sm.e2e, .5), pct(sm.e2e, .9), pct(sm.e2e, .99)
	if sm.promptTok > 0 {
		r.CacheHit = math.Round(sm.cachedTok/sm.promptTok*1000) / 1000
	}
	for _, w := range sm.workers {
		if r.Requests > 0 {
			r.Share[w.spec.Name] += float64(w.served) / float64(r.Requests)
		}
		if w.promptTok > 0 {
			if r.WorkerCacheHit == nil {
				r.WorkerCacheHit = map[string]float64{}
			}
			r.WorkerCacheHit[w.spec.Name] = math.Round(w.cachedTok/w.promptTok*1000) / 1000
		}
	}
	return r
}

func pct(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return math.Round(sorted[int(q*float64(len(sorted)-1))]*10) / 10
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
