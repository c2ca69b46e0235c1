package cli

import (
	"testing"

	"fleet"
)

func TestEngineLocations(t *testing.T) {
	tests := []struct {
		found map[fleet.EngineKind]string
		want  string
	}{
		{nil, "none"},
		{map[fleet.EngineKind]string{fleet.EngineLlamaCpp: "/opt/homebrew/bin/llama-server"}, "llamacpp=/opt/homebrew/bin/llama-server"},
		{map[fleet.EngineKind]string{fleet.EngineOllama: "/usr/local/bin/ollama", fleet.EngineVLLM: "/home/u/.venv/bin/vllm"}, "vllm=/home/u/.venv/bin/vllm ollama=/usr/local/bin/ollama"},
	}
	for _, tc := range tests {
		if got := engineLocations(tc.found); got != tc.want {
			t.Errorf("engineLocations(%v) = %q, want %q", tc.found, got, tc.want)
		}
	}
}
