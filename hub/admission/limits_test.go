package admission

import (
	"strings"
	"testing"

	"fleet"
)

// Each user runs at most MaxRunsPerUser shape probes and bench sweeps at
// once; the next is refused with a message, before any request reaches a
// worker, while other users are not held back.
func TestRunsLimitedPerUser(t *testing.T) {
	fl := &testFleet{models: []fleet.Model{{ID: "qwen3-4b"}}}
	_, runs := newTestJudge(t, fl)
	// As a restarted hub restores them: no engine answering yet.
	for _, node := range []string{"ultra", "max"} {
		fl.put(fleet.Worker{Node: node, Model: "qwen3-4b", State: fleet.WorkerStarting})
	}
	ada := fleet.User{Name: "ada", Role: fleet.RoleAdmin}
	vic := fleet.User{Name: "vic", Role: fleet.RoleViewer}
	var dones []func()
	for range MaxRunsPerUser {
		done, err := runs.running.start(ada, "bench")
		if err != nil {
			t.Fatal(err)
		}
		dones = append(dones, done)
	}
	ctx := t.Context()
	const refusal = "already has 2 shape or bench runs going (the limit per user); wait for one to finish"
	calls := map[string]func(u fleet.User) error{
		"shape":       func(u fleet.User) error { _, err := runs.Shape(ctx, u, "ultra", "max"); return err },
		"shape --all": func(u fleet.User) error { _, err := runs.ShapeAll(ctx, u, "qwen3-4b"); return err },
		"shape pin":   func(u fleet.User) error { _, err := runs.PinShape(ctx, u, "ultra"); return err },
		"bench": func(u fleet.User) error {
			_, err := runs.Bench(ctx, u, "ultra", fleet.BenchOptions{}, nil)
			return err
		},
	}
	for what, call := range calls {
		err := call(ada)
		if err == nil || !strings.Contains(err.Error(), what+": ada "+refusal) {
			t.Errorf("%s beyond the limit: %v; want the refusal", what, err)
		}
		// Another user gets past the limit (to the next check: these
		// workers have no engine answering).
		if err := call(vic); err != nil && strings.Contains(err.Error(), refusal) {
			t.Errorf("%s by another user was refused by ada's limit: %v", what, err)
		}
	}
	dones[0]()
	dones[0]() // ending twice frees one slot, not two
	done, err := runs.running.start(ada, "shape")
	if err != nil {
		t.Fatalf("a freed slot was not reusable: %v", err)
	}
	defer done()
	if _, err := runs.running.start(ada, "shape"); err == nil {
		t.Errorf("a slot ended twice was freed twice")
	}
}
