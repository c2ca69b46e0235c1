package nodes

import (
	"path/filepath"
	"slices"
	"testing"

	"fleet"
)

// A missing engine is installed with its output in the worker's events and
// a progress figure on the worker while it runs, then launched.
func TestManagerInstallReportsProgress(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	bin := filepath.Join(t.TempDir(), "llama-server")
	// Registered first, so it runs last: the installed engine is a copy of the
	// fake one under another name, and it must not outlive the test either.
	t.Cleanup(func() {
		if left := processesRunning(bin); len(left) > 0 {
			t.Errorf("the installed engine outlived the test: %v", left)
		}
	})
	cleanupEngines(t, h, bin)
	m := localModel()
	r := m.Recipes[fleet.EngineLlamaCpp]
	r.Bin = bin
	// The installer prints progress as curl and pip do, then puts the engine in place.
	r.Install = "printf 'downloading  12.5%%\\n'; printf '######## 55%%\\n'; cp '" + fakeEngine + "' '" + bin + "'; echo 'done 100%'"
	m.Recipes[fleet.EngineLlamaCpp] = r
	h.m.SetDesired(localFleet(m))
	h.run()
	w := h.waitReady("hub/qwen3-4b")
	if w.Progress != 0 {
		t.Errorf("a ready worker still shows install progress %.0f%%", w.Progress)
	}
	h.rec.mu.Lock()
	var seen []float64
	for _, x := range h.rec.workers {
		if x.State == fleet.WorkerInstalling && x.Progress > 0 {
			seen = append(seen, x.Progress)
		}
	}
	h.rec.mu.Unlock()
	if !slices.Equal(seen, []float64{12, 55, 100}) {
		t.Errorf("install progress reported %v, want [12 55 100]\n%s", seen, h.rec.dump())
	}
	if !h.rec.eventLike("install: ######## 55%") {
		t.Errorf("the installer's output is not in the events\n%s", h.rec.dump())
	}
	// Where the engine is, once installed.
	if !h.rec.eventLike("installed on hub: " + bin) {
		t.Errorf("the events do not say where the engine is\n%s", h.rec.dump())
	}
}

// An engine already on the node is launched with an event that says where
// it was found.
func TestManagerSaysWhereTheEngineIs(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	cleanupEngines(t, h)
	h.m.SetDesired(localFleet(localModel()))
	h.run()
	h.waitReady("hub/qwen3-4b")
	if !h.rec.eventLike(fakeEngine + " found on the node at " + fakeEngine) {
		t.Errorf("no event says where the engine was found\n%s", h.rec.dump())
	}
	if h.rec.eventLike("install") {
		t.Errorf("an engine on the node was installed again\n%s", h.rec.dump())
	}
}
