package hub

import (
	"testing"

	"fleet"
)

// A restarted hub shows the workers it restored as starting until the node
// manager has checked their engines: a state stored as ready is history, and
// a client reading it would be sent to a router with no worker yet.
func TestRestoredWorkersAreNotReadyBeforeTheirCheck(t *testing.T) {
	h, _ := seededHub(t) // ultra and max were stored ready
	snap := h.Snapshot(t.Context())
	if len(snap.Workers) != 2 {
		t.Fatalf("restored workers %+v, want ultra's and max's", snap.Workers)
	}
	for _, w := range snap.Workers {
		if w.State != fleet.WorkerStarting {
			t.Errorf("%s is %s before its engine was checked, want starting", w.Name(), w.State)
		}
	}
}
