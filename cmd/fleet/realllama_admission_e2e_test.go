package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/gguf"
	"fleet/internal/llamatest"
)

// TestRealLlamaIdenticalWorkersAdmitted: two identical real llama-server
// workers (the same binary, model and flags, on two SSH nodes of this
// machine) are both admitted at the default speed tolerance, whatever
// their slot count: FLEET_ADMISSION_RUNS=N runs N launches each of
// --parallel 1 to 4. It is what issue 30 asks of admission and it does not
// hold yet on a loaded machine: at a load average of 12 on 2 cores, one of
// two identical -np 1 workers was rejected in 2 of 3 runs (17.4 tok/s
// against 46.0; 188.3 against 818.1), so it runs only when asked, not in
// CI, where it would fail at random.
func TestRealLlamaIdenticalWorkersAdmitted(t *testing.T) {
	bin := llamatest.Binary(t)
	if testing.Short() {
		t.Skip("starts real llama-servers, two per run; not in -short")
	}
	v := os.Getenv("FLEET_ADMISSION_RUNS")
	if v == "" {
		t.Skip("identical workers are still rejected on a loaded machine (issue 30); FLEET_ADMISSION_RUNS=5 runs the sweep")
	}
	runs, err := strconv.Atoi(v)
	if err != nil || runs < 1 {
		t.Fatalf("FLEET_ADMISSION_RUNS=%q is not a count of runs", v)
	}
	for _, slots := range []int{1, 2, 3, 4} {
		for run := 1; run <= runs; run++ {
			t.Run(fmt.Sprintf("parallel=%d/run=%d", slots, run), func(t *testing.T) {
				admitIdenticalPair(t, bin, slots)
			})
		}
	}
}

// admitIdenticalPair launches two identical workers of slots slots and
// waits for both to be admitted, logging the speeds admission measured.
func admitIdenticalPair(t *testing.T, bin string, slots int) {
	model := llamatest.ModelOf(t, t.TempDir(), gguf.PrefillTiny)
	t.Cleanup(func() { killArgvContaining(model) })
	var nodes strings.Builder
	for _, name := range []string{"a", "b"} {
		sshd := isolatedSSHD(t)
		sshd.Start()
		fmt.Fprintf(&nodes, "  - name: %s\n    address: %s\n    identity: %s\n", name, sshd.Address(), sshd.Identity())
	}
	fleetYAML := fmt.Sprintf(`nodes:
%smodels:
  - id: tiny
    context: 4096
    memory_gb: 0.1
    recipes:
      llamacpp:
        model: %s
        bin: %s
        args: [--jinja, -np, "%d"]
placements:
  - model: tiny
    node: a
    engine: llamacpp
  - model: tiny
    node: b
    engine: llamacpp
`, nodes.String(), model, bin, slots)
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte(fleetYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	launchHub(t, data, freePort(t), "--fleet", file)
	settled := func(w fleet.WorkerView) bool {
		return w.State == fleet.WorkerReady || w.State == fleet.WorkerRejected || w.State == fleet.WorkerFailed
	}
	var speeds []string
	for _, name := range []string{"a/tiny", "b/tiny"} {
		w := waitWorker(t, data, name, "admitted or rejected", 240*time.Second, settled)
		for _, e := range eventsJSON(t, data, name) {
			if strings.Contains(e.Message, "admission speed") {
				speeds = append(speeds, name+": "+e.Message)
			}
		}
		if w.State != fleet.WorkerReady {
			t.Errorf("%s is %s: %s", name, w.State, w.Reason)
		}
	}
	// A worker admitted may still be re-judged once its twin is: wait for
	// the other's verdict above, then look again.
	for _, w := range workersJSON(t, data) {
		if w.Model == "tiny" && w.State != fleet.WorkerReady {
			t.Errorf("%s is %s after both were judged: %s", w.Name(), w.State, w.Reason)
		}
	}
	for _, s := range speeds {
		t.Log(s)
	}
}
