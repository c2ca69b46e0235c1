package router

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Requests the hub sends to a worker directly (shape requests, bench) are the
// worker's load in the router: they show in its in-flight count, and the
// router's own requests queue behind them instead of piling onto the
// engine.
func TestDirectRequestsCountAsLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*hangGuard)
	defer cancel()
	unblock := make(chan struct{})
	var unblockOnce sync.Once
	free := func() { unblockOnce.Do(func() { close(unblock) }) }
	// A failing check must not leave handlers blocked for the server's Close.
	defer free()
	var active atomic.Int32
	srv, b := startBackend(t, "ultra/qwen3-4b", 4, func(w http.ResponseWriter, req *http.Request) {
		active.Add(1)
		defer active.Add(-1)
		<-unblock
		okJSON(w, req)
	})
	r, rsrv := startRouter(t, Options{QueueTimeout: 2 * hangGuard}, b)
	client := &http.Client{Transport: r.CountingTransport(&http.Transport{MaxConnsPerHost: 64}, b.Name)}

	const requests = 12 // `shape ultra max` twelve times at once
	var wg sync.WaitGroup
	for range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"qwen3-4b"}`))
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("direct request: %v", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	waitFor(t, func() bool { return active.Load() == requests })
	if got := r.InFlight(b.Name); got != requests {
		t.Errorf("router in-flight %d while %d shape requests run on the worker, want %d", got, requests, requests)
	}
	if st := r.Stats(); len(st) != 1 || st[0].InFlight != requests {
		t.Errorf("console figures %+v, want %d in flight", st, requests)
	}

	// A client request now waits in the router, not on the full engine.
	done := make(chan int, 1)
	go func() {
		resp := post(t, ctx, rsrv.URL, `{"model":"qwen3-4b"}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	waitFor(t, func() bool { return r.queueLen("qwen3-4b") == 1 })
	if n := active.Load(); n != requests {
		t.Errorf("the engine holds %d requests, want the %d shape requests only", n, requests)
	}
	free()
	wg.Wait()
	if code := <-done; code != http.StatusOK {
		t.Errorf("queued request answered %d", code)
	}
	waitFor(t, func() bool { return r.InFlight(b.Name) == 0 })

	// A worker outside the ready set has nothing to count.
	release := r.HoldSlot("max/qwen3-4b")
	release()
	if r.InFlight("max/qwen3-4b") != 0 {
		t.Errorf("a hold on a worker the router does not route to counted")
	}
}
