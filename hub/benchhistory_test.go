package hub

import (
	"encoding/json"
	"testing"
	"time"

	"fleet/bench/sweep"
	"fleet/console"
)

// TestBenchSplitsSideBySide: the latest chat and agent sweeps of a worker
// are both kept (an agent run no longer hides the chat one), restored from
// the store at start, and listed by BenchHistory newest first, labelled.
func TestBenchSplitsSideBySide(t *testing.T) {
	h, actors := seededHub(t)
	ctx := t.Context()
	at := time.Date(2026, 11, 30, 18, 0, 0, 0, time.UTC)
	for i, r := range []sweep.Result{
		{Split: sweep.SplitChat, StartedAt: at, Levels: []sweep.Level{{Concurrency: 1, TotalTokPerSec: 10}}},
		{Split: sweep.SplitChat, StartedAt: at.Add(time.Minute), Levels: []sweep.Level{{Concurrency: 1, TotalTokPerSec: 60}}},
		{Split: sweep.SplitAgent, StartedAt: at.Add(2 * time.Minute), Turns: 3, Levels: []sweep.Level{{Concurrency: 1, TotalTokPerSec: 40}}},
	} {
		data, _ := json.Marshal(r)
		if err := h.store.AddBenchRun(ctx, ultraWorker, data); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	// Restored at start: the hub opened again reads them.
	h.Close()
	h, err := openHub(t, Options{DataDir: h.opts.DataDir, Demo: true})
	if err != nil {
		t.Fatalf("Open again: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	var found bool
	for _, w := range h.snapshot(ctx).Workers {
		if w.Name() != ultraWorker {
			continue
		}
		found = true
		if len(w.Bench) != 1 || w.Bench[0].TotalTokPerSec != 60 || len(w.AgentBench) != 1 || w.AgentBench[0].TotalTokPerSec != 40 ||
			!w.AgentBenchAt.Equal(at.Add(2*time.Minute)) {
			t.Errorf("snapshot of %s: chat %+v, agent %+v at %v; want the newest chat (60 tok/s) beside the agent run (40)", ultraWorker, w.Bench, w.AgentBench, w.AgentBenchAt)
		}
	}
	if !found {
		t.Fatalf("no %s in the snapshot", ultraWorker)
	}
	runs, err := h.runs.BenchHistory(ctx, actors[viewer.Name], "ultra", 2)
	if err != nil || len(runs) != 2 || runs[0].Split != sweep.SplitAgent || runs[1].Split != sweep.SplitChat || runs[1].Levels[0].TotalTokPerSec != 60 {
		t.Fatalf("BenchHistory(ultra, 2) = %+v, %v; want the agent run then the newer chat one", runs, err)
	}
}

// The console names the splits the bench package runs.
func TestConsoleSplitsAreTheBenchs(t *testing.T) {
	if console.SplitChat != sweep.SplitChat || console.SplitAgent != sweep.SplitAgent {
		t.Fatalf("console splits %q/%q, bench splits %q/%q", console.SplitChat, console.SplitAgent, sweep.SplitChat, sweep.SplitAgent)
	}
}
