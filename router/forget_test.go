package router

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"
)

// workerNames lists the names the router keeps state for.
func (r *Router) workerNames() []string {
	r.pool.mu.Lock()
	defer r.pool.mu.Unlock()
	var out []string
	for name := range r.pool.workers {
		out = append(out, name)
	}
	return out
}

// metricBackends lists the backend and worker label values on /metrics.
func metricBackends(t *testing.T, url string) map[string]bool {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"/metrics", nil)
	out := map[string]bool{}
	for _, samples := range scrapeValues(t, req) {
		for _, s := range samples {
			for _, l := range []string{"backend", "worker"} {
				if v := s.labels[l]; v != "" {
					out[v] = true
				}
			}
		}
	}
	return out
}

// A fleet whose workers come and go under ever new names (removed, renamed,
// moved) keeps state and series for the ready set only: what the router
// holds does not grow with every name it has seen.
func TestGoneWorkersAreForgotten(t *testing.T) {
	for _, policy := range []string{PolicyFleet, PolicyCacheAware} {
		t.Run(policy, func(t *testing.T) {
			r, rsrv := startRouter(t, Options{Policy: policy, EngineLoadMaxAge: time.Hour})
			srv, _ := startBackend(t, "", 2, okJSON)
			const names = 120
			for i := range names {
				name := fmt.Sprintf("node%d/qwen3-4b", i)
				b := Backend{Name: name, Model: "qwen3-4b", Addr: srv.Listener.Addr().String(), Context: 16384, Slots: 2}
				r.SetBackends([]Backend{b})
				resp := post(t, context.Background(), rsrv.URL, `{"model":"qwen3-4b","messages":[{"role":"user","content":"hi"}]}`)
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("request to %s answered %d", name, resp.StatusCode)
				}
				r.ObserveEngineLoad(name, EngineLoad{Running: 1})
				if err := r.ObserveEngineMetrics(fmt.Sprintf("node%d", i), name, "vllm", []byte(vllmText), time.Now()); err != nil {
					t.Fatal(err)
				}
			}
			last := fmt.Sprintf("node%d/qwen3-4b", names-1)
			if got := r.workerNames(); len(got) != 1 || got[0] != last {
				t.Errorf("after %d names came and went the router keeps state for %d workers (%v), want only %s", names, len(got), trim(got), last)
			}
			got := metricBackends(t, rsrv.URL)
			if len(got) != 1 || !got[last] {
				t.Errorf("/metrics has series of %d backends, want only %s: %v", len(got), last, trim(slices.Sorted(maps.Keys(got))))
			}
			if p, ok := r.sched.policy.(*cacheAwarePolicy); ok {
				p.mu.Lock()
				trees := len(p.trees)
				p.mu.Unlock()
				if trees > 1 {
					t.Errorf("the cache-aware policy keeps %d trees, want at most 1", trees)
				}
			}
			r.SetBackends(nil)
			if got := r.workerNames(); len(got) != 0 {
				t.Errorf("with no ready set the router keeps state for %d workers: %v", len(got), trim(got))
			}
			if got := metricBackends(t, rsrv.URL); len(got) != 0 {
				t.Errorf("with no ready set /metrics has series of %d backends: %v", len(got), trim(slices.Sorted(maps.Keys(got))))
			}
		})
	}
}

func trim(s []string) []string {
	if len(s) > 5 {
		return append(s[:5:5], "…")
	}
	return s
}

// What a worker outside the ready set still needs is kept: its requests in
// flight finish on it and are counted, a drain holds until undrained, and
// a speed measured before it joined (admission) waits for it. A worker
// that comes back after it was dropped starts fresh.
func TestWorkerStateKeptWhileNeeded(t *testing.T) {
	release := make(chan struct{})
	_, slow := startBackend(t, "slow/qwen3-4b", 2, func(w http.ResponseWriter, req *http.Request) {
		<-release
		okJSON(w, req)
	})
	_, other := startBackend(t, "other/qwen3-4b", 2, okJSON)
	r, rsrv := startRouter(t, Options{}, slow)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	// In flight when it leaves: kept until the request ends.
	done := make(chan int)
	go func() {
		resp := post(t, context.Background(), rsrv.URL, `{"model":"qwen3-4b","messages":[{"role":"user","content":"hi"}]}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	waitFor(t, func() bool { return r.InFlight(slow.Name) == 1 })
	r.SetBackends([]Backend{other})
	if !slices.Contains(r.workerNames(), slow.Name) {
		t.Fatalf("%s was forgotten with a request in flight", slow.Name)
	}
	close(release)
	if code := <-done; code != 200 {
		t.Errorf("the request in flight on a removed worker answered %d", code)
	}
	if r.InFlight(slow.Name) != 0 {
		t.Errorf("in flight on %s after its request ended: %d", slow.Name, r.InFlight(slow.Name))
	}
	if slices.Contains(r.workerNames(), slow.Name) {
		t.Errorf("%s is still kept after its last request ended", slow.Name)
	}
	if metricBackends(t, rsrv.URL)[slow.Name] {
		t.Errorf("/metrics still has series of %s", slow.Name)
	}

	// Drained outside the set: kept until undrained.
	r.Drain("drained/qwen3-4b")
	r.SetBackends([]Backend{other})
	if !slices.Contains(r.workerNames(), "drained/qwen3-4b") {
		t.Error("a drained worker outside the set lost its drain at the next SetBackends")
	}
	r.Undrain("drained/qwen3-4b")
	r.SetBackends([]Backend{other})
	if slices.Contains(r.workerNames(), "drained/qwen3-4b") {
		t.Error("an undrained worker outside the set is still kept")
	}

	// Seeded on probation: the seed waits for it to join, across other
	// changes of the set.
	r.SeedSpeed(slow.Name, SpeedPoint{Concurrency: 1, TTFT: 4 * time.Second, ITL: time.Second})
	r.SetBackends([]Backend{other})
	r.SetBackends([]Backend{other, slow})
	if st := statsOf(r, slow.Name); st.PredictedTTFTms < 1000 {
		t.Errorf("the speed seeded before %s joined was lost: predicted TTFT %.0f ms", slow.Name, st.PredictedTTFTms)
	}

	// Gone and back: a fresh start (no history, no seed), but for a drain.
	for _, drained := range []bool{false, true} {
		r.SeedSpeed(slow.Name, SpeedPoint{Concurrency: 1, TTFT: 4 * time.Second, ITL: time.Second})
		if drained {
			r.Drain(slow.Name)
		}
		r.SetBackends([]Backend{other})
		if metricBackends(t, rsrv.URL)[slow.Name] {
			t.Errorf("drained %v: /metrics keeps series of %s, which left the set", drained, slow.Name)
		}
		r.SetBackends([]Backend{other, slow})
		st := statsOf(r, slow.Name)
		if st.PredictedTTFTms >= 1000 || len(st.TTFTHistory) != 0 {
			t.Errorf("drained %v: %s came back with its old state: predicted TTFT %.0f ms, %d TTFTs", drained, slow.Name, st.PredictedTTFTms, len(st.TTFTHistory))
		}
		if st.Draining != drained {
			t.Errorf("drained %v: %s came back draining %v", drained, slow.Name, st.Draining)
		}
	}

	// A slot the hub holds around the router (a bench) likewise.
	release2 := r.HoldSlot(other.Name)
	r.SetBackends([]Backend{slow})
	if !slices.Contains(r.workerNames(), other.Name) {
		t.Errorf("%s was forgotten with a slot held", other.Name)
	}
	release2()
	if slices.Contains(r.workerNames(), other.Name) {
		t.Errorf("%s is still kept after its held slot was released", other.Name)
	}
}

// Seeds of workers that never join are bounded too.
func TestParkedWorkersBounded(t *testing.T) {
	r := mustNew(t, Options{})
	for i := range 3 * maxParked {
		r.SeedSpeed(fmt.Sprintf("probation%d/m", i), SpeedPoint{Concurrency: 1, TTFT: time.Second, ITL: time.Second})
		r.SetBackends(nil)
	}
	got := r.workerNames()
	if len(got) > maxParked {
		t.Errorf("%d workers seeded and never ready are kept, want at most %d", len(got), maxParked)
	}
	if !slices.Contains(got, fmt.Sprintf("probation%d/m", 3*maxParked-1)) {
		t.Error("the newest seeded worker was dropped before older ones")
	}
}

func statsOf(r *Router, name string) BackendStats {
	for _, st := range r.Stats() {
		if st.Name == name {
			return st
		}
	}
	return BackendStats{}
}
