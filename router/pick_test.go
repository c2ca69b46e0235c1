package router

import (
	"strconv"
	"testing"
	"time"
)

// TestDecisionAllocatesAlikeAtAnySize: a decision's allocations are those of
// the request (its flight, the wake-up of whoever waits for a change), not
// one per worker: a model of 64 workers beside 64 of another costs the heap
// what a model of 4 does, under every policy. Before the pool kept its
// candidate lists and the policies drew without listing, each decision of
// a large model grew fresh slices.
func TestDecisionAllocatesAlikeAtAnySize(t *testing.T) {
	for _, policy := range PolicyNames {
		t.Run(policy, func(t *testing.T) {
			small := decisionAllocs(t, policy, 4, 0)
			large := decisionAllocs(t, policy, 64, 64)
			if large != small {
				t.Errorf("a decision allocates %.0f times among 64 workers (and 64 of another model), %.0f among 4; want the same", large, small)
			}
		})
	}
}

// decisionAllocs is the allocations of one request placed and ended among
// workers of its model and others of another model.
func decisionAllocs(t *testing.T, policy string, workers, others int) float64 {
	t.Helper()
	r := mustNew(t, Options{Policy: policy})
	var bs []Backend
	for i := range workers + others {
		model := "model-a"
		if i >= workers {
			model = "model-b"
		}
		bs = append(bs, Backend{Name: "node" + strconv.Itoa(i) + "/" + model, Model: model, Addr: "127.0.0.1:1", Context: 8192, Slots: 4})
	}
	r.SetBackends(bs)
	now := time.Now()
	job := Job{PromptTokens: 100, OutputTokens: 10, NeedContext: 110}
	decide := func() {
		f, _, _, serr := r.sched.place("model-a", job, nil, now)
		if f == nil {
			t.Fatalf("%s: no worker of %d idle ones taken: %v", policy, workers, serr)
		}
		r.pool.finish(f, nil, &r.outputs, now)
	}
	decide() // the pool's candidate lists reach their size
	return testing.AllocsPerRun(100, decide)
}
