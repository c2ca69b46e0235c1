package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"fleet"
	"fleet/router/simulate"
	"fleet/sim"
)

// The real-time counterpart of `fleet simulate --scenario seed-mixed`: the
// same four machines as real `fleet sim` engines behind a real hub, the same
// kind of open-loop Poisson traffic at the same load fraction, one run per
// policy. It is a measurement, not a check: the machine is shared and timing
// is noisy, so it prints the table and fails only when something breaks
// (a hub that does not start, a worker that is not admitted, a request that
// errors). It takes several minutes, hence the opt-in.

// realtimeNodes are the scenario's workers as simulated nodes. The node
// names are the scenario's, so the share columns line up with simulate's.
var realtimeNodes = []struct {
	node, profile string
	slots         int
}{
	// The scenario gives the 5060 Ti 8 slots; vLLM would default to 256, so
	// the recipe pins --max-num-seqs 8 and both sides see the same machine.
	{"wsl", "rtx5060ti-vllm", 8},
	{"ultra", "m1ultra-llamacpp", 4},
	{"max", "m4max-llamacpp", 4},
	{"ultra27", "m1ultra-27b-starved", 4},
}

// The starved Mac decodes at 10.7 tok/s, 11% of the 5060 Ti's 96: the
// default speed_tolerance (0.5) would rightly reject it at admission. The
// scenario is about a router that must live with such a worker, so the
// model's speed_tolerance is lowered to 0.05 to admit it (rather than
// `fleet admit --force`, which would need a second step after the hub is up).
const realtimeFleetFile = `# seed-mixed, in real time: one RTX 5060 Ti running vLLM, the M1 Ultra and
# the M4 Max running llama.cpp, and a memory-starved M1 Ultra (the 27B's
# speed) serving the same model name.
nodes:
  - name: wsl
    address: sim:rtx5060ti-vllm
  - name: ultra
    address: sim:m1ultra-llamacpp
  - name: max
    address: sim:m4max-llamacpp
  - name: ultra27
    address: sim:m1ultra-27b-starved
models:
  - id: qwen3-4b
    context: 16384
    memory_gb: 3
    # Low enough to admit the starved worker (10.7 tok/s against 96).
    speed_tolerance: 0.05
    recipes:
      # Tool calls must come back in the same shape from both engines, or
      # admission's reference-shape rule rejects whichever differs.
      vllm:
        model: Qwen/Qwen3-4B-AWQ
        args: [--max-num-seqs, "8", --enable-auto-tool-choice, --tool-call-parser, hermes]
      llamacpp:
        model: Qwen3-4B-Q4_K_M.gguf
        args: [-ngl, "99", --jinja, --reasoning-format, none]
placements:
  - model: qwen3-4b
    nodes: [wsl, ultra, max, ultra27]
`

const (
	realtimeLoad        = 0.7
	realtimeMaxRequests = 150
	realtimeWindow      = 60 * time.Second
)

// rtArrival is one request of the open-loop stream.
type rtArrival struct {
	at     time.Duration
	prompt int
	output int
}

// rtOutcome is what the client saw of one request.
type rtOutcome struct {
	ttft, e2e time.Duration
	rejected  bool
	err       error
}

// rtResult is one policy's run.
type rtResult struct {
	policy         string
	requests       int
	rejected       int
	ttft, e2e      []float64 // ms, sorted
	share          map[string]float64
	failures       []string
	wallClockSpent time.Duration
}

func TestRealtimePolicyComparison(t *testing.T) {
	if os.Getenv("FLEET_REALTIME") != "1" {
		t.Skip("a real-time run of several minutes; set FLEET_REALTIME=1 to measure")
	}
	scen, err := simulate.Builtin("seed-mixed", realtimeLoad)
	if err != nil {
		t.Fatal(err)
	}
	// Capacity is computed as simulate computes it (each worker's best total
	// decode throughput within its slots), but from the sim profiles that
	// really run, so "70% load" is 70% of these engines.
	capacity := 0.0
	for _, n := range realtimeNodes {
		p, err := sim.LookupProfile(n.profile)
		if err != nil {
			t.Fatal(err)
		}
		best := 0.0
		for c := 1; c <= n.slots; c++ {
			best = max(best, p.TotalTokPerSec(c))
		}
		capacity += best
	}
	meanOut := scen.Output.Mean()
	reqPerSec := scen.Load * capacity / meanOut
	arrivals := rtPoissonArrivals(scen, reqPerSec)
	t.Logf("seed-mixed in real time: capacity %.0f tok/s, mean output %.0f tokens, load %.0f%% → %.2f req/s; %d requests over %.1f s, seed %d",
		capacity, meanOut, scen.Load*100, reqPerSec, len(arrivals), arrivals[len(arrivals)-1].at.Seconds(), scen.Seed)

	fleetFile := filepath.Join(t.TempDir(), "seed-mixed.yaml")
	if err := os.WriteFile(fleetFile, []byte(realtimeFleetFile), 0o600); err != nil {
		t.Fatal(err)
	}

	policies := []string{"fleet", "p2c-least-loaded", "round-robin", "random"}
	var results []rtResult
	for _, policy := range policies {
		t.Run(policy, func(t *testing.T) {
			r := runRealtimePolicy(t, policy, fleetFile, arrivals)
			results = append(results, r)
			for _, f := range r.failures {
				t.Error(f)
			}
		})
	}
	if len(results) == 0 {
		return
	}
	t.Logf("real time (%d requests per policy, same arrivals for each):\n%s", len(arrivals), realtimeTable(results))

	// The same arrivals in virtual time, for side-by-side reading: simulate
	// draws them from the same seed and rate, so its load is set to give
	// this run's rate against the scenario's own capacity figures.
	vscen := scen
	vscen.Requests = len(arrivals)
	vscen.Load = reqPerSec * meanOut / scen.Capacity()
	if vr, err := simulate.Run(vscen, policies); err == nil {
		t.Logf("virtual time, same seed and rate (fleet simulate):\n%s", simulate.Text(vscen, vr))
	} else {
		t.Logf("virtual-time comparison not available: %v", err)
	}
}

// runRealtimePolicy runs one policy on a fresh hub and data dir.
func runRealtimePolicy(t *testing.T, policy, fleetFile string, arrivals []rtArrival) rtResult {
	data := t.TempDir()
	h := startPolicyHub(t, data, freePort(t), fleetFile, policy)
	base := "http://" + h.http
	rtWaitAllReady(t, data, len(realtimeNodes), 3*time.Minute)

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 0}}
	defer client.CloseIdleConnections()
	outcomes := make([]rtOutcome, len(arrivals))
	var wg sync.WaitGroup
	start := time.Now()
	for i, a := range arrivals {
		// Open loop: each request leaves at its time whatever the others do.
		time.Sleep(time.Until(start.Add(a.at)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			outcomes[i] = rtRequest(client, base, i, a)
		}()
	}
	wg.Wait()

	r := rtResult{policy: policy, wallClockSpent: time.Since(start)}
	for i, o := range outcomes {
		switch {
		case o.err != nil:
			r.failures = append(r.failures, fmt.Sprintf("%s: request %d (prompt %d, max_tokens %d): %v", policy, i, arrivals[i].prompt, arrivals[i].output, o.err))
		case o.rejected:
			r.rejected++
		default:
			r.requests++
			r.ttft = append(r.ttft, rtMS(o.ttft))
			r.e2e = append(r.e2e, rtMS(o.e2e))
		}
	}
	sort.Float64s(r.ttft)
	sort.Float64s(r.e2e)
	share, err := rtBackendShares(base)
	if err != nil {
		r.failures = append(r.failures, fmt.Sprintf("%s: reading the router's metrics: %v", policy, err))
	}
	r.share = share
	t.Logf("%s: %d served, %d rejected, %d failed in %.1f s", policy, r.requests, r.rejected, len(r.failures), r.wallClockSpent.Seconds())
	return r
}

// startPolicyHub starts `fleet serve --fleet FILE --policy NAME`.
func startPolicyHub(t *testing.T, data string, httpPort int, fleetFile, policy string) *hubProc {
	t.Helper()
	return launchHub(t, data, httpPort, "--fleet", fleetFile, "--policy", policy)
}

// rtWaitAllReady waits until n workers are ready, and gives up at once when
// admission rejects one: the comparison needs every worker of the scenario.
func rtWaitAllReady(t *testing.T, data string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var ws []fleet.WorkerView
	for time.Now().Before(deadline) {
		ws = workersJSON(t, data)
		ready := 0
		for _, w := range ws {
			switch w.State {
			case fleet.WorkerReady:
				ready++
			case fleet.WorkerRejected:
				t.Fatalf("admission rejected %s: %s", w.Name(), w.Reason)
			}
		}
		if ready == n {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("%d workers not ready within %s: %+v", n, within, ws)
}

// rtRequest sends one streamed chat completion and times it. TTFT is
// the first chunk carrying generated text: vLLM sends an empty role chunk
// before the request is even scheduled, which is no token.
func rtRequest(client *http.Client, base string, i int, a rtArrival) rtOutcome {
	prefix := fmt.Sprintf("Request %d. ", i)
	// The sim counts a prompt token per four characters.
	text := prefix + strings.Repeat("abcd", max(a.prompt-(len(prefix)+3)/4, 1))
	body, _ := json.Marshal(map[string]any{
		"model":          "qwen3-4b",
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"max_tokens":     a.output,
		"messages":       []map[string]string{{"role": "user", "content": text}},
	})
	// A hang guard only: the slowest worker needs about a minute for the
	// longest answer at full concurrency.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return rtOutcome{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return rtOutcome{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		io.Copy(io.Discard, resp.Body)
		return rtOutcome{rejected: true}
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return rtOutcome{err: fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)}
	}
	var o rtOutcome
	completion := -1
	done := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			o.e2e = time.Since(sent)
			done = true
			break
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
					Reasoning        string `json:"reasoning"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return rtOutcome{err: fmt.Errorf("a chunk is not JSON: %w: %s", err, data)}
		}
		if chunk.Error != nil {
			return rtOutcome{err: fmt.Errorf("error event mid-stream: %s", chunk.Error.Message)}
		}
		if o.ttft == 0 && len(chunk.Choices) > 0 {
			d := chunk.Choices[0].Delta
			if d.Content != "" || d.ReasoningContent != "" || d.Reasoning != "" {
				o.ttft = time.Since(sent)
			}
		}
		if chunk.Usage != nil {
			completion = chunk.Usage.CompletionTokens
		}
	}
	if err := sc.Err(); err != nil {
		return rtOutcome{err: fmt.Errorf("reading the stream: %w", err)}
	}
	if !done {
		return rtOutcome{err: fmt.Errorf("the stream ended without [DONE]")}
	}
	if completion != a.output {
		return rtOutcome{err: fmt.Errorf("usage says %d completion tokens, asked for exactly %d", completion, a.output)}
	}
	return o
}

// rtBackendShares reads fleet_router_requests_total and returns each backend's
// fraction of the requests it answered with 200.
func rtBackendShares(base string) (map[string]float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	counts := map[string]float64{}
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "fleet_router_requests_total{") || !strings.Contains(line, `status="200"`) {
			continue
		}
		_, rest, ok := strings.Cut(line, `backend="`)
		if !ok {
			continue
		}
		backend, _, _ := strings.Cut(rest, `"`)
		if backend == "" {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		counts[backend] += v
		total += v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for k := range counts {
		counts[k] /= max(total, 1)
	}
	return counts, nil
}

// rtPoissonArrivals draws arrivals the way simulate does (same generator,
// seed and order of draws), bounded in count and in time.
func rtPoissonArrivals(s simulate.Scenario, reqPerSec float64) []rtArrival {
	rng := rand.New(rand.NewPCG(s.Seed, s.Seed+1))
	var out []rtArrival
	var at float64
	for len(out) < realtimeMaxRequests {
		at += rng.ExpFloat64() / reqPerSec
		if at > realtimeWindow.Seconds() {
			break
		}
		out = append(out, rtArrival{at: time.Duration(at * float64(time.Second)), prompt: s.Prompt.Sample(rng), output: s.Output.Sample(rng)})
	}
	return out
}

func rtMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pct is simulate's percentile: the nearest rank below.
func rtPct(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}

func rtFmtMS(v float64) string {
	if v >= 10000 {
		return fmt.Sprintf("%.1f s", v/1000)
	}
	return fmt.Sprintf("%.0f ms", v)
}

func realtimeTable(rs []rtResult) string {
	var backends []string
	for _, r := range rs {
		for b := range r.share {
			if !slices.Contains(backends, b) {
				backends = append(backends, b)
			}
		}
	}
	sort.Strings(backends)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%18s %8s %8s %9s %9s %9s %9s", "policy", "requests", "rejected", "p50 TTFT", "p99 TTFT", "p50 E2E", "p99 E2E")
	for _, b := range backends {
		fmt.Fprintf(&sb, " %17s", b)
	}
	sb.WriteString("\n")
	for _, r := range rs {
		fmt.Fprintf(&sb, "%18s %8d %8d %9s %9s %9s %9s", r.policy, r.requests, r.rejected,
			rtFmtMS(rtPct(r.ttft, 0.5)), rtFmtMS(rtPct(r.ttft, 0.99)), rtFmtMS(rtPct(r.e2e, 0.5)), rtFmtMS(rtPct(r.e2e, 0.99)))
		for _, b := range backends {
			fmt.Fprintf(&sb, " %16.1f%%", 100*r.share[b])
		}
		sb.WriteString("\n")
	}
	return sb.String()
}
