package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fleet"
)

// writeFleet writes a fleet file into a temp dir and returns its path.
func writeFleet(t *testing.T, content string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// judged is a worker admitted or rejected. A failed one is not: on a
// shared test machine another test's engine may take its port first, and
// the worker relaunches on another.
func judged(w fleet.WorkerView) bool {
	return w.State == fleet.WorkerReady || w.State == fleet.WorkerRejected
}

// The first case: a 90 GB model on a 36 GB Mac was launched, then
// rejected and left running. The memory gate now runs before the launch:
// the worker is rejected with the figures and no engine ever starts.
func TestMemoryGateRejectsBeforeLaunch(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	file := writeFleet(t, `nodes:
  - name: max
    address: sim:m4max-llamacpp
models:
  - id: big
    context: 16384
    memory_gb: 90
    recipes:
      llamacpp:
        model: Big-Q4_K_M.gguf
placements:
  - model: big
    node: max
`)
	launchHub(t, data, freePort(t), "--fleet", file)
	w := waitWorker(t, data, "max/big", "rejected", 120*time.Second, judged)
	if w.State != fleet.WorkerRejected || !strings.Contains(w.Reason, "memory: big needs 90.0 GiB but max has 16.5 GiB usable") {
		t.Fatalf("max/big is %s (%q), want rejected with the memory figures", w.State, w.Reason)
	}
	if w.PID != 0 {
		t.Errorf("the rejected worker records engine PID %d", w.PID)
	}
	if pids := simsOf(data); len(pids) != 0 {
		t.Errorf("engines run for a worker that failed the memory gate: PIDs %v", pids)
	}
	evs := eventsJSON(t, data, "max/big")
	if !containsEvent(evs, "rejected before launch, no engine started: memory: big needs 90.0 GiB") {
		t.Errorf("no event gives the figures: %+v", evs)
	}
	if containsEvent(evs, "launched PID") {
		t.Errorf("an engine was launched: %+v", evs)
	}
}

// storyFleet is the fleet: rig (vLLM, hermes tool parser), max
// (llama.cpp) and metal, a Mac on vllm-metal whose recipe lacks the tool
// parser. metal's engine loads fastest (1 s against rig's 3 s), so with the
// old rule, first ready sets the reference, it decided the shape and the
// correctly configured rig and max were rejected. The placement lists metal
// first so that only `reference: rig` makes rig the reference.
func storyFleet(metalArgs string) string {
	return `nodes:
  - name: rig
    address: sim:rtx3060-vllm
  - name: metal
    address: sim:m4max-llamacpp
  - name: max
    address: sim:m1ultra-llamacpp
models:
  - id: qwen3-4b
    context: 16384
    reference: rig
    recipes:
      vllm:
        model: Qwen/Qwen3-4B-AWQ
        args: [--enable-auto-tool-choice, --tool-call-parser, hermes]
      vllm-metal:
        model: Qwen/Qwen3-4B
        args: [` + metalArgs + `]
      llamacpp:
        model: Qwen3-4B-Q4_K_M.gguf
        args: [--jinja, --reasoning-format, none]
placements:
  - model: qwen3-4b
    node: metal
    engine: vllm-metal
  - model: qwen3-4b
    nodes: [rig, max]
`
}

func TestMisconfiguredWorkerDoesNotDecideTheReference(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	file := writeFleet(t, storyFleet(""))
	launchHub(t, data, freePort(t), "--fleet", file)
	for _, name := range []string{"rig/qwen3-4b", "max/qwen3-4b"} {
		if w := waitWorker(t, data, name, "judged", 120*time.Second, judged); w.State != fleet.WorkerReady {
			t.Fatalf("%s is %s (%q): the correctly configured workers must be admitted", name, w.State, w.Reason)
		}
	}
	metal := waitWorker(t, data, "metal/qwen3-4b", "judged", 120*time.Second, judged)
	if metal.State != fleet.WorkerRejected || !strings.Contains(metal.Reason, "tool calls") || !strings.Contains(metal.Reason, "rig/qwen3-4b") {
		t.Fatalf("metal is %s (%q), want rejected against rig's reference for its tool calls", metal.State, metal.Reason)
	}
	// Its engine is kept up to be looked at, so shape works on it.
	if metal.PID == 0 || !alive(metal.PID) {
		t.Errorf("the rejected worker's engine is not running (PID %d)", metal.PID)
	}
	out, code := fleetCmd(t, data, "shape", "metal", "rig")
	if code != 0 || !strings.Contains(out, "tool") {
		t.Errorf("shape on the rejected worker: exit %d:\n%s", code, out)
	}

	// Fixing metal's recipe relaunches it and judges it against the fleet's
	// reference (rig's), not a stale one of its own.
	fixed := writeFleet(t, storyFleet("--enable-auto-tool-choice, --tool-call-parser, hermes"))
	if out, code := fleetCmd(t, data, "apply", "-f", fixed); code != 0 {
		t.Fatalf("apply the fixed recipe: exit %d:\n%s", code, out)
	}
	w := waitWorker(t, data, "metal/qwen3-4b", "ready with its new command line", 120*time.Second, func(w fleet.WorkerView) bool {
		return w.State == fleet.WorkerReady && strings.Contains(strings.Join(w.Argv, " "), "--tool-call-parser hermes")
	})
	if w.PID == metal.PID {
		t.Errorf("metal kept PID %d: its new recipe never ran", w.PID)
	}
	ready := 0
	for _, x := range workersJSON(t, data) {
		if x.State == fleet.WorkerReady {
			ready++
		}
	}
	if ready != 3 {
		t.Errorf("%d workers ready after the fix, want all 3", ready)
	}
}

// refFleet has a reference node (rig) with a misconfigured recipe of its own
// and a correctly configured metal.
func refFleet(rigArgs string) string {
	return `nodes:
  - name: metal
    address: sim:m4max-llamacpp
  - name: rig
    address: sim:rtx3060-vllm
models:
  - id: qwen3-4b
    context: 16384
    reference: rig
    recipes:
      vllm:
        model: Qwen/Qwen3-4B-AWQ
        args: [` + rigArgs + `]
      vllm-metal:
        model: Qwen/Qwen3-4B
        args: [--enable-auto-tool-choice, --tool-call-parser, hermes]
placements:
  - model: qwen3-4b
    node: metal
    engine: vllm-metal
  - model: qwen3-4b
    node: rig
`
}

// A changed recipe on the reference node retakes the reference, and the
// model's other workers are judged again without a restart.
func TestReferenceRecipeChangeRejudgesOthers(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	launchHub(t, data, freePort(t), "--fleet", writeFleet(t, refFleet("")))
	if w := waitWorker(t, data, "rig/qwen3-4b", "judged", 120*time.Second, judged); w.State != fleet.WorkerReady {
		t.Fatalf("the reference worker is %s (%q)", w.State, w.Reason)
	}
	metal := waitWorker(t, data, "metal/qwen3-4b", "judged", 120*time.Second, judged)
	if metal.State != fleet.WorkerRejected {
		t.Fatalf("metal is %s (%q), want rejected: rig is the reference, whoever was ready first", metal.State, metal.Reason)
	}
	if out, code := fleetCmd(t, data, "apply", "-f", writeFleet(t, refFleet("--enable-auto-tool-choice, --tool-call-parser, hermes"))); code != 0 {
		t.Fatalf("apply: exit %d:\n%s", code, out)
	}
	rig := waitWorker(t, data, "rig/qwen3-4b", "ready with its new recipe", 120*time.Second, func(w fleet.WorkerView) bool {
		return w.State == fleet.WorkerReady && strings.Contains(strings.Join(w.Argv, " "), "--tool-call-parser hermes")
	})
	w := waitWorker(t, data, "metal/qwen3-4b", "admitted on re-judgement", 120*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerReady })
	if w.PID != metal.PID {
		t.Errorf("metal was restarted (PID %d → %d); a re-judgement needs none", metal.PID, w.PID)
	}
	if !containsEvent(eventsJSON(t, data, "metal/qwen3-4b"), "admitted on re-judgement") {
		t.Errorf("no re-judgement event for metal")
	}
	if !containsEvent(eventsJSON(t, data, rig.Name()), "its shape is the reference; the model's other workers are judged again") {
		t.Errorf("rig did not retake the reference")
	}
}

// shape and shape pin work on a rejected worker whose engine runs, and a
// pin re-judges the rejected workers at once.
func TestShapePinRejudgesRejectedWorkers(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	launchHub(t, data, freePort(t), "--fleet", writeFleet(t, mismatchedShapes))
	if w := waitWorker(t, data, "rig/qwen3-4b", "judged", 120*time.Second, judged); w.State != fleet.WorkerReady {
		t.Fatalf("rig, the first node of the first placement, is %s (%q)", w.State, w.Reason)
	}
	ultra := waitWorker(t, data, "ultra/qwen3-4b", "judged", 120*time.Second, judged)
	if ultra.State != fleet.WorkerRejected {
		t.Fatalf("ultra is %s (%q), want rejected for its reasoning field", ultra.State, ultra.Reason)
	}
	if out, code := fleetCmd(t, data, "shape", "ultra", "rig"); code != 0 || !strings.Contains(out, "reasoning") {
		t.Errorf("shape on the rejected worker: exit %d:\n%s", code, out)
	}
	out, code := fleetCmd(t, data, "shape", "pin", "ultra")
	if code != 0 || !strings.Contains(out, "ultra/qwen3-4b: admitted") || !strings.Contains(out, "rig/qwen3-4b: rejected") {
		t.Fatalf("shape pin: exit %d, want ultra admitted and rig, of the other shape, rejected:\n%s", code, out)
	}
	// One model, one shape: rig, ready until now, is judged against the
	// pin at once (issue 21: it stayed ready beside the pinned shape).
	for _, w := range workersJSON(t, data) {
		switch {
		case w.Name() == "ultra/qwen3-4b" && (w.State != fleet.WorkerReady || w.PID != ultra.PID):
			t.Errorf("right after the pin ultra is %s with PID %d (was %d)", w.State, w.PID, ultra.PID)
		case w.Name() == "rig/qwen3-4b" && (w.State != fleet.WorkerRejected || !strings.Contains(w.Reason, "ultra/qwen3-4b, pinned")):
			t.Errorf("right after the pin rig is %s (%q), want rejected against ultra's pinned shape", w.State, w.Reason)
		}
	}
}

// Issue 21's story: `shape pin metal` (tool calls as prose) left rig and
// max (structured tool calls) ready beside it; then metal's recipe was
// fixed, and metal was rejected against its own stale pin while rig and max
// stayed ready. A pin judges every worker of the model at once, and the
// pinned worker, relaunched with a new command line, retakes the pin with
// its new shape, as a reference node does.
func TestShapePinJudgesEveryWorkerAndFollowsThePinnedRecipe(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	launchHub(t, data, freePort(t), "--fleet", writeFleet(t, storyFleet("")))
	others := map[string]fleet.WorkerView{}
	for _, name := range []string{"rig/qwen3-4b", "max/qwen3-4b"} {
		w := waitWorker(t, data, name, "judged", 120*time.Second, judged)
		if w.State != fleet.WorkerReady {
			t.Fatalf("%s is %s (%q)", name, w.State, w.Reason)
		}
		others[name] = w
	}
	if metal := waitWorker(t, data, "metal/qwen3-4b", "judged", 120*time.Second, judged); metal.State != fleet.WorkerRejected {
		t.Fatalf("metal is %s (%q), want rejected for its tool calls", metal.State, metal.Reason)
	}
	out, code := fleetCmd(t, data, "shape", "pin", "metal")
	if code != 0 || !strings.Contains(out, "metal/qwen3-4b: admitted") {
		t.Fatalf("shape pin metal: exit %d:\n%s", code, out)
	}
	for name := range others {
		if !strings.Contains(out, name+": rejected") {
			t.Errorf("shape pin did not reject %s, of the other shape:\n%s", name, out)
		}
	}
	for _, w := range workersJSON(t, data) {
		if _, other := others[w.Name()]; other && w.State != fleet.WorkerRejected {
			t.Errorf("after pinning metal's prose tool calls %s is %s (%q): the model serves two shapes", w.Name(), w.State, w.Reason)
		}
	}

	// metal's recipe fixed: its new shape is the pin, and rig and max, of
	// that shape, are admitted again without a restart.
	if out, code := fleetCmd(t, data, "apply", "-f", writeFleet(t, storyFleet("--enable-auto-tool-choice, --tool-call-parser, hermes"))); code != 0 {
		t.Fatalf("apply the fixed recipe: exit %d:\n%s", code, out)
	}
	metal := waitWorker(t, data, "metal/qwen3-4b", "judged with its new command line", 120*time.Second, func(w fleet.WorkerView) bool {
		return judged(w) && strings.Contains(strings.Join(w.Argv, " "), "--tool-call-parser hermes")
	})
	if metal.State != fleet.WorkerReady {
		t.Fatalf("metal with its fixed recipe is %s (%q): judged against its own stale pin", metal.State, metal.Reason)
	}
	for name, before := range others {
		w := waitWorker(t, data, name, "admitted again", 120*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerReady })
		if w.PID != before.PID {
			t.Errorf("%s was restarted (PID %d → %d); a re-judgement needs none", name, before.PID, w.PID)
		}
	}
	if !containsEvent(eventsJSON(t, data, "metal/qwen3-4b"), "retakes the pinned reference") {
		t.Errorf("no event says metal retook the pinned reference")
	}
}

// A worker admitted first, with nothing to compare it with, is judged again
// when a faster one arrives.
func TestSlowFirstWorkerRejectedWhenAFasterOneArrives(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	const nodes = `nodes:
  - name: slow
    address: sim:m1ultra-27b-starved
  - name: fast
    address: sim:rtx3060-vllm
models:
  - id: qwen3-4b
    context: 16384
    recipes:
      vllm:
        model: Qwen/Qwen3-4B-AWQ
        args: [--enable-auto-tool-choice, --tool-call-parser, hermes]
      llamacpp:
        model: Qwen3-4B-Q4_K_M.gguf
        args: [--jinja, --reasoning-format, none]
placements:
  - model: qwen3-4b
`
	launchHub(t, data, freePort(t), "--fleet", writeFleet(t, nodes+"    nodes: [slow]\n"))
	slow := waitWorker(t, data, "slow/qwen3-4b", "judged", 120*time.Second, judged)
	if slow.State != fleet.WorkerReady {
		t.Fatalf("the only worker is %s (%q)", slow.State, slow.Reason)
	}
	if out, code := fleetCmd(t, data, "apply", "-f", writeFleet(t, nodes+"    nodes: [slow, fast]\n")); code != 0 {
		t.Fatalf("apply adding fast: exit %d:\n%s", code, out)
	}
	if w := waitWorker(t, data, "fast/qwen3-4b", "judged", 120*time.Second, judged); w.State != fleet.WorkerReady {
		t.Fatalf("fast is %s (%q)", w.State, w.Reason)
	}
	w := waitWorker(t, data, "slow/qwen3-4b", "rejected", 120*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerRejected })
	newSpeed, best, ok := speedFigures(w.Reason)
	if !ok || !strings.Contains(w.Reason, "fast/qwen3-4b") || newSpeed >= best/2 {
		t.Errorf("slow's reason does not give both figures and the faster worker: %q", w.Reason)
	}
	if w.PID != slow.PID || !alive(w.PID) {
		t.Errorf("slow was restarted or stopped (PID %d → %d) instead of re-judged", slow.PID, w.PID)
	}
}

// Naming another reference node in the fleet file takes the reference from
// that node's worker and judges the others again, without restarting any.
func TestApplyingANewReferenceNodeRejudges(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	launchHub(t, data, freePort(t), "--fleet", writeFleet(t, mismatchedShapes))
	rig := waitWorker(t, data, "rig/qwen3-4b", "judged", 120*time.Second, judged)
	ultra := waitWorker(t, data, "ultra/qwen3-4b", "judged", 120*time.Second, judged)
	if rig.State != fleet.WorkerReady || ultra.State != fleet.WorkerRejected {
		t.Fatalf("rig %s, ultra %s (%q): want rig, the default reference, ready and ultra rejected", rig.State, ultra.State, ultra.Reason)
	}
	moved := strings.Replace(mismatchedShapes, "    context: 16384\n", "    context: 16384\n    reference: ultra\n", 1)
	out, code := fleetCmd(t, data, "apply", "-f", writeFleet(t, moved))
	if code != 0 || !strings.Contains(out, "reference first placed node → ultra") {
		t.Fatalf("apply: exit %d:\n%s", code, out)
	}
	u := waitWorker(t, data, "ultra/qwen3-4b", "admitted as the new reference", 120*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerReady })
	r := waitWorker(t, data, "rig/qwen3-4b", "rejected against ultra's shape", 120*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerRejected })
	if u.PID != ultra.PID || r.PID != rig.PID {
		t.Errorf("engines restarted: ultra %d → %d, rig %d → %d", ultra.PID, u.PID, rig.PID, r.PID)
	}
	if !strings.Contains(r.Reason, "ultra/qwen3-4b") {
		t.Errorf("rig's reason does not name the new reference: %q", r.Reason)
	}
	// And export writes the key back.
	exported, code := fleetCmd(t, data, "export")
	if code != 0 || !strings.Contains(exported, "reference: ultra") {
		t.Errorf("export: exit %d:\n%s", code, exported)
	}
}

// Workers of one model that start together are judged against each other
// once all have been measured. ultra (llama.cpp, ~76 tok/s) loads in 1 s,
// rig (vLLM, ~90 tok/s) in 3 s; with speed_tolerance 1 only the fastest
// passes. Judged when it alone was measured, ultra "set the bar" and both
// were admitted; now it waits for rig's measurement and is rejected.
func TestColdStartJudgesAgainstPeers(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	launchHub(t, data, freePort(t), "--fleet", writeFleet(t, `nodes:
  - name: ultra
    address: sim:m1ultra-llamacpp
  - name: rig
    address: sim:rtx3060-vllm
models:
  - id: qwen3-4b
    context: 16384
    speed_tolerance: 1
    recipes:
      vllm:
        model: Qwen/Qwen3-4B-AWQ
        args: [--enable-auto-tool-choice, --tool-call-parser, hermes]
      llamacpp:
        model: Qwen3-4B-Q4_K_M.gguf
        args: [--jinja, --reasoning-format, none]
placements:
  - model: qwen3-4b
    nodes: [ultra, rig]
`))
	if w := waitWorker(t, data, "rig/qwen3-4b", "judged", 120*time.Second, judged); w.State != fleet.WorkerReady {
		t.Fatalf("rig is %s (%q)", w.State, w.Reason)
	}
	// Normally ultra is rejected at its own admission; if rig lost its first
	// port to another process on this shared machine, ultra is judged
	// without it and then again when rig arrives. Either way it ends rejected.
	ultra := waitWorker(t, data, "ultra/qwen3-4b", "rejected against rig", 120*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerRejected })
	if !strings.Contains(ultra.Reason, "rig/qwen3-4b") {
		t.Fatalf("ultra is rejected (%q), want rejected against rig, which started with it", ultra.Reason)
	}
}

// A worker rejected for its shape keeps its engine for --rejected-grace,
// then the engine stops while the worker stays rejected; shape then says the
// engine is down, and admit --force launches it unchecked.
func TestRejectedEngineStopsAfterTheGrace(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	launchHub(t, data, freePort(t), "--fleet", writeFleet(t, mismatchedShapes), "--rejected-grace", "2s")
	ultra := waitWorker(t, data, "ultra/qwen3-4b", "rejected", 120*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerRejected })
	stopped := waitWorker(t, data, "ultra/qwen3-4b", "rejected with its engine stopped", 120*time.Second, func(w fleet.WorkerView) bool {
		return w.State == fleet.WorkerRejected && w.PID == 0
	})
	for deadline := time.Now().Add(30 * time.Second); alive(ultra.PID); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("engine PID %d of the rejected worker still runs", ultra.PID)
		}
	}
	if !strings.Contains(stopped.Reason, "shape") || !strings.Contains(stopped.Reason, "its engine was stopped after 2s rejected") {
		t.Errorf("reason %q does not keep the rejection and say the engine stopped", stopped.Reason)
	}
	out, code := fleetCmd(t, data, "shape", "ultra", "rig")
	if code == 0 || !strings.Contains(out, "is rejected and its engine is down") {
		t.Errorf("shape on a stopped rejected worker: exit %d:\n%s", code, out)
	}
	if out, code := fleetCmd(t, data, "admit", "--force", "ultra"); code != 0 {
		t.Fatalf("admit --force: exit %d:\n%s", code, out)
	}
	w := waitWorker(t, data, "ultra/qwen3-4b", "ready after admit --force", 120*time.Second, func(w fleet.WorkerView) bool { return w.State == fleet.WorkerReady })
	if !alive(w.PID) {
		t.Errorf("ultra is ready without a live engine: PID %d", w.PID)
	}
}

func TestServeRefusesANonPositiveGrace(t *testing.T) {
	out, code := fleetCmd(t, t.TempDir(), "serve", "--http", "127.0.0.1:0", "--ssh=", "--rejected-grace", "0s")
	if code == 0 || !strings.Contains(out, "--rejected-grace 0s and --admission-wait 2m0s must both be above zero") {
		t.Errorf("serve --rejected-grace 0s: exit %d:\n%s", code, out)
	}
}
