package router

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// BenchmarkPick is the router's cost of one decision (a request placed on a
// worker and its flight ended) as the fleet grows: ready workers of one
// model, or of 16 models with the workers split over them, every worker's
// prefix index holding its sessions' conversations, so that a decision
// scores prefix affinity as in production. Each worker serves 4 slots and
// holds 2 of its 4 requests, so a decision sees free and full workers and
// predicts when the full ones free a slot.
func BenchmarkPick(b *testing.B) {
	for _, workers := range []int{4, 64, 512, 2048, 8192} {
		for _, models := range []int{1, 16} {
			if workers < models {
				continue
			}
			b.Run(fmt.Sprintf("workers=%d/models=%d", workers, models), func(b *testing.B) { benchPick(b, workers, models) })
		}
	}
}

// pickSessions is how many conversations each worker's prefix index holds.
const pickSessions = 8

func benchPick(b *testing.B, workers, models int) {
	r := mustNew(b, Options{})
	bs := make([]Backend, workers)
	for i := range bs {
		bs[i] = Backend{Name: "node" + strconv.Itoa(i) + "/m", Model: "model-" + strconv.Itoa(i%models),
			Addr: "127.0.0.1:1", Context: 32768, Slots: 4}
	}
	r.SetBackends(bs)
	now := time.Now()
	conversation := func(worker, session int) []uint64 {
		return PrefixChain([]byte(fmt.Sprintf("system prompt of worker %d session %d %0512d", worker, session, 0)))
	}
	// Two requests on each worker, their conversations in its index.
	for i, cfg := range bs {
		for s := range 2 {
			job := Job{PromptTokens: 2000, OutputTokens: 200, NeedContext: 2200, Prefix: conversation(i, s)}
			r.pool.mu.Lock()
			r.pool.takeLocked(r.pool.backends[i], cfg.Model, job, now)
			r.pool.mu.Unlock()
		}
		r.pool.mu.Lock()
		w := r.pool.workerLocked(cfg.Name)
		for s := 2; s < pickSessions; s++ {
			w.prefix.Insert(conversation(i, s))
		}
		r.pool.mu.Unlock()
	}
	// The turns asked for continue conversations held by workers of model-0.
	jobs := make([]Job, 64)
	for i := range jobs {
		worker := (i * models) % workers
		jobs[i] = Job{PromptTokens: 2500, OutputTokens: 200, NeedContext: 2700, Prefix: conversation(worker, i%pickSessions)}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		f, _, _, serr := r.sched.place("model-0", jobs[i%len(jobs)], nil, now)
		if f == nil {
			b.Fatalf("no worker taken with most slots free: %v", serr)
		}
		r.pool.finish(f, nil, &r.outputs, now)
	}
}
