package router

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"fleet/internal/llamatest"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

type sample struct {
	labels map[string]string
	value  float64
}

// scrapeValues reads req's /metrics answer through the Prometheus text
// parser, failing unless it is 200 and valid.
func scrapeValues(t *testing.T, req *http.Request) map[string][]sample {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics answered %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text: %v", err)
	}
	out := map[string][]sample{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			s := sample{labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.Counter != nil:
				s.value = m.Counter.GetValue()
			case m.Gauge != nil:
				s.value = m.Gauge.GetValue()
			case m.Untyped != nil:
				s.value = m.Untyped.GetValue()
			case m.Histogram != nil:
				s.value = float64(m.Histogram.GetSampleCount())
			}
			out[name] = append(out[name], s)
		}
	}
	return out
}

// Under required keys /metrics needs one too; --metrics-open-loopback
// leaves it open to a Prometheus on the hub's machine.
func TestMetricsFollowKeys(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       Options
		key        string
		wantStatus int
	}{
		{"no keys required", Options{}, "", 200},
		{"keys required, none sent", Options{Keys: keys{"sk-a": "alice"}}, "", 401},
		{"keys required, a wrong one", Options{Keys: keys{"sk-a": "alice"}}, "sk-x", 401},
		{"keys required, a good one", Options{Keys: keys{"sk-a": "alice"}}, "sk-a", 200},
		{"open to loopback", Options{Keys: keys{"sk-a": "alice"}, MetricsOpenLoopback: true}, "", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, rsrv := startRouter(t, tc.opts)
			req, _ := http.NewRequest(http.MethodGet, rsrv.URL+"/metrics", nil)
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Errorf("/metrics answered %d, want %d", resp.StatusCode, tc.wantStatus)
			}
		})
	}
}

// vllmText is a vLLM /metrics page in miniature: a gauge, a counter and a
// histogram labelled model_name and engine (the data-parallel index), and a
// Python process metric the hub has no use for.
const vllmText = `# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen3-4b"} 3
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="qwen3-4b"} 1234
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="qwen3-4b"} 4
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="qwen3-4b"} 5
vllm:time_to_first_token_seconds_count{engine="0",model_name="qwen3-4b"} 5
vllm:time_to_first_token_seconds_sum{engine="0",model_name="qwen3-4b"} 0.7
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1e+06
`

const llamaText = `# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 99
`

// Each worker's engine metrics are served relabelled with node, worker and
// engine (vLLM's own engine label kept as exported_engine), only the
// engines' own families, and not once they are stale.
func TestEngineMetricsRelabelled(t *testing.T) {
	r, rsrv := startRouter(t, Options{EngineLoadMaxAge: time.Hour})
	now := time.Now()
	if err := r.ObserveEngineMetrics("rig", "rig/qwen3-4b", "vllm", []byte(vllmText), now); err != nil {
		t.Fatal(err)
	}
	if err := r.ObserveEngineMetrics("ultra", "ultra/qwen3-4b", "llama.cpp", []byte(llamaText), now); err != nil {
		t.Fatal(err)
	}
	if err := r.ObserveEngineMetrics("max", "max/qwen3-4b", "llama.cpp", []byte("<html>not metrics"), now); err == nil {
		t.Error("an HTML page was taken for metrics")
	}
	req, _ := http.NewRequest(http.MethodGet, rsrv.URL+"/metrics", nil)
	got := scrapeValues(t, req)
	waiting := got["vllm:num_requests_waiting"]
	if len(waiting) != 1 || waiting[0].value != 3 {
		t.Fatalf("vllm:num_requests_waiting = %+v", waiting)
	}
	want := map[string]string{"node": "rig", "worker": "rig/qwen3-4b", "engine": "vllm", "exported_engine": "0", "model_name": "qwen3-4b"}
	for k, v := range want {
		if waiting[0].labels[k] != v {
			t.Errorf("vllm:num_requests_waiting label %s = %q, want %q (labels %v)", k, waiting[0].labels[k], v, waiting[0].labels)
		}
	}
	if h := got["vllm:time_to_first_token_seconds"]; len(h) != 1 || h[0].value != 5 || h[0].labels["worker"] != "rig/qwen3-4b" {
		t.Errorf("the TTFT histogram = %+v", h)
	}
	if d := got["llamacpp:requests_deferred"]; len(d) != 1 || d[0].value != 2 || d[0].labels["node"] != "ultra" || d[0].labels["engine"] != "llama.cpp" {
		t.Errorf("llamacpp:requests_deferred = %+v", d)
	}
	if _, ok := got["python_gc_objects_collected_total"]; ok {
		t.Error("an engine's process metrics were passed on")
	}
	// Stale readings leave: a stopped worker's metrics go with it.
	r.opts.EngineLoadMaxAge = time.Nanosecond
	time.Sleep(time.Millisecond)
	got = scrapeValues(t, req)
	if _, ok := got["vllm:num_requests_waiting"]; ok {
		t.Error("stale engine metrics are still served")
	}
}

// The real llama-server's /metrics (built by .ci/build-llama-server), after
// a request through it, is served relabelled and parses as Prometheus text.
func TestEngineMetricsFromRealLlamaServer(t *testing.T) {
	real := llamatest.Start(t, "-a", "qwen3-4b", "--metrics", "-np", "1", "-c", "2048")
	resp, err := http.Post(real.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = http.Get(real.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r, rsrv := startRouter(t, Options{EngineLoadMaxAge: time.Hour})
	if err := r.ObserveEngineMetrics("max", "max/qwen3-4b", "llamacpp", text, time.Now()); err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	req, _ := http.NewRequest(http.MethodGet, rsrv.URL+"/metrics", nil)
	got := scrapeValues(t, req)
	for _, name := range []string{"llamacpp:requests_deferred", "llamacpp:requests_processing", "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total"} {
		s := got[name]
		if len(s) != 1 || s[0].labels["worker"] != "max/qwen3-4b" || s[0].labels["node"] != "max" || s[0].labels["engine"] != "llamacpp" {
			t.Errorf("%s = %+v; want one series labelled node max, worker max/qwen3-4b, engine llamacpp\n%s", name, s, text)
		}
	}
	if p := got["llamacpp:tokens_predicted_total"]; len(p) == 1 && p[0].value < 1 {
		t.Errorf("llamacpp:tokens_predicted_total = %v after a request", p[0].value)
	}
}

// A worker that left is not kept in memory until someone scrapes /metrics
// (many fleets never do): each new reading drops the stale ones.
func TestEngineMetricsOfWorkersThatLeftAreDropped(t *testing.T) {
	r := mustNew(t, Options{EngineLoadMaxAge: time.Minute})
	now := time.Now()
	if err := r.ObserveEngineMetrics("gone", "gone/qwen3-4b", "llama.cpp", []byte(llamaText), now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := r.ObserveEngineMetrics("ultra", "ultra/qwen3-4b", "llama.cpp", []byte(llamaText), now); err != nil {
		t.Fatal(err)
	}
	r.engines.mu.Lock()
	defer r.engines.mu.Unlock()
	if _, kept := r.engines.byWorker["gone/qwen3-4b"]; kept || len(r.engines.byWorker) != 1 {
		t.Errorf("kept engine metrics of %d workers, want only ultra/qwen3-4b's", len(r.engines.byWorker))
	}
}
