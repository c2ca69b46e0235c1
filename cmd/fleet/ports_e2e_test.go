package main

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"fleet"
)

// Engine ports come from the node's ports: in the fleet file, else the
// hub's --engine-ports; both show in `nodes` and `status`, and export
// writes the node's back.
func TestEnginePortsFromTheFleetFileAndTheHub(t *testing.T) {
	// Two ranges of 20 below the ephemeral ports; sim engines bind the
	// hub's machine, where a port another program holds is skipped.
	base := 20000 + 200*rand.IntN(40)
	hubPorts := fleet.PortRange{Min: base, Max: base + 19}
	maxPorts := fleet.PortRange{Min: base + 100, Max: base + 119}
	data := t.TempDir()
	file := writeFleet(t, fmt.Sprintf(`nodes:
  - name: rig
    address: sim:rtx3060-vllm
  - name: max
    address: sim:m4max-llamacpp
    ports: %s
models:
  - id: qwen3-4b
    context: 16384
    recipes:
      vllm:
        model: Qwen/Qwen3-4B-AWQ
      llamacpp:
        model: Qwen/Qwen3-4B-GGUF:Q4_K_M
placements:
  - model: qwen3-4b
    nodes: [rig, max]
`, maxPorts))
	launchHub(t, data, freePort(t), "--fleet", file, "--engine-ports", hubPorts.String())
	for node, want := range map[string]fleet.PortRange{"rig": hubPorts, "max": maxPorts} {
		// Serving is enough: admission (the two sims differ in shape) is
		// not what this is about.
		w := waitWorker(t, data, node+"/qwen3-4b", "serving", 120*time.Second, func(w fleet.WorkerView) bool {
			return w.PID > 0 && (w.State == fleet.WorkerProbation || w.State == fleet.WorkerReady || w.State == fleet.WorkerRejected)
		})
		if w.Port < want.Min || w.Port > want.Max {
			t.Errorf("%s listens on port %d, outside %s", w.Name(), w.Port, want)
		}
	}

	out, code := fleetCmd(t, data, "nodes")
	if code != 0 {
		t.Fatalf("nodes: exit %d\n%s", code, out)
	}
	for node, want := range map[string]string{"rig": hubPorts.String() + " (hub's)", "max": maxPorts.String()} {
		if !regexp.MustCompile(`(?m)^` + node + `\s.*\s` + regexp.QuoteMeta(want) + `\s`).MatchString(out) {
			t.Errorf("the nodes table does not show %s's ports as %q:\n%s", node, want, out)
		}
	}
	if out, _ := fleetCmd(t, data, "status"); !strings.Contains(out, "engine ports  "+hubPorts.String()) {
		t.Errorf("status does not show the hub's engine ports %s:\n%s", hubPorts, out)
	}
	if out, _ := fleetCmd(t, data, "export"); !strings.Contains(out, "    ports: "+maxPorts.String()+"\n") {
		t.Errorf("export does not write max's ports %s:\n%s", maxPorts, out)
	}
}

func TestServeRefusesBadEnginePorts(t *testing.T) {
	out, code := fleetCmd(t, t.TempDir(), "serve", "--http", "127.0.0.1:0", "--ssh=", "--engine-ports", "80-90")
	if code == 0 || !strings.Contains(out, `--engine-ports: ports "80-90" must be MIN-MAX, two port numbers from 1024 to 65535, like 18000-18999`) {
		t.Errorf("serve --engine-ports 80-90: exit %d:\n%s", code, out)
	}
}
