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
		// Every spelling vLLM's argparse reads as --api-key: '_' for '-', an
		// unambiguous prefix, inline or not; and its list of keys.
		{[]string{"vllm", "serve", "m", "--api_key", "sk-1"}, []string{"vllm", "serve", "m", "--api_key", Redacted}},
		{[]string{"vllm", "serve", "m", "--api_key=sk-1", "--API-KEY", "sk-2"}, []string{"vllm", "serve", "m", "--api_key=" + Redacted, "--API-KEY", Redacted}},
		{[]string{"vllm", "serve", "m", "--api-k", "sk-1", "--api_ke=sk-2", "--hf_tok", "hf_1"}, []string{"vllm", "serve", "m", "--api-k", Redacted, "--api_ke=" + Redacted, "--hf_tok", Redacted}},
		{[]string{"vllm", "serve", "m", "--api-key", "sk-1", "sk-2", "--port", "8000"}, []string{"vllm", "serve", "m", "--api-key", Redacted, Redacted, "--port", "8000"}},
		{[]string{"llama-server", "--api-key", "-starts-with-a-dash"}, []string{"llama-server", "--api-key", Redacted}},                                    // llama-server takes the next word whatever it is
		{[]string{"vllm", "serve", "m", "--api", "x", "--api-server-count", "2"}, []string{"vllm", "serve", "m", "--api", "x", "--api-server-count", "2"}}, // ambiguous, and another flag
		{[]string{"sh", "-c", "HF_TOKEN=hf_1 exec vllm", "x", "HF_TOKEN=hf_2", "CUDA_VISIBLE_DEVICES=0,1"}, []string{"sh", "-c", "HF_TOKEN=" + Redacted + " exec vllm", "x", "HF_TOKEN=" + Redacted, "CUDA_VISIBLE_DEVICES=" + Redacted}},
		{[]string{"vllm", "serve", "https://u:pw@h/m?token=t", "--lora-modules", "name=path"}, []string{"vllm", "serve", "https://" + Redacted + "@h/m?" + Redacted, "--lora-modules", "name=path"}},
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
		{"vllm serve m --api_key sk-1 sk-2 --port 8000", "vllm serve m --api_key " + Redacted + " " + Redacted + " --port 8000"},
		{"vllm serve m '--api_key=s k' --api-ke=sk-3", "vllm serve m --api_key=" + Redacted + " --api-ke=" + Redacted},
		{"--api-key=\"a b\" next", "--api-key=" + Redacted + " next"},
		// An install script: assignments, a token flag, a bearer header, a
		// signed URL; a flag's list ends with its line.
		{"set -e\nexport HF_TOKEN=hf_1\nHF_HUB_ENABLE_HF_TRANSFER=1 hf download Qwen/Q --token hf_2\npip install 'vllm==0.9' torch==2.1\ncurl -H 'Authorization: Bearer t0k' https://h/x.whl?sig=s",
			"set -e\nexport HF_TOKEN=" + Redacted + "\nHF_HUB_ENABLE_HF_TRANSFER=" + Redacted + " hf download Qwen/Q --token " + Redacted + "\npip install 'vllm==0.9' torch==2.1\ncurl -H 'Authorization: Bearer " + Redacted + "' https://h/x.whl?" + Redacted},
		// vLLM logs its settings as a dict when it starts.
		{"INFO non-default args: {'model': 'm', 'api_key': ['sk-1', 'sk-2'], 'hf_token': 'hf_1'}",
			"INFO non-default args: {'model': 'm', 'api_key': " + Redacted + ", 'hf_token': " + Redacted + "}"},
		{"don't stop: --api-key sk-1", "don't stop: --api-key " + Redacted},
		// The same secrets named as settings, in every spelling.
		{"INFO starting with api_key=sk-1 port=8000", "INFO starting with api_key=" + Redacted + " port=8000"},
		{"cfg: API-Key: sk-1, apiKey=sk-2 openai_api_key='sk 3' hf_token=\"hf_4\"",
			"cfg: API-Key: " + Redacted + ", apiKey=" + Redacted + " openai_api_key=" + Redacted + " hf_token=" + Redacted},
		{`{"model":"m","api_key":"sk-1","max_tokens":8}`, `{"model":"m","api_key":` + Redacted + `,"max_tokens":8}`},
		{"max_tokens=8 n_token=3 tokens: 12", "max_tokens=8 n_token=3 tokens: 12"},
	}
	for _, tt := range tests {
		if got := RedactText(tt.in); got != tt.want {
			t.Errorf("RedactText(%q)\n = %q\nwant %q", tt.in, got, tt.want)
		} else if again := RedactText(got); again != got {
			t.Errorf("RedactText is not idempotent: %q then %q", got, again)
		}
	}
	in := []Event{{ID: 1, Message: "--api-key sk-1"}}
	if out := RedactEvents(in); out[0].Message != "--api-key "+Redacted || out[0].ID != 1 || in[0].Message != "--api-key sk-1" {
		t.Errorf("RedactEvents(%+v) = %+v; want the message redacted in a copy", in, out)
	}
}
