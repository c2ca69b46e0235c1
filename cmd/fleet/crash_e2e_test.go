package main

import (
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"fleet"
	"fleet/fleetfile"
)

// demoPlacing is the demo fleet with its one model placed on nodes only
// (none: no placement at all).
func demoPlacing(t *testing.T, nodes ...string) string {
	t.Helper()
	const all = "placements:\n  - model: qwen3-4b\n    nodes: [rig, ultra, max]\n"
	demo := string(fleetfile.Demo)
	if !strings.HasSuffix(demo, all) {
		t.Fatalf("the demo fleet no longer ends with %q; adapt demoPlacing", all)
	}
	placed := "placements: []\n"
	if len(nodes) > 0 {
		placed = fmt.Sprintf("placements:\n  - model: qwen3-4b\n    nodes: [%s]\n", strings.Join(nodes, ", "))
	}
	return strings.TrimSuffix(demo, all) + placed
}

// crashingHub starts `fleet serve` on data with FLEET_CRASH_AT=point: once
// armed, it kills itself with SIGKILL the first time it passes point. Only
// this process has the point in its environment: the hubs started after
// it, or beside it in parallel tests, are not armed.
func crashingHub(t *testing.T, data string, port int, point string, flags ...string) (*hubProc, func()) {
	t.Helper()
	armedBy := filepath.Join(data, "crash.armed")
	h := launchHubEnv(t, data, port, []string{"FLEET_CRASH_AT=" + point, "FLEET_CRASH_ARMED_BY=" + armedBy}, flags...)
	arm := func() {
		if err := os.WriteFile(armedBy, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return h, arm
}

// waitKilled waits for the hub to die at its crash point.
func waitKilled(t *testing.T, h *hubProc, point string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- h.cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != -1 {
			t.Fatalf("the hub was to be killed at %s, but it ended with %v", point, err)
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("the hub never reached the crash point %s", point)
	}
}

// checkEnginesTracked: every engine process run from the data dirs (those
// of every hub of the fleet) is the engine of exactly one worker, by PID,
// and no worker's engine runs twice.
func checkEnginesTracked(t *testing.T, ws []fleet.WorkerView, datas ...string) {
	t.Helper()
	owner := map[int]string{}
	for _, w := range ws {
		if w.PID > 0 {
			if o, dup := owner[w.PID]; dup {
				t.Errorf("workers %s and %s both claim engine PID %d", o, w.Name(), w.PID)
			}
			owner[w.PID] = w.Name()
		}
	}
	sims := simsIn(datas...)
	for _, pid := range sims {
		if _, ok := owner[pid]; !ok {
			t.Errorf("engine PID %d runs untracked: no worker has it (workers %v)", pid, owner)
		}
	}
	if len(sims) != len(owner) {
		t.Errorf("%d engine processes run for %d workers with an engine: %v, %v", len(sims), len(owner), sims, owner)
	}
}

// simsIn lists the simulated engines run from any of the data dirs.
func simsIn(datas ...string) []int {
	var pids []int
	for _, data := range datas {
		pids = append(pids, simsOf(data)...)
	}
	return pids
}

// waitSims waits until exactly n engines run from the data dirs.
func waitSims(t *testing.T, n int, within time.Duration, datas ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for len(simsIn(datas...)) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d engines run, want %d: %v", len(simsIn(datas...)), n, simsIn(datas...))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A hub killed with SIGKILL at any of the points where a crash is worst, in
// an apply that adds placements, a launch, `stop all`, a drain and an apply
// that removes a placement, loses nothing and leaks nothing once it is
// started again: every engine process is tracked by its worker, none runs
// twice, every accepted stop is carried out and every drain kept. The hub
// kills itself at a named point (FLEET_CRASH_AT), one run per point; the
// runs share nothing (a data dir and engine ports each), so they run side
// by side.
func TestHubKilledAtEveryCrashPointLosesNothing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		scenario, point string
	}{
		{"add", "apply.stored"},
		{"add", "launch.recorded"},
		{"add", "launch.started"},
		{"add", "launch.saved"},
		{"stop", "stop.accepted"},
		{"stop", "stop.drained"},
		{"stop", "stop.held"},
		{"stop", "stop.signalled"},
		{"drain", "drain.recorded"},
		{"remove", "apply.stored"},
		{"remove", "retire.stopping"},
		{"remove", "stop.signalled"},
	}
	var tried atomic.Int32
	// After every run: the parallel runs start once this function returns.
	t.Cleanup(func() {
		t.Logf("killed the hub at %d crash points of %d (apply, launch, stop, drain, retire)", tried.Load(), len(cases))
	})
	for _, tc := range cases {
		name := tc.scenario + "@" + tc.point
		ports := "--engine-ports=" + enginePortsFor(t.Name()+"/"+name).String()
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data := t.TempDir()
			port := freePort(t)
			switch tc.scenario {
			case "add":
				file := filepath.Join(data, "none.yaml")
				if err := os.WriteFile(file, []byte(demoPlacing(t)), 0o600); err != nil {
					t.Fatal(err)
				}
				h, arm := crashingHub(t, data, port, tc.point, "--fleet", file, ports)
				waitProbedSince(t, data, time.Time{}, 3, 60*time.Second)
				arm()
				// The apply's answer is lost with the hub; its exit status says nothing.
				fleetCmdIn(t, data, demoPlacing(t, "rig", "ultra", "max"), "apply", "-f", "-")
				waitKilled(t, h, tc.point)
				tried.Add(1)
				launchHub(t, data, port, ports)
				ws := waitReady(t, data, 3, 120*time.Second)
				checkEnginesTracked(t, ws, data)

			case "stop", "drain":
				h, arm := crashingHub(t, data, port, tc.point, "--demo", ports)
				waitReady(t, data, 3, 120*time.Second)
				arm()
				if tc.scenario == "stop" {
					fleetCmd(t, data, "stop", "all")
				} else {
					fleetCmd(t, data, "drain", "rig/qwen3-4b")
				}
				waitKilled(t, h, tc.point)
				tried.Add(1)
				launchHub(t, data, port, ports)
				// The killed action's lines say so once the hub is back.
				defer checkInterrupted(t, data, fleet.ActionName(tc.scenario))
				if tc.scenario == "drain" {
					// rig stays drained (no new requests): draining, not ready.
					ws := waitWorkers(t, data, 90*time.Second, func(ws []fleet.WorkerView) bool {
						return len(ws) == 3 && !slices.ContainsFunc(ws, func(w fleet.WorkerView) bool {
							return w.State != fleet.WorkerReady && w.State != fleet.WorkerDraining
						})
					})
					checkEnginesTracked(t, ws, data)
					for _, w := range ws {
						if w.Drained != (w.Node == "rig") {
							t.Errorf("%s drained=%v after the restart; only rig's drain was asked for", w.Name(), w.Drained)
						}
					}
					return
				}
				// Every stop was accepted (held) before the first drain:
				// each is carried out, and none comes back.
				waitNoSims(t, data, 60*time.Second)
				ws := waitWorkers(t, data, 60*time.Second, func(ws []fleet.WorkerView) bool {
					return len(ws) == 3 && !slices.ContainsFunc(ws, func(w fleet.WorkerView) bool { return w.State != fleet.WorkerStopped })
				})
				for _, w := range ws {
					if !w.Held || w.PID != 0 {
						t.Errorf("%s after the restart: %s held=%v PID %d, want stopped and held", w.Name(), w.State, w.Held, w.PID)
					}
				}
				checkEnginesTracked(t, ws, data)

			case "remove":
				h, arm := crashingHub(t, data, port, tc.point, "--demo", ports)
				waitReady(t, data, 3, 120*time.Second)
				arm()
				fleetCmdIn(t, data, demoPlacing(t, "rig", "ultra"), "apply", "-f", "-")
				waitKilled(t, h, tc.point)
				tried.Add(1)
				launchHub(t, data, port, ports)
				waitSims(t, 2, 60*time.Second, data)
				ws := waitWorkers(t, data, 60*time.Second, func(ws []fleet.WorkerView) bool {
					return len(ws) == 2 && !slices.ContainsFunc(ws, func(w fleet.WorkerView) bool { return w.State != fleet.WorkerReady })
				})
				checkEnginesTracked(t, ws, data)
			}
		})
	}
}

// checkInterrupted checks that once the hub is back after a kill no audit
// line says its action is still under way, and that action's lines (one a
// worker) say the kill cut it short.
func checkInterrupted(t *testing.T, data string, action fleet.ActionName) {
	t.Helper()
	es := auditJSON(t, data)
	interrupted := 0
	for _, e := range es {
		if e.Outcome == "started" {
			t.Errorf("after the hub came back, the audit line of %s %s still says started", e.Action, e.Target)
		}
		if e.Action == string(action) && strings.HasPrefix(e.Outcome, "interrupted: ") {
			interrupted++
		}
	}
	if interrupted == 0 {
		t.Errorf("no audit line of the killed %s says interrupted: %+v", action, es)
	}
}

// waitWorkers waits until the workers satisfy ok and returns them.
func waitWorkers(t *testing.T, data string, within time.Duration, ok func([]fleet.WorkerView) bool) []fleet.WorkerView {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ws := workersJSON(t, data)
		if ok(ws) {
			return ws
		}
		if time.Now().After(deadline) {
			evs, _ := fleetCmd(t, data, "events", "--limit", "60")
			t.Fatalf("workers not as expected within %s: %+v\nevents:\n%s", within, ws, evs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A hub started on a copy of another hub's database (the data dir's lock
// covers one directory only) is refused, and so cannot adopt, or stop, the
// first hub's engines; once an admin makes the copy a fleet of its own
// (`fleet fleet-id --new`), it runs its own engines and its `stop all`
// leaves the first hub's alone.
func TestHubOnACopiedDatabaseLeavesTheFirstHubsEngines(t *testing.T) {
	t.Parallel()
	first := t.TempDir()
	startHub(t, first, freePort(t))
	before := waitReady(t, first, 3, 120*time.Second)

	// A consistent copy, as SQLite's .backup makes it, while the first hub runs.
	copied := t.TempDir()
	db, err := sql.Open("sqlite3", filepath.Join(first, "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(`VACUUM INTO ?`, filepath.Join(copied, "fleet.db"))
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	port := freePort(t)
	h := launchHub(t, copied, port)
	done := make(chan error, 1)
	go func() { done <- h.cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the hub on the copy exited 0; want a refusal")
		}
	case <-time.After(30 * time.Second):
		ws := workersJSON(t, copied)
		t.Fatalf("a hub started on a copy of another hub's database and runs, with workers %+v", ws)
	}
	logs, _ := filepath.Glob(filepath.Join(copied, "hub-*.log"))
	var refusal []byte
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		refusal = append(refusal, b...)
	}
	if !strings.Contains(string(refusal), "fleet-id --new") || !strings.Contains(string(refusal), first) {
		t.Errorf("the refusal names neither the admin step nor the original data dir:\n%s", refusal)
	}

	out, code := fleetCmd(t, copied, "fleet-id", "--new")
	if code != 0 || !strings.Contains(out, "a fleet of its own") {
		t.Fatalf("fleet-id --new: exit %d:\n%s", code, out)
	}
	launchHub(t, copied, port)
	waitReady(t, copied, 3, 120*time.Second)
	if out, code := fleetCmd(t, copied, "stop", "all"); code != 0 {
		t.Fatalf("stop all on the copy: exit %d:\n%s", code, out)
	}
	waitNoSims(t, copied, 30*time.Second)

	after := workersJSON(t, first)
	for i, w := range before {
		if !alive(w.PID) {
			t.Errorf("the first hub's engine of %s (PID %d) was stopped by the hub on the copy", w.Name(), w.PID)
		}
		if i < len(after) && (after[i].PID != w.PID || after[i].State != fleet.WorkerReady) {
			t.Errorf("the first hub's %s: PID %d %s, was PID %d ready", w.Name(), after[i].PID, after[i].State, w.PID)
		}
	}
}
