package nodes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fleet"
	"fleet/store"
)

// eightRTX3060 is an 8 × 12 GiB box as the sim profile rtx3060-vllm and
// `nvidia-smi` on such a box report it: 12036 MiB free of 12288 on each.
func eightRTX3060() fleet.Platform {
	gpus := make([]fleet.GPU, 8)
	for i := range gpus {
		gpus[i] = fleet.GPU{Name: "NVIDIA GeForce RTX 3060", MemTotalMiB: 12288, MemFreeMiB: 12036}
	}
	return fleet.Platform{OS: "linux", Arch: "amd64", GPUs: gpus, MemTotalBytes: 128 << 30, MemFreeBytes: 117 << 30}
}

func TestRecipeGPUDemand(t *testing.T) {
	tests := []struct {
		name    string
		r       fleet.Recipe
		want    GPUDemand
		wantErr string
	}{
		{name: "no flags: one GPU", want: GPUDemand{1, 1, 1, nil}},
		{name: "long flags", r: fleet.Recipe{Args: []string{"--max-model-len", "8192", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"}}, want: GPUDemand{2, 2, 1, nil}},
		{name: "short and = forms", r: fleet.Recipe{Args: []string{"-tp=4", "-dp", "2"}}, want: GPUDemand{4, 1, 2, nil}},
		{name: "visible devices", r: fleet.Recipe{Env: map[string]string{"CUDA_VISIBLE_DEVICES": "4, 5,6,7"}}, want: GPUDemand{1, 1, 1, []int{4, 5, 6, 7}}},
		{name: "no visible device", r: fleet.Recipe{Env: map[string]string{"CUDA_VISIBLE_DEVICES": ""}}, want: GPUDemand{1, 1, 1, []int{}}},
		{name: "not a number", r: fleet.Recipe{Args: []string{"--tensor-parallel-size", "two"}}, wantErr: `--tensor-parallel-size "two" is not a whole number`},
		{name: "zero", r: fleet.Recipe{Args: []string{"-pp=0"}}, wantErr: `-pp "0" is not a whole number`},
		{name: "missing value", r: fleet.Recipe{Args: []string{"--data-parallel-size"}}, wantErr: "has no value"},
		{name: "UUIDs", r: fleet.Recipe{Env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"}}, wantErr: "GPU indices only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RecipeGPUDemand(tt.r)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to say %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.TensorParallel != tt.want.TensorParallel || got.PipelineParallel != tt.want.PipelineParallel ||
				got.DataParallel != tt.want.DataParallel || !slices.Equal(got.Visible, tt.want.Visible) || (got.Visible == nil) != (tt.want.Visible == nil) {
				t.Errorf("demand = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// Failure 4 of issue 27: memory per GPU, not summed over the node's GPUs.
func TestPlaceOnGPUs(t *testing.T) {
	const gib = 1 << 30
	rig, captured, spark := eightRTX3060(), probeMachine(t, "nvidia-8x3090"), probeMachine(t, "dgx-spark-gb10")
	d := func(tp, pp, dp int, visible ...int) GPUDemand { return GPUDemand{tp, pp, dp, visible} }
	tests := []struct {
		name    string
		p       fleet.Platform
		need    uint64
		d       GPUDemand
		taken   []int
		want    []int
		wantErr string
	}{
		{name: "20 GiB on one 12 GiB GPU is refused with the per-GPU figure", p: rig, need: 20 * gib, d: d(1, 1, 1),
			wantErr: "memory: big needs 20.0 GiB on one GPU (tensor-parallel 1 × pipeline-parallel 1) but rig's GPUs have at most 11.8 GiB free each (8x RTX 3060); spread it over more GPUs (--tensor-parallel-size)"},
		{name: "20 GiB over two GPUs fits", p: rig, need: 20 * gib, d: d(2, 1, 1), want: []int{0, 1}},
		{name: "pipeline parallel splits too", p: rig, need: 20 * gib, d: d(1, 2, 1), want: []int{0, 1}},
		{name: "data parallel takes that many groups", p: rig, need: 20 * gib, d: d(2, 1, 2), want: []int{0, 1, 2, 3}},
		{name: "GPUs of other engines are skipped", p: rig, need: 20 * gib, d: d(2, 1, 1), taken: []int{0, 1}, want: []int{2, 3}},
		{name: "the recipe's CUDA_VISIBLE_DEVICES", p: rig, need: 20 * gib, d: d(2, 1, 1, 6, 7, 4, 5), want: []int{6, 7}},
		{name: "not enough free GPUs left", p: rig, need: 20 * gib, d: d(2, 1, 1, 4, 5, 6), taken: []int{5, 6},
			wantErr: "needs 10.0 GiB on each of 2 GPUs (tensor-parallel 2 × pipeline-parallel 1) but only 1 of rig's GPUs has that free (#4); GPUs #5,6 are held by other engines"},
		{name: "more GPUs than the node has", p: rig, need: gib, d: d(4, 1, 4), wantErr: "asks for 16 GPUs (tensor-parallel 4 × pipeline-parallel 1 × data-parallel 4) and rig has 8"},
		{name: "a visible GPU the node lacks", p: rig, need: gib, d: d(1, 1, 1, 8), wantErr: "CUDA_VISIBLE_DEVICES to GPU 8, and rig has GPUs 0 to 7"},
		{name: "no memory figure: the first free GPUs", p: rig, d: d(1, 1, 1), taken: []int{0}, want: []int{1}},
		// The captured box runs engines on GPUs 0 and 1 (6.0 and 7.2 GiB free).
		{name: "captured 8x3090: busy GPUs are passed over", p: captured, need: 20 * gib, d: d(1, 1, 1), want: []int{2}},
		{name: "captured 8x3090: 40 GiB over two", p: captured, need: 40 * gib, d: d(2, 1, 1), want: []int{2, 3}},
		{name: "captured 8x3090: 30 GiB on one GPU", p: captured, need: 30 * gib, d: d(1, 1, 1), wantErr: "rig's GPUs have at most 24.0 GiB free each (8x RTX 3090)"},
		{name: "unified memory: the GPU, memory checked by the caller", p: spark, need: 90 * gib, d: d(1, 1, 1), want: []int{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PlaceOnGPUs(tt.p, "rig", "big", tt.need, tt.d, tt.taken)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("GPUs %v, err = %v; want it to say %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("GPUs %v, err %v; want %v", got, err, tt.want)
			}
		})
	}
}

// The done criterion, through the manager: a 20 GiB model on an
// 8 × 12 GiB node is refused before launch with a tensor-parallel-1
// recipe, naming the per-GPU figure, and admitted with tensor-parallel 2;
// two engines get different GPUs, and each runs with CUDA_VISIBLE_DEVICES
// set to its own.
func TestManagerGivesVLLMEnginesTheirGPUs(t *testing.T) {
	vllmModel := func(id string, args ...string) fleet.Model {
		return fleet.Model{ID: id, Context: 8192, MemoryGB: 20, Recipes: map[fleet.EngineKind]fleet.Recipe{
			fleet.EngineVLLM: {Model: "Qwen/" + id, Args: args},
		}}
	}
	models := []fleet.Model{vllmModel("tp1"), vllmModel("tp2a", "--tensor-parallel-size", "2"), vllmModel("tp2b", "-tp=2")}
	later := vllmModel("tp2c", "-tp", "2") // placed after a hub restart
	fleetOf := func(models ...fleet.Model) fleet.Fleet {
		f := fleet.Fleet{Nodes: []fleet.Node{{Name: "rig", Address: "sim:rtx3060-vllm"}}, Models: models}
		for _, m := range models {
			f.Placements = append(f.Placements, fleet.Placement{Model: m.ID, Node: "rig"})
		}
		return f
	}
	f := fleetOf(models...)
	gate := func(o *ManagerOptions) {
		o.SimPlatform = func(string) (fleet.Platform, error) { return eightRTX3060(), nil }
		o.Gate = func(_ context.Context, w fleet.Worker, node fleet.Node, held Held) ([]int, error) {
			all := append(slices.Clone(models), later)
			i := slices.IndexFunc(all, func(m fleet.Model) bool { return m.ID == w.Model })
			d, err := RecipeGPUDemand(all[i].Recipes[w.Engine])
			if err != nil {
				return nil, err
			}
			return PlaceOnGPUs(*node.Platform, node.Name, w.Model, MemoryNeed(all[i]), d, held.GPUs)
		}
	}
	data := t.TempDir()
	h := newHarness(t, data, gate)
	cleanupEngines(t, h)
	h.m.SetDesired(f)
	h.run()

	refused := h.waitWorker("rig/tp1", "rejected", func(x fleet.Worker) bool { return x.State == fleet.WorkerRejected })
	if !strings.Contains(refused.Reason, "tp1 needs 20.0 GiB on one GPU (tensor-parallel 1 × pipeline-parallel 1) but rig's GPUs have at most 11.8 GiB free each") || refused.PID != 0 {
		t.Errorf("rig/tp1: reason %q, PID %d; want refused before launch with the per-GPU figure", refused.Reason, refused.PID)
	}
	a, b := h.waitReady("rig/tp2a"), h.waitReady("rig/tp2b")
	if len(a.GPUs) != 2 || len(b.GPUs) != 2 || slices.ContainsFunc(a.GPUs, func(g int) bool { return slices.Contains(b.GPUs, g) }) {
		t.Fatalf("GPUs of tp2a %v and tp2b %v: want two each, none shared", a.GPUs, b.GPUs)
	}
	for _, w := range []fleet.Worker{a, b} {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", w.PID))
		if err != nil {
			t.Fatalf("reading the environment of %s's engine: %v", w.Name(), err)
		}
		want := fmt.Sprintf("CUDA_VISIBLE_DEVICES=%d,%d", w.GPUs[0], w.GPUs[1])
		vars := strings.Split(string(env), "\x00")
		if !slices.Contains(vars, want) || !slices.Contains(vars, "CUDA_DEVICE_ORDER=PCI_BUS_ID") {
			t.Errorf("%s runs on GPUs %v without %s and CUDA_DEVICE_ORDER=PCI_BUS_ID in its environment", w.Name(), w.GPUs, want)
		}
	}
	h.rec.mu.Lock()
	launched := slices.ContainsFunc(h.rec.events, func(e fleet.Event) bool {
		return e.Subject == "rig/tp1" && strings.Contains(e.Message, "launched PID")
	})
	h.rec.mu.Unlock()
	if launched {
		t.Errorf("rig/tp1 was launched:\n%s", h.rec.dump())
	}

	// The hub restarts from its store: it adopts both engines with their
	// GPUs, and a model placed next gets two other GPUs.
	h.stop()
	st, err := store.Open(context.Background(), filepath.Join(data, "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.ApplyFleet(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	for _, w := range h.m.Workers() {
		if _, err := st.SaveWorker(context.Background(), w); err != nil {
			t.Fatal(err)
		}
	}
	stored, err := st.Workers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h2 := newHarness(t, data, func(o *ManagerOptions) {
		gate(o)
		o.PortMin, o.PortMax = h.m.opts.PortMin, h.m.opts.PortMax
	})
	cleanupEngines(t, h2)
	h2.m.Restore(stored)
	h2.m.SetDesired(fleetOf(append(slices.Clone(models), later)...))
	h2.run()
	for _, was := range []fleet.Worker{a, b} {
		got := h2.waitReady(was.Name())
		if got.PID != was.PID || !slices.Equal(got.GPUs, was.GPUs) {
			t.Errorf("%s after the restart: PID %d on GPUs %v, want the adopted PID %d on GPUs %v", was.Name(), got.PID, got.GPUs, was.PID, was.GPUs)
		}
	}
	c := h2.waitReady("rig/tp2c")
	if len(c.GPUs) != 2 || slices.ContainsFunc(c.GPUs, func(g int) bool { return slices.Contains(a.GPUs, g) || slices.Contains(b.GPUs, g) }) {
		t.Errorf("rig/tp2c, placed after the restart, got GPUs %v; tp2a holds %v and tp2b %v", c.GPUs, a.GPUs, b.GPUs)
	}
}
