package fleetfile

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"fleet"
)

// awkward has a value in every field that YAML would misread if written
// plain: booleans, nulls, numbers, indicators, quotes, newlines, unicode.
func awkward() fleet.Fleet {
	return fleet.Fleet{
		Nodes: []fleet.Node{
			{Name: "true", Address: "local", Identity: "~", Endpoint: "direct"},
			{Name: "0x1f", Address: "ops@[fd00::1]:2222", Identity: "/keys/id #1"},
			{Name: "n.3_x-y", Address: "sim:m4max-llamacpp", Ports: fleet.PortRange{Min: 20000, Max: 20099}},
		},
		Models: []fleet.Model{
			{ID: "Qwen/Qwen3-4B", Aliases: []string{"null", "yes", "1e3", "a:b", "- x"}, Context: 32768, MemoryGB: 2.75, SpeedTolerance: 0.6,
				Reasoning: "field", Reference: "0x1f",
				Recipes: map[fleet.EngineKind]fleet.Recipe{
					fleet.EngineVLLM: {Engine: fleet.EngineVLLM, Model: "Qwen/Qwen3-4B-AWQ",
						Args: []string{"--x", "1", "-", "", "[a]", "{b}", "c, d", "it's", `say "hi"`, "tab  here", "é ✓", "#", "&a", "*a", "!t", "%p", "@u", "`b`", "|", ">", "?", "a: b", " lead", "trail "}},
					fleet.EngineLlamaCpp: {Engine: fleet.EngineLlamaCpp, Model: "Qwen/Qwen3-4B-GGUF:Q4_K_M", Bin: "/opt/homebrew/bin/llama-server",
						Install: "brew install llama.cpp\nbrew upgrade\n", Env: map[string]string{"A": "1", "B_2": "false", "NO": "", "LINE": "\u2028"}},
					fleet.EngineSim: {Engine: fleet.EngineSim, ReadyTimeout: 90 * time.Minute},
				}},
			{ID: "gemma", Context: 1, Recipes: map[fleet.EngineKind]fleet.Recipe{fleet.EngineOllama: {Engine: fleet.EngineOllama, Model: "gemma3:4b"}}},
		},
		Placements: []fleet.Placement{
			{Model: "Qwen/Qwen3-4B", Node: "true"},
			{Model: "Qwen/Qwen3-4B", Node: "0x1f"},
			{Model: "gemma", Node: "true", Engine: fleet.EngineOllama},
			{Model: "Qwen/Qwen3-4B", Node: "n.3_x-y", Engine: fleet.EngineSim, Context: 4096},
			{Model: "gemma", Node: "n.3_x-y"},
		},
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	demo, err := Parse("demo.yaml", Demo)
	if err != nil {
		t.Fatal(err)
	}
	design, err := Parse("design.yaml", []byte(designExample))
	if err != nil {
		t.Fatal(err)
	}
	empty := fleet.Fleet{Nodes: []fleet.Node{}, Models: []fleet.Model{}, Placements: []fleet.Placement{}}
	for name, f := range map[string]fleet.Fleet{"demo": demo, "design": design, "awkward": awkward(), "empty": empty} {
		t.Run(name, func(t *testing.T) {
			out, err := Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse("export.yaml", out)
			if err != nil {
				t.Fatalf("Parse(Marshal(f)): %v\n%s", err, out)
			}
			if !reflect.DeepEqual(back, f) {
				t.Fatalf("round trip changed the fleet:\n got %+v\nwant %+v\nfile:\n%s", back, f, out)
			}
			again, err := Marshal(back)
			if err != nil || string(again) != string(out) {
				t.Fatalf("Marshal is not stable:\n%s\nvs\n%s", out, again)
			}
		})
	}
}

func TestMarshalLayout(t *testing.T) {
	demo, err := Parse("demo.yaml", Demo)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Marshal(demo)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  - name: ultra\n    address: sim:m1ultra-llamacpp\n",
		"    aliases: [qwen3]\n    context: 16384\n    memory_gb: 3\n",
		`        args: [-ngl, "99", --jinja, --reasoning-format, none]` + "\n",
		"placements:\n  - model: qwen3-4b\n    nodes: [rig, ultra, max]\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("export lacks %q:\n%s", want, out)
		}
	}
	// Placements group only when consecutive and alike, so order survives.
	out, err = Marshal(awkward())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  - model: Qwen/Qwen3-4B\n    nodes: [\"true\", \"0x1f\"]\n  - model: gemma\n    node: \"true\"\n    engine: ollama\n",
		"    node: n.3_x-y\n    engine: sim\n    context: 4096\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("export lacks %q:\n%s", want, out)
		}
	}
	// A placement with its own context is not grouped with the others.
	f := awkward()
	f.Placements[1].Context = 8192
	if out, err = Marshal(f); err != nil || !strings.Contains(string(out), "    node: \"0x1f\"\n    context: 8192\n") {
		t.Errorf("export of a placement context: %v\n%s", err, out)
	}
}

func TestMarshalRefusesWhatParseWouldRefuse(t *testing.T) {
	f := awkward()
	f.Placements = append(f.Placements, fleet.Placement{Model: "gemma", Node: "nowhere"})
	if _, err := Marshal(f); err == nil || !strings.Contains(err.Error(), `node "nowhere" is not declared`) {
		t.Fatalf("Marshal of an invalid fleet = %v", err)
	}
}
