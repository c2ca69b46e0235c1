package main

import (
	"database/sql"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/pgtest"
)

// orphanedAction is in the answer to an action whose leader died carrying
// it out: the next leader fails it (store.FailOrphanedActions).
const orphanedAction = "stopped before it said how it ended"

// failoverCase is one run of the failover sweep: the leader kills itself at
// point, in scenario's action, asked on the follower or on the leader.
type failoverCase struct {
	scenario, point string
	onFollower      bool
	// mayFinish: the action may have ended, and said so, before the leader
	// reached point (launches and retirements run after an apply's answer).
	mayFinish bool
}

func (tc failoverCase) name() string {
	on := "asked-on-leader"
	if tc.onFollower {
		on = "asked-on-follower"
	}
	return tc.scenario + "@" + tc.point + "/" + on
}

// A failover is a hub killed at any instant. Two hubs on one PostgreSQL
// database run the demo fleet; the leader kills itself with SIGKILL at one
// of the one-hub sweep's crash points (TestHubKilledAtEveryCrashPointLosesNothing)
// in an apply that adds placements, `stop all`, a drain or an apply that
// removes a placement, asked on the leader or on the follower (the action
// then travels to the leader through the action queue). The follower takes
// the lease and must leave the fleet as a restarted hub does: every engine
// is the engine of exactly one worker, none is launched twice across the
// two hubs' terms, the engines of the workers nothing touched are the same
// processes, every accepted stop is carried out; the action the dead
// leader took and did not finish is failed to its caller with a word to
// look at the fleet, and no action is left pending or running. The lease's
// own point: the follower dies right after taking the lease, before
// adopting anything (so the former leader's stop is neither done nor
// failed), and the former leader, started again, leads after it.
//
// The points of one run share nothing (a schema and two data dirs each), so
// they run side by side.
func TestLeaderKilledAtEveryCrashPointFailsOver(t *testing.T) {
	t.Parallel()
	cases := []failoverCase{
		{scenario: "add", point: "apply.stored", onFollower: true},
		{scenario: "add", point: "launch.recorded", mayFinish: true},
		{scenario: "add", point: "launch.started", onFollower: true, mayFinish: true},
		{scenario: "add", point: "launch.saved", mayFinish: true},
		// Reached on the hub asked only, which holds the stops itself
		// when it leads.
		{scenario: "stop", point: "stop.accepted"},
		{scenario: "stop", point: "stop.drained", onFollower: true},
		{scenario: "stop", point: "stop.held"},
		{scenario: "stop", point: "stop.signalled", onFollower: true},
		{scenario: "drain", point: "drain.recorded", onFollower: true},
		{scenario: "drain", point: "drain.recorded"},
		{scenario: "remove", point: "apply.stored"},
		{scenario: "remove", point: "retire.stopping", onFollower: true, mayFinish: true},
		{scenario: "remove", point: "stop.signalled", mayFinish: true},
		{scenario: "lease", point: "lease.taken", onFollower: true},
	}
	for _, tc := range cases {
		// Engine ports of their own for each run's fleet, away from the
		// default range other tests use: an engine that cannot bind (another
		// fleet's took its port) dies, and would look like one stopped or
		// lost in the failover.
		ports := enginePortsFor(t.Name() + "/" + tc.name())
		t.Run(tc.name(), func(t *testing.T) {
			t.Parallel()
			failOver(t, tc, ports)
		})
	}
}

func failOver(t *testing.T, tc failoverCase, ports fleet.PortRange) {
	dbURL := pgtest.URL(t)
	dataA, dataB := t.TempDir(), t.TempDir()
	portA := freePort(t)
	hubA := []string{"--database-url", dbURL, "--hub-name", "hub-a", "--engine-ports", ports.String()}
	flagsA := append(slices.Clone(hubA), "--demo")
	if tc.scenario == "add" {
		file := filepath.Join(dataA, "none.yaml")
		if err := os.WriteFile(file, []byte(demoPlacing(t)), 0o600); err != nil {
			t.Fatal(err)
		}
		flagsA = append(slices.Clone(hubA), "--fleet", file)
	}
	// The lease's point is the follower's: the leader dies first in a stop
	// asked on the follower, which dies on taking the lease.
	pointA := tc.point
	if tc.scenario == "lease" {
		pointA = "stop.drained"
	}
	a, armA := crashingHub(t, dataA, portA, pointA, flagsA...)
	if tc.scenario == "add" {
		waitProbedSince(t, dataA, time.Time{}, 3, 90*time.Second)
	} else {
		waitReady(t, dataA, 3, 120*time.Second)
	}
	hubB := []string{"--database-url", dbURL, "--hub-name", "hub-b", "--engine-ports", ports.String()}
	var b *hubProc
	armB := func() {}
	if tc.scenario == "lease" {
		b, armB = crashingHub(t, dataB, freePort(t), "lease.taken", hubB...)
	} else {
		b = launchHub(t, dataB, freePort(t), hubB...)
	}
	waitRole(t, dataB, "follower", 60*time.Second)
	// The engines before, as the follower sees them.
	before := map[string]int{}
	if tc.scenario != "add" {
		for _, w := range waitReady(t, dataB, 3, 60*time.Second) {
			before[w.Name()] = w.PID
		}
	}

	asked := dataA
	if tc.onFollower {
		asked = dataB
	}
	var stdin string
	var args []string
	switch tc.scenario {
	case "add":
		stdin, args = demoPlacing(t, "rig", "ultra", "max"), []string{"apply", "-f", "-"}
	case "remove":
		stdin, args = demoPlacing(t, "rig", "ultra"), []string{"apply", "-f", "-"}
	case "stop":
		args = []string{"stop", "all"}
	case "lease":
		args = []string{"stop", "rig/qwen3-4b"}
	case "drain":
		args = []string{"drain", "rig/qwen3-4b"}
	}
	armA()
	armB()
	// Asked on the follower, the command returns once the next leader has
	// failed (or finished) the action; asked on the leader, when it dies.
	out, code := fleetCmdIn(t, asked, stdin, args...)
	waitKilled(t, a, pointA)
	// The engines running once the leader is dead: in an apply that adds,
	// none may be stopped or launched again.
	running := simsIn(dataA, dataB)
	leader, leaderName := dataB, "hub-b"
	if tc.scenario == "lease" {
		waitKilled(t, b, "lease.taken")
		// hub-a again, unarmed: it takes its name back, and the lease once
		// hub-b's expires.
		launchHub(t, dataA, portA, hubA...)
		leader, leaderName = dataA, "hub-a"
	}
	if st := waitRole(t, leader, "leader", 90*time.Second); st.Leader != leaderName {
		t.Errorf("the new leader says %q leads; want %s", st.Leader, leaderName)
	}

	var ws []fleet.WorkerView
	switch tc.scenario {
	case "add":
		ws = waitReady(t, leader, 3, 120*time.Second)
		for _, pid := range running {
			if !slices.ContainsFunc(ws, func(w fleet.WorkerView) bool { return w.PID == pid }) {
				t.Errorf("engine PID %d ran when the leader died and is no worker's engine after the failover (workers %+v)", pid, ws)
			}
		}
	case "drain":
		// rig stays drained (no new requests): draining, not ready.
		ws = waitWorkers(t, leader, 90*time.Second, func(ws []fleet.WorkerView) bool {
			return len(ws) == 3 && !slices.ContainsFunc(ws, func(w fleet.WorkerView) bool {
				return w.State != fleet.WorkerReady && w.State != fleet.WorkerDraining
			})
		})
		for _, w := range ws {
			if w.Drained != (w.Node == "rig") {
				t.Errorf("%s drained=%v after the failover; only rig's drain was asked for", w.Name(), w.Drained)
			}
		}
	case "stop", "lease":
		// A stop is accepted once its hold is recorded: each held worker
		// is stopped for good; one whose stop never got that far runs on.
		ws = waitWorkers(t, leader, 90*time.Second, func(ws []fleet.WorkerView) bool {
			return len(ws) == 3 && !slices.ContainsFunc(ws, func(w fleet.WorkerView) bool {
				if w.Held {
					return w.State != fleet.WorkerStopped || w.PID != 0
				}
				return w.State != fleet.WorkerReady
			})
		})
		held := 0
		for _, w := range ws {
			if w.Held {
				held++
				if runs(before[w.Name()], dataA, dataB) {
					t.Errorf("%s is held and stopped, but its engine PID %d still runs", w.Name(), before[w.Name()])
				}
			}
		}
		// Which holds were recorded before the leader died: on the leader,
		// `stop all` records all three before its first drain; the one
		// stop asked in the lease's run, before its drain; on the follower,
		// the leader holds each worker as it takes its action, so at least
		// the one that reached the point.
		want := 1
		if tc.scenario == "stop" && !tc.onFollower {
			want = 3
		}
		if held < want {
			t.Errorf("%d workers held after the failover, want at least %d: a stop accepted before the leader died was lost: %+v", held, want, ws)
		}
	case "remove":
		const removed = "max/qwen3-4b"
		waitSims(t, 2, 90*time.Second, dataA, dataB)
		ws = waitWorkers(t, leader, 60*time.Second, func(ws []fleet.WorkerView) bool {
			return len(ws) == 2 && !slices.ContainsFunc(ws, func(w fleet.WorkerView) bool { return w.State != fleet.WorkerReady })
		})
		if runs(before[removed], dataA, dataB) {
			t.Errorf("the engine of the removed placement, PID %d, still runs", before[removed])
		}
	}
	checkEnginesTracked(t, ws, dataA, dataB)
	// Nothing restarted: the engine of each worker nothing stopped is the
	// process it was before the failover.
	for _, w := range ws {
		if pid, ok := before[w.Name()]; ok && !w.Held && w.PID != pid {
			t.Errorf("%s: engine PID %d after the failover, was %d: restarted, not adopted", w.Name(), w.PID, pid)
		}
	}

	// Every action queued for the leader has ended; one the dead leader
	// was carrying out is failed with the word to look at the fleet.
	actions := waitActionsEnded(t, dbURL)
	if !tc.onFollower && len(actions) > 0 {
		t.Errorf("actions queued though everything was asked on the leader: %+v", actions)
	}
	for _, ac := range actions {
		if ac.state == "failed" && !strings.Contains(ac.result, orphanedAction) && !strings.Contains(ac.result, "no hub holds the leader's lease") {
			t.Errorf("action %s %s failed with %q; want it failed as orphaned by the dead leader", ac.action, ac.target, ac.result)
		}
	}
	// What the caller was told.
	callerDied := !tc.onFollower || tc.scenario == "lease"
	switch {
	case callerDied:
		if code != 0 && !strings.Contains(out, "the hub closed the connection before the command finished") || code == 0 && !tc.mayFinish {
			t.Errorf("`fleet %s` on the hub that died: exit %d; want it to say it was cut off:\n%s", strings.Join(args, " "), code, out)
		}
	case tc.mayFinish:
		if code != 0 && !strings.Contains(out, orphanedAction) {
			t.Errorf("`fleet %s` on the follower: exit %d; want it done, or failed as orphaned by the dead leader:\n%s", strings.Join(args, " "), code, out)
		}
	default:
		if code == 0 || !strings.Contains(out, orphanedAction) {
			t.Errorf("`fleet %s` on the follower: exit %d; want it failed as orphaned by the dead leader:\n%s", strings.Join(args, " "), code, out)
		}
	}
	// Each failed action's answer names what it was about: `stop all`
	// asks for one action per worker.
	for _, ac := range actions {
		if ac.state == "failed" && !callerDied && !strings.Contains(out, ac.target) {
			t.Errorf("the answer to `fleet %s` does not say which of its actions failed (%s %s):\n%s", strings.Join(args, " "), ac.action, ac.target, out)
		}
	}
	t.Logf("`fleet %s` on %s: exit %d:\n%s", strings.Join(args, " "), filepath.Base(asked), code, out)
}

// runs says whether engine pid runs from one of the data dirs. Not alive:
// a killed engine whose hub died first may stay a zombie where nothing
// reaps the orphans (PID 1 in some containers), and kill(pid, 0) finds it.
func runs(pid int, datas ...string) bool {
	return slices.Contains(simsIn(datas...), pid)
}

// queuedAction is a row of the actions table: an action asked on a
// follower for the leader.
type queuedAction struct {
	action, target, state, result string
}

// waitActionsEnded waits until no action in the fleet's database is pending
// or running, and returns them all.
func waitActionsEnded(t *testing.T, dbURL string) []queuedAction {
	t.Helper()
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		rows, err := db.Query(`SELECT action, target, state, result FROM actions ORDER BY id`)
		if err != nil {
			t.Fatalf("reading the queued actions: %v", err)
		}
		var all []queuedAction
		open := false
		for rows.Next() {
			var a queuedAction
			if err := rows.Scan(&a.action, &a.target, &a.state, &a.result); err != nil {
				t.Fatal(err)
			}
			all = append(all, a)
			open = open || a.state == "pending" || a.state == "running"
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
		if !open {
			return all
		}
		if time.Now().After(deadline) {
			t.Fatalf("actions still pending or running after the failover: %+v", all)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
