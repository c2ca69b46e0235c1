package enginectl

import (
	"strings"
	"testing"

	"fleet"
)

func TestCheckRecipes(t *testing.T) {
	model := func(k fleet.EngineKind, r fleet.Recipe) fleet.Model {
		return fleet.Model{ID: "qwen3-4b", Context: 16384, Recipes: map[fleet.EngineKind]fleet.Recipe{k: r}}
	}
	tests := []struct {
		name    string
		m       fleet.Model
		wantErr string // "" = accepted
	}{
		{"llama.cpp recipe", model(fleet.EngineLlamaCpp, fleet.Recipe{Model: "Qwen/Qwen3-4B-GGUF:Q4_K_M", Args: []string{"-ngl", "99"}}), ""},
		{"llama.cpp context flag", model(fleet.EngineLlamaCpp, fleet.Recipe{Model: "q.gguf", Args: []string{"-c", "4096"}}), "passes -c, which fleet sets itself"},
		{"vllm port flag", model(fleet.EngineVLLM, fleet.Recipe{Model: "Qwen/Qwen3-4B-AWQ", Args: []string{"--port=9000"}}), "passes --port"},
		{"vllm without weights", model(fleet.EngineVLLM, fleet.Recipe{}), "names no weights"},
		{"bad env name", model(fleet.EngineLlamaCpp, fleet.Recipe{Model: "q.gguf", Env: map[string]string{"A-B": "1"}}), "env name \"A-B\""},
		{"sim with a profile", model(fleet.EngineSim, fleet.Recipe{Profile: "m4max-llamacpp"}), ""},
		// The profile of a sim recipe without one comes from its sim node.
		{"sim without a profile", model(fleet.EngineSim, fleet.Recipe{}), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckRecipes(tt.m)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("CheckRecipes: %v, want it accepted", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("CheckRecipes: %v, want an error saying %q", err, tt.wantErr)
			}
		})
	}
}
