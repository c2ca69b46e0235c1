package enginectl

import "testing"

// The engines' own words for a port they cannot bind, as their logs end.
func TestBindFailed(t *testing.T) {
	tests := []struct {
		engine, tail string
		want         bool
	}{
		{"llama-server", "main: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080", true},
		{"vLLM (uvicorn)", "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use", true},
		{"vLLM (pre-bound socket)", "OSError: [Errno 98] Address already in use", true},
		{"Ollama", "Error: listen tcp 127.0.0.1:11434: bind: address already in use", true},
		{"fleet sim", "fleet sim: listen tcp 127.0.0.1:18000: bind: address already in use", true},
		{"out of memory", "CUDA error: out of memory", false},
		{"empty log", "", false},
	}
	for _, tt := range tests {
		if got := bindFailed(tt.tail); got != tt.want {
			t.Errorf("%s: bindFailed(%q) = %v, want %v", tt.engine, tt.tail, got, tt.want)
		}
	}
}
