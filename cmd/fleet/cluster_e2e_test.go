package main

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/pgtest"
)

// hubStatus is `fleet status --json` of the hub on data.
func hubStatus(t *testing.T, data string) fleet.HubStatus {
	t.Helper()
	out, code := fleetCmd(t, data, "status", "--json")
	var st fleet.HubStatus
	if code != 0 {
		t.Fatalf("fleet status --json: exit %d:\n%s", code, out)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, out)
	}
	return st
}

// waitRole waits until the hub on data says it has role, and returns its
// status.
func waitRole(t *testing.T, data, role string, within time.Duration) fleet.HubStatus {
	t.Helper()
	deadline := time.Now().Add(within)
	var st fleet.HubStatus
	for time.Now().Before(deadline) {
		// Until its control socket answers, the hub is still starting.
		if out, code := fleetCmd(t, data, "status", "--json"); code == 0 {
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatalf("status --json is not JSON: %v\n%s", err, out)
			}
			if st.HubRole == role {
				return st
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("the hub on %s is not %s within %s: %+v", data, role, within, st)
	return st
}

// auditLines counts the audit lines of action on target, on any hub (one
// database).
func auditLines(t *testing.T, data string, action fleet.ActionName, target string) []fleet.AuditEntry {
	t.Helper()
	var got []fleet.AuditEntry
	for _, e := range auditJSON(t, data) {
		if e.Action == string(action) && e.Target == target {
			got = append(got, e)
		}
	}
	return got
}

// TestTwoHubsOnePostgreSQL: two `fleet serve` processes on one PostgreSQL
// database, the demo fleet. The first leads, the second follows: it routes
// to the same ready workers, and says its role in status and /healthz.
// drain and stop run on the follower are carried out by the leader and
// audited once. kill -9 of the leader: the follower takes the lease and
// adopts every engine with the same PIDs (none restarted, none launched
// twice), and the stopped worker stays stopped.
func TestTwoHubsOnePostgreSQL(t *testing.T) {
	dbURL := pgtest.URL(t)
	dataA, dataB := t.TempDir(), t.TempDir()
	a := startHub(t, dataA, freePort(t), "--database-url", dbURL, "--hub-name", "hub-a")
	ws := waitReady(t, dataA, 3, 60*time.Second)
	pids := map[string]int{}
	for _, w := range ws {
		pids[w.Name()] = w.PID
	}
	b := startHub(t, dataB, freePort(t), "--database-url", dbURL, "--hub-name", "hub-b")

	stB := waitRole(t, dataB, "follower", 30*time.Second)
	if stB.Hub != "hub-b" || stB.Leader != "hub-a" || len(stB.Hubs) != 2 {
		t.Fatalf("the second hub's status: hub %q role %q leader %q hubs %+v; want hub-b following hub-a, two hubs", stB.Hub, stB.HubRole, stB.Leader, stB.Hubs)
	}
	if stA := hubStatus(t, dataA); stA.Hub != "hub-a" || stA.HubRole != "leader" || stA.Leader != "hub-a" {
		t.Fatalf("the first hub's status: hub %q role %q leader %q; want hub-a leading", stA.Hub, stA.HubRole, stA.Leader)
	}
	if out, _ := fleetCmd(t, dataB, "status"); !strings.Contains(out, "hub-b, follower (leader hub-a)") || !strings.Contains(out, "hub-a leader, heartbeat") {
		t.Errorf("fleet status on the follower does not say its role and the hubs:\n%s", out)
	}
	code, body := healthz(t, b.http)
	if code != http.StatusOK || !strings.Contains(body, `"role":"follower"`) || !strings.Contains(body, `"leader":"hub-a"`) {
		t.Errorf("/healthz on the follower: %d %s; want 200 with its role", code, body)
	}

	// The follower routes to the ready workers the leader runs.
	for _, w := range waitReady(t, dataB, 3, 30*time.Second) {
		if pids[w.Name()] != w.PID {
			t.Errorf("the follower sees %s with PID %d, the leader %d", w.Name(), w.PID, pids[w.Name()])
		}
	}
	if events, _ := streamChat(t, "http://"+b.http, 8); len(events) < 3 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("chat through the follower: %d events %q", len(events), events)
	}

	// drain on the follower: the leader carries it out, one audit line.
	const drained = "ultra/qwen3-4b"
	if out, code := fleetCmd(t, dataB, "drain", drained); code != 0 || !strings.Contains(out, "draining "+drained) {
		t.Fatalf("drain on the follower: exit %d:\n%s", code, out)
	}
	for _, data := range []string{dataA, dataB} {
		waitWorkerSeen(t, data, drained, "drained", func(w fleet.WorkerView) bool { return w.Drained })
	}
	if lines := auditLines(t, dataA, fleet.ActionDrain, drained); len(lines) != 1 || lines[0].Outcome != "ok" {
		t.Errorf("drain on the follower audited as %+v; want one line, ok", lines)
	}
	if out, code := fleetCmd(t, dataB, "undrain", drained); code != 0 {
		t.Fatalf("undrain on the follower: exit %d:\n%s", code, out)
	}

	// stop on the follower: the leader holds and stops the engine.
	const stopped = "max/qwen3-4b"
	if out, code := fleetCmd(t, dataB, "stop", stopped); code != 0 || !strings.Contains(out, "stopped "+stopped) {
		t.Fatalf("stop on the follower: exit %d:\n%s", code, out)
	}
	if lines := auditLines(t, dataB, fleet.ActionStop, stopped); len(lines) != 1 || lines[0].Outcome != "ok" {
		t.Errorf("stop on the follower audited as %+v; want one line, ok", lines)
	}
	if n := len(simsOf(dataA)); n != 2 {
		t.Errorf("%d simulated engines run after the stop, want 2", n)
	}
	delete(pids, stopped)

	// The leader dies: the follower leads, adopts the engines, restarts
	// none, launches none twice.
	a.cmd.Process.Kill()
	a.cmd.Wait()
	stB = waitRole(t, dataB, "leader", 60*time.Second)
	if stB.Leader != "hub-b" {
		t.Errorf("after the leader died, hub-b leads but says the leader is %q", stB.Leader)
	}
	for _, w := range waitReady(t, dataB, 2, 60*time.Second) {
		if w.State == fleet.WorkerReady && pids[w.Name()] != w.PID {
			t.Errorf("%s: PID %d after the failover, was %d: not adopted", w.Name(), w.PID, pids[w.Name()])
		}
		if w.Name() == stopped && (w.State != fleet.WorkerStopped || !w.Held) {
			t.Errorf("%s after the failover: %s held=%v; want it stopped as asked", stopped, w.State, w.Held)
		}
	}
	if got := simsOf(dataA); len(got) != 2 {
		t.Errorf("%d simulated engines run after the failover, want the same 2", len(got))
	}
	if n := len(simsOf(dataB)); n != 0 {
		t.Errorf("the new leader launched %d engines of its own", n)
	}
	if events, _ := streamChat(t, "http://"+b.http, 8); len(events) < 3 {
		t.Errorf("the new leader does not route after the failover")
	}
	// The old leader's undrain is done too; the drain flag is the database's.
	if out, code := fleetCmd(t, dataB, "drain", drained); code != 0 {
		t.Errorf("drain on the new leader: exit %d:\n%s", code, out)
	}
	if lines := auditLines(t, dataB, fleet.ActionDrain, drained); len(lines) != 2 {
		t.Errorf("two drains audited as %+v; want two lines", lines)
	}
}

// waitWorkerSeen waits until the hub on data sees worker name as ok says.
func waitWorkerSeen(t *testing.T, data, name, what string, ok func(fleet.WorkerView) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var ws []fleet.WorkerView
	for time.Now().Before(deadline) {
		ws = workersJSON(t, data)
		if i := slices.IndexFunc(ws, func(w fleet.WorkerView) bool { return w.Name() == name }); i >= 0 && ok(ws[i]) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("the hub on %s does not see %s %s: %+v", data, name, what, ws)
}

// healthz answers GET /healthz on addr.
func healthz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
