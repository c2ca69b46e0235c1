package router

import (
	"slices"
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

// TestDecisionFollowsTheReadySetsModels: a decision sees the workers of its
// model in the ready set given last, as a worker moves from one model to
// another and a model's last worker leaves, since the pool finds a model's
// workers by model rather than by looking at each.
func TestDecisionFollowsTheReadySetsModels(t *testing.T) {
	r := mustNew(t, Options{})
	job := Job{PromptTokens: 100, OutputTokens: 10, NeedContext: 110}
	workersOf := func(model string) []string {
		var names []string
		now := time.Now()
		for {
			f, q, wt, _ := r.sched.place(model, job, nil, now)
			if f == nil {
				if wt != nil {
					r.sched.withdraw(model, q, wt) // every slot is taken: it would wait
				}
				return names
			}
			names = append(names, f.b.cfg.Name)
			if len(names) > 8 {
				t.Fatalf("%s: more flights than slots", model)
			}
			defer r.pool.finish(f, nil, &r.outputs, now)
		}
	}
	set := func(bs ...Backend) { r.SetBackends(bs) }
	a1 := Backend{Name: "n1/a", Model: "a", Addr: "127.0.0.1:1", Slots: 1}
	a2 := Backend{Name: "n2/a", Model: "a", Addr: "127.0.0.1:2", Slots: 1}
	set(a1, a2)
	if got := workersOf("a"); !slices.Equal(got, []string{"n1/a", "n2/a"}) && !slices.Equal(got, []string{"n2/a", "n1/a"}) {
		t.Fatalf("model a placed on %v; want n1/a and n2/a", got)
	}
	b2 := a2
	b2.Model = "b"
	set(a1, b2)
	if got := workersOf("b"); !slices.Equal(got, []string{"n2/a"}) {
		t.Errorf("model b placed on %v after n2/a moved to it; want [n2/a]", got)
	}
	if got := workersOf("a"); !slices.Equal(got, []string{"n1/a"}) {
		t.Errorf("model a placed on %v after n2/a moved to b; want [n1/a]", got)
	}
	set(b2)
	if got := workersOf("a"); len(got) != 0 {
		t.Errorf("model a placed on %v with no worker of it left; want none", got)
	}
}
