package hub

import (
	"testing"

	"fleet"
)

// TestOutlookCountsPlacedWorkers: the router learns, per model, which placed
// workers are on their way (a placement the manager has not reported yet
// is pending) and which cannot serve.
func TestOutlookCountsPlacedWorkers(t *testing.T) {
	h := &mirror{
		placements: []fleet.Placement{
			{Model: "a", Node: "n1"}, {Model: "a", Node: "n2"}, {Model: "a", Node: "n3"},
			{Model: "b", Node: "n1"}, {Model: "b", Node: "n2"},
			{Model: "c", Node: "n1"}, {Model: "c", Node: "n2"},
		},
		workers: map[string]fleet.Worker{
			"n1/a": {Node: "n1", Model: "a", State: fleet.WorkerStarting},
			"n2/a": {Node: "n2", Model: "a", State: fleet.WorkerReady},
			"n1/b": {Node: "n1", Model: "b", State: fleet.WorkerFailed},
			"n2/b": {Node: "n2", Model: "b", State: fleet.WorkerRejected},
			// Stopped on the way to a restart it comes back; held by
			// 'fleet stop' it does not.
			"n1/c": {Node: "n1", Model: "c", State: fleet.WorkerStopped, Reason: "restarting"},
			"n2/c": {Node: "n2", Model: "c", State: fleet.WorkerStopped, Held: true},
			// A worker whose placement is gone is not the model's supply.
			"n9/a": {Node: "n9", Model: "a", State: fleet.WorkerInstalling},
		},
	}
	got := h.outlookLocked()
	if a := got["a"]; a.Coming != 2 || len(a.Down) != 0 {
		t.Errorf("model a: %+v, want 2 coming (n1 starting, n3 not reported yet) and none down", a)
	}
	if b := got["b"]; b.Coming != 0 || b.Down[fleet.WorkerFailed] != 1 || b.Down[fleet.WorkerRejected] != 1 {
		t.Errorf("model b: %+v, want 1 failed and 1 rejected", b)
	}
	if c := got["c"]; c.Coming != 1 || c.Down[fleet.WorkerStopped] != 1 {
		t.Errorf("model c: %+v, want the restarting worker coming and the held one stopped", c)
	}
	if _, ok := got["d"]; ok {
		t.Errorf("a model with no placement has an outlook: %+v", got["d"])
	}
}

// TestOutlookSaysTheComingContext: the router learns the largest context of
// a model's coming workers (a placement's own, else the model's), so that a
// prompt too long for the ready ones waits for one that holds it; ready
// and stopped workers do not count.
func TestOutlookSaysTheComingContext(t *testing.T) {
	h := &mirror{
		models: []fleet.Model{{ID: "a", Context: 16384}, {ID: "b", Context: 8192}},
		placements: []fleet.Placement{
			{Model: "a", Node: "n1", Context: 4096}, {Model: "a", Node: "n2"}, {Model: "a", Node: "n3", Context: 2048},
			{Model: "b", Node: "n1", Context: 4096}, {Model: "b", Node: "n2"},
		},
		workers: map[string]fleet.Worker{
			"n1/a": {Node: "n1", Model: "a", State: fleet.WorkerReady},
			"n2/a": {Node: "n2", Model: "a", State: fleet.WorkerStarting},
			"n3/a": {Node: "n3", Model: "a", State: fleet.WorkerInstalling},
			"n1/b": {Node: "n1", Model: "b", State: fleet.WorkerProbation},
			"n2/b": {Node: "n2", Model: "b", State: fleet.WorkerStopped, Held: true},
		},
	}
	got := h.outlookLocked()
	if a := got["a"]; a.ComingContext != 16384 {
		t.Errorf("model a: coming context %d, want 16384 (n2 starting with the model's context)", a.ComingContext)
	}
	if b := got["b"]; b.ComingContext != 4096 {
		t.Errorf("model b: coming context %d, want 4096 (n1 on probation; n2 is held stopped)", b.ComingContext)
	}
}
