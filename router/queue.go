package router

import (
	"errors"
	"math/rand/v2"
	"slices"
	"time"
)

// Queue is one model's requests waiting for a slot, oldest first, and the
// rules that give them one. It holds no clock and no backends: the router
// drives it under its scheduler's lock in real time and router/simulate
// drives it in virtual time, so the figures `fleet simulate` prints are
// those of the live scheduler's own rules.
type Queue[T comparable] struct {
	waiting []T
	claims  []claim
}

// claim counts the waiters ahead in one dispatch that wait for a backend.
type claim struct {
	name string
	n    int
}

// Seats is the caller's side of a dispatch: what it knows of the waiters
// and its backends at this instant.
type Seats[T any] interface {
	// Job is what the scheduler knows of a waiting request.
	Job(w T) Job
	// Candidates lists the backends job may go to now. ErrHold keeps
	// every waiter waiting (no worker ready yet, but one is coming);
	// ErrKeep keeps this waiter waiting in its place while the ones behind
	// it are offered the backends; another error ends this waiter's wait
	// with it (Fail).
	Candidates(w T, job Job) ([]Candidate, error)
	// Take sends w to cands[i] of the last Candidates call.
	Take(w T, job Job, i int)
	// Fail ends w's wait with err.
	Fail(w T, err error)
}

// ErrHold is Seats.Candidates' answer when no backend can take any waiter
// yet but one is coming: the queue keeps waiting, in order.
var ErrHold = errors.New("no worker ready yet; the queue waits")

// ErrKeep is Seats.Candidates' answer when no backend can take this waiter
// yet but one that could is coming (a drained or starting worker with the
// context it needs): it keeps its place, and the waiters behind it, which
// other backends may take, are still offered them.
var ErrKeep = errors.New("no worker for this request yet; it waits in its place")

// Len is the number of waiting requests.
func (q *Queue[T]) Len() int { return len(q.waiting) }

// Oldest is the request that has waited longest.
func (q *Queue[T]) Oldest() (T, bool) {
	if len(q.waiting) == 0 {
		var zero T
		return zero, false
	}
	return q.waiting[0], true
}

// Remove takes w out of the queue (its wait ended without a slot); it
// reports whether w was waiting.
func (q *Queue[T]) Remove(w T) bool {
	i := slices.Index(q.waiting, w)
	if i < 0 {
		return false
	}
	q.waiting = slices.Delete(q.waiting, i, i+1)
	return true
}

// Choose decides for a newly arrived job with its candidates: the index to
// take now, or -1 to queue it (Push, then Dispatch). With requests already
// waiting it is always -1: the newcomer is offered slots after them, in the
// dispatch, so it cannot take a slot an earlier request is waiting for.
func (q *Queue[T]) Choose(p Policy, rng *rand.Rand, job Job, cands []Candidate) int {
	if len(q.waiting) > 0 {
		return -1
	}
	return p.Choose(job, cands, rng)
}

// Push queues w behind everyone waiting.
func (q *Queue[T]) Push(w T) { q.waiting = append(q.waiting, w) }

// Dispatch offers the waiting requests, oldest first, to the policy; each
// one it sends somewhere leaves the queue. One it leaves waiting keeps its
// place, and the requests behind it are still offered the backends it
// declined: a request whose conversation a free worker holds does not wait
// behind one that waits for the busy fast worker (head-of-line blocking,
// which on the agent workload made most of the router's queue waits). It
// cannot take the slot an earlier request waits for: the earlier one is
// offered every freed slot first, and each request behind sees the backend
// it waits for as that many slot intervals further off, as it really is.
func (q *Queue[T]) Dispatch(p Policy, rng *rand.Rand, s Seats[T]) {
	q.claims = q.claims[:0]
	kept := q.waiting[:0]
	for k, w := range q.waiting {
		job := s.Job(w)
		job.Behind = len(q.waiting) - 1 - k
		cands, err := s.Candidates(w, job)
		if errors.Is(err, ErrHold) {
			kept = append(kept, q.waiting[k:]...)
			break
		}
		if errors.Is(err, ErrKeep) {
			kept = append(kept, w)
			continue
		}
		if err != nil {
			s.Fail(w, err)
			continue
		}
		q.pushBack(cands, job)
		i, waitFor := choose(p, job, cands, rng)
		if i >= 0 {
			s.Take(w, job, i)
			continue
		}
		kept = append(kept, w)
		if waitFor >= 0 {
			q.claim(cands[waitFor].Name)
		}
	}
	clear(q.waiting[len(kept):])
	q.waiting = kept
}

// pushBack moves each full backend that waiters ahead wait for back by one
// slot interval (its completion time at full slots over its slots) per
// such waiter: they take its next slots before this job.
func (q *Queue[T]) pushBack(cands []Candidate, job Job) {
	for _, cl := range q.claims {
		for i := range cands {
			c := &cands[i]
			if c.Name != cl.name || c.free() {
				continue
			}
			full := c.Speed.Completion(c.Slots, job)
			c.NextFree += time.Duration(cl.n) * full / time.Duration(max(c.Slots, 1))
		}
	}
}

func (q *Queue[T]) claim(name string) {
	for i := range q.claims {
		if q.claims[i].name == name {
			q.claims[i].n++
			return
		}
	}
	q.claims = append(q.claims, claim{name: name, n: 1})
}

// waitChooser is a policy that can say which full backend a job it leaves
// waiting waits for.
type waitChooser interface {
	chooseOrWait(job Job, cands []Candidate, rng *rand.Rand) (take, waitFor int)
}

// choose is the policy's choice, and when it leaves the job waiting, the
// backend it waits for: the policy's own where it says, else the full
// backend that frees first (what a least-loaded or random pick takes).
func choose(p Policy, job Job, cands []Candidate, rng *rand.Rand) (take, waitFor int) {
	if wc, ok := p.(waitChooser); ok {
		return wc.chooseOrWait(job, cands, rng)
	}
	if i := p.Choose(job, cands, rng); i >= 0 {
		return i, -1
	}
	waitFor = -1
	for i, c := range cands {
		if !c.free() && (waitFor < 0 || c.NextFree < cands[waitFor].NextFree) {
			waitFor = i
		}
	}
	return -1, waitFor
}

// NextFree predicts when a slot frees for job on a full backend holding load
// requests in slots slots, own of them sent by the router, the soonest of
// which is predicted to end in soonest (negative when it sent none).
func NextFree(soonest time.Duration, load, own, slots int, speed *SpeedModel, job Job) time.Duration {
	next := soonest
	if load > own {
		// Some of the load is requests the router did not send, whose ends
		// it cannot know: assume their remaining times are spread evenly,
		// so a slot frees every completion/slots, and the engine's own
		// queue takes the first ones that free.
		full := speed.Completion(slots, job)
		est := time.Duration(load-slots+1) * full / time.Duration(max(slots, 1))
		if next < 0 || load > slots {
			next = est
		} else {
			next = min(next, est)
		}
	}
	// An overdue request ends "soon", not "now": a token's time keeps an
	// overrun from looking like a free slot.
	return max(next, speed.ITL(slots))
}
