package router

import (
	"errors"
	"math/rand/v2"
	"slices"
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
