package router

import (
	"errors"
	"math/rand/v2"
	"slices"
	"time"
)

// Queue is one model's requests waiting for a slot, oldest first, and the
// rules that give them one. It holds no clock and no backends: the router
// drives it under its lock in real time and router/simulate drives it in
// virtual time, so the figures `fleet simulate` prints are those of the
// live scheduler's own rules.
type Queue[T comparable] struct {
	waiting []T
}

// Seats is the caller's side of a dispatch: what it knows of the waiters
// and its backends at this instant.
type Seats[T any] interface {
	// Job is what the scheduler knows of a waiting request.
	Job(w T) Job
	// Candidates lists the backends job may go to now. ErrHold keeps
	// every waiter waiting (no worker ready yet, but one is coming);
	// another error ends this waiter's wait with it (Fail).
	Candidates(w T, job Job) ([]Candidate, error)
	// Take sends w to cands[i] of the last Candidates call.
	Take(w T, job Job, i int)
	// Fail ends w's wait with err.
	Fail(w T, err error)
}

// ErrHold is Seats.Candidates' answer when no backend can take any waiter
// yet but one is coming: the queue keeps waiting, in order.
var ErrHold = errors.New("no worker ready yet; the queue waits")

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
// take now, or -1 to queue it (Push). With requests already waiting it is
// always -1: the newcomer queues behind them.
func (q *Queue[T]) Choose(p Policy, rng *rand.Rand, job Job, cands []Candidate) int {
	if len(q.waiting) > 0 {
		return -1
	}
	return p.Choose(job, cands, rng)
}

// Push queues w behind everyone waiting.
func (q *Queue[T]) Push(w T) { q.waiting = append(q.waiting, w) }

// Dispatch offers the waiting requests, oldest first, to the policy; each
// one it sends somewhere leaves the queue. The first one it leaves waiting
// holds the rest behind it (FIFO).
func (q *Queue[T]) Dispatch(p Policy, rng *rand.Rand, s Seats[T]) {
	kept := q.waiting[:0]
	for k, w := range q.waiting {
		job := s.Job(w)
		job.Behind = len(q.waiting) - 1 - k
		cands, err := s.Candidates(w, job)
		if errors.Is(err, ErrHold) {
			kept = append(kept, q.waiting[k:]...)
			break
		}
		if err != nil {
			s.Fail(w, err)
			continue
		}
		if i := p.Choose(job, cands, rng); i >= 0 {
			s.Take(w, job, i)
			continue
		}
		kept = append(kept, q.waiting[k:]...)
		break
	}
	clear(q.waiting[len(kept):])
	q.waiting = kept
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
