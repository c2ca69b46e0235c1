package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fleet"
)

// The first seed's lesson: vLLM without a reasoning parser leaves <think>
// inline in content while llama-server by default moves it to
// reasoning_content. Under one model name, one of them must be rejected at
// admission with the diff in its events.
const mismatchedShapes = `nodes:
  - name: rig
    address: sim:rtx3060-vllm
  - name: ultra
    address: sim:m1ultra-llamacpp
models:
  - id: qwen3-4b
    context: 16384
    recipes:
      vllm:
        model: Qwen/Qwen3-4B-AWQ
        args: [--enable-auto-tool-choice, --tool-call-parser, hermes]
      llamacpp:
        model: Qwen3-4B-Q4_K_M.gguf
        args: [--jinja]
placements:
  - model: qwen3-4b
    nodes: [rig, ultra]
`

func TestAdmissionRejectsADifferentResponseShape(t *testing.T) {
	data := t.TempDir()
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte(mismatchedShapes), 0o600); err != nil {
		t.Fatal(err)
	}
	h := launchHub(t, data, freePort(t), "--fleet", file)

	var ready, rejected []fleet.WorkerView
	deadline := time.Now().Add(60 * time.Second)
	for len(ready)+len(rejected) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("admission did not settle within 60 s: ready %v, rejected %v", ready, rejected)
		}
		time.Sleep(200 * time.Millisecond)
		ready, rejected = nil, nil
		for _, w := range workersJSON(t, data) {
			switch w.State {
			case fleet.WorkerReady:
				ready = append(ready, w)
			case fleet.WorkerRejected:
				rejected = append(rejected, w)
			}
		}
	}
	if len(ready) != 1 || len(rejected) != 1 {
		t.Fatalf("want one worker admitted (the reference) and one rejected; ready %d, rejected %d", len(ready), len(rejected))
	}
	r := rejected[0]
	if !strings.Contains(r.Reason, "shape") || !strings.Contains(r.Reason, "reasoning") {
		t.Errorf("rejected %s without naming the reasoning difference: %s", r.Name(), r.Reason)
	}
	events, code := fleetCmd(t, data, "events", "--subject", r.Name(), "--limit", "200")
	if code != 0 || !strings.Contains(events, "admission shape differs") || !strings.Contains(events, "reasoning_content") {
		t.Errorf("the diff is not in %s's events (exit %d):\n%s", r.Name(), code, events)
	}
	// The rejected worker takes no traffic.
	base := "http://" + h.http
	for i := 0; i < 4; i++ {
		streamChat(t, base, 4)
	}
	if n := requestsTo(t, base, r.Name()); n != 0 {
		t.Errorf("the router sent %d requests to rejected %s", n, r.Name())
	}
}

// With normalisation on the model, the same two engines answer in one shape
// through the router, so both are admitted and the diff says so.
func TestNormalisationMakesShapesEqual(t *testing.T) {
	data := t.TempDir()
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	normalised := strings.Replace(mismatchedShapes, "    context: 16384\n", "    context: 16384\n    reasoning: inline\n", 1)
	if err := os.WriteFile(file, []byte(normalised), 0o600); err != nil {
		t.Fatal(err)
	}
	h := launchHub(t, data, freePort(t), "--fleet", file)
	waitReady(t, data, 2, 60*time.Second)
	out, code := fleetCmd(t, data, "shape", "rig", "ultra", "--json")
	if code != 0 {
		t.Fatalf("shape: exit %d: %s", code, out)
	}
	if !strings.Contains(out, `"verdict": "same"`) {
		t.Errorf("with reasoning: inline the shapes still differ:\n%s", out)
	}
	// The whole pool against the model's reference: every worker, same.
	out, code = fleetCmd(t, data, "shape", "--all", "qwen3-4b", "--json")
	if code != 0 || strings.Count(out, `"verdict": "same"`) != 2 {
		t.Errorf("shape --all: exit %d, want both workers the same as the reference:\n%s", code, out)
	}
	// And a client of the router reads the thinking inline from either worker.
	for i := 0; i < 4; i++ {
		events, _ := streamChat(t, "http://"+h.http, 8)
		if !strings.Contains(strings.Join(events, ""), `"content":"\u003cthink\u003e`) && !strings.Contains(strings.Join(events, ""), `"content":"<think>`) {
			t.Fatalf("request %d: no inline <think> in the stream: %v", i, events[:3])
		}
	}
}
