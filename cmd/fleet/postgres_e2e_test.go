package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fleet/internal/pgtest"
)

// TestDemoOnPostgreSQLServesAndAdoptsAfterRestart: `fleet serve --demo
// --database-url URL` runs the demo with its state in PostgreSQL: workers
// come ready, a chat request is answered, `fleet workers` and `fleet
// status` answer through the control socket; after kill -9, the same hub
// started with the URL in $FLEET_DATABASE_URL instead adopts the running
// engines (same PIDs, none launched twice). The data dir never holds a
// SQLite database and no output shows the URL's password.
func TestDemoOnPostgreSQLServesAndAdoptsAfterRestart(t *testing.T) {
	const password = "s3cret-pw" // the test cluster trusts its socket: any password goes
	dbURL := pgtest.URLWithPassword(t, password)
	data := t.TempDir()
	port := freePort(t)

	h := startHub(t, data, port, "--database-url", dbURL)
	ws := waitReady(t, data, 3, 120*time.Second)
	pids := map[string]int{}
	for _, w := range ws {
		pids[w.Name()] = w.PID
	}
	if events, _ := streamChat(t, "http://"+h.http, 8); len(events) < 3 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("chat on a PostgreSQL hub: %d events %q", len(events), events)
	}
	out, code := fleetCmd(t, data, "workers")
	for _, name := range []string{"rig", "ultra", "max"} {
		if code != 0 || !strings.Contains(out, name) {
			t.Fatalf("fleet workers (exit %d) does not list %s:\n%s", code, name, out)
		}
	}
	out, code = fleetCmd(t, data, "status")
	if code != 0 || !strings.Contains(out, "state in postgres://") || strings.Contains(out, password) {
		t.Errorf("fleet status (exit %d) does not say the state is in PostgreSQL, or shows the password:\n%s", code, out)
	}

	h.cmd.Process.Kill()
	h.cmd.Wait()
	t.Setenv("FLEET_DATABASE_URL", dbURL)
	restartAdopts(t, data, port, pids)

	if _, err := os.Stat(filepath.Join(data, "fleet.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the data dir holds a SQLite database: %v", err)
	}
	logs, _ := filepath.Glob(filepath.Join(data, "hub-*.log"))
	if len(logs) != 2 {
		t.Fatalf("%d hub logs, want 2", len(logs))
	}
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "state in postgres://<redacted>@") || strings.Contains(string(b), password) {
			t.Errorf("%s does not say where the state is, or shows the password:\n%s", filepath.Base(l), b)
		}
	}
}
