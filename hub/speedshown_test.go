package hub

import (
	"testing"
	"time"

	"fleet"
	"fleet/router"
)

// A restarted hub has measured none of its workers yet: their speed is
// shown as unknown ("-"), not as the router's prior, which was the same
// 66.7 tok/s and 15 ms for every worker; a measurement, once there, is.
func TestUnmeasuredWorkersShowNoSpeed(t *testing.T) {
	h, _ := seededHub(t)
	// Adopted as the restarted hub finds them: ready, where they were.
	h.state.mu.Lock()
	for name, w := range h.state.workers {
		w.State, w.Port, w.PID = fleet.WorkerReady, 1, 1
		h.state.workers[name] = w
	}
	h.state.mu.Unlock()
	h.syncRouter()
	if n := len(h.router.Stats()); n != 2 {
		t.Fatalf("the router has %d workers, want the 2 ready", n)
	}
	snap := h.Snapshot(t.Context(), operator)
	if len(snap.Workers) != 2 {
		t.Fatalf("snapshot has %d workers, want the 2 restored", len(snap.Workers))
	}
	for _, w := range snap.Workers {
		if w.TokPerSec != 0 || w.ITLms != 0 || w.PredictedTTFTms != 0 {
			t.Errorf("%s, measured by no one, shows %.1f tok/s, ITL %.1f ms, predicted TTFT %.1f ms; want none",
				w.Name(), w.TokPerSec, w.ITLms, w.PredictedTTFTms)
		}
	}
	h.router.SeedSpeed("ultra/qwen3-4b", router.SpeedPoint{Concurrency: 1, TTFT: 90 * time.Millisecond, ITL: 8 * time.Millisecond})
	for _, w := range h.Snapshot(t.Context(), operator).Workers {
		if w.Node == "ultra" && (w.ITLms != 8 || w.TokPerSec != 125) {
			t.Errorf("ultra, measured at 8 ms, shows %.1f tok/s and ITL %.1f ms", w.TokPerSec, w.ITLms)
		}
	}
}
