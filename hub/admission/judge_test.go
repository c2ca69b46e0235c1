package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/bench"
	"fleet/bench/shape"
	"fleet/nodes"
	"fleet/sim/simtest"
	"fleet/store"
)

// peer is a worker of model m beside the one being judged, with its
// admission record (none when tokS is 0).
type peer struct {
	node    string
	state   fleet.WorkerState
	drained bool
	tokS    float64
	shape   int
	stale   bool // the record is of an earlier launch
}

// judgeWith is a Judge whose fleet holds the peers of a/m.
func judgeWith(t *testing.T, peers []peer) (*Judge, fleet.Worker) {
	t.Helper()
	fl := &testFleet{workers: map[string]fleet.Worker{}}
	j, _ := newTestJudge(t, fl)
	launched := time.Now().Add(-time.Minute)
	for _, p := range peers {
		w := fleet.Worker{Node: p.node, Model: "m", State: p.state, Drained: p.drained, StartedAt: launched}
		fl.put(w)
		if p.tokS > 0 {
			r := speedRecord{tokS: p.tokS, started: launched, shape: p.shape}
			if p.stale {
				r.started = launched.Add(-time.Hour)
			}
			j.speeds[w.Name()] = r
		}
	}
	w := fleet.Worker{Node: "a", Model: "m", State: fleet.WorkerProbation, StartedAt: launched}
	fl.put(w)
	return j, w
}

// A worker measured at 40 tok/s (tolerance 0.5) waits only for peers that
// could reject it and whose shape is being judged; a peer not measured yet,
// the starved node of issue 21, holds no one up.
func TestFasterPending(t *testing.T) {
	tests := []struct {
		name  string
		peers []peer
		want  []string
	}{
		{"a peer not measured yet holds no one up", []peer{{node: "slow", state: fleet.WorkerProbation}}, nil},
		{"a slower peer, shape pending", []peer{{node: "slow", state: fleet.WorkerProbation, tokS: 30}}, nil},
		{"a peer fast enough to reject it, shape pending", []peer{{node: "fast", state: fleet.WorkerProbation, tokS: 100}}, []string{"fast/m"}},
		{"exactly at the bar does not reject", []peer{{node: "fast", state: fleet.WorkerProbation, tokS: 80}}, nil},
		{"a faster peer whose shape was judged", []peer{{node: "fast", state: fleet.WorkerProbation, tokS: 100, shape: 1}}, nil},
		{"a record of an earlier launch", []peer{{node: "fast", state: fleet.WorkerProbation, tokS: 100, stale: true}}, nil},
		{"a ready worker is judged against, not waited for", []peer{{node: "fast", state: fleet.WorkerReady, tokS: 100}}, nil},
		{"several, sorted", []peer{
			{node: "z", state: fleet.WorkerProbation, tokS: 100},
			{node: "slow", state: fleet.WorkerStarting},
			{node: "b", state: fleet.WorkerProbation, tokS: 90},
		}, []string{"b/m", "z/m"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, w := judgeWith(t, tt.peers)
			if got := j.fasterPending(w, 40, 0.5); !slices.Equal(got, tt.want) {
				t.Errorf("waits for %v, want %v", got, tt.want)
			}
		})
	}
}

// The bar is the fastest worker measured so far whose shape did not fail;
// a ready worker with no figure is measured before anyone is judged
// against it (its figure counts as infinite).
func TestBestMeasured(t *testing.T) {
	tests := []struct {
		name      string
		peers     []peer
		best      string
		bestSpeed float64
	}{
		{"nothing measured", []peer{{node: "slow", state: fleet.WorkerStarting}, {node: "b", state: fleet.WorkerProbation}}, "", 0},
		{"a peer measured and shape-checked beats a ready worker", []peer{
			{node: "r", state: fleet.WorkerReady, tokS: 90, shape: 1},
			{node: "p", state: fleet.WorkerProbation, tokS: 120, shape: 1},
		}, "p/m", 120},
		{"a peer whose shape is pending or failed sets no bar", []peer{
			{node: "r", state: fleet.WorkerReady, tokS: 90, shape: 1},
			{node: "p", state: fleet.WorkerProbation, tokS: 120},
			{node: "q", state: fleet.WorkerProbation, tokS: 150, shape: -1},
		}, "r/m", 90},
		{"an unchecked peer (no reference answered) sets it", []peer{{node: "p", state: fleet.WorkerProbation, tokS: 70, shape: 2}}, "p/m", 70},
		{"a drained or rejected worker sets no bar", []peer{
			{node: "d", state: fleet.WorkerReady, drained: true, tokS: 200, shape: 1},
			{node: "x", state: fleet.WorkerRejected, tokS: 300, shape: -1},
			{node: "r", state: fleet.WorkerReady, tokS: 90, shape: 1},
		}, "r/m", 90},
		{"a ready worker never measured here is measured first", []peer{
			{node: "r", state: fleet.WorkerReady, tokS: 90, shape: 1},
			{node: "adopted", state: fleet.WorkerReady},
		}, "adopted/m", math.Inf(1)},
		{"a ready worker's record of an earlier launch is no figure", []peer{{node: "r", state: fleet.WorkerReady, tokS: 90, shape: 1, stale: true}}, "r/m", math.Inf(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, w := judgeWith(t, tt.peers)
			if best, speed := j.bestMeasured(w); best != tt.best || speed != tt.bestSpeed {
				t.Errorf("best %q at %v, want %q at %v", best, speed, tt.best, tt.bestSpeed)
			}
		})
	}
}

func TestCheckMemory(t *testing.T) {
	const gib = 1 << 30
	model := fleet.Model{ID: "qwen3-4b", MemoryGB: 3}
	worker := fleet.Worker{Node: "n", Model: "qwen3-4b"}
	tests := []struct {
		name    string
		model   fleet.Model
		node    fleet.Node
		held    uint64 // held for other launches on the node
		wantErr string // "" = admitted
	}{
		{name: "Linux GPU with room", model: model,
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 1 * gib, GPUs: []fleet.GPU{{MemFreeMiB: 4096}}}}},
		{name: "Linux GPU too full: GPU memory counts, not RAM", model: model,
			node:    fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 64 * gib, GPUs: []fleet.GPU{{MemFreeMiB: 2048}}}},
			wantErr: "memory: qwen3-4b needs 3.0 GiB but n has 2.0 GiB usable (free GPU memory)"},
		{name: "Linux GPU with room, but not beside a launch in progress", model: model, held: 2 * gib,
			node:    fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", GPUs: []fleet.GPU{{MemFreeMiB: 4096}}}},
			wantErr: "n has 2.0 GiB usable (free GPU memory, less 2.0 GiB held for launches in progress on it)"},
		{name: "held beyond what the node has", model: model, held: 8 * gib,
			node:    fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 4 * gib}},
			wantErr: "n has 0.0 GiB usable (free memory, less 8.0 GiB held"},
		{name: "room beside a launch in progress", model: model, held: 1 * gib,
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 4 * gib}}},
		{name: "Linux CPU node uses available RAM", model: model,
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 4 * gib}}},
		{name: "Mac counts three quarters of free memory", model: model,
			node:    fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "darwin", MemFreeBytes: 3 * gib}},
			wantErr: "has 2.2 GiB usable (three quarters of free + inactive + speculative memory)"},
		{name: "Mac with room", model: model,
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "darwin", MemFreeBytes: 8 * gib}}},
		{name: "model without a memory figure is not checked", model: fleet.Model{ID: "qwen3-4b"},
			node: fleet.Node{Name: "n", Platform: &fleet.Platform{OS: "darwin"}}},
		{name: "node never probed is not judged", model: model, node: fleet.Node{Name: "n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := CheckMemory(worker, tt.model, tt.node, nodes.Held{Bytes: tt.held})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("rejected: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("error %v, want one saying %q", err, tt.wantErr)
			case err != nil && !strings.Contains(err.Error(), "place the model elsewhere"):
				t.Errorf("error %q does not say what to do", err)
			}
		})
	}
}

// A store that fails to keep a reference shape loses nothing: the Judge
// says what failed and what to do, the stored reference stays the one
// before, no worker is judged against a reference that was not kept, and
// once the store answers again the same step goes through (nothing was
// left held).
func TestReferenceNotStored(t *testing.T) {
	const model = "qwen3-4b"
	// The workers answer as llama-server does; the stored reference was
	// taken from vLLM, whose reasoning is elsewhere (a material change).
	llama := simtest.Start(t, "--mimic", "llamacpp", "--profile", "instant", "--",
		"-m", "Qwen3-4B-Q4_K_M.gguf", "-a", model, "-c", "16384", "--jinja")
	vllm := simtest.Start(t, "--mimic", "vllm", "--profile", "instant", "--",
		"serve", "Qwen/Qwen3-4B-AWQ", "--served-model-name", model, "--max-model-len", "16384")
	before, err := shape.MeasureWith(t.Context(), bench.Target{Name: "vllm", BaseURL: vllm.URL + "/v1", Model: model}, shape.Options{MaxTokens: admissionShapeTokens})
	if err != nil {
		t.Fatal(err)
	}
	oldShape, err := json.Marshal(before)
	if err != nil {
		t.Fatal(err)
	}
	port := llama.Listener.Addr().(*net.TCPAddr).Port
	argv := []string{"llama-server", "-a", model, "--jinja"}
	ref := fleet.Worker{Node: "ref", Model: model, State: fleet.WorkerReady, PID: 7, Port: port, Argv: argv}
	peer := fleet.Worker{Node: "peer", Model: model, State: fleet.WorkerProbation, PID: 8, Port: port, Argv: argv}
	checkShape := func(w fleet.Worker) func(context.Context, *Judge) error {
		return func(ctx context.Context, j *Judge) error {
			_, err := j.checkShape(ctx, w)
			return err
		}
	}

	tests := []struct {
		name string
		old  store.Reference
		// step is the Judge's step that stores taker's shape as the
		// model's reference.
		step    func(context.Context, *Judge) error
		taker   string
		wantErr string
	}{
		{"the reference worker retakes the reference",
			store.Reference{Shape: oldShape, Source: ref.Name(), Argv: []string{"llama-server"}},
			checkShape(ref), ref.Name(), "shape: storing the reference of qwen3-4b failed; the stored one is as it was ('restart ref/qwen3-4b' judges it again)"},
		{"the pinned worker retakes the pin",
			store.Reference{Shape: oldShape, Pinned: true, Source: peer.Name(), Argv: argv},
			checkShape(peer), peer.Name(), "shape: storing the pinned reference of qwen3-4b failed; the stored one is as it was ('restart peer/qwen3-4b' judges it again)"},
		{"shape pin",
			store.Reference{Shape: oldShape, Source: ref.Name(), Argv: argv},
			func(ctx context.Context, j *Judge) error {
				_, err := j.Pin(ctx, peer.Name())
				return err
			}, peer.Name(), "storing peer/qwen3-4b's shape as the pinned reference of qwen3-4b failed; the stored one is as it was (run 'shape pin peer/qwen3-4b' again)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			fl := &testFleet{models: []fleet.Model{{ID: model}}}
			nodes := &loopbackNodes{}
			refs := &failingReferences{}
			tj := newTestJudgeWith(t, fl, nodes, func(s Store) Store { refs.Store = s; return refs })
			fl.put(ref)
			fl.put(peer)
			// ref is the model's reference node: placed first.
			if err := tj.store.ApplyFleet(ctx, fleet.Fleet{
				Nodes: []fleet.Node{{Name: "ref", Address: fleet.AddressLocal}, {Name: "peer", Address: fleet.AddressLocal}},
				Models: []fleet.Model{{ID: model, Context: 16384, Recipes: map[fleet.EngineKind]fleet.Recipe{
					fleet.EngineLlamaCpp: {Engine: fleet.EngineLlamaCpp, Model: "Qwen3-4B-Q4_K_M.gguf"},
				}}},
				Placements: []fleet.Placement{{Model: model, Node: "ref"}, {Model: model, Node: "peer"}},
			}); err != nil {
				t.Fatal(err)
			}
			if err := tj.store.SetReference(ctx, model, tt.old); err != nil {
				t.Fatal(err)
			}

			refs.fail.Store(true)
			err := tt.step(ctx, tj.j)
			if !errors.Is(err, errStoreDown) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v; want the store's, saying %q", err, tt.wantErr)
			}
			got, rerr := tj.store.Reference(ctx, model)
			if rerr != nil || got.Source != tt.old.Source || got.Pinned != tt.old.Pinned || !bytes.Equal(got.Shape, tt.old.Shape) {
				t.Errorf("stored reference from %s (pinned %v), %v; want the one before, from %s (pinned %v)", got.Source, got.Pinned, rerr, tt.old.Source, tt.old.Pinned)
			}
			if n := tj.detached.Load(); n != 0 {
				t.Errorf("%d re-judging(s) started against a reference that was not kept", n)
			}
			if v := nodes.judged(); len(v) != 0 {
				t.Errorf("workers judged against a reference that was not kept: %v", v)
			}

			refs.fail.Store(false)
			if err := tt.step(ctx, tj.j); err != nil {
				t.Fatalf("once the store answers: %v", err)
			}
			if got, err := tj.store.Reference(ctx, model); err != nil || got.Source != tt.taker || bytes.Equal(got.Shape, tt.old.Shape) {
				t.Errorf("once the store answers, the stored reference is from %s, %v; want %s's new shape", got.Source, err, tt.taker)
			}
			// Kept, the new reference is what the model's workers are judged
			// against again (Pin at once, the others detached).
			if tj.detached.Load() == 0 && len(nodes.judged()) == 0 {
				t.Error("once the store answers, no worker is judged again against the new reference")
			}
		})
	}
}

// Failure 4 of issue 27 at the gate: a vLLM engine's memory against the
// GPUs its recipe spreads it over, not the node's GPUs summed; vLLM refused
// on a node whose nvidia-smi fails.
func TestCheckMemoryPerGPU(t *testing.T) {
	const gib = 1 << 30
	eight := make([]fleet.GPU, 8)
	for i := range eight {
		eight[i] = fleet.GPU{Name: "NVIDIA GeForce RTX 3060", MemTotalMiB: 12288, MemFreeMiB: 12036}
	}
	rig := fleet.Node{Name: "rig", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 117 * gib, GPUs: eight}}
	failed := fleet.Node{Name: "rig", Platform: &fleet.Platform{OS: "linux", MemFreeBytes: 60 * gib,
		GPUError: "nvidia-smi failed (exit status 18): Failed to initialize NVML: Driver/library version mismatch. The NVIDIA driver was upgraded while the old one is still loaded (unattended upgrades do this): reboot the node, or reinstall the driver; the node serves on CPU until then, and vLLM is refused on it"}}
	spark := fleet.Node{Name: "spark", Platform: &fleet.Platform{OS: "linux", Arch: "arm64", MemFreeBytes: 7789944 * 1024, GPUs: []fleet.GPU{{Name: "NVIDIA GB10"}}}}
	model := func(engine fleet.EngineKind, gb float64, args ...string) fleet.Model {
		return fleet.Model{ID: "big", MemoryGB: gb, Recipes: map[fleet.EngineKind]fleet.Recipe{engine: {Model: "m", Args: args}}}
	}
	tests := []struct {
		name    string
		engine  fleet.EngineKind
		model   fleet.Model
		node    fleet.Node
		held    nodes.Held
		want    []int
		wantErr string
	}{
		{name: "20 GiB, tensor-parallel 1, 8 × 12 GiB: refused with the per-GPU figure", engine: fleet.EngineVLLM, model: model(fleet.EngineVLLM, 20), node: rig,
			wantErr: "memory: big needs 20.0 GiB on one GPU (tensor-parallel 1 × pipeline-parallel 1) but rig's GPUs have at most 11.8 GiB free each (8x RTX 3060)"},
		{name: "20 GiB, tensor-parallel 2: admitted on two GPUs", engine: fleet.EngineVLLM, model: model(fleet.EngineVLLM, 20, "--tensor-parallel-size", "2"), node: rig, want: []int{0, 1}},
		{name: "beside an engine on GPUs 0 and 1", engine: fleet.EngineVLLM, model: model(fleet.EngineVLLM, 20, "-tp", "2"), node: rig, held: nodes.Held{GPUs: []int{0, 1}}, want: []int{2, 3}},
		{name: "llama.cpp splits over every GPU: summed", engine: fleet.EngineLlamaCpp, model: model(fleet.EngineLlamaCpp, 20), node: rig},
		{name: "vLLM on a failed GPU is refused with what to do", engine: fleet.EngineVLLM, model: model(fleet.EngineVLLM, 3), node: failed,
			wantErr: "gpu: vLLM needs the NVIDIA GPUs of rig, and nvidia-smi failed (exit status 18): Failed to initialize NVML: Driver/library version mismatch. The NVIDIA driver was upgraded"},
		{name: "llama.cpp on a failed GPU serves on CPU", engine: fleet.EngineLlamaCpp, model: model(fleet.EngineLlamaCpp, 20), node: failed},
		{name: "unified memory: system memory counts", engine: fleet.EngineVLLM, model: model(fleet.EngineVLLM, 20), node: spark,
			wantErr: "memory: big needs 20.0 GiB but spark has 7.4 GiB usable (free memory)"},
		{name: "unified memory with room", engine: fleet.EngineVLLM, model: model(fleet.EngineVLLM, 5), node: spark, want: []int{0}},
		{name: "unreadable recipe", engine: fleet.EngineVLLM, model: model(fleet.EngineVLLM, 5, "-tp", "all"), node: rig,
			wantErr: `memory: big's vllm recipe: recipe argument -tp "all" is not a whole number`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := fleet.Worker{Node: tt.node.Name, Model: "big", Engine: tt.engine}
			got, err := CheckMemory(w, tt.model, tt.node, tt.held)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("GPUs %v, error %v; want one saying %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("GPUs %v, error %v; want GPUs %v", got, err, tt.want)
			}
		})
	}
}
