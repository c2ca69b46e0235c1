package columns

import (
	"testing"

	"fleet"
)

func TestCells(t *testing.T) {
	w := func(f func(*fleet.WorkerView)) fleet.WorkerView {
		v := fleet.WorkerView{Worker: fleet.Worker{Node: "rig", Model: "qwen3-4b", State: fleet.WorkerReady}}
		f(&v)
		return v
	}
	tests := []struct {
		name string
		col  Column
		w    fleet.WorkerView
		want string
	}{
		{"ctx in KiB", Ctx, w(func(v *fleet.WorkerView) { v.Context = 16384 }), "16k"},
		{"ctx in thousands", Ctx, w(func(v *fleet.WorkerView) { v.Context = 4000 }), "4k"},
		{"ctx small", Ctx, w(func(v *fleet.WorkerView) { v.Context = 512 }), "512"},
		{"ctx unknown", Ctx, w(func(v *fleet.WorkerView) {}), "-"},
		{"tok/s small keeps a decimal", TokS, w(func(v *fleet.WorkerView) { v.TokPerSec = 42.46 }), "42.5"},
		{"tok/s large", TokS, w(func(v *fleet.WorkerView) { v.TokPerSec = 1234.4 }), "1234"},
		{"tok/s unmeasured", TokS, w(func(v *fleet.WorkerView) {}), "-"},
		{"TTFT under 10 ms", TTFT, w(func(v *fleet.WorkerView) { v.TTFTms = 4.25 }), "4.2ms"},
		{"TTFT ms", TTFT, w(func(v *fleet.WorkerView) { v.TTFTms = 187.2 }), "187ms"},
		{"TTFT seconds", TTFT, w(func(v *fleet.WorkerView) { v.TTFTms = 2345 }), "2.3s"},
		{"ITL unmeasured", ITL, w(func(v *fleet.WorkerView) {}), "-"},
		{"load with slots", Load, w(func(v *fleet.WorkerView) { v.InFlight, v.Slots = 3, 4 }), "3/4"},
		{"load without slots", Load, w(func(v *fleet.WorkerView) { v.InFlight = 1 }), "1/-"},
		{"state", State, w(func(v *fleet.WorkerView) {}), "ready"},
		{"state installing with progress", State, w(func(v *fleet.WorkerView) { v.State, v.Progress = fleet.WorkerInstalling, 42.4 }), "installing 42%"},
		{"state installing before progress", State, w(func(v *fleet.WorkerView) { v.State = fleet.WorkerInstalling }), "installing"},
		{"state ignores a finished install's progress", State, w(func(v *fleet.WorkerView) { v.Progress = 100 }), "ready"},
		{"drained with requests in flight", State, w(func(v *fleet.WorkerView) { v.State, v.Drained, v.InFlight = fleet.WorkerDraining, true, 2 }), "draining"},
		{"drained with nothing in flight", State, w(func(v *fleet.WorkerView) { v.State, v.Drained = fleet.WorkerDraining, true }), "drained"},
		{"drained on probation", State, w(func(v *fleet.WorkerView) { v.State, v.Drained = fleet.WorkerProbation, true }), "probation, drained"},
		{"drained while downloading", State, w(func(v *fleet.WorkerView) { v.State, v.Drained, v.Progress = fleet.WorkerStarting, true, 40 }), "starting 40%, drained"},
		{"stopped after a drain", State, w(func(v *fleet.WorkerView) { v.State, v.Drained = fleet.WorkerStopped, true }), "stopped"},
		{"argv", Argv, w(func(v *fleet.WorkerView) { v.Argv = []string{"llama-server", "-c", "16384"} }), "llama-server -c 16384"},
		{"pid", PID, w(func(v *fleet.WorkerView) { v.PID, v.Port = 42, 18000 }), "42"},
		{"port", Port, w(func(v *fleet.WorkerView) { v.PID, v.Port = 42, 18000 }), "18000"},
		{"no pid when stopped", PID, w(func(v *fleet.WorkerView) { v.State, v.Port = fleet.WorkerStopped, 18000 }), "-"},
		{"no port without a process", Port, w(func(v *fleet.WorkerView) { v.State, v.Port = fleet.WorkerStopped, 18000 }), "-"},
		{"engine", Engine, w(func(v *fleet.WorkerView) { v.Engine = fleet.EngineLlamaCpp }), "llama.cpp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.col.Cell(tt.w); got != tt.want {
				t.Errorf("%s cell = %q, want %q", tt.col.Header, got, tt.want)
			}
		})
	}
}

func TestCLIHeaderIsTheHeaderInCapitals(t *testing.T) {
	if got := Argv.CLIHeader(); got != "STARTED WITH" {
		t.Errorf("Argv.CLIHeader() = %q, want STARTED WITH", got)
	}
}

// The GPU cell shows which of the node's GPUs a worker holds, within the
// column's width.
func TestGPUCell(t *testing.T) {
	tests := []struct {
		gpu  string
		gpus []int
		want string
	}{
		{"Apple M4 Max", nil, "Apple M4 Max"},
		{"8x RTX 3060", []int{2, 3}, "8x RTX 3060 #2,3"},
		{"8x RTX 3060", []int{0, 1, 2, 3}, "8x RTX 3060 #0-3"},
		{"8x RTX 3090", []int{6}, "8x RTX 3090 #6"},
		{"8x RTX PRO 6000 Blackwell", []int{0, 1, 2, 3, 4, 5, 6, 7}, "8x RTX PRO 6… #0-7"},
		{"GB10", []int{0}, "GB10 #0"},
	}
	for _, tt := range tests {
		got := GPUCell(fleet.WorkerView{GPU: tt.gpu, Worker: fleet.Worker{GPUs: tt.gpus}})
		if got != tt.want {
			t.Errorf("GPUCell(%q, %v) = %q, want %q", tt.gpu, tt.gpus, got, tt.want)
		}
		if n := len([]rune(got)); n > GPU.Max {
			t.Errorf("GPUCell(%q, %v) = %q: %d cells, wider than the column's %d", tt.gpu, tt.gpus, got, n, GPU.Max)
		}
	}
}
