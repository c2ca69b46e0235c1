package fleetfile

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"fleet"
	"fleet/sim/profiles"
)

// designExample is the README's fleet file (section "A fleet file", also in docs/fleet-file.md) with two
// things more to parse: a vLLM argument list over two lines and a sim recipe.
const designExample = `nodes:
  - name: rig
    address: ops@rig.lan:22          # user@host[:port]; "local" is the hub's own machine
    identity: ~/.ssh/id_ed25519      # optional; else the ssh-agent
  - name: ultra
    address: ops@ultra.lan
  - name: max
    address: sim:m4max-llamacpp      # a simulated node with that profile's platform (demo, tests)
models:
  - id: qwen3-4b
    aliases: [qwen3]
    context: 16384
    memory_gb: 3
    recipes:
      vllm:
        model: Qwen/Qwen3-4B-AWQ
        args: [--tensor-parallel-size, "1", --data-parallel-size, "3",
               --enable-auto-tool-choice, --tool-call-parser, hermes]
      llamacpp:
        model: Qwen/Qwen3-4B-GGUF:Q4_K_M   # or a path to a .gguf on the node
        args: [-ngl, "99", --jinja, --reasoning-format, none]
        bin: /opt/homebrew/bin/llama-server   # optional
      sim:
        profile: m4max-llamacpp
placements:
  - model: qwen3-4b
    nodes: [rig, ultra, max]         # engine from each node's platform
`

func TestParseDesignExample(t *testing.T) {
	f, err := Parse("fleet.yaml", []byte(designExample))
	if err != nil {
		t.Fatal(err)
	}
	want := fleet.Fleet{
		Nodes: []fleet.Node{
			{Name: "rig", Address: "ops@rig.lan:22", Identity: "~/.ssh/id_ed25519"},
			{Name: "ultra", Address: "ops@ultra.lan"},
			{Name: "max", Address: "sim:m4max-llamacpp"},
		},
		Models: []fleet.Model{{
			ID: "qwen3-4b", Aliases: []string{"qwen3"}, Context: 16384, MemoryGB: 3,
			Recipes: map[fleet.EngineKind]fleet.Recipe{
				fleet.EngineVLLM: {Engine: fleet.EngineVLLM, Model: "Qwen/Qwen3-4B-AWQ", Args: []string{
					"--tensor-parallel-size", "1", "--data-parallel-size", "3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"}},
				fleet.EngineLlamaCpp: {Engine: fleet.EngineLlamaCpp, Model: "Qwen/Qwen3-4B-GGUF:Q4_K_M",
					Args: []string{"-ngl", "99", "--jinja", "--reasoning-format", "none"}, Bin: "/opt/homebrew/bin/llama-server"},
				fleet.EngineSim: {Engine: fleet.EngineSim, Profile: "m4max-llamacpp"},
			},
		}},
		Placements: []fleet.Placement{
			{Model: "qwen3-4b", Node: "rig"}, {Model: "qwen3-4b", Node: "ultra"}, {Model: "qwen3-4b", Node: "max"},
		},
	}
	if !reflect.DeepEqual(f, want) {
		t.Fatalf("Parse(the README's example):\n got %+v\nwant %+v", f, want)
	}
}

func TestDemoMirrorsFirstSeed(t *testing.T) {
	f, err := Parse("demo.yaml", Demo)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range f.Nodes {
		nodes = append(nodes, n.Name+"="+n.Address)
	}
	if want := []string{"rig=sim:rtx3060-vllm", "ultra=sim:m1ultra-llamacpp", "max=sim:m4max-llamacpp"}; !reflect.DeepEqual(nodes, want) {
		t.Errorf("demo nodes = %v, want %v", nodes, want)
	}
	if len(f.Models) != 1 {
		t.Fatalf("demo has %d models, want 1", len(f.Models))
	}
	m := f.Models[0]
	if m.ID != "qwen3-4b" || !reflect.DeepEqual(m.Aliases, []string{"qwen3"}) || m.Context != 16384 || m.MemoryGB != 3 {
		t.Errorf("demo model = %+v", m)
	}
	vllm, llama := m.Recipes[fleet.EngineVLLM], m.Recipes[fleet.EngineLlamaCpp]
	if vllm.Model != "Qwen/Qwen3-4B-AWQ" || strings.Join(vllm.Args, " ") != "--tensor-parallel-size 1 --data-parallel-size 3 --enable-auto-tool-choice --tool-call-parser hermes --enable-prompt-tokens-details" {
		// --enable-prompt-tokens-details: without it vLLM reports no
		// cached tokens, which the router learns prefix reuse from and
		// bench's cache hit shows.
		t.Errorf("demo vllm recipe = %+v", vllm)
	}
	if llama.Model != "Qwen3-4B-Q4_K_M.gguf" || strings.Join(llama.Args, " ") != "-ngl 99 --jinja --reasoning-format none" {
		t.Errorf("demo llamacpp recipe = %+v", llama)
	}
	if len(f.Placements) != 3 || f.Placements[0].Engine != "" {
		t.Errorf("demo placements = %+v, want qwen3-4b on the three nodes, engine from the platform", f.Placements)
	}
}

const validBase = `nodes:
  - name: rig
    address: ops@rig.lan:22
  - name: ultra
    address: ops@ultra.lan
models:
  - id: qwen3-4b
    context: 16384
    recipes:
      llamacpp:
        model: Qwen3-4B-Q4_K_M.gguf
placements:
  - model: qwen3-4b
    nodes: [rig, ultra]
`

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		want []string // each a full line of the joined error
	}{
		{"unknown key in a recipe", `nodes: []
models:
  - id: qwen3-4b
    context: 16384
    recipes:
      llamacpp:
        model: x.gguf
        agrs: [-ngl, "99"]
`, []string{"fleet.yaml:8: model qwen3-4b: recipe llamacpp: unknown key 'agrs' (known: model, args, bin, install, env, profile, ready_timeout)"}},
		{"unknown top-level key", "nodes: []\nmodles: []\n", []string{"fleet.yaml:2: unknown key 'modles' (known: nodes, models, placements)"}},
		{"unknown node key", strings.Replace(validBase, "    address: ops@ultra.lan\n", "    address: ops@ultra.lan\n    adress: x\n", 1),
			[]string{"fleet.yaml:6: node ultra: unknown key 'adress' (known: name, address, identity, endpoint, ports)"}},
		{"context is text", strings.Replace(validBase, "context: 16384", "context: lots", 1),
			[]string{"fleet.yaml:8: model qwen3-4b: context must be a number, not text"}},
		{"context is a fraction", strings.Replace(validBase, "context: 16384", "context: 1.5", 1),
			[]string{"fleet.yaml:8: model qwen3-4b: context must be a whole number of tokens from 1 to 10000000, like 16384"}},
		{"args is not a list", strings.Replace(validBase, "model: Qwen3-4B-Q4_K_M.gguf", "model: Qwen3-4B-Q4_K_M.gguf\n        args: -ngl 99", 1),
			[]string{`fleet.yaml:12: model qwen3-4b: recipe llamacpp: args must be a list, like [-ngl, "99", --jinja], not text`}},
		{"nodes is a mapping", "nodes:\n  rig: ops@rig\n", []string{"fleet.yaml:2: nodes must be a list, like [{name: rig, address: ops@rig.lan}], not a mapping"}},
		{"address without user", strings.Replace(validBase, "ops@ultra.lan", "ultra.lan", 1),
			[]string{`fleet.yaml:5: node ultra: address "ultra.lan" must be local, sim:PROFILE or user@host[:port]`}},
		{"address without host", strings.Replace(validBase, "ops@ultra.lan", "ops@:22", 1),
			[]string{`fleet.yaml:5: node ultra: address "ops@:22" has no host after '@'; it must be local, sim:PROFILE or user@host[:port]`}},
		{"port out of range", strings.Replace(validBase, "ops@rig.lan:22", "ops@rig.lan:70000", 1),
			[]string{`fleet.yaml:3: node rig: address "ops@rig.lan:70000": port "70000" must be a number from 1 to 65535`}},
		{"sim without profile", strings.Replace(validBase, "ops@rig.lan:22", `"sim:"`, 1),
			[]string{`fleet.yaml:3: node rig: address "sim:" names no sim profile; write sim:PROFILE, like sim:m4max-llamacpp`}},
		{"sim profile misspelled", strings.Replace(validBase, "ops@rig.lan:22", `sim:instnt`, 1),
			[]string{`fleet.yaml:3: node rig: address "sim:instnt": unknown sim profile "instnt": use one of ` + strings.Join(profiles.Names(), ", ")}},
		{"args pass a flag fleet sets", strings.Replace(validBase, "model: Qwen3-4B-Q4_K_M.gguf", "model: Qwen3-4B-Q4_K_M.gguf\n        args:\n          - -ngl\n          - \"99\"\n          - -c\n          - \"8192\"", 1),
			[]string{`fleet.yaml:15: model qwen3-4b: recipe llamacpp: args pass -c, which fleet sets itself (host, port, served name, context come from the fleet file); remove it from args`}},
		{"bad endpoint", strings.Replace(validBase, "    address: ops@ultra.lan\n", "    address: ops@ultra.lan\n    endpoint: http\n", 1),
			[]string{`fleet.yaml:6: node ultra: endpoint "http" must be tunnel (through SSH, the default) or direct`}},
		{"ports below 1024", strings.Replace(validBase, "    address: ops@ultra.lan\n", "    address: ops@ultra.lan\n    ports: 80-90\n", 1),
			[]string{`fleet.yaml:6: node ultra: ports "80-90" must be MIN-MAX, two port numbers from 1024 to 65535, like 18000-18999 (the TCP ports this node's engines may listen on; leave it out for the hub's default, serve --engine-ports)`}},
		{"ports reversed", strings.Replace(validBase, "    address: ops@ultra.lan\n", "    address: ops@ultra.lan\n    ports: 19000-18000\n", 1),
			[]string{`fleet.yaml:6: node ultra: ports "19000-18000": 19000 is above 18000; write the lower port first, like 18000-19000 (the TCP ports this node's engines may listen on; leave it out for the hub's default, serve --engine-ports)`}},
		{"ports a list", strings.Replace(validBase, "    address: ops@ultra.lan\n", "    address: ops@ultra.lan\n    ports: [18000, 18999]\n", 1),
			[]string{`fleet.yaml:6: node ultra: ports must be text, not a list`}},
		{"missing address", strings.Replace(validBase, "    address: ops@ultra.lan\n", "", 1),
			[]string{"fleet.yaml:4: node ultra: missing 'address' (local, sim:PROFILE or user@host[:port])"}},
		{"bad node name", strings.Replace(validBase, "name: rig", "name: Rig", 1),
			[]string{`fleet.yaml:2: node Rig: name "Rig" must be lower-case letters, digits, '.', '_' or '-', starting with a letter or digit`,
				`fleet.yaml:14: placement 1 (model qwen3-4b): node "rig" is not declared under nodes:`}},
		{"duplicate node", strings.Replace(validBase, "name: ultra", "name: rig", 1),
			[]string{"fleet.yaml:4: node rig: node rig is declared twice (first on line 2)",
				`fleet.yaml:14: placement 1 (model qwen3-4b): node "ultra" is not declared under nodes:`}},
		{"unknown node in placement", strings.Replace(validBase, "[rig, ultra]", "[rig, ultra, max]", 1),
			[]string{`fleet.yaml:14: placement 1 (model qwen3-4b): node "max" is not declared under nodes:`}},
		{"unknown model in placement", strings.Replace(validBase, "  - model: qwen3-4b\n", "  - model: qwen3-8b\n", 1),
			[]string{`fleet.yaml:13: placement 1 (model qwen3-8b): model "qwen3-8b" is not declared under models:`}},
		{"duplicate placement", validBase + "  - model: qwen3-4b\n    node: ultra\n",
			[]string{"fleet.yaml:16: placement 2 (model qwen3-4b): model qwen3-4b is already placed on node ultra (line 14); a node runs one worker per model"}},
		{"two workers whose engine files share a name", `nodes:
  - name: a-b
    address: ops@one.lan
  - name: a
    address: ops@two.lan
models:
  - id: c
    context: 1
    recipes: {llamacpp: {model: c.gguf}}
  - id: b-c
    context: 1
    recipes: {llamacpp: {model: bc.gguf}}
placements:
  - model: c
    node: a-b
  - model: b-c
    node: a
`, []string{"fleet.yaml:17: placement 2 (model b-c): model b-c on node a names its engine's files a-b-c.*, as model c on node a-b does (line 15): on a machine both nodes reach they would take each other's engine; rename a node or a model"}},
		{"node and nodes", validBase + "    node: rig\n",
			[]string{"fleet.yaml:14: placement 1 (model qwen3-4b): give either node: or nodes:, not both"}},
		{"no node", "nodes: []\nmodels:\n  - id: m\n    context: 1\n    recipes: {sim: {}}\nplacements:\n  - model: m\n",
			[]string{"fleet.yaml:7: placement 1 (model m): missing 'node' or 'nodes' (where the model runs)"}},
		{"unknown engine recipe", strings.Replace(validBase, "      llamacpp:\n", "      tensorrt:\n        model: x\n      llamacpp:\n", 1),
			[]string{"fleet.yaml:10: model qwen3-4b: recipe for unknown engine 'tensorrt' (known: vllm, llamacpp, vllm-metal, ollama, sim)"}},
		{"pinned engine unknown", validBase + "    engine: trt\n",
			[]string{`fleet.yaml:15: placement 1 (model qwen3-4b): engine "trt" is not one of vllm, llamacpp, vllm-metal, ollama, sim`}},
		{"pinned engine without recipe", validBase + "    engine: vllm-metal\n",
			[]string{"fleet.yaml:15: placement 1 (model qwen3-4b): engine vllm-metal is pinned but model qwen3-4b has no vllm-metal recipe"}},
		{"missing model id", strings.Replace(validBase, "  - id: qwen3-4b\n", "  - aliases: [q]\n", 1),
			[]string{"fleet.yaml:7: model 1: missing 'id' (the model name clients send)",
				`fleet.yaml:13: placement 1 (model qwen3-4b): model "qwen3-4b" is not declared under models:`}},
		{"missing context and recipes", "nodes: []\nmodels:\n  - id: m\n",
			[]string{"fleet.yaml:3: model m: missing 'context' (tokens, like 16384)",
				"fleet.yaml:3: model m: missing 'recipes' (one per engine: vllm, llamacpp, vllm-metal, ollama, sim)"}},
		{"recipe without weights", strings.Replace(validBase, "        model: Qwen3-4B-Q4_K_M.gguf\n", "        bin: /usr/bin/llama-server\n", 1),
			[]string{"fleet.yaml:10: model qwen3-4b: recipe llamacpp: missing 'model' (the weights: an HF repo, a GGUF path or repo:quant)"}},
		{"profile outside sim", strings.Replace(validBase, "model: Qwen3-4B-Q4_K_M.gguf", "model: x.gguf\n        profile: p", 1),
			[]string{"fleet.yaml:12: model qwen3-4b: recipe llamacpp: profile is only for the sim engine"}},
		{"alias collides with an id", "nodes: []\nmodels:\n  - id: a\n    context: 1\n    recipes: {sim: {}}\n  - id: b\n    aliases: [a]\n    context: 1\n    recipes: {sim: {}}\n",
			[]string{"fleet.yaml:7: model b: alias a is the id of model a; a name must mean one model"}},
		{"duplicate model", "nodes: []\nmodels:\n  - id: a\n    context: 1\n    recipes: {sim: {}}\n  - id: a\n    context: 2\n    recipes: {sim: {}}\n",
			[]string{"fleet.yaml:6: model a: model a is declared twice (first on line 3)"}},
		{"bad env name", strings.Replace(validBase, "model: Qwen3-4B-Q4_K_M.gguf", "model: x.gguf\n        env: {1X: y}", 1),
			[]string{`fleet.yaml:12: model qwen3-4b: recipe llamacpp: env name "1X" must be letters, digits and '_', not starting with a digit`}},
		{"bad speed tolerance", strings.Replace(validBase, "context: 16384", "context: 16384\n    speed_tolerance: 2", 1),
			[]string{"fleet.yaml:9: model qwen3-4b: speed_tolerance must be a fraction above 0 and at most 1, like 0.5"}},
		{"reference not placed there", strings.Replace(validBase, "context: 16384", "context: 16384\n    reference: max", 1),
			[]string{`fleet.yaml:9: model qwen3-4b: reference "max" is not a node the model is placed on; use one of rig, ultra`}},
		{"reference of an unplaced model", strings.Replace(strings.Replace(validBase, "context: 16384", "context: 16384\n    reference: rig", 1), "  - model: qwen3-4b\n    nodes: [rig, ultra]\n", "", 1),
			[]string{`fleet.yaml:9: model qwen3-4b: reference "rig": the model is not placed on any node; place it on rig or remove reference:`}},
		{"empty reference", strings.Replace(validBase, "context: 16384", "context: 16384\n    reference: \"\"", 1),
			[]string{`fleet.yaml:9: model qwen3-4b: reference is empty; name the node whose worker sets the model's response shape, or leave the key out`}},
		{"ready_timeout not a duration", strings.Replace(validBase, "model: Qwen3-4B-Q4_K_M.gguf", "model: x.gguf\n        ready_timeout: soon", 1),
			[]string{`fleet.yaml:12: model qwen3-4b: recipe llamacpp: ready_timeout "soon" must be a duration from 10s to 48h, like 30m or 2h (how long a launch may take to serve, first download included)`}},
		{"ready_timeout too short", strings.Replace(validBase, "model: Qwen3-4B-Q4_K_M.gguf", "model: x.gguf\n        ready_timeout: 1s", 1),
			[]string{`fleet.yaml:12: model qwen3-4b: recipe llamacpp: ready_timeout "1s" must be a duration from 10s to 48h, like 30m or 2h (how long a launch may take to serve, first download included)`}},
		{"placement context above the model's", validBase + "    context: 32768\n",
			[]string{"fleet.yaml:15: placement 1 (model qwen3-4b): context 32768 is more than model qwen3-4b's context 16384; a placement may run the model with a smaller context, not a larger one (raise the model's context: instead)"}},
		{"placement context zero", validBase + "    context: 0\n",
			[]string{"fleet.yaml:15: placement 1 (model qwen3-4b): context must be a whole number of tokens from 1 to 10000000, like 8192"}},
		{"placement context is text", validBase + "    context: 8k\n",
			[]string{"fleet.yaml:15: placement 1 (model qwen3-4b): context must be a number, not text"}},
		{"duplicate key", "nodes: []\nnodes: []\n", []string{`fleet.yaml:2: not valid YAML: mapping key "nodes" already defined at [1:1]`}},
		{"empty file", "", []string{"fleet.yaml: the file is empty; a fleet file is a mapping with nodes:, models: and placements:"}},
		{"only comments", "# nothing yet\n", []string{"fleet.yaml: the file is empty; a fleet file is a mapping with nodes:, models: and placements:"}},
		{"a list at the top", "- name: rig\n", []string{"fleet.yaml:1: the top level must be a mapping with nodes:, models: and placements:, not a list"}},
		{"a word at the top", "hello\n", []string{"fleet.yaml:1: the top level must be a mapping with nodes:, models: and placements:, not text"}},
		{"two documents", "nodes: []\n---\nmodels: []\n", []string{"fleet.yaml:3: the file holds 2 YAML documents; a fleet file is one (remove the extra ---)"}},
		{"tags", "nodes: !!seq []\n", []string{"fleet.yaml:1: YAML tags like !!seq are not supported; quote the value instead"}},
		{"not utf-8", "nodes: [\xff]\n", []string{"fleet.yaml: the file is not UTF-8 text; save it as UTF-8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("fleet.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tc.src)
			}
			got := strings.Split(err.Error(), "\n")
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Parse error:\n got %q\nwant %q", got, tc.want)
			}
			var fe *Error
			if !errors.As(err, &fe) || fe.File != "fleet.yaml" {
				t.Fatalf("error is not a *fleetfile.Error: %#v", err)
			}
		})
	}
}

func TestParseSyntaxErrorHasLine(t *testing.T) {
	_, err := Parse("fleet.yaml", []byte("nodes:\n  - name: rig\n    address: [unclosed\n"))
	var fe *Error
	if !errors.As(err, &fe) || fe.Line == 0 || !strings.HasPrefix(err.Error(), "fleet.yaml:") || !strings.Contains(err.Error(), "not valid YAML") {
		t.Fatalf("syntax error = %v, want fleet.yaml:LINE: not valid YAML: …", err)
	}
}

func TestParseAccepts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		src   string
		check func(fleet.Fleet) bool
	}{
		{"unquoted numbers in args", strings.Replace(validBase, "model: Qwen3-4B-Q4_K_M.gguf", "model: x.gguf\n        args: [-ngl, 99, -t, 0x10]", 1),
			func(f fleet.Fleet) bool {
				return reflect.DeepEqual(f.Models[0].Recipes[fleet.EngineLlamaCpp].Args, []string{"-ngl", "99", "-t", "0x10"})
			}},
		{"anchors and aliases", strings.Replace(validBase, "model: Qwen3-4B-Q4_K_M.gguf", "model: x.gguf\n        args: &common [--jinja]\n      vllm:\n        model: y\n        args: *common", 1),
			func(f fleet.Fleet) bool {
				return reflect.DeepEqual(f.Models[0].Recipes[fleet.EngineVLLM].Args, []string{"--jinja"})
			}},
		{"single node and pinned engine", strings.Replace(validBase, "    nodes: [rig, ultra]\n", "    node: ultra\n    engine: llamacpp\n", 1),
			func(f fleet.Fleet) bool {
				return reflect.DeepEqual(f.Placements, []fleet.Placement{{Model: "qwen3-4b", Node: "ultra", Engine: fleet.EngineLlamaCpp}})
			}},
		{"ready_timeout", strings.Replace(validBase, "model: Qwen3-4B-Q4_K_M.gguf", "model: x.gguf\n        ready_timeout: 45m", 1),
			func(f fleet.Fleet) bool {
				return f.Models[0].Recipes[fleet.EngineLlamaCpp].ReadyTimeout == 45*time.Minute
			}},
		{"placement context", strings.Replace(validBase, "    nodes: [rig, ultra]\n", "    node: rig\n  - model: qwen3-4b\n    node: ultra\n    context: 8192\n", 1),
			func(f fleet.Fleet) bool {
				return reflect.DeepEqual(f.Placements, []fleet.Placement{{Model: "qwen3-4b", Node: "rig"}, {Model: "qwen3-4b", Node: "ultra", Context: 8192}}) &&
					f.Placements[0].ContextOf(f.Models[0]) == 16384 && f.Placements[1].ContextOf(f.Models[0]) == 8192
			}},
		{"addresses", `nodes:
  - {name: a, address: local}
  - {name: b, address: "ops@[fd00::1]:2222"}
  - {name: c, address: ops@10.0.0.7}
  - {name: d, address: sim:m1ultra-llamacpp, endpoint: direct}
models: []
`, func(f fleet.Fleet) bool { return len(f.Nodes) == 4 && f.Nodes[3].Endpoint == "direct" }},
		{"ports", "nodes:\n  - {name: a, address: local, ports: 20000-20099}\n  - {name: b, address: local, ports: 21000}\n  - {name: c, address: local}\n",
			func(f fleet.Fleet) bool {
				return f.Nodes[0].Ports == fleet.PortRange{Min: 20000, Max: 20099} && f.Nodes[1].Ports == fleet.PortRange{Min: 21000, Max: 21000} && f.Nodes[2].Ports.IsZero()
			}},
		{"env and install", strings.Replace(validBase, "model: Qwen3-4B-Q4_K_M.gguf", "model: x.gguf\n        install: |\n          brew install llama.cpp\n        env:\n          GGML_METAL: \"1\"", 1),
			func(f fleet.Fleet) bool {
				r := f.Models[0].Recipes[fleet.EngineLlamaCpp]
				return r.Install == "brew install llama.cpp\n" && r.Env["GGML_METAL"] == "1"
			}},
		{"reference", strings.Replace(validBase, "context: 16384", "context: 16384\n    reference: ultra", 1),
			func(f fleet.Fleet) bool {
				return f.Models[0].Reference == "ultra" && f.ReferenceNode("qwen3-4b") == "ultra"
			}},
		{"reference defaults to the first node of the first placement", strings.Replace(validBase, "[rig, ultra]", "[ultra, rig]", 1),
			func(f fleet.Fleet) bool { return f.Models[0].Reference == "" && f.ReferenceNode("qwen3-4b") == "ultra" }},
		{"empty sections", "nodes:\nmodels:\nplacements:\n", func(f fleet.Fleet) bool {
			return f.Nodes != nil && len(f.Nodes)+len(f.Models)+len(f.Placements) == 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse("fleet.yaml", []byte(tc.src))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(f) {
				t.Fatalf("parsed %+v", f)
			}
		})
	}
}
