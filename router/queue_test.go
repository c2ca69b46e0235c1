package router

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// wantPolicy sends a job to the candidate whose index is its PromptTokens
// when that one is free, else leaves it waiting.
type wantPolicy struct{}

func (wantPolicy) Name() string { return "want" }
func (wantPolicy) Choose(job Job, cands []Candidate, _ *rand.Rand) int {
	if cands[job.PromptTokens].free() {
		return job.PromptTokens
	}
	return -1
}

// testSeats is a fixed set of backends; Take fills a slot.
type testSeats struct {
	cands  []Candidate
	hold   bool
	failOn string
	taken  []string // "waiter>backend"
	failed []string
	behind map[string]int
}

func (s *testSeats) Job(w string) Job {
	return Job{PromptTokens: int(w[0] - '0')}
}

func (s *testSeats) Candidates(w string, job Job) ([]Candidate, error) {
	if s.behind == nil {
		s.behind = map[string]int{}
	}
	s.behind[w] = job.Behind
	if s.hold {
		return nil, ErrHold
	}
	if w == s.failOn {
		return nil, errors.New("every worker was tried")
	}
	return slices.Clone(s.cands), nil
}

func (s *testSeats) Take(w string, _ Job, i int) {
	s.cands[i].InFlight++
	s.taken = append(s.taken, w+">"+s.cands[i].Name)
}

func (s *testSeats) Fail(w string, _ error) { s.failed = append(s.failed, w) }

func TestQueueDispatch(t *testing.T) {
	speed := NewSpeedModel(SpeedPrior{})
	cands := func(free ...bool) []Candidate {
		var out []Candidate
		for i, f := range free {
			c := Candidate{Name: string(rune('a' + i)), Slots: 1, InFlight: 1, Speed: speed, NextFree: time.Second}
			if f {
				c.InFlight = 0
			}
			out = append(out, c)
		}
		return out
	}
	// A waiter is named by the index of the backend it wants, then a letter.
	for _, tc := range []struct {
		name        string
		waiting     []string
		seats       testSeats
		taken, left []string
		failed      []string
	}{
		{name: "oldest first takes the free slot", waiting: []string{"0x", "0y"}, seats: testSeats{cands: cands(true, false)},
			taken: []string{"0x>a"}, left: []string{"0y"}},
		{name: "hold keeps everyone in order", waiting: []string{"0x", "1y"}, seats: testSeats{cands: cands(true, true), hold: true},
			left: []string{"0x", "1y"}},
		{name: "a failed waiter leaves, the rest go on", waiting: []string{"0x", "1y"}, seats: testSeats{cands: cands(true, true), failOn: "0x"},
			taken: []string{"1y>b"}, failed: []string{"0x"}},
		{name: "all free: all go", waiting: []string{"0x", "1y"}, seats: testSeats{cands: cands(true, true)},
			taken: []string{"0x>a", "1y>b"}},
		{name: "a later waiter takes the free backend the oldest declines", waiting: []string{"1x", "0y", "1z"}, seats: testSeats{cands: cands(true, false)},
			taken: []string{"0y>a"}, left: []string{"1x", "1z"}},
		{name: "nobody takes a slot an earlier waiter is offered first", waiting: []string{"0x", "0y"}, seats: testSeats{cands: cands(true)},
			taken: []string{"0x>a"}, left: []string{"0y"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var q Queue[string]
			for _, w := range tc.waiting {
				q.Push(w)
			}
			q.Dispatch(wantPolicy{}, newRNG(1), &tc.seats)
			if !slices.Equal(tc.seats.taken, tc.taken) {
				t.Errorf("taken %v, want %v", tc.seats.taken, tc.taken)
			}
			if !slices.Equal(tc.seats.failed, tc.failed) {
				t.Errorf("failed %v, want %v", tc.seats.failed, tc.failed)
			}
			if !slices.Equal(q.waiting, tc.left) && len(q.waiting)+len(tc.left) > 0 {
				t.Errorf("left waiting %v, want %v", q.waiting, tc.left)
			}
			if b, ok := tc.seats.behind[tc.waiting[0]]; ok && b != len(tc.waiting)-1 {
				t.Errorf("oldest saw %d behind it, want %d", b, len(tc.waiting)-1)
			}
		})
	}
}

func TestQueueChooseQueuesBehindWaiters(t *testing.T) {
	var q Queue[string]
	c := []Candidate{{Name: "a", Slots: 1}}
	if i := q.Choose(wantPolicy{}, newRNG(1), Job{}, c); i != 0 {
		t.Fatalf("empty queue: Choose = %d, want the free backend", i)
	}
	q.Push("0x")
	if i := q.Choose(wantPolicy{}, newRNG(1), Job{}, c); i != -1 {
		t.Fatalf("with a waiter: Choose = %d, want -1 (queue behind it)", i)
	}
}

func TestNextFree(t *testing.T) {
	speed := NewSpeedModel(SpeedPrior{})
	job := Job{PromptTokens: 100, OutputTokens: 100}
	itl := speed.ITL(4)
	full := speed.Completion(4, job)
	for _, tc := range []struct {
		name             string
		soonest          time.Duration
		load, own, slots int
		want             time.Duration
	}{
		{"own requests only: the soonest end", 3 * time.Second, 4, 4, 4, 3 * time.Second},
		{"overdue: a token's time, not now", -time.Second, 4, 4, 4, itl},
		{"engine holds more than its slots: spread evenly", time.Second, 6, 2, 4, 3 * full / 4},
		{"none of the router's own: spread evenly", -1, 4, 0, 4, full / 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NextFree(tc.soonest, tc.load, tc.own, tc.slots, speed, job); got != max(tc.want, itl) {
				t.Errorf("NextFree = %v, want %v", got, max(tc.want, itl))
			}
		})
	}
}

// seenPolicy leaves every job waiting and records the first candidate's
// NextFree as each job saw it.
type seenPolicy struct{ seen []time.Duration }

func (*seenPolicy) Name() string { return "seen" }
func (p *seenPolicy) Choose(_ Job, cands []Candidate, _ *rand.Rand) int {
	p.seen = append(p.seen, cands[0].NextFree)
	return -1
}

// Each waiter sees the full backend that the waiters ahead of it wait for
// one slot interval further off per such waiter: they take its next slots.
func TestQueueWaitersAheadPushBackTheBackendTheyWaitFor(t *testing.T) {
	speed := NewSpeedModel(SpeedPrior{})
	seats := &testSeats{cands: []Candidate{{Name: "a", Slots: 2, InFlight: 2, Speed: speed, NextFree: time.Second}}}
	var q Queue[string]
	for _, w := range []string{"0x", "0y", "0z"} {
		q.Push(w)
	}
	p := &seenPolicy{}
	q.Dispatch(p, newRNG(1), seats)
	interval := speed.Completion(2, Job{}) / 2
	want := []time.Duration{time.Second, time.Second + interval, time.Second + 2*interval}
	if !slices.Equal(p.seen, want) {
		t.Errorf("waiters saw the full backend free in %v, want %v", p.seen, want)
	}
	if q.Len() != 3 {
		t.Errorf("%d waiting, want all 3", q.Len())
	}
}

// longWaitsForA sends a job with a long prompt only to backend "a" (waiting
// for it when it is busy) and any other job to any free backend.
type longWaitsForA struct{}

func (longWaitsForA) Name() string { return "long-waits-for-a" }
func (longWaitsForA) Choose(job Job, cands []Candidate, _ *rand.Rand) int {
	for i, c := range cands {
		if c.free() && (job.PromptTokens < 50 || c.Name == "a") {
			return i
		}
	}
	return -1
}

// Through the router: a request that a free worker can serve does not wait
// behind a queued one that waits for the busy worker.
func TestRouterQueuedRequestOvertakesOneWaitingForABusyWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	started := map[string]chan struct{}{"a": make(chan struct{}, 4), "b": make(chan struct{}, 4)}
	release := make(chan struct{})
	handler := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, req *http.Request) {
			started[name] <- struct{}{}
			<-release
			okJSON(w, req)
		}
	}
	_, a := startBackend(t, "a", 1, handler("a"))
	_, b := startBackend(t, "b", 1, handler("b"))
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the backends close, which waits for their handlers
	// A queue of one: full while the long request waits in it.
	r, rsrv := startRouter(t, Options{QueueSize: 1}, a, b)
	r.sched.mu.Lock()
	r.sched.policy = longWaitsForA{}
	r.sched.mu.Unlock()
	long := `{"model":"qwen3-4b","messages":[{"role":"user","content":"` + strings.Repeat("x", 400) + `"}]}`
	codes := make(chan int, 3)
	send := func(body string) {
		go func() {
			resp := post(t, ctx, rsrv.URL, body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	send(long)
	<-started["a"]
	send(long)
	waitFor(t, func() bool { return r.queueLen("qwen3-4b") == 1 })
	send(`{"model":"qwen3-4b","messages":[{"role":"user","content":"hi"}]}`)
	select {
	case <-started["b"]:
	case <-ctx.Done():
		t.Fatal("the short request waited behind the long one queued for the busy worker, or the full queue turned it away")
	}
	// Both workers busy and the queue full: one more that would wait is
	// turned away, and the one waiting keeps its place.
	resp := post(t, ctx, rsrv.URL, long)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || r.queueLen("qwen3-4b") != 1 {
		t.Errorf("with the queue full: status %d and %d waiting, want 429 and 1", resp.StatusCode, r.queueLen("qwen3-4b"))
	}
	free()
	for range 3 {
		if c := <-codes; c != http.StatusOK {
			t.Errorf("status %d", c)
		}
	}
}
