package nodes

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"fleet"
)

// TestManagerStartReportsDownloadProgress: an engine that downloads its
// weights as it starts (here a script printing vLLM's tqdm bars to its log,
// then becoming the engine) shows the download's percent on the starting
// worker, as an install's is shown, and its bars in the events; the figure
// is gone once the worker is ready.
func TestManagerStartReportsDownloadProgress(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	bin := filepath.Join(t.TempDir(), "llama-server")
	script := fmt.Sprintf(`#!/bin/sh
for p in 20 50 80 100; do
	printf 'model-00001-of-00001.safetensors:  %%3d%%%%|#####     | 1.0G/2.0G [00:01<00:01, 1.0GB/s]\r' "$p" >&2
	sleep 1.5
done
printf '\n' >&2
exec '%s' "$@"
`, fakeEngine)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cleanupEngines(t, h, bin)
	m := localModel()
	r := m.Recipes[fleet.EngineLlamaCpp]
	r.Bin = bin
	m.Recipes[fleet.EngineLlamaCpp] = r
	h.m.SetDesired(localFleet(m))
	h.run()
	w := h.waitReady("hub/qwen3-4b")
	if w.Progress != 0 {
		t.Errorf("a ready worker still shows download progress %.0f%%", w.Progress)
	}
	h.rec.mu.Lock()
	var seen []float64
	for _, x := range h.rec.workers {
		if x.State == fleet.WorkerStarting && x.Progress > 0 && !slices.Contains(seen, x.Progress) {
			seen = append(seen, x.Progress)
		}
	}
	h.rec.mu.Unlock()
	// The log is read once a second, so which bars are caught depends on
	// the machine; each seen one must be a bar the engine printed, in order.
	if len(seen) == 0 || !slices.IsSorted(seen) || slices.ContainsFunc(seen, func(p float64) bool { return !slices.Contains([]float64{20, 50, 80, 100}, p) }) {
		t.Errorf("download progress on the starting worker: %v; want some of 20, 50, 80, 100 in order\n%s", seen, h.rec.dump())
	}
	if !h.rec.eventLike("download: model-00001-of-00001.safetensors:") {
		t.Errorf("the download's bar is not in the events\n%s", h.rec.dump())
	}
}
