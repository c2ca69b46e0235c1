package hub

import (
	"testing"

	"fleet"
)

// TestOutlookCountsPlacedWorkers: the router learns, per model, which placed
// workers are on their way (a placement the manager has not reported yet
// is pending) and which cannot serve.
func TestOutlookCountsPlacedWorkers(t *testing.T) {
	h := &Hub{
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
