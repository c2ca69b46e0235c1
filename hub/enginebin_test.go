package hub

import (
	"strings"
	"testing"

	"fleet"
)

func TestEngineBin(t *testing.T) {
	mac := &fleet.Platform{OS: "darwin", Engines: map[fleet.EngineKind]string{fleet.EngineLlamaCpp: "/opt/homebrew/bin/llama-server"}}
	tests := []struct {
		name string
		w    fleet.Worker
		p    *fleet.Platform
		want string
	}{
		{"default binary", fleet.Worker{Engine: fleet.EngineLlamaCpp, Argv: []string{"llama-server", "-m", "m.gguf"}}, mac, "/opt/homebrew/bin/llama-server"},
		{"the recipe's own bin", fleet.Worker{Engine: fleet.EngineLlamaCpp, Argv: []string{"/srv/llama/build/bin/server", "-m", "m.gguf"}}, mac, ""},
		{"simulated", fleet.Worker{Engine: fleet.EngineLlamaCpp, Argv: []string{"llama-server"}, Simulated: true}, mac, ""},
		{"not probed yet", fleet.Worker{Engine: fleet.EngineLlamaCpp, Argv: []string{"llama-server"}}, nil, ""},
		{"another engine", fleet.Worker{Engine: fleet.EngineOllama, Argv: []string{"ollama", "serve"}}, mac, ""},
	}
	for _, tc := range tests {
		if got := engineBin(tc.w, tc.p); got != tc.want {
			t.Errorf("%s: engineBin = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestSanitizeNodeEngines(t *testing.T) {
	n := sanitizeNode(fleet.Node{Platform: &fleet.Platform{Engines: map[fleet.EngineKind]string{fleet.EngineVLLM: "/home/u/.venv\x1b]0;owned\x07/bin/vllm"}}})
	if got := n.Platform.Engines[fleet.EngineVLLM]; strings.ContainsAny(got, "\x1b\x07") {
		t.Errorf("a node's engine path reaches the console with its escapes: %q", got)
	}
}
