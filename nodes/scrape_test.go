package nodes

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"fleet/internal/testbin"
)

// TestManagerScrapeFakeEngine scrapes a real engine process on the hub's own
// machine (the fake engine as llama-server, told to report 3 of 4 slots
// busy) through the node's transport, and checks the refusals.
func TestManagerScrapeFakeEngine(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	cleanupEngines(t, h)
	busy := localModel("--running", "3", "--slots", "4")
	h.m.SetDesired(localFleet(busy))
	h.run()
	w := h.waitReady("hub/qwen3-4b")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := h.m.Scrape(ctx, w.Name())
	if err != nil {
		t.Fatalf("Scrape: %v\n%s", err, h.rec.dump())
	}
	if l.Running != 3 || l.Slots != 4 || l.Waiting != 0 {
		t.Errorf("Scrape = %+v; want 3 running of 4 slots, none waiting", l)
	}

	if _, err := h.m.Scrape(ctx, "hub/ghost"); err == nil || !strings.Contains(err.Error(), "no such worker") {
		t.Errorf("unknown worker: %v", err)
	}
	if err := h.m.StopWorker(ctx, w.Name()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Scrape(ctx, w.Name()); err == nil || !strings.Contains(err.Error(), "the worker is stopped") {
		t.Errorf("stopped worker: %v", err)
	}
}

// TestManagerScrapeRealSimulator runs the real `fleet sim` on a simulated
// node, puts two requests on its engine behind the manager's back (as
// another client would) and expects the scrape to see them.
func TestManagerScrapeRealSimulator(t *testing.T) {
	bin := testbin.ForTest(t, "fleet", "fleet/enginectl/testdata/fleetsim")
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) { o.FleetBin = bin })
	// Found by command line, and killed with kill(2): procps-ng 4.0.2's
	// kill(1) given a negative PID that names no group kills every process
	// it may signal (seen in CI, where it took the whole run down).
	t.Cleanup(func() {
		for pid := range processesRunning(bin) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	// --metrics: llama-server serves /metrics only when asked to.
	h.m.SetDesired(simFleet(testModel("--metrics"), "max"))
	h.run()
	w := h.waitReady("max/qwen3-4b")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	idle, err := h.m.Scrape(ctx, w.Name())
	if err != nil {
		t.Fatalf("Scrape: %v\n%s", err, h.rec.dump())
	}
	if idle.Running != 0 || idle.Slots != 4 {
		t.Errorf("idle sim: %+v; want nothing running on 4 slots", idle)
	}

	// Two long streams straight to the engine; each holds a slot until the
	// test cancels it.
	streamCtx, stop := context.WithCancel(ctx)
	defer stop()
	hc := &http.Client{Transport: &http.Transport{DialContext: h.m.Dialer(w.Node)}}
	for range 2 {
		body := `{"model":"qwen3-4b","stream":true,"max_tokens":4000,"messages":[{"role":"user","content":"tell me a long story"}]}`
		req, _ := http.NewRequestWithContext(streamCtx, http.MethodPost, "http://127.0.0.1:"+strconv.Itoa(w.Port)+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("stream to the sim: %v", err)
		}
		defer resp.Body.Close()
		// Wait for the first chunk: the request is then decoding in a slot.
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatalf("first chunk: %v", err)
		}
	}
	busy, err := h.m.Scrape(ctx, w.Name())
	if err != nil {
		t.Fatal(err)
	}
	if busy.Running != 2 || busy.Slots != 4 {
		t.Errorf("sim with two streams: %+v; want 2 running on 4 slots", busy)
	}
	// The engine's own /metrics page comes through the same transport,
	// for the hub to serve relabelled.
	ew, text, err := h.m.EngineMetrics(ctx, w.Name())
	if err != nil {
		t.Fatalf("EngineMetrics: %v", err)
	}
	if ew.Node != "max" || !strings.Contains(string(text), "# TYPE llamacpp:") {
		t.Errorf("EngineMetrics = worker %s, text %.300q; want max's llama-server exposition", ew.Name(), text)
	}
	if _, _, err := h.m.EngineMetrics(ctx, "max/ghost"); err == nil || !strings.Contains(err.Error(), "no such worker") {
		t.Errorf("unknown worker: %v", err)
	}
}
