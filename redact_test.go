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

func TestRedactText(t *testing.T) {
	tests := []struct{ in, want string }{
		{"launched PID 7: llama-server --api-key sk-1 --port 8000", "launched PID 7: llama-server --api-key " + Redacted + " --port 8000"},
		{"vllm serve --api-key=sk-1 --hf-token  hf_2 -hft 'hf 3'", "vllm serve --api-key=" + Redacted + " --hf-token  " + Redacted + " -hft " + Redacted},
		{"llama-server --api-key-file /etc/key --api-key", "llama-server --api-key-file /etc/key --api-key"}, // another flag; a flag without value
		{"download: https://cas.hf.co/a/b.gguf?X-Amz-Signature=s&t=1 45%|##", "download: https://cas.hf.co/a/b.gguf?" + Redacted + " 45%|##"},
		{"Looking in indexes: https://__token__:pw@pypi.example.com/simple, http://u@h/x?y#frag",
			"Looking in indexes: https://" + Redacted + "@pypi.example.com/simple, http://" + Redacted + "@h/x?" + Redacted + "#frag"},
		{"downloading https://huggingface.co/Qwen/Qwen3-4B-GGUF/resolve/main/q.gguf to /root/.cache", "downloading https://huggingface.co/Qwen/Qwen3-4B-GGUF/resolve/main/q.gguf to /root/.cache"},
		{"ready on port 18000 (PID 42)", "ready on port 18000 (PID 42)"},
	}
	for _, tt := range tests {
		if got := RedactText(tt.in); got != tt.want {
			t.Errorf("RedactText(%q)\n = %q\nwant %q", tt.in, got, tt.want)
		}
	}
	in := []Event{{ID: 1, Message: "--api-key sk-1"}}
	if out := RedactEvents(in); out[0].Message != "--api-key "+Redacted || out[0].ID != 1 || in[0].Message != "--api-key sk-1" {
		t.Errorf("RedactEvents(%+v) = %+v; want the message redacted in a copy", in, out)
	}
}
