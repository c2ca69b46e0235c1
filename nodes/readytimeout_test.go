package nodes

import (
	"strings"
	"testing"
	"time"

	"fleet"
)

// TestManagerRecipeReadyTimeout: a recipe's ready_timeout, not the hub's
// (ten minutes here), bounds how long its engine may take to serve, and the
// failure says which timeout it was.
func TestManagerRecipeReadyTimeout(t *testing.T) {
	h := newHarness(t, t.TempDir(), func(o *ManagerOptions) { o.ReadyTimeout = 10 * time.Minute })
	cleanupEngines(t, h)
	m := localModel("--no-listen") // alive, never serving
	r := m.Recipes[fleet.EngineLlamaCpp]
	r.ReadyTimeout = 2 * time.Second
	m.Recipes[fleet.EngineLlamaCpp] = r
	h.m.SetDesired(localFleet(m))
	h.run()
	w := h.waitWorker("hub/qwen3-4b", "failed by its recipe's ready timeout", func(w fleet.Worker) bool {
		return w.State == fleet.WorkerFailed
	})
	if !strings.Contains(w.Reason, "the ready timeout is 2s") {
		t.Errorf("failure reason %q does not name the recipe's 2s ready timeout", w.Reason)
	}
}
