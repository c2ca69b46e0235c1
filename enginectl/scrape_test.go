package enginectl

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"fleet"
)

// vllmMetrics is shaped like a data-parallel vLLM's /metrics (two engines).
const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen3-4b"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen3-4b"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen3-4b"} 1.0
vllm:num_requests_waiting{engine="1",model_name="qwen3-4b"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen3-4b"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="qwen3-4b"} 0.5
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="qwen3-4b"} 0.0
vllm:generation_tokens_total{engine="0",model_name="qwen3-4b"} 12345.0
`

const llamaSlots = `[{"id":0,"id_task":12,"n_ctx":16384,"speculative":false,"is_processing":true,"params":{"reasoning_format":"none"},"next_token":{"has_next_token":true,"n_remain":200,"n_decoded":56}},
{"id":1,"id_task":-1,"n_ctx":16384,"speculative":false,"is_processing":false},
{"id":2,"id_task":13,"n_ctx":16384,"speculative":false,"is_processing":true},
{"id":3,"id_task":-1,"n_ctx":16384,"speculative":false,"is_processing":false}]`

const llamaMetrics = `# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
`

func serve(t *testing.T, routes map[string]func(w http.ResponseWriter)) int {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, ok := routes[r.URL.Path]; ok {
			h(w)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	return port
}

func body(s string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) { w.Write([]byte(s)) }
}

func status(code int) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) { w.WriteHeader(code) }
}

func TestScrape(t *testing.T) {
	tests := []struct {
		name   string
		engine fleet.EngineKind
		routes map[string]func(http.ResponseWriter)
		want   Load
		errHas string
		errIs  error
	}{
		{name: "vllm sums data-parallel engines, KV of the fullest", engine: fleet.EngineVLLM,
			routes: map[string]func(http.ResponseWriter){"/metrics": body(vllmMetrics)},
			want:   Load{Running: 5, Waiting: 1, KVUsage: 0.5}},
		{name: "vllm-metal reads as vllm", engine: fleet.EngineVLLMMetal,
			routes: map[string]func(http.ResponseWriter){"/metrics": body("vllm:num_requests_running{model_name=\"a b}\"} 1\nvllm:num_requests_waiting 2 1700000000000\nvllm:gpu_cache_usage_perc 0.125\n")},
			want:   Load{Running: 1, Waiting: 2, KVUsage: 0.125}},
		{name: "llama-server with --metrics", engine: fleet.EngineLlamaCpp,
			routes: map[string]func(http.ResponseWriter){"/slots": body(llamaSlots), "/props": body(`{"total_slots":4,"default_generation_settings":{"n_ctx":16384}}`), "/metrics": body(llamaMetrics)},
			want:   Load{Running: 2, Waiting: 5, Slots: 4}},
		{name: "llama-server without --metrics", engine: fleet.EngineLlamaCpp,
			routes: map[string]func(http.ResponseWriter){"/slots": body(llamaSlots), "/metrics": status(501)},
			want:   Load{Running: 2, Slots: 4}},
		{name: "sim mimicking llama-server", engine: fleet.EngineSim,
			routes: map[string]func(http.ResponseWriter){"/slots": body(llamaSlots), "/metrics": body(llamaMetrics)},
			want:   Load{Running: 2, Waiting: 5, Slots: 4}},
		{name: "sim mimicking vllm", engine: fleet.EngineSim,
			routes: map[string]func(http.ResponseWriter){"/metrics": body(vllmMetrics)},
			want:   Load{Running: 5, Waiting: 1, KVUsage: 0.5}},
		{name: "llama-server with --no-slots", engine: fleet.EngineLlamaCpp,
			routes: map[string]func(http.ResponseWriter){"/slots": status(501)}, errHas: "--no-slots"},
		{name: "llama-server with an API key", engine: fleet.EngineLlamaCpp,
			routes: map[string]func(http.ResponseWriter){"/slots": status(401)}, errHas: "needs the API key"},
		{name: "not a vLLM", engine: fleet.EngineVLLM,
			routes: map[string]func(http.ResponseWriter){"/metrics": body("go_goroutines 12\n")}, errHas: "is it a vLLM server"},
		{name: "ollama has no load figures", engine: fleet.EngineOllama, errIs: ErrNoLoadSignal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			port := serve(t, tc.routes)
			got, err := Scrape(testCtx(t), LocalRunner{}, port, tc.engine)
			switch {
			case tc.errIs != nil:
				if !errors.Is(err, tc.errIs) {
					t.Fatalf("Scrape = %+v, %v; want %v", got, err, tc.errIs)
				}
			case tc.errHas != "":
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("Scrape = %+v, %v; want an error containing %q", got, err, tc.errHas)
				}
			case err != nil:
				t.Fatal(err)
			case got != tc.want:
				t.Errorf("Scrape = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseMetrics(t *testing.T) {
	tests := []struct {
		name string
		text string
		want map[string][]float64
	}{
		{"plain", "a 1\nb 2.5\n", map[string][]float64{"a": {1}, "b": {2.5}}},
		{"labels with spaces and braces", `m{x="a } b",y="\"q\""} 3` + "\n", map[string][]float64{"m": {3}}},
		{"timestamp ignored", "m 4 1700000000\n", map[string][]float64{"m": {4}}},
		{"comments and blanks skipped", "# HELP m x\n\n# TYPE m gauge\nm 1\n", map[string][]float64{"m": {1}}},
		{"NaN and garbage skipped", "m NaN\nn +Inf\nbroken{a=\"1\" 2\nvalueless\no 1e3\n", map[string][]float64{"o": {1000}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := parseMetrics([]byte(tc.text))
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if len(got[k]) != len(v) || got[k][0] != v[0] {
					t.Errorf("%s = %v, want %v", k, got[k], v)
				}
			}
		})
	}
}
