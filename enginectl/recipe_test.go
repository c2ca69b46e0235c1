package enginectl

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"fleet"
)

// qwen is the example model of the README's fleet file, one recipe per engine.
func qwen() fleet.Model {
	return fleet.Model{ID: "qwen3-4b", Aliases: []string{"qwen3"}, Context: 16384, MemoryGB: 3,
		Recipes: map[fleet.EngineKind]fleet.Recipe{
			fleet.EngineVLLM: {Model: "Qwen/Qwen3-4B-AWQ", Args: []string{"--tensor-parallel-size", "1", "--data-parallel-size", "3",
				"--enable-auto-tool-choice", "--tool-call-parser", "hermes"}},
			fleet.EngineLlamaCpp:  {Model: "Qwen/Qwen3-4B-GGUF:Q4_K_M", Args: []string{"-ngl", "99", "--jinja", "--reasoning-format", "none"}},
			fleet.EngineVLLMMetal: {Model: "Qwen/Qwen3-4B", Args: []string{"--max-num-seqs", "8"}},
			fleet.EngineOllama:    {Model: "qwen3:4b"},
			fleet.EngineSim:       {Profile: "m4max-llamacpp", Args: []string{"--reasoning-format", "none"}},
		}}
}

func withRecipe(k fleet.EngineKind, r fleet.Recipe) fleet.Model {
	m := qwen()
	m.Recipes = maps.Clone(m.Recipes)
	m.Recipes[k] = r
	return m
}

var (
	localNode = fleet.Node{Name: "rig", Address: "local"}
	simMax    = fleet.Node{Name: "max", Address: "sim:m4max-llamacpp"}
	// directNode's engines are dialled at its address, not through SSH.
	directNode = fleet.Node{Name: "rig", Address: "ops@rig.lan", Endpoint: "direct"}
	simRig     = fleet.Node{Name: "rig", Address: "sim:rtx3060-vllm"}
)

func TestBuildCommand(t *testing.T) {
	tests := []struct {
		name       string
		spec       Spec
		argv       string // space-joined
		launch     string // "" = same as argv
		env        map[string]string
		slots      int
		served     string
		simulated  bool
		wantErrHas string
	}{
		{
			name: "vllm",
			spec: Spec{Node: localNode, Model: qwen(), Engine: fleet.EngineVLLM, Port: 18001},
			argv: "vllm serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3-4b --max-model-len 16384 --host 127.0.0.1 --port 18001 " +
				"--tensor-parallel-size 1 --data-parallel-size 3 --enable-auto-tool-choice --tool-call-parser hermes",
			slots: 256, served: "qwen3-4b",
		},
		{
			name:  "vllm keeps --quantization awq when the recipe says so",
			spec:  Spec{Node: localNode, Model: withRecipe(fleet.EngineVLLM, fleet.Recipe{Model: "Qwen/Qwen3-4B-AWQ", Args: []string{"--quantization", "awq", "--max-num-seqs", "64"}}), Engine: fleet.EngineVLLM, Port: 18001},
			argv:  "vllm serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3-4b --max-model-len 16384 --host 127.0.0.1 --port 18001 --quantization awq --max-num-seqs 64",
			slots: 64, served: "qwen3-4b",
		},
		{
			name: "vllm with bin and env",
			spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineVLLM, fleet.Recipe{Model: "Qwen/Qwen3-4B-AWQ", Bin: "/opt/vllm/bin/vllm", Env: map[string]string{"CUDA_VISIBLE_DEVICES": "0,1"}}), Engine: fleet.EngineVLLM, Port: 8000},
			argv: "/opt/vllm/bin/vllm serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3-4b --max-model-len 16384 --host 127.0.0.1 --port 8000",
			env:  map[string]string{"CUDA_VISIBLE_DEVICES": "0,1"}, slots: 256, served: "qwen3-4b",
		},
		{
			name:  "vllm-metal runs from its venv",
			spec:  Spec{Node: localNode, Model: qwen(), Engine: fleet.EngineVLLMMetal, Port: 18002},
			argv:  "~/.venv-vllm-metal/bin/vllm serve Qwen/Qwen3-4B --served-model-name qwen3-4b --max-model-len 16384 --host 127.0.0.1 --port 18002 --max-num-seqs 8",
			slots: 8, served: "qwen3-4b",
		},
		{
			name:  "llamacpp from repo:quant downloads with -hf",
			spec:  Spec{Node: localNode, Model: qwen(), Engine: fleet.EngineLlamaCpp, Port: 18003},
			argv:  "llama-server -hf Qwen/Qwen3-4B-GGUF:Q4_K_M -a qwen3-4b -c 16384 --host 127.0.0.1 --port 18003 -np 4 --kv-unified -ngl 99 --jinja --reasoning-format none",
			slots: 4, served: "qwen3-4b",
		},
		{
			name: "llamacpp from a gguf path (the seed's command line)",
			spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineLlamaCpp, fleet.Recipe{Model: "Qwen3-4B-Q4_K_M.gguf", Bin: "/opt/homebrew/bin/llama-server",
				Args: []string{"-ngl", "99", "--jinja", "--reasoning-format", "none"}}), Engine: fleet.EngineLlamaCpp, Port: 8090},
			argv:  "/opt/homebrew/bin/llama-server -m Qwen3-4B-Q4_K_M.gguf -a qwen3-4b -c 16384 --host 127.0.0.1 --port 8090 -np 4 --kv-unified -ngl 99 --jinja --reasoning-format none",
			slots: 4, served: "qwen3-4b",
		},
		{
			name:  "llamacpp: recipe -np keeps the full context per slot with --kv-unified",
			spec:  Spec{Node: localNode, Model: withRecipe(fleet.EngineLlamaCpp, fleet.Recipe{Model: "/models/q.gguf", Args: []string{"-np", "2"}}), Engine: fleet.EngineLlamaCpp, Port: 1},
			argv:  "llama-server -m /models/q.gguf -a qwen3-4b -c 16384 --host 127.0.0.1 --port 1 --kv-unified -np 2",
			slots: 2, served: "qwen3-4b",
		},
		{
			name:  "llamacpp: --no-kv-unified multiplies -c by the slots",
			spec:  Spec{Node: localNode, Model: withRecipe(fleet.EngineLlamaCpp, fleet.Recipe{Model: "~/models/q.gguf", Args: []string{"--parallel=3", "--no-kv-unified"}}), Engine: fleet.EngineLlamaCpp, Port: 2},
			argv:  "llama-server -m ~/models/q.gguf -a qwen3-4b -c 49152 --host 127.0.0.1 --port 2 --parallel=3 --no-kv-unified",
			slots: 3, served: "qwen3-4b",
		},
		{
			name:  "llamacpp: recipe --kv-unified is not repeated",
			spec:  Spec{Node: localNode, Model: withRecipe(fleet.EngineLlamaCpp, fleet.Recipe{Model: "q.gguf", Args: []string{"--kv-unified"}}), Engine: fleet.EngineLlamaCpp, Port: 3},
			argv:  "llama-server -m q.gguf -a qwen3-4b -c 16384 --host 127.0.0.1 --port 3 -np 4 --kv-unified",
			slots: 4, served: "qwen3-4b",
		},
		{
			name:  "ollama is configured through env",
			spec:  Spec{Node: localNode, Model: qwen(), Engine: fleet.EngineOllama, Port: 18004},
			argv:  "ollama serve",
			env:   map[string]string{"OLLAMA_HOST": "127.0.0.1:18004", "OLLAMA_CONTEXT_LENGTH": "16384", "OLLAMA_NUM_PARALLEL": "4"},
			slots: 4, served: "qwen3:4b",
		},
		{
			name:  "ollama: recipe sets the parallelism",
			spec:  Spec{Node: localNode, Model: withRecipe(fleet.EngineOllama, fleet.Recipe{Model: "qwen3:4b", Env: map[string]string{"OLLAMA_NUM_PARALLEL": "2", "OLLAMA_KEEP_ALIVE": "-1"}}), Engine: fleet.EngineOllama, Port: 11434},
			argv:  "ollama serve",
			env:   map[string]string{"OLLAMA_HOST": "127.0.0.1:11434", "OLLAMA_CONTEXT_LENGTH": "16384", "OLLAMA_NUM_PARALLEL": "2", "OLLAMA_KEEP_ALIVE": "-1"},
			slots: 2, served: "qwen3:4b",
		},
		{
			name: "llamacpp on a simulated Mac runs fleet sim with the real argv",
			spec: Spec{Node: simMax, Model: qwen(), Engine: fleet.EngineLlamaCpp, Port: 18005, FleetBin: "/usr/local/bin/fleet"},
			argv: "llama-server -hf Qwen/Qwen3-4B-GGUF:Q4_K_M -a qwen3-4b -c 16384 --host 127.0.0.1 --port 18005 -np 4 --kv-unified -ngl 99 --jinja --reasoning-format none",
			launch: "/usr/local/bin/fleet sim --mimic llamacpp --profile m4max-llamacpp -- " +
				"-hf Qwen/Qwen3-4B-GGUF:Q4_K_M -a qwen3-4b -c 16384 --host 127.0.0.1 --port 18005 -np 4 --kv-unified -ngl 99 --jinja --reasoning-format none",
			slots: 4, served: "qwen3-4b", simulated: true,
		},
		{
			name: "vllm on a simulated rig mimics vllm with serve MODEL",
			spec: Spec{Node: simRig, Model: qwen(), Engine: fleet.EngineVLLM, Port: 18006, FleetBin: "/usr/local/bin/fleet"},
			argv: "vllm serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3-4b --max-model-len 16384 --host 127.0.0.1 --port 18006 " +
				"--tensor-parallel-size 1 --data-parallel-size 3 --enable-auto-tool-choice --tool-call-parser hermes",
			launch: "/usr/local/bin/fleet sim --mimic vllm --profile rtx3060-vllm -- serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3-4b " +
				"--max-model-len 16384 --host 127.0.0.1 --port 18006 --tensor-parallel-size 1 --data-parallel-size 3 --enable-auto-tool-choice --tool-call-parser hermes",
			slots: 256, served: "qwen3-4b", simulated: true,
		},
		{
			name:   "sim engine on a local node maps to the profile's mimic",
			spec:   Spec{Node: localNode, Model: qwen(), Engine: fleet.EngineSim, Port: 18007, FleetBin: "/bin/fleet"},
			argv:   "llama-server -m qwen3-4b -a qwen3-4b -c 16384 --host 127.0.0.1 --port 18007 -np 4 --kv-unified --reasoning-format none",
			launch: "/bin/fleet sim --mimic llamacpp --profile m4max-llamacpp -- -m qwen3-4b -a qwen3-4b -c 16384 --host 127.0.0.1 --port 18007 -np 4 --kv-unified --reasoning-format none",
			slots:  4, served: "qwen3-4b", simulated: true,
		},
		{
			name:   "sim engine with an explicit vllm mimic",
			spec:   Spec{Node: localNode, Model: withRecipe(fleet.EngineSim, fleet.Recipe{Profile: "instant"}), Engine: fleet.EngineSim, Port: 18008, FleetBin: "/bin/fleet", SimMimic: fleet.EngineVLLM},
			argv:   "vllm serve qwen3-4b --served-model-name qwen3-4b --max-model-len 16384 --host 127.0.0.1 --port 18008",
			launch: "/bin/fleet sim --mimic vllm --profile instant -- serve qwen3-4b --served-model-name qwen3-4b --max-model-len 16384 --host 127.0.0.1 --port 18008",
			slots:  256, served: "qwen3-4b", simulated: true,
		},

		// endpoint: direct — the router dials the node, so the engine must
		// listen beyond its loopback; where the setting means nothing (the
		// hub's own machine, a simulated node) it still binds 127.0.0.1.
		{
			name:  "vllm on a direct SSH node listens on every interface",
			spec:  Spec{Node: directNode, Model: qwen(), Engine: fleet.EngineVLLM, Port: 18009},
			argv:  "vllm serve Qwen/Qwen3-4B-AWQ --served-model-name qwen3-4b --max-model-len 16384 --host 0.0.0.0 --port 18009 --tensor-parallel-size 1 --data-parallel-size 3 --enable-auto-tool-choice --tool-call-parser hermes",
			slots: 256, served: "qwen3-4b",
		},
		{
			name:  "ollama on a direct SSH node",
			spec:  Spec{Node: directNode, Model: qwen(), Engine: fleet.EngineOllama, Port: 18010},
			argv:  "ollama serve",
			env:   map[string]string{"OLLAMA_HOST": "0.0.0.0:18010", "OLLAMA_CONTEXT_LENGTH": "16384", "OLLAMA_NUM_PARALLEL": "4"},
			slots: 4, served: "qwen3:4b",
		},
		{
			name:  "direct on the hub's own machine changes nothing",
			spec:  Spec{Node: fleet.Node{Name: "hub", Address: "local", Endpoint: "direct"}, Model: qwen(), Engine: fleet.EngineLlamaCpp, Port: 18011},
			argv:  "llama-server -hf Qwen/Qwen3-4B-GGUF:Q4_K_M -a qwen3-4b -c 16384 --host 127.0.0.1 --port 18011 -np 4 --kv-unified -ngl 99 --jinja --reasoning-format none",
			slots: 4, served: "qwen3-4b",
		},
		{
			name: "direct on a simulated node changes nothing",
			spec: Spec{Node: fleet.Node{Name: "max", Address: "sim:m4max-llamacpp", Endpoint: "direct"}, Model: qwen(), Engine: fleet.EngineLlamaCpp, Port: 18012, FleetBin: "/bin/fleet"},
			argv: "llama-server -hf Qwen/Qwen3-4B-GGUF:Q4_K_M -a qwen3-4b -c 16384 --host 127.0.0.1 --port 18012 -np 4 --kv-unified -ngl 99 --jinja --reasoning-format none",
			launch: "/bin/fleet sim --mimic llamacpp --profile m4max-llamacpp -- " +
				"-hf Qwen/Qwen3-4B-GGUF:Q4_K_M -a qwen3-4b -c 16384 --host 127.0.0.1 --port 18012 -np 4 --kv-unified -ngl 99 --jinja --reasoning-format none",
			slots: 4, served: "qwen3-4b", simulated: true,
		},

		// Bad input: a clear error, no command.
		{name: "recipe sets the port", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineVLLM, fleet.Recipe{Model: "m", Args: []string{"--port", "9"}}), Engine: fleet.EngineVLLM, Port: 1}, wantErrHas: "passes --port, which fleet sets itself"},
		{name: "recipe sets the host with =", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineLlamaCpp, fleet.Recipe{Model: "m.gguf", Args: []string{"--host=0.0.0.0"}}), Engine: fleet.EngineLlamaCpp, Port: 1}, wantErrHas: "passes --host"},
		{name: "recipe sets llama's context", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineLlamaCpp, fleet.Recipe{Model: "m.gguf", Args: []string{"-c", "4096"}}), Engine: fleet.EngineLlamaCpp, Port: 1}, wantErrHas: "passes -c"},
		{name: "recipe sets the served name", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineVLLM, fleet.Recipe{Model: "m", Args: []string{"--served-model-name", "x"}}), Engine: fleet.EngineVLLM, Port: 1}, wantErrHas: "passes --served-model-name"},
		{name: "recipe sets the alias", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineLlamaCpp, fleet.Recipe{Model: "m.gguf", Args: []string{"-a", "x"}}), Engine: fleet.EngineLlamaCpp, Port: 1}, wantErrHas: "passes -a"},
		{name: "recipe sets the max model len", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineVLLM, fleet.Recipe{Model: "m", Args: []string{"--max-model-len=8192"}}), Engine: fleet.EngineVLLM, Port: 1}, wantErrHas: "passes --max-model-len"},
		{name: "no such recipe", spec: Spec{Node: localNode, Model: fleet.Model{ID: "m", Context: 1, Recipes: map[fleet.EngineKind]fleet.Recipe{fleet.EngineVLLM: {Model: "x"}}}, Engine: fleet.EngineLlamaCpp, Port: 1}, wantErrHas: "has no llamacpp recipe; it has recipes for: vllm"},
		{name: "no context", spec: Spec{Node: localNode, Model: fleet.Model{ID: "m", Recipes: qwen().Recipes}, Engine: fleet.EngineVLLM, Port: 1}, wantErrHas: "has no context length"},
		{name: "bad port", spec: Spec{Node: localNode, Model: qwen(), Engine: fleet.EngineVLLM, Port: 70000}, wantErrHas: "not a TCP port"},
		{name: "unknown engine", spec: Spec{Node: localNode, Model: qwen(), Engine: "tgi", Port: 1}, wantErrHas: `unknown engine "tgi"`},
		{name: "no weights", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineVLLM, fleet.Recipe{}), Engine: fleet.EngineVLLM, Port: 1}, wantErrHas: "names no weights"},
		{name: "bad -np", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineLlamaCpp, fleet.Recipe{Model: "m.gguf", Args: []string{"-np", "lots"}}), Engine: fleet.EngineLlamaCpp, Port: 1}, wantErrHas: `-np "lots"`},
		{name: "vllm-metal with tensor parallelism", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineVLLMMetal, fleet.Recipe{Model: "m", Args: []string{"-tp", "2"}}), Engine: fleet.EngineVLLMMetal, Port: 1}, wantErrHas: "no tensor parallelism"},
		{name: "ollama with args", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineOllama, fleet.Recipe{Model: "q", Args: []string{"--verbose"}}), Engine: fleet.EngineOllama, Port: 1}, wantErrHas: "takes none"},
		{name: "ollama recipe sets the host", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineOllama, fleet.Recipe{Model: "q", Env: map[string]string{"OLLAMA_HOST": "0.0.0.0"}}), Engine: fleet.EngineOllama, Port: 1}, wantErrHas: "sets OLLAMA_HOST"},
		{name: "ollama cannot be simulated", spec: Spec{Node: simMax, Model: qwen(), Engine: fleet.EngineOllama, Port: 1, FleetBin: "/bin/fleet"}, wantErrHas: "mimics vllm and llamacpp only"},
		{name: "simulated without the fleet binary", spec: Spec{Node: simMax, Model: qwen(), Engine: fleet.EngineLlamaCpp, Port: 1}, wantErrHas: "Spec.FleetBin"},
		{name: "sim recipe without a profile off a sim node", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineSim, fleet.Recipe{}), Engine: fleet.EngineSim, Port: 1, FleetBin: "/bin/fleet"}, wantErrHas: "names no profile"},
		{name: "sim address without a profile", spec: Spec{Node: fleet.Node{Name: "x", Address: "sim:"}, Model: qwen(), Engine: fleet.EngineLlamaCpp, Port: 1, FleetBin: "/bin/fleet"}, wantErrHas: "names no sim profile"},
		{name: "env name that is not a name", spec: Spec{Node: localNode, Model: withRecipe(fleet.EngineVLLM, fleet.Recipe{Model: "m", Env: map[string]string{"A=B": "c"}}), Engine: fleet.EngineVLLM, Port: 1}, wantErrHas: "not a valid variable name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd, err := BuildCommand(tc.spec)
			if tc.wantErrHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrHas) {
					t.Fatalf("BuildCommand error = %v; want one containing %q", err, tc.wantErrHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(cmd.Argv, " "); got != tc.argv {
				t.Errorf("argv\n got %s\nwant %s", got, tc.argv)
			}
			launch := tc.launch
			if launch == "" {
				launch = tc.argv
			}
			if got := strings.Join(cmd.LaunchArgv, " "); got != launch {
				t.Errorf("launch argv\n got %s\nwant %s", got, launch)
			}
			if cmd.Bin != cmd.LaunchArgv[0] {
				t.Errorf("bin %q, want the launched program %q", cmd.Bin, cmd.LaunchArgv[0])
			}
			if len(tc.env) > 0 || len(cmd.Env) > 0 {
				if !maps.Equal(cmd.Env, tc.env) {
					t.Errorf("env %v, want %v", cmd.Env, tc.env)
				}
			}
			if cmd.Slots != tc.slots || cmd.ServedName != tc.served || cmd.Simulated != tc.simulated || cmd.Context != 16384 {
				t.Errorf("slots %d served %q simulated %v ctx %d; want %d %q %v 16384", cmd.Slots, cmd.ServedName, cmd.Simulated, cmd.Context, tc.slots, tc.served, tc.simulated)
			}
			if slices.Contains(cmd.Argv, "--quantization") && !slices.Contains(tc.spec.Model.Recipes[tc.spec.Engine].Args, "--quantization") {
				t.Error("fleet added --quantization on its own")
			}
			want := "127.0.0.1"
			if tc.spec.Node.DialsDirect() {
				want = "0.0.0.0"
			}
			if h, _ := flagValue(cmd.Argv, "--host"); h != want && cmd.Env["OLLAMA_HOST"] == "" {
				t.Errorf("engine binds %q, want %s", h, want)
			}
		})
	}
}

func TestBuildCommandDoesNotShareRecipeSlices(t *testing.T) {
	m := qwen()
	cmd, err := BuildCommand(Spec{Node: localNode, Model: m, Engine: fleet.EngineLlamaCpp, Port: 1})
	if err != nil {
		t.Fatal(err)
	}
	cmd.Argv[len(cmd.Argv)-1] = "changed"
	if m.Recipes[fleet.EngineLlamaCpp].Args[3] != "--reasoning-format" || m.Recipes[fleet.EngineLlamaCpp].Args[4] != "none" {
		t.Error("changing the command changed the model's recipe")
	}
}

func TestEngineFor(t *testing.T) {
	nvidia := fleet.Platform{OS: "linux", Arch: "amd64", GPUs: []fleet.GPU{{Name: "NVIDIA GeForce RTX 3060"}}}
	mac := fleet.Platform{OS: "darwin", Arch: "arm64", Chip: "Apple M4 Max"}
	cpu := fleet.Platform{OS: "linux", Arch: "amd64"}
	intelMac := fleet.Platform{OS: "darwin", Arch: "amd64", Chip: "Intel(R) Core(TM) i9"}
	onlyVLLM := fleet.Model{ID: "big", Context: 1, Recipes: map[fleet.EngineKind]fleet.Recipe{fleet.EngineVLLM: {Model: "x"}, fleet.EngineSim: {Profile: "p"}}}
	tests := []struct {
		name   string
		p      fleet.Platform
		m      fleet.Model
		pinned fleet.EngineKind
		want   fleet.EngineKind
		errHas string
	}{
		{"linux with NVIDIA gets vllm", nvidia, qwen(), "", fleet.EngineVLLM, ""},
		{"Apple Silicon gets llama.cpp", mac, qwen(), "", fleet.EngineLlamaCpp, ""},
		{"CPU Linux gets llama.cpp", cpu, qwen(), "", fleet.EngineLlamaCpp, ""},
		{"pinned vllm-metal on Apple Silicon", mac, qwen(), fleet.EngineVLLMMetal, fleet.EngineVLLMMetal, ""},
		{"pinned ollama", cpu, qwen(), fleet.EngineOllama, fleet.EngineOllama, ""},
		{"pinned sim anywhere", cpu, qwen(), fleet.EngineSim, fleet.EngineSim, ""},
		{"vllm-metal needs Apple Silicon", intelMac, qwen(), fleet.EngineVLLMMetal, "", "needs an Apple Silicon Mac"},
		{"vllm needs Linux", mac, qwen(), fleet.EngineVLLM, "", "vllm needs Linux"},
		{"missing default recipe names the ones there are", mac, onlyVLLM, "", "", "has no llamacpp recipe, which is the default for macOS/arm64 (Apple M4 Max); it has recipes for: sim, vllm"},
		{"missing pinned recipe", nvidia, onlyVLLM, fleet.EngineLlamaCpp, "", "pinned by the placement"},
		{"unknown pinned engine", nvidia, qwen(), "tgi", "", `unknown engine "tgi"`},
		{"unprobed node", fleet.Platform{}, qwen(), "", "", "probe the node first"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EngineFor(tc.p, tc.m, tc.pinned)
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("EngineFor = %v, %v; want an error containing %q", got, err, tc.errHas)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("EngineFor = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestFileStem(t *testing.T) {
	tests := []struct{ node, model, want string }{
		{"max", "qwen3-4b", "max-qwen3-4b"},
		{"max", "col_x.gguf", "max-col_x.gguf"},
		{"rig", "Qwen/Qwen3-4B", "rig-Qwen%2FQwen3-4B"},
		{"..", "../../etc/passwd", "%2E.-%2E.%2F..%2Fetc%2Fpasswd"},
		{"a b", "m;rm -rf", "a%20b-m%3Brm%20-rf"},
		{"max", "100%", "max-100%25"},
	}
	for _, tc := range tests {
		if got := FileStem(tc.node, tc.model); got != tc.want {
			t.Errorf("FileStem(%q, %q) = %q, want %q", tc.node, tc.model, got, tc.want)
		}
		if strings.Contains(FileStem(tc.node, tc.model), "/") {
			t.Errorf("FileStem(%q, %q) contains a slash", tc.node, tc.model)
		}
	}
}

// Two models of one node never share their pid, argv and log files: the
// stem of col/x is not the stem of col_x (nor of col%2Fx, nor of .x and x).
func TestFileStemIsInjective(t *testing.T) {
	models := []string{"col/x", "col_x", "col x", "col%2Fx", "col%x", ".x", "x", "%2Ex", "a..b", "Qwen/Qwen3-4B", "Qwen_Qwen3-4B"}
	seen := map[string]string{}
	for _, m := range models {
		stem := FileStem("max", m)
		if other, dup := seen[stem]; dup {
			t.Errorf("models %q and %q share the file stem %q", other, m, stem)
		}
		seen[stem] = m
		if strings.ContainsAny(stem, "/ ;") || strings.HasPrefix(stem, ".") {
			t.Errorf("FileStem(max, %q) = %q: not a plain file name", m, stem)
		}
	}
}

// TestServedNameIsWhatTheEngineIsStartedWith: the name the router and the
// checks send each engine is the one its command line makes it serve.
func TestServedNameIsWhatTheEngineIsStartedWith(t *testing.T) {
	for _, tc := range []struct {
		engine fleet.EngineKind
		want   string
	}{
		{fleet.EngineVLLM, "qwen3-4b"},
		{fleet.EngineLlamaCpp, "qwen3-4b"},
		{fleet.EngineOllama, "qwen3:4b"},
	} {
		t.Run(string(tc.engine), func(t *testing.T) {
			if got := ServedName(qwen(), tc.engine); got != tc.want {
				t.Errorf("ServedName = %q, want %q", got, tc.want)
			}
			cmd, err := BuildCommand(Spec{Node: localNode, Model: qwen(), Engine: tc.engine, Port: 18004})
			if err != nil {
				t.Fatal(err)
			}
			if cmd.ServedName != tc.want {
				t.Errorf("the command serves %q, ServedName says %q", cmd.ServedName, tc.want)
			}
		})
	}
}
