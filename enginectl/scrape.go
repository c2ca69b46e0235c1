package enginectl

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"fleet"
)

// Load is an engine's own view of how busy it is.
type Load struct {
	Running int
	Waiting int
	// KVUsage is the KV-cache fill, 0 to 1; llama-server no longer exports
	// one, so it stays 0 there.
	KVUsage float64
	// Slots is how many requests the engine serves at once; 0 when the
	// engine does not say (vLLM: use Command.Slots from --max-num-seqs).
	Slots int
}

// ErrNoLoadSignal means the engine exposes no load figures (Ollama).
var ErrNoLoadSignal = errors.New("engine exposes no load figures")

// Scrape reads an engine's load: vLLM's /metrics (num_requests_running,
// num_requests_waiting, kv_cache_usage_perc, summed over data-parallel
// engines, KV the fullest one), or llama-server's /slots and /props (plus
// requests_deferred from /metrics when it runs with --metrics). A sim
// engine is read as whichever engine it mimics.
func Scrape(ctx context.Context, r Runner, port int, engine fleet.EngineKind) (Load, error) {
	hc := httpClient(r)
	defer hc.CloseIdleConnections()
	switch engine {
	case fleet.EngineVLLM, fleet.EngineVLLMMetal:
		return scrapeVLLM(ctx, hc, port)
	case fleet.EngineLlamaCpp:
		return scrapeLlama(ctx, hc, port)
	case fleet.EngineSim:
		if l, err := scrapeVLLM(ctx, hc, port); err == nil {
			return l, nil
		}
		return scrapeLlama(ctx, hc, port)
	case fleet.EngineOllama:
		return Load{}, fmt.Errorf("scrape port %d: ollama has no metrics or slots endpoint: %w", port, ErrNoLoadSignal)
	}
	return Load{}, fmt.Errorf("scrape port %d: unknown engine %q", port, engine)
}

func scrapeVLLM(ctx context.Context, hc *http.Client, port int) (Load, error) {
	status, body, err := get(ctx, hc, port, "/metrics")
	if err != nil {
		return Load{}, fmt.Errorf("scrape vLLM on port %d: %w", port, err)
	}
	if status != http.StatusOK {
		return Load{}, fmt.Errorf("scrape vLLM on port %d: /metrics answered %d %s", port, status, snippet(body))
	}
	samples := parseMetrics(body)
	running, okR := samples.sum("vllm:num_requests_running")
	waiting, okW := samples.sum("vllm:num_requests_waiting")
	if !okR && !okW {
		return Load{}, fmt.Errorf("scrape vLLM on port %d: /metrics has no vllm:num_requests_running or vllm:num_requests_waiting; is it a vLLM server?", port)
	}
	kv, ok := samples.max("vllm:kv_cache_usage_perc")
	if !ok {
		kv, _ = samples.max("vllm:gpu_cache_usage_perc") // before vLLM 0.9
	}
	return Load{Running: int(running), Waiting: int(waiting), KVUsage: kv}, nil
}

func scrapeLlama(ctx context.Context, hc *http.Client, port int) (Load, error) {
	status, body, err := get(ctx, hc, port, "/slots")
	if err != nil {
		return Load{}, fmt.Errorf("scrape llama-server on port %d: %w", port, err)
	}
	switch status {
	case http.StatusOK:
	case http.StatusNotImplemented:
		return Load{}, fmt.Errorf("scrape llama-server on port %d: /slots is disabled (started with --no-slots); remove that flag from the recipe", port)
	case http.StatusUnauthorized:
		return Load{}, fmt.Errorf("scrape llama-server on port %d: /slots needs the API key (started with --api-key)", port)
	default:
		return Load{}, fmt.Errorf("scrape llama-server on port %d: /slots answered %d %s", port, status, snippet(body))
	}
	var slots []struct {
		IsProcessing bool `json:"is_processing"`
	}
	if err := json.Unmarshal(body, &slots); err != nil {
		return Load{}, fmt.Errorf("scrape llama-server on port %d: /slots is not a list of slots: %w", port, err)
	}
	l := Load{Slots: len(slots)}
	for _, s := range slots {
		if s.IsProcessing {
			l.Running++
		}
	}
	if status, body, err := get(ctx, hc, port, "/props"); err == nil && status == http.StatusOK {
		var props struct {
			TotalSlots int `json:"total_slots"`
		}
		if json.Unmarshal(body, &props) == nil && props.TotalSlots > 0 {
			l.Slots = props.TotalSlots
		}
	}
	// /metrics exists only with --metrics; without it the queue is unknown.
	if status, body, err := get(ctx, hc, port, "/metrics"); err == nil && status == http.StatusOK {
		if d, ok := parseMetrics(body).sum("llamacpp:requests_deferred"); ok {
			l.Waiting = int(d)
		}
	}
	return l, nil
}

// metricSamples maps a metric name to the values of its series.
type metricSamples map[string][]float64

func (m metricSamples) sum(name string) (float64, bool) {
	vs, ok := m[name]
	t := 0.0
	for _, v := range vs {
		t += v
	}
	return t, ok
}

func (m metricSamples) max(name string) (float64, bool) {
	vs, ok := m[name]
	best := 0.0
	for _, v := range vs {
		best = max(best, v)
	}
	return best, ok
}

// parseMetrics reads the Prometheus text format: enough of it for gauges
// (name, optional {labels} possibly holding spaces, value, optional
// timestamp). Lines it cannot read are skipped.
func parseMetrics(body []byte) metricSamples {
	out := metricSamples{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		var name, rest string
		if i := strings.IndexAny(line, "{ \t"); i < 0 {
			continue
		} else if line[i] == '{' {
			end := labelsEnd(line, i)
			if end < 0 {
				continue
			}
			name, rest = line[:i], line[end+1:]
		} else {
			name, rest = line[:i], line[i:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		out[name] = append(out[name], v)
	}
	return out
}

// labelsEnd finds the '}' closing the label set that opens at line[open],
// skipping braces inside quoted label values.
func labelsEnd(line string, open int) int {
	quoted, escaped := false, false
	for i := open + 1; i < len(line); i++ {
		c := line[i]
		switch {
		case escaped:
			escaped = false
		case c == '\\':
			escaped = quoted
		case c == '"':
			quoted = !quoted
		case c == '}' && !quoted:
			return i
		}
	}
	return -1
}
