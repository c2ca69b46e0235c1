package nodes

import (
	"context"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/sshdtest"
)

// TestManagerOverSSH drives a real sshd as a remote node: probe, launch an
// engine with a recipe through SSH, reach it through the SSH tunnel, lose the
// node (its workers leave ready), get it back (the same engine is adopted,
// not restarted), and adopt it again after the hub itself restarts.
func TestManagerOverSSH(t *testing.T) {
	s := sshdtest.New(t)
	s.Start()
	keys := &MemoryHostKeys{}
	remoteState := t.TempDir()
	mutate := func(o *ManagerOptions) {
		o.HostKeys = keys
		o.RemoteStateDir = remoteState
		o.Transport = Options{KeepaliveInterval: 200 * time.Millisecond, KeepaliveMissed: 3, ReconnectBackoffMax: 500 * time.Millisecond}
	}
	h := newHarness(t, t.TempDir(), mutate)
	cleanupEngines(t, h)
	desired := fleet.Fleet{
		Nodes:      []fleet.Node{{Name: "rig", Address: s.Address(), Identity: s.Identity()}},
		Models:     []fleet.Model{localModel()},
		Placements: []fleet.Placement{{Model: "qwen3-4b", Node: "rig"}},
	}
	h.m.SetDesired(desired)
	h.run()

	w := h.waitReady("rig/qwen3-4b")
	if !alive(w.PID) {
		t.Fatalf("engine PID %d is not running", w.PID)
	}
	nodes := h.m.Nodes()
	if nodes[0].Platform == nil || nodes[0].Platform.OS != "linux" || !strings.HasPrefix(nodes[0].HostKey, "ssh-ed25519 ") {
		t.Errorf("probed node = %+v", nodes[0])
	}
	if ids := modelsVia(t, h.m, w); len(ids) == 0 || ids[0] != "qwen3-4b" {
		t.Errorf("/v1/models through the SSH tunnel: %q", ids)
	}

	// The node's sshd dies: the worker leaves ready within a probe interval
	// or two, though its engine keeps running on the node.
	s.Kill()
	lost := time.Now()
	h.waitWorker(w.Name(), "out of the ready set", func(x fleet.Worker) bool { return x.State != fleet.WorkerReady })
	t.Logf("worker left ready %v after sshd died", time.Since(lost).Round(time.Millisecond))
	if !alive(w.PID) {
		t.Fatal("the engine died with the node's sshd")
	}
	h.waitWorker(w.Name(), "failed with the node named", func(x fleet.Worker) bool {
		return x.State == fleet.WorkerFailed && strings.Contains(x.Reason, "rig")
	})

	// The node comes back: the same engine is adopted.
	s.Start()
	back := h.waitReady(w.Name())
	if back.PID != w.PID {
		t.Errorf("after the node returned: PID %d, want the adopted %d\n%s", back.PID, w.PID, h.rec.dump())
	}

	// The hub restarts: the engine on the remote node is adopted again.
	h.stop()
	h2 := newHarness(t, t.TempDir(), mutate)
	h2.m.Restore(h.m.Workers())
	h2.m.SetDesired(desired)
	h2.run()
	again := h2.waitReady(w.Name())
	if again.PID != w.PID || len(enginesOnPort(w.Port)) != 1 {
		t.Errorf("after a hub restart: PID %d (want %d), %d engines on the port", again.PID, w.PID, len(enginesOnPort(w.Port)))
	}

	// Stopping through SSH ends it.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := h2.m.StopWorker(ctx, w.Name()); err != nil {
		t.Fatal(err)
	}
	if alive(w.PID) {
		t.Error("engine still runs after StopWorker over SSH")
	}
}
