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
	snap := h.snapshot(t.Context())
	if len(snap.Workers) != 2 {
		t.Fatalf("restored workers %+v, want ultra's and max's", snap.Workers)
	}
	for _, w := range snap.Workers {
		if w.State != fleet.WorkerStarting {
			t.Errorf("%s is %s before its engine was checked, want starting", w.Name(), w.State)
		}
	}
}

// A node that left the fleet with an engine still to stop is reached again
// with the host key pinned when it was declared: the pending stop carries it.
func TestHostKeyOfARemovedNodeComesFromItsPendingStop(t *testing.T) {
	h, _ := seededHub(t)
	ctx := t.Context()
	pinned, err := hostKeys{h.store}.PinnedHostKey(ctx, "ultra")
	if err != nil || pinned == "" {
		t.Fatalf("ultra's pinned key: %q, %v", pinned, err)
	}
	if _, err := h.store.SaveWorker(ctx, fleet.Worker{Node: "ultra", Model: "qwen3-4b", Engine: fleet.EngineLlamaCpp, State: fleet.WorkerReady, PID: 4242}); err != nil {
		t.Fatal(err)
	}
	if err := h.store.ApplyFleet(ctx, fleet.Fleet{}); err != nil {
		t.Fatal(err)
	}
	got, err := hostKeys{h.store}.PinnedHostKey(ctx, "ultra")
	if err != nil || got != pinned {
		t.Errorf("removed ultra's pinned key = %q, %v; want the one pinned before, %q", got, err, pinned)
	}
	if got, err := (hostKeys{h.store}).PinnedHostKey(ctx, "never-declared"); err != nil || got != "" {
		t.Errorf("a node never declared: %q, %v; want no key and no error", got, err)
	}
}
