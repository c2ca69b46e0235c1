package router

import (
	"context"
	"io"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// TestHealthCheckedWithoutTraffic: a cooled-down backend is checked by its
// own health checker, not as a side effect of a request looking for a
// worker: with no request at all after the cooldown, its /health is asked
// again and again while it fails, and a pass brings it back.
func TestHealthCheckedWithoutTraffic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	var healthy atomic.Bool
	var checks atomic.Int32
	_, rig := startBackend(t, "rig/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/health" {
			checks.Add(1)
			if !healthy.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, `{"status":"ok"}`)
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
	})
	r, rsrv := startRouter(t, Options{FailureThreshold: 1, Cooldown: 5 * time.Millisecond, MaxRetries: 0}, rig)
	resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
	resp.Body.Close()
	if st := r.Stats(); !st[0].Cooling {
		t.Fatalf("backend answering 500 not cooling: %+v", st[0])
	}
	// No request from here on.
	for checks.Load() < 3 {
		if ctx.Err() != nil {
			t.Fatalf("the cooled-down backend was checked %d times without traffic, want repeated checks", checks.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if st := r.Stats(); !st[0].Cooling {
		t.Errorf("backend failing its health checks stopped cooling: %+v", st[0])
	}
	healthy.Store(true)
	// The checker ends once a check passes, and the backend is back; then
	// no more checks of a healthy backend.
	waitCheckerDone(t, ctx, r, r.backendsForTest()[0])
	if st := r.Stats(); st[0].Cooling {
		t.Errorf("a passing health check did not bring the backend back: %+v", st[0])
	}
	r.pool.mu.Lock()
	until := r.pool.workerLocked("rig/qwen3-4b").coolingUntil
	r.pool.mu.Unlock()
	if !until.IsZero() {
		t.Errorf("still cooling until %v after a passing check", until)
	}
	n := checks.Load()
	time.Sleep(50 * time.Millisecond)
	if got := checks.Load(); got != n {
		t.Errorf("health checks went on after the backend passed: %d, then %d", n, got)
	}
}

// TestHealthCheckerEndsWithItsBackend: a cooled-down backend taken out of
// the router's set is no longer checked.
func TestHealthCheckerEndsWithItsBackend(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	var checks atomic.Int32
	_, rig := startBackend(t, "rig/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/health" {
			checks.Add(1)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	r, rsrv := startRouter(t, Options{FailureThreshold: 1, Cooldown: 5 * time.Millisecond, MaxRetries: 0}, rig)
	resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
	resp.Body.Close()
	for checks.Load() < 1 {
		if ctx.Err() != nil {
			t.Fatal("never checked")
		}
		time.Sleep(time.Millisecond)
	}
	b := r.backendsForTest()[0]
	r.SetBackends(nil)
	waitCheckerDone(t, ctx, r, b)
	n := checks.Load()
	time.Sleep(50 * time.Millisecond)
	if got := checks.Load(); got != n {
		t.Errorf("a removed backend is still checked: %d, then %d", n, got)
	}
}

func (r *Router) backendsForTest() []*backend {
	r.pool.mu.Lock()
	defer r.pool.mu.Unlock()
	return slices.Clone(r.pool.backends)
}

// waitCheckerDone waits until b's health checker has ended.
func waitCheckerDone(t *testing.T, ctx context.Context, r *Router, b *backend) {
	t.Helper()
	for {
		r.pool.mu.Lock()
		checking := b.checking
		r.pool.mu.Unlock()
		if !checking {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("the health checker did not end")
		}
		time.Sleep(time.Millisecond)
	}
}
