package fleetfile

import (
	"strings"
	"testing"

	"fleet"
)

func TestDiff(t *testing.T) {
	old, err := Parse("old.yaml", []byte(`nodes:
  - name: rig
    address: ops@rig.lan
  - name: ultra
    address: ops@ultra.lan
models:
  - id: qwen3-4b
    aliases: [qwen3]
    context: 8192
    recipes:
      vllm: {model: Qwen/Qwen3-4B-AWQ, args: [--tensor-parallel-size, "1"]}
      llamacpp: {model: Qwen3-4B-Q4_K_M.gguf}
  - id: gemma
    context: 4096
    recipes: {ollama: {model: "gemma3:4b"}}
placements:
  - model: qwen3-4b
    nodes: [rig, ultra]
  - model: gemma
    node: ultra
`))
	if err != nil {
		t.Fatal(err)
	}
	updated, err := Parse("new.yaml", []byte(`nodes:
  - name: ultra
    address: ops@ultra.lan:2222
    endpoint: direct
    ports: 20000-20099
  - name: max
    address: sim:m4max-llamacpp
models:
  - id: qwen3-4b
    aliases: [qwen3]
    context: 16384
    reference: ultra
    recipes:
      vllm: {model: Qwen/Qwen3-4B-AWQ, args: [--tensor-parallel-size, "2"], ready_timeout: 2h}
      vllm-metal: {model: Qwen/Qwen3-4B}
  - id: gemma
    context: 4096
    recipes: {ollama: {model: "gemma3:4b"}}
placements:
  - model: qwen3-4b
    nodes: [max]
  - model: qwen3-4b
    node: ultra
    engine: vllm-metal
  - model: gemma
    node: ultra
    context: 2048
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		old, new fleet.Fleet
		want     string
	}{
		{"no change", old, old, "no changes\n"},
		{"everything", old, updated, `~ node ultra: address ops@ultra.lan → ops@ultra.lan:2222
~ node ultra: endpoint tunnel → direct
~ node ultra: ports the hub's default → 20000-20099
+ node max (sim:m4max-llamacpp)
- node rig (ops@rig.lan)
~ model qwen3-4b: context 8192 → 16384
~ model qwen3-4b: reference first placed node → ultra
~ model qwen3-4b: recipe vllm: args [--tensor-parallel-size 1] → [--tensor-parallel-size 2]
~ model qwen3-4b: recipe vllm: ready_timeout default → 2h
~ model qwen3-4b: recipe vllm-metal added
~ model qwen3-4b: recipe llamacpp removed
+ placement qwen3-4b on max
~ placement qwen3-4b on ultra: engine auto → vllm-metal
~ placement gemma on ultra: context the model's → 2048 (the worker restarts)
- placement qwen3-4b on rig
`},
		{"from nothing", fleet.Fleet{}, old, `+ node rig (ops@rig.lan)
+ node ultra (ops@ultra.lan)
+ model qwen3-4b (context 8192, recipes vllm, llamacpp)
+ model gemma (context 4096, recipes ollama)
+ placement qwen3-4b on rig
+ placement qwen3-4b on ultra
+ placement gemma on ultra
`},
		{"to nothing", old, fleet.Fleet{}, `- node rig (ops@rig.lan)
- node ultra (ops@ultra.lan)
- model qwen3-4b
- model gemma
- placement qwen3-4b on rig
- placement qwen3-4b on ultra
- placement gemma on ultra
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Diff(tc.old, tc.new)
			if got := p.String(); got != tc.want {
				t.Fatalf("plan:\n%s\nwant:\n%s", got, tc.want)
			}
			if p.Empty() != (tc.want == "no changes\n") {
				t.Fatalf("Empty() = %v", p.Empty())
			}
		})
	}
}

func TestDiffIgnoresRuntimeState(t *testing.T) {
	f, err := Parse("demo.yaml", Demo)
	if err != nil {
		t.Fatal(err)
	}
	probed := f
	probed.Nodes = append([]fleet.Node(nil), f.Nodes...)
	probed.Nodes[0].State, probed.Nodes[0].HostKey = fleet.NodeUp, "ssh-ed25519 AAAA"
	probed.Nodes[0].Platform = &fleet.Platform{OS: "linux"}
	if p := Diff(probed, f); !p.Empty() {
		t.Fatalf("runtime state shows as a change: %s", p)
	}
	changed := f
	changed.Models = append([]fleet.Model(nil), f.Models...)
	changed.Models[0].MemoryGB = 3.5
	if got := Diff(f, changed).String(); !strings.Contains(got, "~ model qwen3-4b: memory_gb 3 → 3.5\n") {
		t.Fatalf("plan %q lacks the memory change", got)
	}
}
