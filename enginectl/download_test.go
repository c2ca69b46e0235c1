package enginectl

import "testing"

func TestDownloadProgress(t *testing.T) {
	tests := []struct {
		name string
		log  string
		pct  float64
		line string
		ok   bool
	}{
		{"vLLM's tqdm bars redraw with \\r; the last wins",
			"INFO 11-30 loading\nmodel-00001-of-00002.safetensors:   5%|▌         | 250M/4.97G [00:01<00:20, 230MB/s]\rmodel-00001-of-00002.safetensors:  45%|████▌     | 2.24G/4.97G [00:10<00:12, 215MB/s]",
			45, "model-00001-of-00002.safetensors:  45%|████▌     | 2.24G/4.97G [00:10<00:12, 215MB/s]", true},
		{"huggingface_hub's file count bar", "Fetching 4 files:  50%|█████     | 2/4 [00:03<00:03,  1.50s/it]\n", 50,
			"Fetching 4 files:  50%|█████     | 2/4 [00:03<00:03,  1.50s/it]", true},
		{"llama-server's bar with its terminal codes", "\nDownloading Qwen3-4B-Q4_K_M.gguf ──────────╴          67%\x1b[K\r", 67,
			"Downloading Qwen3-4B-Q4_K_M.gguf ──────────╴          67%", true},
		{"a curl meter", "######################                          45.2%\r", 45.2, "######################                          45.2%", true},
		{"figures that are no download", "INFO GPU KV cache usage: 12.5%, prefix cache hit rate: 80.0%\nLoading safetensors checkpoint shards: 50% Completed | 1/2\n", 0, "", false},
		{"nothing yet", "", 0, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pct, line, ok := DownloadProgress([]byte(tt.log))
			if pct != tt.pct || line != tt.line || ok != tt.ok {
				t.Errorf("DownloadProgress = %v, %q, %v; want %v, %q, %v", pct, line, ok, tt.pct, tt.line, tt.ok)
			}
		})
	}
}
