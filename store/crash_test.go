package store

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"fleet"
)

// helperEnv carries "DATABASE|STEP" to the child process of the crash test,
// DATABASE being a SQLite file or a PostgreSQL URL.
const helperEnv = "FLEET_STORE_APPLY_HELPER"

// TestHelperApplyProcess is not a test: it is the child process of
// TestApplyFleetSurvivesKill. It applies fleet B to the database and parks at
// the named step of ApplyFleet until the parent kills it.
func TestHelperApplyProcess(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		t.Skip("helper process of TestApplyFleetSurvivesKill; runs only when that test starts it")
	}
	i := strings.LastIndex(spec, "|")
	target, step := spec[:i], spec[i+1:]
	open := Open
	if strings.HasPrefix(target, "postgres://") {
		open = OpenPostgres
	}
	s, err := open(context.Background(), target)
	if err == nil && s.Clustered() {
		err = leadForTest(context.Background(), s)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: open:", err)
		os.Exit(3)
	}
	s.applyPause = func(at string) {
		if at != step {
			return
		}
		fmt.Printf("PAUSED %s\n", at)
		// Sleep rather than select{}: a process with every goroutine blocked
		// is killed by the Go runtime, and the parent must be the killer.
		time.Sleep(time.Hour)
	}
	err = s.ApplyFleet(context.Background(), fleetB())
	fmt.Fprintln(os.Stderr, "helper: ApplyFleet returned without pausing:", err)
	os.Exit(4)
}

// TestApplyFleetSurvivesKill SIGKILLs a real process inside ApplyFleet's
// transaction (and once just after its commit) and checks that the database
// it leaves behind holds exactly fleet A or exactly fleet B, on each
// dialect: on PostgreSQL the server rolls back the dead client's
// transaction and frees its locks.
func TestApplyFleetSurvivesKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	for _, tc := range []struct {
		step string
		want string
	}{
		{"nodes", "A"},
		{"models", "A"},
		{"placements", "A"},
		{"workers", "A"},
		{"committed", "B"},
	} {
		t.Run(tc.step, func(t *testing.T) {
			forEachDialect(t, func(t *testing.T, db testDB) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // hang guard only
				defer cancel()
				seedFleetA(t, ctx, db)

				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperApplyProcess$", "-test.count=1")
				cmd.Env = append(os.Environ(), helperEnv+"="+db.target+"|"+tc.step)
				var stderr strings.Builder
				cmd.Stderr = &stderr
				out, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				paused := false
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					if sc.Text() == "PAUSED "+tc.step {
						paused = true
						break
					}
				}
				if !paused {
					cmd.Wait()
					t.Fatalf("child never paused at %q; its stderr:\n%s", tc.step, stderr.String())
				}
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
					t.Fatalf("child was not killed: %v", err)
				}

				got := stateOf(t, ctx, db)
				if got != tc.want {
					t.Fatalf("killed at %s: database holds %s, want exactly fleet %s", tc.step, got, tc.want)
				}
				// The dead writer holds nothing: the next write goes through.
				s, err := db.open(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if err := s.ApplyFleet(ctx, fleetB()); err != nil {
					t.Fatalf("a write after the kill: %v", err)
				}
			})
		})
	}
}

func seedFleetA(t *testing.T, ctx context.Context, db testDB) {
	t.Helper()
	s, err := db.open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.ApplyFleet(ctx, fleetA()); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"rig", "ultra"} {
		if _, err := s.SaveWorker(ctx, fleet.Worker{Node: n, Model: "qwen3-4b", Engine: fleet.EngineVLLM, State: fleet.WorkerReady}); err != nil {
			t.Fatal(err)
		}
	}
	if got := stateOf(t, ctx, db); got != "A" {
		t.Fatalf("seeded database holds %s", got)
	}
}

// stateOf reopens the database (recovering its WAL) and names what it
// holds: "A", "B", or a description of the mix.
func stateOf(t *testing.T, ctx context.Context, db testDB) string {
	t.Helper()
	s, err := db.open(ctx)
	if err != nil {
		t.Fatalf("reopen after kill: %v", err)
	}
	defer s.Close()
	f, err := s.LoadFleet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := s.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var workers []string
	for _, w := range ws {
		workers = append(workers, w.Name())
	}
	switch {
	case reflect.DeepEqual(declared(f), fleetA()) && reflect.DeepEqual(workers, []string{"rig/qwen3-4b", "ultra/qwen3-4b"}):
		return "A"
	case reflect.DeepEqual(declared(f), fleetB()) && reflect.DeepEqual(workers, []string{"ultra/qwen3-4b"}):
		return "B"
	}
	return fmt.Sprintf("a mix: fleet %+v, workers %v", declared(f), workers)
}
