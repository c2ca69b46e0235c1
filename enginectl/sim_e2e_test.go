package enginectl

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/internal/testbin"
)

// buildFleetSim builds the real simulator (the sim package, another
// engineer's) behind a `sim` subcommand, like the fleet binary.
func buildFleetSim(t *testing.T) string {
	t.Helper()
	return testbin.ForTest(t, "fleet", "./testdata/fleetsim")
}

// TestRealSimulatorOnSimNodes drives `fleet sim` exactly as a simulated
// node would: the real engine's argv shown, fleet sim launched, readiness
// through the engine's own endpoints, load scraped in the mimicked engine's
// shape, adoption, a stale sim on the port stopped, and stop.
func TestRealSimulatorOnSimNodes(t *testing.T) {
	fleetBin := buildFleetSim(t)
	tests := []struct {
		name   string
		node   fleet.Node
		engine fleet.EngineKind
		slots  int // what Scrape must report
	}{
		{"llama.cpp mimic on a simulated M4 Max", fleet.Node{Name: "max", Address: "sim:m4max-llamacpp", Platform: &fleet.Platform{OS: "darwin", Arch: "arm64", Chip: "Apple M4 Max"}}, fleet.EngineLlamaCpp, 4},
		{"vLLM mimic on a simulated RTX 3060 rig", fleet.Node{Name: "rig", Address: "sim:rtx3060-vllm", Platform: &fleet.Platform{OS: "linux", Arch: "amd64", GPUs: []fleet.GPU{{Name: "NVIDIA GeForce RTX 3060"}}}}, fleet.EngineVLLM, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			r := LocalRunner{}
			engine, err := EngineFor(*tc.node.Platform, qwen(), "")
			if err != nil || engine != tc.engine {
				t.Fatalf("EngineFor = %v, %v; want %v", engine, err, tc.engine)
			}
			port := freePort(t)
			spec := Spec{Node: tc.node, Model: qwen(), Engine: engine, Port: port, FleetBin: fleetBin, StateDir: t.TempDir()}
			cmd, err := BuildCommand(spec)
			if err != nil {
				t.Fatal(err)
			}

			// A leftover sim from an earlier hub holds the port.
			stale := exec.Command(fleetBin, "sim", "--mimic", "llamacpp", "--profile", "instant", "--", "--port", strconv.Itoa(port))
			stale.SysProcAttr = newGroup()
			if err := stale.Start(); err != nil {
				t.Fatal(err)
			}
			go stale.Wait()
			t.Cleanup(func() { _ = stale.Process.Kill() })
			waitListening(t, port)
			owner, err := CheckPort(ctx, r, port, cmd.Bin, fast...)
			if err != nil || !owner.Stale || owner.PID != stale.Process.Pid {
				t.Fatalf("CheckPort = %+v, %v; want the stale sim stopped", owner, err)
			}

			p, err := Start(ctx, r, spec, cmd, fast...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = Stop(ctx, r, p, 5*time.Second, fast...) })
			if err := WaitReady(ctx, r, port, p, engine, fast...); err != nil {
				t.Fatal(err)
			}
			load, err := Scrape(ctx, r, port, engine)
			if err != nil {
				t.Fatal(err)
			}
			if load.Running != 0 || load.Waiting != 0 || load.Slots != tc.slots {
				t.Errorf("idle load %+v; want nothing running, %d slots", load, tc.slots)
			}
			if ok, err := Adopt(ctx, r, Process{PID: p.PID, PGID: p.PGID}, cmd.LaunchArgv, fast...); err != nil || !ok {
				t.Errorf("Adopt = %v, %v; want the running sim adopted", ok, err)
			}
			if err := Stop(ctx, r, p, 5*time.Second, fast...); err != nil {
				t.Fatal(err)
			}
			log, _ := os.ReadFile(p.LogPath)
			if len(strings.TrimSpace(string(log))) == 0 {
				t.Error("the sim's log is empty; want its startup line")
			}
		})
	}
}
