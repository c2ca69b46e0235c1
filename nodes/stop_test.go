package nodes

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"fleet"
	"fleet/internal/sshdtest"
)

// Nodes that share a host share its ports, and a port is reserved the
// moment it is picked, so two workers launching at once cannot both get it
// (max and ultra, two sim nodes, were both given 18007).
func TestAllocatePortSharedHostPortSpace(t *testing.T) {
	min := sshdtest.FreePort(t)
	m := NewManager(ManagerOptions{PortMin: min, PortMax: min + 20})
	nodes := []fleet.Node{
		{Name: "max", Address: "sim:m4max-llamacpp"},
		{Name: "ultra", Address: "sim:m1ultra-llamacpp"},
		{Name: "hub", Address: fleet.AddressLocal},
		{Name: "loop", Address: "ops@127.0.0.1:2200"},
		{Name: "a", Address: "ops@box.lan:22"},
		{Name: "b", Address: "root@BOX.lan:2222"},
		{Name: "c", Address: "ops@other.lan"},
	}
	ws := map[string]*workerState{}
	for _, n := range nodes {
		m.nodes[n.Name] = &nodeState{node: n}
		ws[n.Name] = m.newWorkerState(n.Name+"/q", fleet.Placement{Node: n.Name, Model: "q"})
		m.workers[n.Name+"/q"] = ws[n.Name]
	}
	port := map[string]int{}
	for _, n := range nodes {
		p, err := m.allocatePort(ws[n.Name], n)
		if err != nil {
			t.Fatal(err)
		}
		port[n.Name] = p
		if ws[n.Name].w.Port != p {
			t.Errorf("%s: allocatePort returned %d but reserved %d", n.Name, p, ws[n.Name].w.Port)
		}
	}
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"max", "ultra", false}, // sim nodes: the hub's machine
		{"max", "hub", false},
		{"ultra", "loop", false}, // an SSH node at a loopback address is the hub's machine too
		{"a", "b", false},        // one host, two addresses
		{"a", "c", true},         // two hosts: each has its own ports
	} {
		if got := port[tc.a] == port[tc.b]; got != tc.same {
			t.Errorf("%s got port %d and %s got %d: same = %v, want %v", tc.a, port[tc.a], tc.b, port[tc.b], got, tc.same)
		}
	}
}

// An emptied fleet file removes nodes and placements at once: the engines
// are stopped through the node before it is let go, not left running
// untracked ("engine PID … may still run there").
func TestManagerRemovingNodesStopsTheirEngines(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "max", "ultra"))
	h.run()
	a := h.waitReady("max/qwen3-4b")
	b := h.waitReady("ultra/qwen3-4b")

	h.m.SetDesired(fleet.Fleet{})
	deadline := time.Now().Add(60 * time.Second)
	for len(h.m.Workers()) > 0 || len(h.m.Nodes()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("workers %+v / nodes %+v not let go\n%s", h.m.Workers(), h.m.Nodes(), h.rec.dump())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, w := range []fleet.Worker{a, b} {
		if alive(w.PID) {
			t.Errorf("%s: engine PID %d still runs after its node left the fleet\n%s", w.Name(), w.PID, h.rec.dump())
		}
	}
	if h.rec.eventLike("may still run") {
		t.Errorf("an engine was given up on:\n%s", h.rec.dump())
	}
}

// A pending stop left by a previous hub (the node is no longer in the
// fleet) is carried out by the next one through the node as recorded.
func TestManagerRestoreRemovedStopsTheEngine(t *testing.T) {
	data := t.TempDir()
	h := newHarness(t, data, nil)
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "max"))
	h.run()
	w := h.waitReady("max/qwen3-4b")
	h.stop()

	h2 := newHarness(t, data, func(o *ManagerOptions) { o.PortMin, o.PortMax = h.m.opts.PortMin, h.m.opts.PortMax })
	cleanupEngines(t, h2)
	h2.m.RestoreRemoved(w, fleet.Node{Name: "max", Address: "sim:m4max-llamacpp"})
	h2.m.SetDesired(fleet.Fleet{})
	h2.run()
	deadline := time.Now().Add(60 * time.Second)
	for alive(w.PID) || len(h2.m.Workers()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("engine PID %d (alive %v) of a removed node not stopped; workers %+v\n%s", w.PID, alive(w.PID), h2.m.Workers(), h2.rec.dump())
		}
		time.Sleep(50 * time.Millisecond)
	}
	h2.rec.mu.Lock()
	removed := len(h2.rec.removed)
	h2.rec.mu.Unlock()
	if removed != 1 {
		t.Errorf("OnWorkerRemoved called %d times, want 1 (the hub forgets the pending stop then)", removed)
	}
}

// fleet stop is a desired state: a restarted hub keeps the worker stopped,
// and one killed between recording the stop and stopping the engine stops
// the engine when it comes back.
func TestManagerHeldWorkerStaysStoppedAcrossRestarts(t *testing.T) {
	data := t.TempDir()
	h := newHarness(t, data, nil)
	cleanupEngines(t, h)
	h.m.SetDesired(simFleet(testModel(), "max", "ultra"))
	h.run()
	a := h.waitReady("max/qwen3-4b")
	b := h.waitReady("ultra/qwen3-4b")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := h.m.StopWorker(ctx, a.Name()); err != nil {
		t.Fatal(err)
	}
	stopped, _ := h.worker(a.Name())
	if !stopped.Held || stopped.State != fleet.WorkerStopped || alive(a.PID) {
		t.Fatalf("after StopWorker: %+v, engine alive %v", stopped, alive(a.PID))
	}
	h.stop()

	// ultra is recorded held but still running, as after a hub killed
	// between the two steps.
	restored := []fleet.Worker{stopped, b}
	restored[1].Held = true
	opts := func(o *ManagerOptions) { o.PortMin, o.PortMax = h.m.opts.PortMin, h.m.opts.PortMax }
	h2 := newHarness(t, data, opts)
	cleanupEngines(t, h2)
	h2.m.Restore(restored)
	h2.m.SetDesired(simFleet(testModel(), "max", "ultra"))
	h2.run()
	h2.waitWorker(b.Name(), "stopped", func(x fleet.Worker) bool { return x.State == fleet.WorkerStopped && x.PID == 0 })
	if alive(b.PID) {
		t.Errorf("held worker's engine PID %d still runs after the restarted hub checked it\n%s", b.PID, h2.rec.dump())
	}
	// Both nodes are up and the supervisors have looked: nothing launched.
	for _, n := range []string{"max", "ultra"} {
		waitNodeUp(t, h2, n)
	}
	time.Sleep(5 * h2.m.opts.ReconcileInterval)
	for _, w := range h2.m.Workers() {
		if w.State != fleet.WorkerStopped || !w.Held || w.PID != 0 {
			t.Errorf("%s after restart: %s held=%v PID %d, want stopped and held", w.Name(), w.State, w.Held, w.PID)
		}
	}
	if h2.rec.eventLike("launched PID") {
		t.Errorf("a held worker was launched:\n%s", h2.rec.dump())
	}

	// fleet start brings it back and clears the hold.
	if err := h2.m.StartWorker(ctx, a.Name()); err != nil {
		t.Fatalf("StartWorker: %v\n%s", err, h2.rec.dump())
	}
	if x := h2.waitReady(a.Name()); x.Held || !alive(x.PID) {
		t.Errorf("after StartWorker: %+v, alive %v", x, alive(x.PID))
	}
}

func waitNodeUp(t *testing.T, h *harness, name string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		for _, n := range h.m.Nodes() {
			if n.Name == name && n.State == fleet.NodeUp {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s never came up: %+v", name, h.m.Nodes())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// An engine whose node cannot be reached when its placement (and node) is
// removed, or when an operator stops it, is stopped once the node is back.
func TestManagerStopsWhenUnreachableNodeReturns(t *testing.T) {
	s := sshdtest.New(t)
	s.Start()
	mutate := func(o *ManagerOptions) {
		o.HostKeys = &MemoryHostKeys{}
		o.RemoteStateDir = t.TempDir()
		o.Transport = Options{KeepaliveInterval: 200 * time.Millisecond, KeepaliveMissed: 3, ReconnectBackoffMax: 500 * time.Millisecond}
	}
	h := newHarness(t, t.TempDir(), mutate)
	cleanupEngines(t, h)
	other := localModel()
	other.ID = "other"
	desired := fleet.Fleet{
		Nodes:      []fleet.Node{{Name: "rig", Address: s.Address(), Identity: s.Identity()}},
		Models:     []fleet.Model{localModel(), other},
		Placements: []fleet.Placement{{Model: "qwen3-4b", Node: "rig"}, {Model: "other", Node: "rig"}},
	}
	h.m.SetDesired(desired)
	h.run()
	w := h.waitReady("rig/qwen3-4b")
	o := h.waitReady("rig/other")

	s.Kill()
	h.waitWorker(w.Name(), "out of the ready set", func(x fleet.Worker) bool { return x.State != fleet.WorkerReady })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := h.m.StopWorker(ctx, o.Name())
	if err == nil || !strings.Contains(err.Error(), "once the node is reachable") {
		t.Errorf("stopping a worker of an unreachable node: %v, want it to say the stop waits for the node", err)
	}
	h.m.SetDesired(fleet.Fleet{Models: desired.Models})
	h.waitWorker(w.Name(), "waiting to be stopped", func(x fleet.Worker) bool {
		return strings.Contains(x.Reason, "is stopped once node rig is reachable again")
	})
	if !alive(w.PID) || !alive(o.PID) {
		t.Fatal("the engines died with the node's sshd; the test needs them running")
	}

	s.Start()
	deadline := time.Now().Add(90 * time.Second)
	for alive(w.PID) || alive(o.PID) {
		if time.Now().After(deadline) {
			t.Fatalf("engines PID %d (alive %v), %d (alive %v) not stopped after the node returned\n%s", w.PID, alive(w.PID), o.PID, alive(o.PID), h.rec.dump())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if h.rec.eventLike("may still run") {
		t.Errorf("an engine was given up on:\n%s", h.rec.dump())
	}
}

// Another process on the host takes the port fleet just found free before
// the engine binds it: the worker moves to another port at once instead of
// failing into a 10 s backoff (the demo took 21 s instead of 6).
func TestManagerLaunchLosesItsPortToAStranger(t *testing.T) {
	dir := t.TempDir()
	// The first launch starts a stranger on the engine's port, in a session
	// of its own (not the engine's group), and never listens itself; later
	// launches run the engine.
	script := filepath.Join(dir, "llama-server")
	body := `#!/bin/sh
port=""; prev=""
for a in "$@"; do [ "$prev" = "--port" ] && port=$a; prev=$a; done
if [ ! -e ` + dir + `/taken ]; then
	: > ` + dir + `/taken
	setsid ` + fakeEngine + ` --port "$port" -a stranger </dev/null >/dev/null 2>&1 &
	exec sleep 600
fi
exec ` + fakeEngine + ` "$@"
`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) {
		o.RestartBackoff = func(int) time.Duration { return time.Hour } // a backoff would fail the test
	})
	cleanupEngines(t, h)
	m := localModel()
	r := m.Recipes[fleet.EngineLlamaCpp]
	r.Bin = script
	m.Recipes[fleet.EngineLlamaCpp] = r
	h.m.SetDesired(fleet.Fleet{
		Nodes:      []fleet.Node{{Name: "hub", Address: fleet.AddressLocal}},
		Models:     []fleet.Model{m},
		Placements: []fleet.Placement{{Model: m.ID, Node: "hub"}},
	})
	h.run()
	w := h.waitReady("hub/qwen3-4b")
	var first int
	h.rec.mu.Lock()
	for _, x := range h.rec.workers {
		if x.Port != 0 && first == 0 {
			first = x.Port
		}
	}
	h.rec.mu.Unlock()
	t.Cleanup(func() {
		for _, pid := range enginesOnPort(first) {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	})
	if w.Port == first || w.Restarts != 0 {
		t.Errorf("ready on port %d (first picked %d) after %d restarts; want another port and no failure\n%s", w.Port, first, w.Restarts, h.rec.dump())
	}
	if !h.rec.eventLike("launching again on another port") {
		t.Errorf("no event says the port was lost:\n%s", h.rec.dump())
	}
	if len(enginesOnPort(first)) != 1 {
		t.Errorf("the stranger on port %d was touched: %v", first, enginesOnPort(first))
	}
}
