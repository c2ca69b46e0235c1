package simulate

import (
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"fleet/router"
)

// simReq is one request's life in the simulation.
type simReq struct {
	arr        arrival
	job        router.Job
	enqueued   time.Duration
	dispatched time.Duration
	prefillEnd time.Duration
	// remaining decode tokens after the first.
	remaining    float64
	predictedEnd time.Duration
	startConc    int
	area0        float64
}

type simWorker struct {
	spec   *WorkerSpec
	active []*simReq
	speed  *router.SpeedModel
	area   float64 // ∫active dt in request-seconds, as the router keeps it
	served int
}

// benchPromptTokens is the admission bench's prompt length (the seed's
// 45-token prompts); the hub seeds each worker's speed model from it.
const benchPromptTokens = 45

func newSimWorker(spec *WorkerSpec) *simWorker {
	w := &simWorker{spec: spec, speed: router.NewSpeedModel(router.SpeedPrior{})}
	// What the hub's admission bench measures on every worker before it
	// takes traffic: one request alone. Everything else is learned online.
	w.speed.Seed(router.SpeedPoint{
		Concurrency:      1,
		PromptTokens:     benchPromptTokens,
		TTFT:             spec.Overhead + secs(benchPromptTokens/spec.PrefillTokPerSec),
		ITL:              secs(1 / spec.rate(1)),
		PrefillTokPerSec: spec.PrefillTokPerSec,
	})
	return w
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// sim is one policy's run. It mirrors the router's dispatch: a new request
// goes straight to the policy when nobody waits, else joins a FIFO queue
// whose head is offered to the policy each time a slot frees.
type sim struct {
	s       *Scenario
	policy  router.Policy
	rng     *rand.Rand
	now     time.Duration
	workers []*simWorker
	queue   []*simReq
	// outputMean mirrors the router's per-model output estimate.
	outputMean, outputN float64
	cands               []router.Candidate

	ttft, e2e []float64
	rejected  int
}

func (s Scenario) runOne(p router.Policy, arrivals []arrival) Result {
	sm := &sim{s: &s, policy: p, rng: rand.New(rand.NewPCG(s.Seed^0xfeed, s.Seed)), outputMean: 256}
	for i := range s.Workers {
		sm.workers = append(sm.workers, newSimWorker(&s.Workers[i]))
	}
	next := 0
	done := 0
	for done < len(arrivals) {
		t := time.Duration(math.MaxInt64)
		if next < len(arrivals) {
			t = arrivals[next].at
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
		if len(sm.queue) > 0 {
			t = min(t, sm.queue[0].enqueued+s.QueueTimeout)
		}
		sm.advance(t)
		done += sm.finishDue()
		done += sm.expireQueue()
		for next < len(arrivals) && arrivals[next].at <= sm.now {
			sm.arrive(arrivals[next])
			next++
		}
	}
	return sm.result()
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
			if sm.now < q.prefillEnd || q.remaining > 1e-6 {
				i++
				continue
			}
			w.active = append(w.active[:i], w.active[i+1:]...)
			sm.record(w, q)
			finished++
		}
	}
	if finished > 0 {
		sm.dispatch()
	}
	return finished
}

func (sm *sim) record(w *simWorker, q *simReq) {
	w.served++
	sm.ttft = append(sm.ttft, ms(q.prefillEnd-q.arr.at))
	sm.e2e = append(sm.e2e, ms(sm.now-q.arr.at))
	life := (sm.now - q.dispatched).Seconds()
	mean := float64(q.startConc)
	if life > 0 {
		mean = (w.area - q.area0) / life
	}
	var itl time.Duration
	if q.arr.output > 1 {
		itl = (sm.now - q.prefillEnd) / time.Duration(q.arr.output-1)
	}
	w.speed.Observe(q.startConc, mean, q.job.PromptTokens, q.prefillEnd-q.dispatched, itl)
	sm.outputN++
	alpha := max(1/sm.outputN, 0.1)
	sm.outputMean += alpha * (float64(q.arr.output) - sm.outputMean)
}

func (sm *sim) expireQueue() int {
	n := 0
	for len(sm.queue) > 0 && sm.now-sm.queue[0].enqueued >= sm.s.QueueTimeout {
		sm.queue = sm.queue[1:]
		sm.rejected++
		n++
	}
	return n
}

func (sm *sim) arrive(a arrival) {
	q := &simReq{arr: a, enqueued: sm.now, job: router.Job{PromptTokens: a.prompt, OutputTokens: int(sm.outputMean)}}
	if len(sm.queue) == 0 {
		if i := sm.policy.Choose(q.job, sm.candidates(), sm.rng); i >= 0 {
			sm.start(sm.workers[i], q)
			return
		}
	}
	sm.queue = append(sm.queue, q)
}

func (sm *sim) dispatch() {
	for len(sm.queue) > 0 {
		head := sm.queue[0]
		head.job.OutputTokens = int(sm.outputMean)
		head.job.Behind = len(sm.queue) - 1
		i := sm.policy.Choose(head.job, sm.candidates(), sm.rng)
		if i < 0 {
			return
		}
		sm.queue = sm.queue[1:]
		sm.start(sm.workers[i], head)
	}
}

func (sm *sim) candidates() []router.Candidate {
	sm.cands = sm.cands[:0]
	for _, w := range sm.workers {
		c := router.Candidate{Name: w.spec.Name, InFlight: len(w.active), Slots: w.spec.Slots, Speed: w.speed}
		if c.InFlight >= c.Slots {
			next := time.Duration(-1)
			for _, q := range w.active {
				if left := q.predictedEnd - sm.now; next < 0 || left < next {
					next = left
				}
			}
			c.NextFree = max(next, w.speed.ITL(c.Slots))
		}
		sm.cands = append(sm.cands, c)
	}
	return sm.cands
}

func (sm *sim) start(w *simWorker, q *simReq) {
	w.active = append(w.active, q)
	q.dispatched = sm.now
	q.startConc = len(w.active)
	q.area0 = w.area
	q.predictedEnd = sm.now + w.speed.Completion(q.startConc, q.job)
	q.prefillEnd = sm.now + w.spec.Overhead + secs(float64(q.arr.prompt)/w.spec.PrefillTokPerSec)
	q.remaining = float64(max(q.arr.output-1, 0))
}

func (sm *sim) result() Result {
	r := Result{Policy: sm.policy.Name(), Requests: len(sm.e2e), Rejected: sm.rejected, Share: map[string]float64{}}
	sort.Float64s(sm.ttft)
	sort.Float64s(sm.e2e)
	r.P50TTFTms, r.P90TTFTms, r.P99TTFTms = pct(sm.ttft, .5), pct(sm.ttft, .9), pct(sm.ttft, .99)
	r.P50E2Ems, r.P90E2Ems, r.P99E2Ems = pct(sm.e2e, .5), pct(sm.e2e, .9), pct(sm.e2e, .99)
	for _, w := range sm.workers {
		if r.Requests > 0 {
			r.Share[w.spec.Name] += float64(w.served) / float64(r.Requests)
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
