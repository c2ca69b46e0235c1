package fleet

import (
	"slices"
	"testing"
)

func TestRedactModels(t *testing.T) {
	in := []Model{{ID: "m", Recipes: map[EngineKind]Recipe{
		EngineVLLM:     {Model: "org/m", Env: map[string]string{"HF_TOKEN": "hf_secret", "VLLM_X": "1"}},
		EngineLlamaCpp: {Model: "m.gguf"},
	}}, {ID: "bare"}}
	out := RedactModels(in)
	if got := out[0].Recipes[EngineVLLM].Env; got["HF_TOKEN"] != Redacted || got["VLLM_X"] != Redacted || len(got) != 2 {
		t.Errorf("redacted env %v", got)
	}
	if out[0].Recipes[EngineVLLM].Model != "org/m" || out[0].Recipes[EngineLlamaCpp].Model != "m.gguf" || out[1].ID != "bare" {
		t.Errorf("redaction changed more than env values: %+v", out)
	}
	if in[0].Recipes[EngineVLLM].Env["HF_TOKEN"] != "hf_secret" {
		t.Errorf("RedactModels modified its input")
	}
}

func TestRedactArgv(t *testing.T) {
	tests := []struct{ in, want []string }{
		{[]string{"sh", "-c", "s", "start", "d", "env", "HF_TOKEN=hf_x", "A=b=c", "vllm", "serve", "--x=1"},
			[]string{"sh", "-c", "s", "start", "d", "env", "HF_TOKEN=" + Redacted, "A=" + Redacted, "vllm", "serve", "--x=1"}},
		{[]string{"vllm", "--opt=v"}, []string{"vllm", "--opt=v"}},
		{[]string{"vllm", "serve", "--api-key", "sk-1", "--port", "8000"}, []string{"vllm", "serve", "--api-key", Redacted, "--port", "8000"}},
		{[]string{"llama-server", "--api-key=sk-1", "-hft", "hf_1", "--hf-token=hf_2"}, []string{"llama-server", "--api-key=" + Redacted, "-hft", Redacted, "--hf-token=" + Redacted}},
		{[]string{"llama-server", "--api-key"}, []string{"llama-server", "--api-key"}},                       // no value: nothing to hide
		{[]string{"llama-server", "--api-key-file", "/k"}, []string{"llama-server", "--api-key-file", "/k"}}, // a path, not a secret
		{nil, nil},
	}
	for _, tt := range tests {
		if got := RedactArgv(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("RedactArgv(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
