package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"fleet"
	"fleet/enginectl"
	"fleet/internal/sshdtest"
	"fleet/internal/testbin"
)

// fakeEngine is enginectl's test engine (enginectl/testdata/fakeengine), a
// real HTTP server that takes a real engine's argv and serves /health and
// /v1/models under its -a/--served-model-name. It stands in for both
// llama-server (through a recipe's bin:) and `fleet sim` (as FleetBin).
var fakeEngine string

func TestMain(m *testing.M) {
	os.Exit(testbin.Main(m, "nodes-test-bin", func(dir string) (err error) {
		fakeEngine, err = testbin.Build(dir, "fakeengine", "fleet/enginectl/testdata/fakeengine")
		return err
	}))
}

// recorder keeps what the manager reported.
type recorder struct {
	mu      sync.Mutex
	workers []fleet.Worker
	nodes   []fleet.Node
	events  []fleet.Event
	removed []fleet.Worker
}

func (r *recorder) worker(w fleet.Worker) {
	r.mu.Lock()
	r.workers = append(r.workers, w)
	r.mu.Unlock()
}
func (r *recorder) node(n fleet.Node)   { r.mu.Lock(); r.nodes = append(r.nodes, n); r.mu.Unlock() }
func (r *recorder) event(e fleet.Event) { r.mu.Lock(); r.events = append(r.events, e); r.mu.Unlock() }
func (r *recorder) remove(w fleet.Worker) {
	r.mu.Lock()
	r.removed = append(r.removed, w)
	r.mu.Unlock()
}

func (r *recorder) sawState(name string, s fleet.WorkerState) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		if w.Name() == name && w.State == s {
			return true
		}
	}
	return false
}

func (r *recorder) eventLike(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if strings.Contains(e.Message, sub) {
			return true
		}
	}
	return false
}

func (r *recorder) dump() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, e := range r.events {
		fmt.Fprintf(&b, "  event %s %s: %s\n", e.Level, e.Subject, e.Message)
	}
	for _, w := range r.workers {
		fmt.Fprintf(&b, "  worker %s %s pid=%d port=%d %s\n", w.Name(), w.State, w.PID, w.Port, w.Reason)
	}
	return b.String()
}

func m4max(string) (fleet.Platform, error) {
	return fleet.Platform{OS: "darwin", Arch: "arm64", Chip: "Apple M4 Max", MemTotalBytes: 64 << 30, MemFreeBytes: 40 << 30}, nil
}

func testModel(args ...string) fleet.Model {
	return fleet.Model{
		ID:      "qwen3-4b",
		Context: 16384,
		Recipes: map[fleet.EngineKind]fleet.Recipe{
			fleet.EngineLlamaCpp: {Model: "Qwen/Qwen3-4B-GGUF:Q4_K_M", Args: append([]string{"--jinja", "--reasoning-format", "none"}, args...)},
		},
	}
}

// localModel runs the fake engine as llama-server on a real (non-sim) node.
func localModel(args ...string) fleet.Model {
	m := testModel(args...)
	r := m.Recipes[fleet.EngineLlamaCpp]
	r.Bin = fakeEngine
	m.Recipes[fleet.EngineLlamaCpp] = r
	return m
}

type harness struct {
	t      *testing.T
	m      *Manager
	rec    *recorder
	cancel context.CancelFunc
	done   chan error
	data   string
}

func newHarness(t *testing.T, data string, mutate func(*ManagerOptions)) *harness {
	t.Helper()
	rec := &recorder{}
	opts := ManagerOptions{
		DataDir:           data,
		FleetBin:          fakeEngine,
		ProbeInterval:     300 * time.Millisecond,
		ReconcileInterval: 200 * time.Millisecond,
		ReadyTimeout:      30 * time.Second,
		StopGrace:         5 * time.Second,
		PortMin:           sshdtest.FreePort(t),
		SimPlatform:       m4max,
		RestartBackoff:    func(int) time.Duration { return 100 * time.Millisecond },
		EngineOptions:     []enginectl.Option{enginectl.WithPollInterval(50 * time.Millisecond)},
		OnWorker:          rec.worker,
		OnNode:            rec.node,
		OnEvent:           rec.event,
		OnWorkerRemoved:   rec.remove,
	}
	opts.PortMax = opts.PortMin + 50
	if mutate != nil {
		mutate(&opts)
	}
	return &harness{t: t, m: NewManager(opts), rec: rec, data: data}
}

func (h *harness) run() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.m.Run(ctx) }()
	h.t.Cleanup(h.stop)
}

// stop ends Run the way a hub shutdown does; engines stay up.
func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	select {
	case <-h.done:
	case <-time.After(60 * time.Second):
		h.t.Fatal("Run did not return after its context ended")
	}
}

func (h *harness) worker(name string) (fleet.Worker, bool) {
	for _, w := range h.m.Workers() {
		if w.Name() == name {
			return w, true
		}
	}
	return fleet.Worker{}, false
}

// waitWorker waits until the worker satisfies cond.
func (h *harness) waitWorker(name, what string, cond func(fleet.Worker) bool) fleet.Worker {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if w, ok := h.worker(name); ok && cond(w) {
			return w
		}
		if time.Now().After(deadline) {
			w, _ := h.worker(name)
			h.t.Fatalf("worker %s never became %s; now %+v\n%s", name, what, w, h.rec.dump())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (h *harness) waitReady(name string) fleet.Worker {
	h.t.Helper()
	return h.waitWorker(name, "ready", func(w fleet.Worker) bool { return w.State == fleet.WorkerReady })
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	rest := string(raw)
	if i := strings.LastIndex(rest, ") "); i >= 0 {
		rest = rest[i+2:]
	}
	return !strings.HasPrefix(rest, "Z")
}

// enginesOnPort lists the live engines started with --port port: the fake
// engine, and the copies of it at bins a test installed in its place.
func enginesOnPort(port int, bins ...string) []int {
	var pids []int
	for _, bin := range append([]string{fakeEngine}, bins...) {
		for pid, args := range processesRunning(bin) {
			if i := slices.Index(args, "--port"); i >= 0 && i+1 < len(args) && args[i+1] == strconv.Itoa(port) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// processesRunning maps each live process whose argv[0] is bin to its argv.
// Tests find what they started this way, never by a PID kept from earlier:
// numbers are reused once a process is gone.
func processesRunning(bin string) map[int][]string {
	found := map[int][]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
		if len(args) > 0 && args[0] == bin && alive(pid) {
			found[pid] = args
		}
	}
	return found
}

func killEngine(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %d: %v", pid, err)
	}
}

// cleanupEngines kills every engine the test left running: Run leaves them
// up by design. bins are the paths of engines the test installed besides the
// fake engine.
func cleanupEngines(t *testing.T, h *harness, bins ...string) {
	t.Cleanup(func() {
		h.rec.mu.Lock()
		ws := slices.Clone(h.rec.workers)
		h.rec.mu.Unlock()
		var killed []int
		for _, w := range ws {
			for _, pid := range enginesOnPort(w.Port, bins...) {
				syscall.Kill(-pid, syscall.SIGKILL)
				killed = append(killed, pid)
			}
		}
		// Wait for them to go, so that a check after this one sees the end state.
		deadline := time.Now().Add(10 * time.Second)
		for _, pid := range killed {
			for alive(pid) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if alive(pid) {
				t.Errorf("engine %d outlived SIGKILL", pid)
			}
		}
	})
}

func modelsVia(t *testing.T, m *Manager, w fleet.Worker) []string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: m.Dialer(w.Node)}, Timeout: 10 * time.Second}
	resp, err := hc.Get("http://127.0.0.1:" + strconv.Itoa(w.Port) + "/v1/models")
	if err != nil {
		t.Fatalf("GET /v1/models through the node's dialer: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("/v1/models: %v: %s", err, body)
	}
	var ids []string
	for _, d := range list.Data {
		ids = append(ids, d.ID)
	}
	return ids
}

// localFleet places model on one node, the hub's own machine.
func localFleet(model fleet.Model) fleet.Fleet {
	return fleet.Fleet{
		Nodes:      []fleet.Node{{Name: "hub", Address: "local"}},
		Models:     []fleet.Model{model},
		Placements: []fleet.Placement{{Model: model.ID, Node: "hub"}},
	}
}

func simFleet(model fleet.Model, nodes ...string) fleet.Fleet {
	f := fleet.Fleet{Models: []fleet.Model{model}}
	for _, n := range nodes {
		f.Nodes = append(f.Nodes, fleet.Node{Name: n, Address: "sim:m4max-llamacpp"})
		f.Placements = append(f.Placements, fleet.Placement{Model: model.ID, Node: n})
	}
	return f
}

func TestManagerLaunchCrashRelaunchAndAdopt(t *testing.T) {
	data := t.TempDir()
	h := newHarness(t, data, nil)
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "max", "ultra"))
	h.run()

	w := h.waitReady("max/qwen3-4b")
	u := h.waitReady("ultra/qwen3-4b")
	if !alive(w.PID) || w.PGID != w.PID {
		t.Errorf("worker PID %d / PGID %d: want a live process leading its own group", w.PID, w.PGID)
	}
	if w.Port == u.Port {
		t.Errorf("two sim nodes on one machine got the same port %d", w.Port)
	}
	if w.Argv[0] != "llama-server" || !slices.Contains(w.Argv, "--reasoning-format") || !w.Simulated {
		t.Errorf("Argv = %q (simulated %v): want the llama-server command line the real engine would run", w.Argv, w.Simulated)
	}
	if w.LaunchArgv[0] != fakeEngine || w.LaunchArgv[1] != "sim" {
		t.Errorf("LaunchArgv = %q: want the fleet binary's sim command", w.LaunchArgv)
	}
	if ids := modelsVia(t, h.m, w); !slices.Contains(ids, "qwen3-4b") {
		t.Errorf("/v1/models through the dialer lists %q", ids)
	}
	for _, s := range []fleet.WorkerState{fleet.WorkerPending, fleet.WorkerStarting, fleet.WorkerProbation, fleet.WorkerReady} {
		if !h.rec.sawState(w.Name(), s) {
			t.Errorf("OnWorker never reported %s", s)
		}
	}
	if !h.rec.eventLike("launched PID " + strconv.Itoa(w.PID)) {
		t.Errorf("no launch event:\n%s", h.rec.dump())
	}
	pidFile := filepath.Join(NodeStateDir(data, "max"), enginectl.FileStem("max", "qwen3-4b")+".pid")
	if _, err := os.Stat(pidFile); err != nil {
		t.Errorf("sim node's pid file is not in its state dir under the data dir: %v", err)
	}
	nodes := h.m.Nodes()
	if len(nodes) != 2 || nodes[0].State != fleet.NodeUp || nodes[0].Platform == nil || nodes[0].Platform.Chip != "Apple M4 Max" {
		t.Errorf("nodes = %+v", nodes)
	}

	// Crash: the worker leaves ready and comes back with a new engine.
	killEngine(t, w.PID)
	h.waitWorker(w.Name(), "failed after the crash", func(x fleet.Worker) bool { return x.State != fleet.WorkerReady || x.PID != w.PID })
	re := h.waitWorker(w.Name(), "ready again", func(x fleet.Worker) bool { return x.State == fleet.WorkerReady && x.PID != w.PID })
	if !h.rec.sawState(w.Name(), fleet.WorkerFailed) || re.Restarts < 1 {
		t.Errorf("crash not reported as failed with a restart: restarts %d\n%s", re.Restarts, h.rec.dump())
	}
	if !h.rec.eventLike(fmt.Sprintf("engine PID %d exited", w.PID)) {
		t.Errorf("no event names the crashed PID:\n%s", h.rec.dump())
	}

	// The hub stops: engines keep running.
	before := h.m.Workers()
	h.stop()
	for _, x := range before {
		if !alive(x.PID) {
			t.Fatalf("stopping the manager killed engine %s PID %d", x.Name(), x.PID)
		}
	}

	// A new hub restores the stored workers and adopts them: same PIDs, no
	// second engine on any port.
	h2 := newHarness(t, data, func(o *ManagerOptions) { o.PortMin, o.PortMax = h.m.opts.PortMin, h.m.opts.PortMax })
	cleanupEngines(t, h2)
	h2.m.Restore(before)
	h2.m.SetDesired(simFleet(testModel(), "max", "ultra"))
	h2.run()
	for _, x := range before {
		got := h2.waitReady(x.Name())
		if got.PID != x.PID {
			t.Errorf("%s: PID %d after restart, want the adopted %d\n%s", x.Name(), got.PID, x.PID, h2.rec.dump())
		}
		if n := enginesOnPort(x.Port); len(n) != 1 {
			t.Errorf("%s: %d engines on port %d after restart, want 1: %v", x.Name(), len(n), x.Port, n)
		}
	}
	if !h2.rec.eventLike("adopted running engine") {
		t.Errorf("no adoption event:\n%s", h2.rec.dump())
	}

	// A restored worker whose engine died meanwhile is relaunched.
	h2.stop()
	dead := h2.m.Workers()
	killEngine(t, dead[0].PID)
	h3 := newHarness(t, data, func(o *ManagerOptions) { o.PortMin, o.PortMax = h.m.opts.PortMin, h.m.opts.PortMax })
	cleanupEngines(t, h3)
	h3.m.Restore(dead)
	h3.m.SetDesired(simFleet(testModel(), "max", "ultra"))
	h3.run()
	got := h3.waitReady(dead[0].Name())
	if got.PID == dead[0].PID {
		t.Errorf("a dead engine's PID %d was reported as adopted", got.PID)
	}
	other := h3.waitReady(dead[1].Name())
	if other.PID != dead[1].PID {
		t.Errorf("the live engine was not adopted: PID %d, want %d", other.PID, dead[1].PID)
	}
}

func TestManagerRecipeChangeRemovalAndOperatorActions(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "max"))
	h.run()
	w := h.waitReady("max/qwen3-4b")

	// The recipe gains an argument: the engine restarts with it.
	h.m.SetDesired(simFleet(testModel("--temp", "0.7"), "max"))
	re := h.waitWorker(w.Name(), "restarted with the new argv", func(x fleet.Worker) bool {
		return x.State == fleet.WorkerReady && slices.Contains(x.Argv, "0.7")
	})
	if re.PID == w.PID || alive(w.PID) {
		t.Errorf("old engine PID %d (alive %v) was not replaced (now %d)", w.PID, alive(w.PID), re.PID)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := h.m.StopWorker(ctx, w.Name()); err != nil {
		t.Fatal(err)
	}
	stopped, _ := h.worker(w.Name())
	if stopped.State != fleet.WorkerStopped || alive(re.PID) {
		t.Errorf("after StopWorker: state %s, engine alive %v", stopped.State, alive(re.PID))
	}
	if err := h.m.StartWorker(ctx, w.Name()); err != nil {
		t.Fatalf("StartWorker: %v\n%s", err, h.rec.dump())
	}
	started := h.waitReady(w.Name())
	if err := h.m.RestartWorker(ctx, w.Name()); err != nil {
		t.Fatalf("RestartWorker: %v", err)
	}
	restarted := h.waitReady(w.Name())
	if restarted.PID == started.PID || alive(started.PID) {
		t.Errorf("restart kept PID %d", started.PID)
	}
	if err := h.m.StopWorker(ctx, "nope/x"); err == nil || !strings.Contains(err.Error(), "no worker nope/x") {
		t.Errorf("unknown worker: %v", err)
	}
	if err := h.m.ForceAdmit(ctx, w.Name()); err == nil {
		t.Error("ForceAdmit of a ready worker succeeded")
	}

	// The placement goes: the engine stops and the worker is forgotten.
	f := simFleet(testModel("--temp", "0.7"), "max")
	f.Placements = nil
	h.m.SetDesired(f)
	deadline := time.Now().Add(60 * time.Second)
	for len(h.m.Workers()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("worker not removed: %+v", h.m.Workers())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if alive(restarted.PID) {
		t.Error("the removed placement's engine still runs")
	}
	h.rec.mu.Lock()
	removed := len(h.rec.removed)
	h.rec.mu.Unlock()
	if removed != 1 {
		t.Errorf("OnWorkerRemoved called %d times", removed)
	}
}

func TestManagerAdmissionRejects(t *testing.T) {
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) {
		o.Admit = func(_ context.Context, w fleet.Worker) error {
			return fmt.Errorf("single-request speed 20.0 tok/s is below half of the best worker's 90.0 tok/s")
		}
	})
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "max"))
	h.run()
	w := h.waitWorker("max/qwen3-4b", "rejected", func(x fleet.Worker) bool { return x.State == fleet.WorkerRejected })
	if !strings.Contains(w.Reason, "20.0 tok/s") || !alive(w.PID) {
		t.Errorf("rejected worker: reason %q, engine alive %v", w.Reason, alive(w.PID))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.m.ForceAdmit(ctx, w.Name()); err != nil {
		t.Fatal(err)
	}
	if x, _ := h.worker(w.Name()); x.State != fleet.WorkerReady || x.PID != w.PID {
		t.Errorf("after ForceAdmit: %+v", x)
	}
}

// The memory gate runs before the launch, on the node probed then: a worker
// that fails it never starts an engine, and admit --force launches it.
func TestManagerGateRejectsBeforeLaunch(t *testing.T) {
	var (
		mu     sync.Mutex
		judged []fleet.Node
	)
	added := time.Now()
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) {
		o.Gate = func(_ context.Context, w fleet.Worker, node fleet.Node, _ Held) ([]int, error) {
			mu.Lock()
			judged = append(judged, node)
			mu.Unlock()
			if len(w.Argv) == 0 {
				return nil, errors.New("the gate saw no command line")
			}
			return nil, fmt.Errorf("memory: qwen3-4b needs 90.0 GB but %s has %.1f GB usable", node.Name, float64(node.Platform.MemFreeBytes)/(1<<30))
		}
	})
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "max"))
	h.run()
	w := h.waitWorker("max/qwen3-4b", "rejected", func(x fleet.Worker) bool { return x.State == fleet.WorkerRejected })
	if !strings.Contains(w.Reason, "needs 90.0 GB but max has 40.0 GB usable") || w.PID != 0 {
		t.Errorf("rejected worker: reason %q, PID %d", w.Reason, w.PID)
	}
	// The gate is tried again (the node may free memory) without launching.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(judged)
		mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gate was not tried again\n%s", h.rec.dump())
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	first := judged[0]
	mu.Unlock()
	if first.Platform == nil || first.ProbedAt.Before(added) {
		t.Errorf("the gate judged node %+v, not one probed for the launch", first)
	}
	if h.rec.eventLike("launched PID") || h.rec.sawState(w.Name(), fleet.WorkerStarting) {
		t.Fatalf("an engine was launched for a worker that failed the memory gate\n%s", h.rec.dump())
	}
	if !h.rec.eventLike("rejected before launch, no engine started: memory: qwen3-4b needs 90.0 GB") {
		t.Errorf("no event gives the figures\n%s", h.rec.dump())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := h.m.ForceAdmit(ctx, w.Name()); err != nil {
		t.Fatalf("admit --force: %v\n%s", err, h.rec.dump())
	}
	if x := h.waitReady(w.Name()); !alive(x.PID) {
		t.Errorf("forced worker is ready without a live engine: %+v", x)
	}
}

// Two placements on one node whose memory together exceeds the node's: both
// are gated at once, before either engine runs, so a fresh probe shows each
// the whole free memory. The first to pass holds its memory until its engine
// is up, so the second is rejected, and launches once the first stops.
func TestManagerGateHoldsMemoryOfLaunchesInProgress(t *testing.T) {
	const gib = 1 << 30
	small, big := testModel(), testModel()
	small.MemoryGB = 20
	big.ID, big.MemoryGB = "qwen3-8b", 20
	f := simFleet(small, "max") // m4max: 40 GB free, of which a Mac's engine gets 30
	f.Models = append(f.Models, big)
	f.Placements = append(f.Placements, fleet.Placement{Model: big.ID, Node: "max"})

	var (
		mu      sync.Mutex
		running = map[string]bool{} // engines started, which a real probe sees once loaded
		calls   int
		bothIn  = make(chan struct{})
	)
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) {
		report := o.OnWorker
		o.OnWorker = func(w fleet.Worker) {
			mu.Lock()
			running[w.Name()] = w.PID != 0
			mu.Unlock()
			report(w)
		}
		o.Gate = func(_ context.Context, w fleet.Worker, node fleet.Node, h Held) ([]int, error) {
			held := h.Bytes
			mu.Lock()
			calls++
			first := calls == 1
			if calls == 2 {
				close(bothIn)
			}
			mu.Unlock()
			if first {
				// Give the other launch the chance to be gated at the same
				// time, as the two supervisors are started together.
				select {
				case <-bothIn:
				case <-time.After(5 * time.Second):
				}
			}
			mu.Lock()
			defer mu.Unlock()
			usable := node.Platform.UsableMemory() - min(held, node.Platform.UsableMemory())
			for name, up := range running {
				if up && name != w.Name() {
					usable -= min(20*gib, usable)
				}
			}
			if usable < 20*gib {
				return nil, fmt.Errorf("memory: %s needs 20.0 GB but %s has %.1f GB usable (%.1f GB held)", w.Model, node.Name, float64(usable)/gib, float64(held)/gib)
			}
			return nil, nil
		}
	})
	cleanupEngines(t, h)
	h.m.SetDesired(f)
	h.run()
	names := []string{"max/qwen3-4b", "max/qwen3-8b"}
	settled := func(x fleet.Worker) bool { return x.State == fleet.WorkerReady || x.State == fleet.WorkerRejected }
	a, b := h.waitWorker(names[0], "ready or rejected", settled), h.waitWorker(names[1], "ready or rejected", settled)
	if a.State == b.State {
		t.Fatalf("two engines of 20 GB each on a node with 30 GB usable: %s is %s and %s is %s; want one ready, one rejected\n%s",
			a.Name(), a.State, b.Name(), b.State, h.rec.dump())
	}
	up, down := a, b
	if a.State == fleet.WorkerRejected {
		up, down = b, a
	}
	if !strings.Contains(down.Reason, "20.0 GB held") || down.PID != 0 {
		t.Errorf("rejected worker: reason %q, PID %d; want a rejection that counts the other launch's 20 GB, no engine", down.Reason, down.PID)
	}
	h.m.holds.mu.Lock()
	left := fmt.Sprint(h.m.holds.byNode)
	h.m.holds.mu.Unlock()
	if left != "map[]" {
		t.Errorf("memory still held after %s came up: %s", up.Name(), left)
	}

	// Once the engine that came up stops, its memory is free: the rejected
	// worker passes its next gate (its hold would still count if never released).
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := h.m.StopWorker(ctx, up.Name()); err != nil {
		t.Fatal(err)
	}
	if x := h.waitReady(down.Name()); !alive(x.PID) {
		t.Errorf("%s is ready without a live engine: %+v", x.Name(), x)
	}
}

// A worker rejected after its launch keeps its engine for RejectedGrace, can
// be re-judged meanwhile without a restart, and then has its engine stopped
// while it stays rejected and down until started.
func TestManagerRejectedEngineStopsAfterGrace(t *testing.T) {
	var (
		mu     sync.Mutex
		reject = true
	)
	const grace = 3 * time.Second
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) {
		o.RejectedGrace = grace
		o.Admit = func(context.Context, fleet.Worker) error {
			mu.Lock()
			defer mu.Unlock()
			if reject {
				return errors.New("shape: differs from the reference")
			}
			return nil
		}
	})
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "max"))
	h.run()
	name := "max/qwen3-4b"
	w := h.waitWorker(name, "rejected", func(x fleet.Worker) bool { return x.State == fleet.WorkerRejected })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Re-judged without a restart: admitted, then rejected again.
	if err := h.m.Judge(ctx, name, nil); err != nil {
		t.Fatalf("Judge(admit): %v", err)
	}
	if x, _ := h.worker(name); x.State != fleet.WorkerReady || x.PID != w.PID {
		t.Fatalf("after an admitting verdict: %+v (engine was PID %d)", x, w.PID)
	}
	if err := h.m.Judge(ctx, name, errors.New("speed: 10.0 tok/s is below 50% of 90.0")); err != nil {
		t.Fatalf("Judge(reject): %v", err)
	}
	if x, _ := h.worker(name); x.State != fleet.WorkerRejected || x.PID != w.PID || !strings.Contains(x.Reason, "10.0 tok/s") {
		t.Fatalf("after a rejecting verdict: %+v", x)
	}

	stopped := h.waitWorker(name, "rejected with its engine stopped", func(x fleet.Worker) bool {
		return x.State == fleet.WorkerRejected && x.PID == 0
	})
	if alive(w.PID) {
		t.Errorf("engine PID %d still runs after the grace", w.PID)
	}
	if !strings.Contains(stopped.Reason, "10.0 tok/s") || !strings.Contains(stopped.Reason, rejectedStoppedNote) {
		t.Errorf("reason %q does not keep the rejection and say the engine stopped", stopped.Reason)
	}
	if err := h.m.Judge(ctx, name, nil); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("Judge of a worker whose engine is down: %v", err)
	}
	// It stays down (parked): a few reconcile rounds later nothing relaunched.
	time.Sleep(5 * 200 * time.Millisecond)
	if x, _ := h.worker(name); x.PID != 0 || x.State != fleet.WorkerRejected {
		t.Fatalf("a parked rejected worker was relaunched: %+v\n%s", x, h.rec.dump())
	}
	// start launches it and judges it again.
	mu.Lock()
	reject = false
	mu.Unlock()
	if err := h.m.StartWorker(ctx, name); err != nil {
		t.Fatalf("StartWorker: %v\n%s", err, h.rec.dump())
	}
	if x := h.waitReady(name); !alive(x.PID) {
		t.Errorf("started worker: %+v", x)
	}
}

func TestManagerLocalNodeAndLaunchFailure(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	cleanupEngines(t, h)
	// The broken model's engine crashes before it ever listens; the good
	// one runs on the hub's own machine.
	broken := localModel("--exit-after", "300ms", "--no-listen")
	broken.ID = "broken"
	good := localModel()
	h.m.SetDesired(fleet.Fleet{
		Nodes:      []fleet.Node{{Name: "hub", Address: "local"}},
		Models:     []fleet.Model{good, broken},
		Placements: []fleet.Placement{{Model: good.ID, Node: "hub"}, {Model: broken.ID, Node: "hub"}},
	})
	h.run()
	w := h.waitReady("hub/qwen3-4b")
	if w.Argv[0] != fakeEngine || w.Simulated {
		t.Errorf("local worker Argv %q simulated %v", w.Argv, w.Simulated)
	}
	b := h.waitWorker("hub/broken", "failed", func(x fleet.Worker) bool { return x.State == fleet.WorkerFailed && x.Restarts >= 1 })
	if !strings.Contains(b.Reason, "exited before it was ready") {
		t.Errorf("failure reason %q does not say the engine exited", b.Reason)
	}
	if b.Port == w.Port {
		t.Errorf("two workers of one node share port %d", w.Port)
	}
}

func TestManagerUnknownModelFails(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	f := simFleet(testModel(), "max")
	f.Placements = append(f.Placements, fleet.Placement{Model: "ghost", Node: "max"})
	h.m.SetDesired(f)
	h.run()
	cleanupEngines(t, h)
	w := h.waitWorker("max/ghost", "failed", func(x fleet.Worker) bool { return x.State == fleet.WorkerFailed })
	if !strings.Contains(w.Reason, "model ghost is not defined") {
		t.Errorf("reason %q", w.Reason)
	}
	h.waitReady("max/qwen3-4b")
}
