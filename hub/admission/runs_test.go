package admission

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/bench/sweep"
)

// TestBenchHistoryOfAModel: `bench --history MODEL` is accepted as `bench
// MODEL` is (an alias too): it lists the model's runs through the router
// and its workers' runs, newest first; a node with no such model still
// says what it accepts.
func TestBenchHistoryOfAModel(t *testing.T) {
	fl := &testFleet{models: []fleet.Model{{ID: "qwen3-4b", Aliases: []string{"qwen3"}}}}
	_, runs := newTestJudge(t, fl)
	for _, node := range []string{"ultra", "max"} {
		fl.put(fleet.Worker{Node: node, Model: "qwen3-4b", State: fleet.WorkerReady})
	}
	viewer := fleet.User{Name: "vic", Role: fleet.RoleViewer}
	ctx := t.Context()
	at := time.Date(2026, 11, 30, 18, 0, 0, 0, time.UTC)
	for i, r := range []struct {
		key string
		res sweep.Result
	}{
		{"ultra/qwen3-4b", sweep.Result{Target: "ultra", StartedAt: at}},
		{routerBenchKey("qwen3-4b"), sweep.Result{Target: "qwen3-4b via router", StartedAt: at.Add(time.Minute)}},
		{"max/qwen3-4b", sweep.Result{Target: "max", StartedAt: at.Add(2 * time.Minute)}},
		{"max/other-model", sweep.Result{Target: "max other", StartedAt: at.Add(3 * time.Minute)}},
	} {
		data, _ := json.Marshal(r.res)
		if err := runs.store.AddBenchRun(ctx, r.key, data); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	for _, name := range []string{"qwen3-4b", "qwen3"} {
		got, err := runs.BenchHistory(ctx, viewer, name, 10)
		if err != nil {
			t.Fatalf("BenchHistory(%s): %v", name, err)
		}
		var targets []string
		for _, r := range got {
			targets = append(targets, r.Target)
		}
		if want := []string{"max", "qwen3-4b via router", "ultra"}; !slices.Equal(targets, want) {
			t.Errorf("BenchHistory(%s) = %q, want %q: the model's runs, newest first", name, targets, want)
		}
	}
	if got, err := runs.BenchHistory(ctx, viewer, "qwen3-4b", 1); err != nil || len(got) != 1 || got[0].Target != "max" {
		t.Errorf("BenchHistory(qwen3-4b, 1) = %+v, %v; want only the newest run", got, err)
	}
	if _, err := runs.BenchHistory(ctx, viewer, "nope", 10); err == nil || !strings.Contains(err.Error(), "bench --history MODEL") {
		t.Errorf("BenchHistory(nope) = %v; want an error that names what it accepts", err)
	}
}
