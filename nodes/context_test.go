package nodes

import (
	"slices"
	"testing"

	"fleet"
)

// TestManagerPlacementContext: a placement's own context reaches the
// engine's command line (-c for llama-server, --max-model-len for vLLM) and
// the worker's Context the router checks prompts against; changing it
// relaunches the engine.
func TestManagerPlacementContext(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	cleanupEngines(t, h)
	f := simFleet(testModel(), "max", "ultra")
	f.Placements[1].Context = 4096
	h.m.SetDesired(f)
	h.run()

	full, small := h.waitReady("max/qwen3-4b"), h.waitReady("ultra/qwen3-4b")
	if full.Context != 16384 || !hasFlag(full.Argv, "-c", "16384") {
		t.Errorf("max, without a placement context: Context %d, argv %q; want the model's 16384", full.Context, full.Argv)
	}
	if small.Context != 4096 || !hasFlag(small.Argv, "-c", "4096") {
		t.Errorf("ultra, placed with context 4096: Context %d, argv %q", small.Context, small.Argv)
	}

	f.Placements[1].Context = 8192
	h.m.SetDesired(f)
	re := h.waitWorker(small.Name(), "relaunched with -c 8192", func(w fleet.Worker) bool {
		return w.State == fleet.WorkerReady && hasFlag(w.Argv, "-c", "8192")
	})
	if re.PID == small.PID || re.Context != 8192 {
		t.Errorf("after the context change: PID %d (was %d), Context %d", re.PID, small.PID, re.Context)
	}
}

func hasFlag(argv []string, flag, value string) bool {
	i := slices.Index(argv, flag)
	return i >= 0 && i+1 < len(argv) && argv[i+1] == value
}
