package nodes

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fleet"
)

// lockedBuffer is a log sink several goroutines write to.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// latest is each worker as last reported: what the hub's database holds,
// which a hub taking the lead reads back.
func (r *recorder) latest() []fleet.Worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	last := map[string]fleet.Worker{}
	var order []string
	for _, w := range r.workers {
		if _, ok := last[w.Name()]; !ok {
			order = append(order, w.Name())
		}
		last[w.Name()] = w
	}
	out := make([]fleet.Worker, 0, len(order))
	for _, n := range order {
		out = append(out, last[n])
	}
	return out
}

func (r *recorder) count() (workers, events int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.workers), len(r.events)
}

// launches counts the launch events: a new engine started.
func (r *recorder) launches() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if strings.HasPrefix(e.Message, "launched PID ") {
			n++
		}
	}
	return n
}

// gag makes every worker callback after it a test failure: a manager that
// gave up leadership must not report a worker (the hub would write it with
// an epoch that is no longer its own).
type gag struct {
	on   atomic.Bool
	late atomic.Int64
}

func (g *gag) wrap(o *ManagerOptions) {
	onWorker, onEvent, onRemoved := o.OnWorker, o.OnEvent, o.OnWorkerRemoved
	o.OnWorker = func(w fleet.Worker) {
		if g.on.Load() {
			g.late.Add(1)
		}
		onWorker(w)
	}
	o.OnWorkerRemoved = func(w fleet.Worker) {
		if g.on.Load() {
			g.late.Add(1)
		}
		onRemoved(w)
	}
	o.OnEvent = func(e fleet.Event) {
		if g.on.Load() && strings.Contains(e.Subject, "/") {
			g.late.Add(1) // an event about a worker
		}
		onEvent(e)
	}
}

// waitProbes waits until the node has been probed n more times.
func waitProbes(t *testing.T, h *harness, node string, n int) {
	t.Helper()
	count := func() int {
		h.rec.mu.Lock()
		defer h.rec.mu.Unlock()
		c := 0
		for _, x := range h.rec.nodes {
			if x.Name == node && x.State == fleet.NodeUp {
				c++
			}
		}
		return c
	}
	want := count() + n
	waitFor(t, func() bool { return count() >= want }, "node "+node+" probed "+strconv.Itoa(n)+" more times")
}

// A following manager keeps its nodes connected and probed, and reachable
// through Dialer for the router, but drives nothing: no worker is
// supervised, launched or reported, and operator requests are refused.
func TestManagerFollowingProbesButNeverLaunches(t *testing.T) {
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) { o.Following = true })
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "max"))
	h.run()
	waitNodeUp(t, h, "max")
	// A leader would have launched by now: its supervisor reports the
	// worker pending before the node's first probe is even done.
	waitProbes(t, h, "max", 3)

	if ws := h.m.Workers(); len(ws) != 0 {
		t.Errorf("a follower supervises workers: %+v", ws)
	}
	if n, _ := h.rec.count(); n != 0 || h.rec.launches() != 0 {
		t.Errorf("a follower reported %d worker changes and %d launches:\n%s", n, h.rec.launches(), h.rec.dump())
	}
	for p := h.m.opts.PortMin; p <= h.m.opts.PortMax; p++ {
		if pids := enginesOnPort(p); len(pids) > 0 {
			t.Errorf("engines %v run on port %d under a follower", pids, p)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for what, err := range map[string]error{
		"stop":  h.m.StopWorker(ctx, "max/qwen3-4b"),
		"start": h.m.StartWorker(ctx, "max/qwen3-4b"),
		"hold":  h.m.Hold(ctx, "max/qwen3-4b"),
	} {
		if !errors.Is(err, ErrNotLeading) {
			t.Errorf("%s on a follower: %v, want ErrNotLeading", what, err)
		}
	}

	// The router of a follower reaches engines through its node connections.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "through the node")
	}()
	conn, err := h.m.Dialer("max")(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("a follower's Dialer: %v", err)
	}
	defer conn.Close()
	got, _ := io.ReadAll(conn)
	if string(got) != "through the node" {
		t.Errorf("read %q through a follower's Dialer", got)
	}
}

// Leadership handed to a manager that followed while another hub launched
// the engines, and taken back and forth three times: every time the engines
// are adopted with their PIDs (none launched, none stopped), and between
// terms nothing of the workers is reported while the router's way to them
// (Dialer, ScrapeWorker) keeps working.
func TestManagerSetLeadingAdoptsTheSamePIDs(t *testing.T) {
	data := t.TempDir()
	first := newHarness(t, data, nil)
	cleanupEngines(t, first)
	first.m.SetDesired(simFleet(testModel(), "max", "ultra"))
	first.run()
	want := map[string]int{}
	for _, n := range []string{"max/qwen3-4b", "ultra/qwen3-4b"} {
		want[n] = first.waitReady(n).PID
	}
	known := first.m.Workers()
	first.stop() // a leader gone; its engines run on

	g := &gag{}
	h := newHarness(t, data, func(o *ManagerOptions) {
		o.PortMin, o.PortMax = first.m.opts.PortMin, first.m.opts.PortMax
		o.Following = true
		g.wrap(o)
	})
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "max", "ultra"))
	h.run()
	waitNodeUp(t, h, "max")
	if ids := modelsVia(t, h.m, known[0]); len(ids) == 0 {
		t.Errorf("a follower's Dialer reached no model")
	}

	for round := 1; round <= 3; round++ {
		h.m.SetLeading(true, known)
		for name, pid := range want {
			got := h.waitReady(name)
			if got.PID != pid {
				t.Fatalf("round %d: %s ready with PID %d, want the adopted %d\n%s", round, name, got.PID, pid, h.rec.dump())
			}
		}
		if n := h.rec.launches(); n != 0 {
			t.Fatalf("round %d: %d engines launched on taking the lead, want none\n%s", round, n, h.rec.dump())
		}
		known = h.rec.latest()

		g.on.Store(true)
		h.m.SetLeading(false, nil)
		if ws := h.m.Workers(); len(ws) != 0 {
			t.Errorf("round %d: workers after giving up the lead: %+v", round, ws)
		}
		for name, pid := range want {
			if !alive(pid) {
				t.Fatalf("round %d: giving up the lead stopped %s's engine PID %d", round, name, pid)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := h.m.ScrapeWorker(ctx, known[0]); err != nil {
			t.Errorf("round %d: a follower's ScrapeWorker: %v", round, err)
		}
		var log bytes.Buffer
		if err := h.m.WorkerLog(ctx, known[0].Name(), 5, &log); err != nil {
			t.Errorf("round %d: a follower's WorkerLog: %v", round, err)
		}
		cancel()
		waitProbes(t, h, "max", 2)
		if n := g.late.Swap(0); n != 0 {
			t.Errorf("round %d: %d worker callbacks after SetLeading(false)\n%s", round, n, h.rec.dump())
		}
		g.on.Store(false)
	}
	for name, pid := range want {
		if pids := enginesOnPort(portOf(known, name)); len(pids) != 1 || pids[0] != pid {
			t.Errorf("%s: engines %v on its port, want only PID %d", name, pids, pid)
		}
	}
}

func portOf(ws []fleet.Worker, name string) int {
	for _, w := range ws {
		if w.Name() == name {
			return w.Port
		}
	}
	return 0
}

// SetLeading(false) while an engine is loading leaves it loading: the
// supervisor ends without a stop and without a further report, and the next
// term adopts the engine with its PID.
func TestManagerSetLeadingFalseMidLaunch(t *testing.T) {
	g := &gag{}
	var started atomic.Int64
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) {
		g.wrap(o)
		onEvent := o.OnEvent
		o.OnEvent = func(e fleet.Event) {
			// The last report before the launch waits for the engine.
			if pid, ok := strings.CutPrefix(e.Message, "launched PID "); ok {
				n, _ := strconv.Atoi(strings.Fields(pid)[0])
				started.CompareAndSwap(0, int64(n))
			}
			onEvent(e)
		}
	})
	cleanupEngines(t, h)
	// The engine answers /health only after loading for 8 s.
	model := testModel("--load-time", "8s")
	h.m.SetDesired(simFleet(model, "max"))
	h.run()
	waitFor(t, func() bool { return started.Load() > 0 }, "the engine started")
	// From the call on: what the supervisor does while it winds down is
	// not reported either.
	g.on.Store(true)
	h.m.SetLeading(false, nil)
	pid := int(started.Load())
	if h.rec.sawState("max/qwen3-4b", fleet.WorkerReady) || h.rec.sawState("max/qwen3-4b", fleet.WorkerProbation) {
		t.Skipf("the engine was up before SetLeading(false) (a very slow machine?); not mid-launch\n%s", h.rec.dump())
	}
	if !alive(pid) {
		t.Fatalf("giving up the lead mid-launch stopped engine PID %d\n%s", pid, h.rec.dump())
	}
	known := h.rec.latest()
	port := portOf(known, "max/qwen3-4b")
	// The engine finishes loading on its own, unwatched.
	waitFor(t, func() bool {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "the engine left loading to serve")
	if n := g.late.Load(); n != 0 {
		t.Errorf("%d worker callbacks after SetLeading(false)\n%s", n, h.rec.dump())
	}
	if !alive(pid) || len(enginesOnPort(port)) != 1 {
		t.Fatalf("engine PID %d alive %v, engines on its port %v", pid, alive(pid), enginesOnPort(port))
	}
	g.on.Store(false)

	h.m.SetLeading(true, known)
	if got := h.waitReady("max/qwen3-4b"); got.PID != pid {
		t.Errorf("after taking the lead again: PID %d, want the adopted %d\n%s", got.PID, pid, h.rec.dump())
	}
	if n := h.rec.launches(); n != 1 {
		t.Errorf("%d launches, want the one before the lead was given up\n%s", n, h.rec.dump())
	}
}

// A hub whose StillLeading says no acts on no engine: no launch recorded or
// started, no stop, no relaunch of a dead engine. The worker's supervisor
// ends, saying why in the log.
func TestManagerStillLeadingFalseRefusesActs(t *testing.T) {
	cases := []struct {
		name string
		// lapse is where the lease lapses: "start" before anything, "record"
		// as the launch is recorded, "ready" once the engine is up.
		lapse string
		// then is what the test asks of the engine once the lease lapsed.
		then string
	}{
		{name: "launch refused", lapse: "start"},
		{name: "start refused after its record", lapse: "record"},
		{name: "stop refused", lapse: "ready", then: "stop"},
		{name: "restart refused", lapse: "ready", then: "restart"},
		{name: "dead engine not relaunched", lapse: "ready", then: "kill"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var leading atomic.Bool
			leading.Store(tc.lapse != "start")
			var records atomic.Int64
			logs := &lockedBuffer{}
			h := newHarness(t, t.TempDir(), func(o *ManagerOptions) {
				o.Logger = slog.New(slog.NewTextHandler(logs, nil))
				o.StillLeading = leading.Load
				o.FleetID = "fleet-test"
				o.RecordLaunch = func(ctx context.Context, w fleet.Worker) (fleet.Worker, error) {
					n := records.Add(1)
					w.Launch = n
					if tc.lapse == "record" {
						leading.Store(false)
					}
					return w, nil
				}
			})
			cleanupEngines(t, h)
			h.m.SetDesired(simFleet(testModel(), "max"))
			h.run()
			gaveUp := func() bool { return strings.Contains(logs.String(), "no longer the leader; leaving") }

			var pid int
			if tc.lapse == "ready" {
				pid = h.waitReady("max/qwen3-4b").PID
				leading.Store(false)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				var err error
				switch tc.then {
				case "stop":
					err = h.m.StopWorker(ctx, "max/qwen3-4b")
				case "restart":
					err = h.m.RestartWorker(ctx, "max/qwen3-4b")
				case "kill":
					killEngine(t, pid)
				}
				if tc.then != "kill" && !errors.Is(err, ErrNotLeading) {
					t.Errorf("%s after the lease lapsed: %v, want ErrNotLeading", tc.then, err)
				}
			}
			// Not fatal: what was (not) done to the engine is the point.
			deadline := time.Now().Add(30 * time.Second)
			for !gaveUp() && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if !gaveUp() {
				t.Errorf("the log never said the supervisor gave up for want of the lease:\n%s", logs.String())
			}
			waitNodeUp(t, h, "max")
			waitProbes(t, h, "max", 2)

			wantRecords := map[string]int64{"start": 0, "record": 1, "ready": 1}[tc.lapse]
			if n := records.Load(); n != wantRecords {
				t.Errorf("RecordLaunch called %d times, want %d", n, wantRecords)
			}
			wantLaunches := map[string]int{"start": 0, "record": 0, "ready": 1}[tc.lapse]
			if n := h.rec.launches(); n != wantLaunches {
				t.Errorf("%d engines launched, want %d\n%s", n, wantLaunches, h.rec.dump())
			}
			var running []int
			for p := h.m.opts.PortMin; p <= h.m.opts.PortMax; p++ {
				running = append(running, enginesOnPort(p)...)
			}
			switch {
			case tc.then == "kill" && len(running) != 0:
				t.Errorf("a dead engine was relaunched after the lease lapsed: %v\n%s", running, h.rec.dump())
			case tc.then == "stop" || tc.then == "restart":
				if len(running) != 1 || running[0] != pid || !alive(pid) {
					t.Errorf("engines %v after a %s refused, want PID %d left running\n%s", running, tc.then, pid, h.rec.dump())
				}
			case tc.then == "" && len(running) != 0:
				t.Errorf("engines %v started after the lease lapsed\n%s", running, h.rec.dump())
			}
		})
	}
}
