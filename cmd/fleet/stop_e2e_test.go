package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"fleet"
	"fleet/store"
)

// waitNoSims waits until no simulated engine of data runs.
func waitNoSims(t *testing.T, data string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for len(simsOf(data)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d simulated engines still run: %v", len(simsOf(data)), simsOf(data))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitProbedSince waits until n nodes have come up after since (their "node
// up" events): the hub has probed them, so its workers could have launched.
// The node table alone would not do: it starts from the states stored by
// the previous hub.
func waitProbedSince(t *testing.T, data string, since time.Time, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		out, _ := fleetCmd(t, data, "events", "--json", "--limit", "500")
		up := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var e fleet.Event
			if json.Unmarshal([]byte(line), &e) == nil && e.At.After(since) && strings.HasPrefix(e.Message, "node up:") {
				up[e.Subject] = true
			}
		}
		if len(up) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d nodes came up within %s of the restart: %v", len(up), n, within, up)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// `fleet stop all` leaves no engine process, a restarted hub launches none,
// and `fleet start all` brings the fleet back.
func TestDemoStopAllStaysStoppedAcrossRestart(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	port := freePort(t)
	h := startHub(t, data, port)
	waitReady(t, data, 3, 120*time.Second)
	if n := len(simsOf(data)); n != 3 {
		t.Fatalf("%d simulated engines before the stop, want 3", n)
	}

	out, code := fleetCmd(t, data, "stop", "all")
	if code != 0 || strings.Count(out, "stays stopped") != 3 {
		t.Fatalf("stop all: exit %d:\n%s", code, out)
	}
	waitNoSims(t, data, 30*time.Second)
	for _, w := range workersJSON(t, data) {
		if w.State != fleet.WorkerStopped || !w.Held || w.PID != 0 {
			t.Errorf("%s after stop all: %s held=%v PID %d", w.Name(), w.State, w.Held, w.PID)
		}
	}
	if audit, _ := fleetCmd(t, data, "audit"); strings.Count(audit, "stop") < 3 {
		t.Errorf("stop is not audited per worker:\n%s", audit)
	}

	h.cmd.Process.Signal(syscall.SIGTERM)
	h.cmd.Wait()
	restarted := time.Now()
	startHub(t, data, port)
	waitProbedSince(t, data, restarted, 3, 60*time.Second)
	// The nodes are up, so every worker's supervisor has looked at it;
	// give them a few reconcile rounds to do something they must not.
	time.Sleep(3 * time.Second)
	if n := len(simsOf(data)); n != 0 {
		t.Fatalf("the restarted hub launched %d engines of a stopped fleet", n)
	}
	for _, w := range workersJSON(t, data) {
		if w.State != fleet.WorkerStopped {
			t.Errorf("%s after the hub restarted: %s (%s), want stopped", w.Name(), w.State, w.Reason)
		}
	}

	if out, code := fleetCmd(t, data, "start", "all"); code != 0 {
		t.Fatalf("start all: exit %d:\n%s", code, out)
	}
	ws := waitReady(t, data, 3, 120*time.Second)
	for _, w := range ws {
		if w.Held {
			t.Errorf("%s still held after start all", w.Name())
		}
	}
	if n := len(simsOf(data)); n != 3 {
		t.Errorf("%d simulated engines after start all, want 3", n)
	}
}

// An empty fleet file removes the nodes and their placements together; their
// engines are stopped, not left running untracked.
func TestApplyEmptyFleetStopsEveryEngine(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	startHub(t, data, freePort(t))
	waitReady(t, data, 3, 120*time.Second)
	out, code := fleetCmdIn(t, data, "nodes: []\nmodels: []\nplacements: []\n", "apply", "-f", "-")
	if code != 0 {
		t.Fatalf("apply of an empty fleet from standard input: exit %d:\n%s", code, out)
	}
	waitNoSims(t, data, 60*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for len(workersJSON(t, data)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("workers still listed: %+v", workersJSON(t, data))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if events, _ := fleetCmd(t, data, "events", "--limit", "200"); strings.Contains(events, "may still run") {
		t.Errorf("an engine was left running:\n%s", events)
	}
}

// A hub killed right after an apply removed the nodes, before it stopped
// their engines, finds the pending stops when it starts again and carries
// them out through the nodes as recorded, though the fleet no longer has them.
func TestPendingStopsSurviveAHubKill(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	port := freePort(t)
	h := startHub(t, data, port)
	waitReady(t, data, 3, 120*time.Second)
	h.cmd.Process.Kill()
	h.cmd.Wait()
	if n := len(simsOf(data)); n != 3 {
		t.Fatalf("%d engines after the hub was killed, want its 3", n)
	}

	// The apply the killed hub committed: every node and placement gone.
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(data, "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.ApplyFleet(ctx, fleet.Fleet{}); err != nil {
		t.Fatal(err)
	}
	ps, err := st.PendingStops(ctx)
	st.Close()
	if err != nil || len(ps) != 3 {
		t.Fatalf("pending stops after the apply: %+v, %v; want the 3 engines", ps, err)
	}

	launchHub(t, data, port) // no fleet file: the stored, empty fleet
	waitNoSims(t, data, 60*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := store.Open(ctx, filepath.Join(data, "fleet.db"))
		if err != nil {
			t.Fatal(err)
		}
		ps, err = st.PendingStops(ctx)
		st.Close()
		if err == nil && len(ps) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pending stops not forgotten after their engines stopped: %+v, %v", ps, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A node removed from the fleet while it is unreachable keeps its engine on
// the hub's books: across a hub restart, the hub reaches the node again by
// the address and host key recorded with the pending stop, and stops it.
func TestUnreachableRemovedNodeIsStoppedAfterAHubRestart(t *testing.T) {
	t.Parallel()
	f := startSSHFleet(t, "remote")
	w := waitWorker(t, f.data, "remote/qwen3-4b", "ready", 120*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerReady })
	if !alive(w.PID) {
		t.Fatalf("engine PID %d is not running", w.PID)
	}

	f.sshd.Kill()
	waitWorker(t, f.data, w.Name(), "out of the ready set", 120*time.Second, func(x fleet.WorkerView) bool { return x.State != fleet.WorkerReady })
	if out, code := fleetCmdIn(t, f.data, "nodes: []\nmodels: []\nplacements: []\n", "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply of an empty fleet: exit %d:\n%s", code, out)
	}
	waitWorker(t, f.data, w.Name(), "waiting for its node", 120*time.Second, func(x fleet.WorkerView) bool {
		return strings.Contains(x.Reason, "is stopped once node remote is reachable again")
	})
	if !alive(w.PID) {
		t.Fatal("the engine died with the node's sshd; the test needs it running")
	}

	// The hub restarts on the stored (empty) fleet, then the node returns.
	f.hub.cmd.Process.Signal(syscall.SIGTERM)
	f.hub.cmd.Wait()
	f.hub = launchHub(t, f.data, f.httpPort, "--log-level", "debug")
	f.sshd.Start()
	deadline := time.Now().Add(90 * time.Second)
	for alive(w.PID) {
		if time.Now().After(deadline) {
			evs, _ := fleetCmd(t, f.data, "events", "--limit", "100")
			t.Fatalf("engine PID %d of the removed node still runs after the node returned:\n%s", w.PID, evs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	deadline = time.Now().Add(30 * time.Second)
	for len(workersJSON(t, f.data)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the stopped engine's worker is still listed: %+v", workersJSON(t, f.data))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
