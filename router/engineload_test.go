package router

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// twins returns a router with two backends of equal seeded speed, "busy"
// listed first so that it wins a tie. Their addresses are never dialled.
func twins(t *testing.T, slots int) *Router {
	t.Helper()
	r := mustNew(t, Options{Policy: PolicyFleet, Seed: 1})
	r.SetModels(testModels())
	r.SetBackends([]Backend{
		{Name: "busy/qwen3-4b", Model: "qwen3-4b", Addr: "127.0.0.1:1", Context: 16384, Slots: slots},
		{Name: "idle/qwen3-4b", Model: "qwen3-4b", Addr: "127.0.0.1:2", Context: 16384, Slots: slots},
	})
	for _, n := range []string{"busy/qwen3-4b", "idle/qwen3-4b"} {
		r.SeedSpeed(n, SpeedPoint{Concurrency: 1, TTFT: 80 * time.Millisecond, ITL: 12 * time.Millisecond})
	}
	return r
}

// choose runs the scheduler's decision for one job at now, as acquire does.
func (r *Router) choose(t *testing.T, job Job, now time.Time) (int, []Candidate) {
	t.Helper()
	r.sched.mu.Lock()
	defer r.sched.mu.Unlock()
	r.pool.mu.Lock()
	defer r.pool.mu.Unlock()
	cands, _, _ := r.pool.candidatesLocked("qwen3-4b", job, nil, now)
	if len(cands) == 0 {
		t.Fatal("no candidates")
	}
	return r.sched.policy.Choose(job, cands, r.sched.rng), cands
}

func TestEngineLoadShapesTheChoice(t *testing.T) {
	job := Job{PromptTokens: 100, OutputTokens: 200, NeedContext: 400}
	cases := []struct {
		name     string
		slots    int
		obs      EngineLoad
		age      time.Duration // how old the observation is when it arrives
		later    time.Duration // when, after arrival, the choice is made
		wantLoad int           // busy's load as the scheduler sees it
		wantCap  int           // busy's usable slots
		want     string
	}{
		{"engine reports 4 running while the router has none", 8, EngineLoad{Running: 4}, 0, 0, 4, 8, "idle"},
		{"the engine's queue counts as load", 8, EngineLoad{Running: 1, Waiting: 3}, 0, 0, 4, 8, "idle"},
		{"a report 2 s old is still fresh", 8, EngineLoad{Running: 4}, 2 * time.Second, 0, 4, 8, "idle"},
		{"a report older than the max age is ignored", 8, EngineLoad{Running: 4}, 20 * time.Second, 0, 0, 8, "busy"},
		{"a report that has gone stale since is ignored", 8, EngineLoad{Running: 4}, 0, 16 * time.Second, 0, 8, "busy"},
		{"the engine's slot count caps the slots", 8, EngineLoad{Running: 0, Slots: 2}, 0, 0, 0, 2, "busy"},
		{"a full engine by its own count loses", 8, EngineLoad{Running: 2, Slots: 2}, 0, 0, 2, 2, "idle"},
		{"an idle engine report changes nothing", 8, EngineLoad{}, 0, 0, 0, 8, "busy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := twins(t, tc.slots)
			obs := tc.obs
			obs.At = time.Now().Add(-tc.age)
			r.ObserveEngineLoad("busy/qwen3-4b", obs)
			i, cands := r.choose(t, job, time.Now().Add(tc.later))
			busy, idle := cands[0], cands[1]
			if busy.InFlight != tc.wantLoad || busy.Slots != tc.wantCap {
				t.Errorf("busy seen with %d of %d slots, want %d of %d", busy.InFlight, busy.Slots, tc.wantLoad, tc.wantCap)
			}
			if idle.InFlight != 0 || idle.Slots != tc.slots {
				t.Errorf("idle twin seen with %d of %d slots; its engine said nothing", idle.InFlight, idle.Slots)
			}
			if tc.wantLoad > 0 && busy.free() {
				if pb, pi := busy.Speed.Completion(busy.InFlight+1, job), idle.Speed.Completion(1, job); pb <= pi {
					t.Errorf("busy predicted %v, idle twin %v; the engine's load must make busy slower", pb, pi)
				}
			}
			if !busy.free() {
				// Nothing of the router's runs there, so the next free slot
				// comes from the engine's own requests ending.
				if per := busy.Speed.Completion(busy.Slots, job) / time.Duration(busy.Slots); busy.NextFree < per {
					t.Errorf("full by the engine's count, next free in %v; want at least a slot interval %v", busy.NextFree, per)
				}
			}
			if got := cands[i].Name; got != tc.want+"/qwen3-4b" {
				t.Errorf("fleet chose %s, want %s", got, tc.want)
			}
		})
	}
}

// The engine's running count includes the router's own requests: they must
// not count twice, and when they end the worker must not look busy until
// the next scrape.
func TestEngineLoadDoesNotCountTheRoutersOwnTwice(t *testing.T) {
	r := twins(t, 8)
	job := Job{OutputTokens: 100}
	start := time.Now()
	r.pool.mu.Lock()
	b := r.pool.backends[0]
	f1 := r.pool.takeLocked(b, "qwen3-4b", job, start)
	f2 := r.pool.takeLocked(b, "qwen3-4b", job, start)
	r.pool.mu.Unlock()

	// Read after both went out: 2 of ours + 1 someone else's.
	r.ObserveEngineLoad("busy/qwen3-4b", EngineLoad{Running: 3, At: start.Add(time.Millisecond)})
	if _, c := r.choose(t, job, time.Now()); c[0].InFlight != 3 {
		t.Errorf("load %d after the engine reported 3 with 2 of them ours, want 3", c[0].InFlight)
	}
	r.release(f1, nil)
	if _, c := r.choose(t, job, time.Now()); c[0].InFlight != 2 {
		t.Errorf("load %d after one of ours ended, want 2 (1 ours + 1 external)", c[0].InFlight)
	}
	// One of ours sent after the read is on top of the engine's figure.
	r.pool.mu.Lock()
	f3 := r.pool.takeLocked(b, "qwen3-4b", job, time.Now())
	r.pool.mu.Unlock()
	if _, c := r.choose(t, job, time.Now()); c[0].InFlight != 3 {
		t.Errorf("load %d with 2 ours and 1 external, want 3", c[0].InFlight)
	}
	st := r.Stats()
	if st[0].InFlight != 2 || st[0].EngineRunning != 3 || st[0].EngineWaiting != 0 {
		t.Errorf("stats %+v: want the router's 2 in flight and the engine's 3 running", st[0])
	}
	r.release(f2, nil)
	r.release(f3, nil)
}

func TestStatsReflectTheEngineLoad(t *testing.T) {
	r := twins(t, 8)
	before := r.Stats()
	r.ObserveEngineLoad("busy/qwen3-4b", EngineLoad{Running: 5, Waiting: 2, Slots: 6})
	r.ObserveEngineLoad("idle/qwen3-4b", EngineLoad{Running: 9, At: time.Now().Add(-time.Minute)})
	r.ObserveEngineLoad("idle/qwen3-4b", EngineLoad{Running: -1})
	st := r.Stats()
	busy, idle := st[0], st[1]
	if busy.EngineRunning != 5 || busy.EngineWaiting != 2 || busy.Slots != 6 || busy.InFlight != 0 {
		t.Errorf("busy stats %+v: want engine 5 running, 2 waiting, slots capped to 6, none of the router's", busy)
	}
	if busy.ITLms <= before[0].ITLms || busy.TokPerSec >= before[0].TokPerSec {
		t.Errorf("busy ITL %.1f ms (%.1f tok/s) at its engine's load, was %.1f ms idle; want slower", busy.ITLms, busy.TokPerSec, before[0].ITLms)
	}
	if idle.EngineRunning != 0 || idle.EngineWaiting != 0 || idle.Slots != 8 {
		t.Errorf("idle stats %+v: a stale and a negative report must be ignored", idle)
	}
}

// Under real traffic the fleet policy keeps sending to the idle twin while
// the busy one's engine reports load the router did not send.
func TestFleetAvoidsAnEngineBusyWithOthersTraffic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	var hits [2]atomic.Int32
	_, busy := startBackend(t, "busy/qwen3-4b", 8, func(w http.ResponseWriter, req *http.Request) { hits[0].Add(1); okJSON(w, req) })
	_, idle := startBackend(t, "idle/qwen3-4b", 8, func(w http.ResponseWriter, req *http.Request) { hits[1].Add(1); okJSON(w, req) })
	r, srv := startRouter(t, Options{Policy: PolicyFleet}, busy, idle)
	for _, b := range []Backend{busy, idle} {
		r.SeedSpeed(b.Name, SpeedPoint{Concurrency: 1, TTFT: 80 * time.Millisecond, ITL: 12 * time.Millisecond})
	}
	send := func() {
		resp := post(t, ctx, srv.URL, `{"model":"qwen3-4b","max_tokens":100}`)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	// Equal and idle: the tie goes to the first listed.
	send()
	if hits[0].Load() != 1 {
		t.Fatalf("with no engine report the first twin should win the tie; hits %d/%d", hits[0].Load(), hits[1].Load())
	}
	r.ObserveEngineLoad(busy.Name, EngineLoad{Running: 4, Slots: 8})
	for range 5 {
		send()
	}
	if hits[0].Load() != 1 || hits[1].Load() != 5 {
		t.Errorf("hits busy %d, idle %d; want every request after the report on the idle twin", hits[0].Load(), hits[1].Load())
	}
}

// A request queued because the engine's own figures made the only worker
// full goes as soon as a report says it has room, or the report goes stale.
func TestQueuedRequestGoesWhenTheEngineFrees(t *testing.T) {
	for _, how := range []string{"a new report", "the report going stale"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			_, b := startBackend(t, "ultra/qwen3-4b", 1, okJSON)
			r, srv := startRouter(t, Options{Policy: PolicyFleet, QueueTimeout: hangGuard}, b)
			r.ObserveEngineLoad(b.Name, EngineLoad{Running: 1, Slots: 1})
			codes := make(chan int, 1)
			go func() {
				resp := post(t, ctx, srv.URL, `{"model":"qwen3-4b"}`)
				resp.Body.Close()
				codes <- resp.StatusCode
			}()
			for r.queueLen("qwen3-4b") != 1 {
				select {
				case <-ctx.Done():
					t.Fatal("the request never queued behind the engine's own load")
				case <-time.After(time.Millisecond):
				}
			}
			if how == "a new report" {
				r.ObserveEngineLoad(b.Name, EngineLoad{Running: 0, Slots: 1})
			} else {
				// Make the report stale now and fire its expiry, as the
				// max age passing would.
				r.pool.mu.Lock()
				w := r.pool.workerLocked(b.Name)
				w.engine.until = time.Now()
				w.engine.expiry.Reset(0)
				r.pool.mu.Unlock()
			}
			select {
			case c := <-codes:
				if c != http.StatusOK {
					t.Errorf("status %d", c)
				}
			case <-ctx.Done():
				t.Fatal("the queued request never went")
			}
		})
	}
}

// A worker the router has measured nothing of reports its figures as the
// prior's, marked unmeasured, so that nobody shows the same default guess
// (66.7 tok/s, 15 ms) for every worker after a restart as a measurement.
func TestStatsSayWhetherTheSpeedWasMeasured(t *testing.T) {
	r := mustNew(t, Options{Policy: PolicyFleet, Seed: 1})
	r.SetModels(testModels())
	r.SetBackends([]Backend{
		{Name: "new/qwen3-4b", Model: "qwen3-4b", Addr: "127.0.0.1:1", Context: 16384, Slots: 4},
		{Name: "benched/qwen3-4b", Model: "qwen3-4b", Addr: "127.0.0.1:2", Context: 16384, Slots: 4},
	})
	r.SeedSpeed("benched/qwen3-4b", SpeedPoint{Concurrency: 1, TTFT: 80 * time.Millisecond, ITL: 4 * time.Millisecond})
	for _, st := range r.Stats() {
		switch st.Name {
		case "new/qwen3-4b":
			if st.SpeedMeasured {
				t.Errorf("%s: measured, but nothing was: %+v", st.Name, st)
			}
		case "benched/qwen3-4b":
			if !st.SpeedMeasured || st.ITLms != 4 || st.TokPerSec != 250 {
				t.Errorf("%s: %+v, want measured at 4 ms, 250 tok/s", st.Name, st)
			}
		}
	}
}
