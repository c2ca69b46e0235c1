package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"fleet/router/simulate"
)

// The real-time counterpart of `fleet simulate --scenario agent-sessions`:
// the seed-mixed machines as real `fleet sim` engines, which cache prompts
// as llama-server and vLLM do, behind a real hub; the scenario's first
// sessions run as closed loops (a turn waits for the previous answer and a
// think time), one run per policy. To keep the run to minutes, sessions are
// cut at agentRTMaxTurns turns and start agentRTSpeedup times as often. Cut
// sessions have shorter prompts, which the RTX 5060 Ti's shared vLLM cache
// holds all of: at twice as often it took 96–100% of the turns under both
// fleet policies, never saturated, and prefix knowledge had nothing to
// decide (108 against 107 ms p50 TTFT, and the same in virtual time). At
// four times it saturates as on the virtual run's busy seeds, and turns
// spill onto the llama-server Macs, where holding the conversation is what
// counts. The same sessions' virtual-time figures are logged beside the
// real ones. The cache hit ratio is what the engines themselves report
// (usage.prompt_tokens_details.cached_tokens). Like
// TestRealtimePolicyComparison it is a measurement, opt-in, failing only
// when something breaks.

const (
	agentRTWindow   = 90 * time.Second // of the scenario's session starts
	agentRTMaxTurns = 8
	agentRTSpeedup  = 4
)

// agentRTFleetFile is seed-mixed's fleet with vLLM reporting cached tokens.
var agentRTFleetFile = strings.Replace(realtimeFleetFile, `--max-num-seqs, "8",`,
	`--max-num-seqs, "8", --enable-prompt-tokens-details,`, 1)

type agentRTTurn struct {
	ttft, e2e      time.Duration
	prompt, cached int
	err            error
	rejected       bool
}

type agentRTResult struct {
	policy         string
	ttft, e2e      []float64 // ms, sorted
	prompt, cached int
	rejected       int
	share          map[string]float64
	workerHit      map[string]float64
}

func TestRealtimeAgentSessions(t *testing.T) {
	if os.Getenv("FLEET_REALTIME") != "1" {
		t.Skip("a real-time run of several minutes; set FLEET_REALTIME=1 to measure")
	}
	scen, err := simulate.Builtin("agent-sessions", 0.7)
	if err != nil {
		t.Fatal(err)
	}
	var sessions []simulate.Session
	turns := 0
	for _, s := range scen.Sessions() {
		if s.Start > agentRTWindow {
			break
		}
		s.Turns = s.Turns[:min(len(s.Turns), agentRTMaxTurns)]
		s.Start /= agentRTSpeedup
		turns += len(s.Turns)
		sessions = append(sessions, s)
	}
	t.Logf("agent-sessions in real time: %d sessions starting within %s, %d turns, seed %d", len(sessions), agentRTWindow/agentRTSpeedup, turns, scen.Seed)
	if strings.Count(agentRTFleetFile, "--enable-prompt-tokens-details") != 1 {
		t.Fatal("the fleet file did not get --enable-prompt-tokens-details")
	}
	fleetFile := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(fleetFile, []byte(agentRTFleetFile), 0o600); err != nil {
		t.Fatal(err)
	}
	policies := []string{"fleet", "fleet-no-prefix", "cache-aware", "p2c-least-loaded"}
	virtual, err := simulate.RunSessions(scen, sessions, policies)
	if err != nil {
		t.Fatal(err)
	}
	var results []agentRTResult
	for _, policy := range policies {
		t.Run(policy, func(t *testing.T) {
			results = append(results, runAgentRT(t, policy, fleetFile, scen.Agent.System, sessions))
		})
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%18s %6s %8s %9s %9s %9s %9s %9s\n", "policy", "turns", "rejected", "p50 TTFT", "p99 TTFT", "p50 E2E", "p99 E2E", "cache hit")
	for _, r := range results {
		hit := 0.0
		if r.prompt > 0 {
			hit = float64(r.cached) / float64(r.prompt)
		}
		fmt.Fprintf(&sb, "%18s %6d %8d %9s %9s %9s %9s %8.1f%%\n", r.policy, len(r.ttft), r.rejected,
			rtFmtMS(rtPct(r.ttft, 0.5)), rtFmtMS(rtPct(r.ttft, 0.99)), rtFmtMS(rtPct(r.e2e, 0.5)), rtFmtMS(rtPct(r.e2e, 0.99)), 100*hit)
	}
	sb.WriteString("share of turns per worker (and the cache hit ratio it reported, from workers --json)\n")
	for _, r := range results {
		var names []string
		for w := range r.share {
			names = append(names, w)
		}
		sort.Strings(names)
		fmt.Fprintf(&sb, "%18s", r.policy)
		for _, w := range names {
			fmt.Fprintf(&sb, "  %s %.1f%% (%.0f%%)", w, 100*r.share[w], 100*r.workerHit[w])
		}
		sb.WriteString("\n")
	}
	sb.WriteString("the same sessions in virtual time (simulate.RunSessions)\n")
	for _, r := range virtual {
		fmt.Fprintf(&sb, "%18s %6d %8d %9s %9s %9s %9s %8.1f%%\n", r.Policy, r.Requests, r.Rejected,
			rtFmtMS(r.P50TTFTms), rtFmtMS(r.P99TTFTms), rtFmtMS(r.P50E2Ems), rtFmtMS(r.P99E2Ems), 100*r.CacheHit)
	}
	t.Logf("real time, same sessions for each policy:\n%s", sb.String())
}

func runAgentRT(t *testing.T, policy, fleetFile string, system []int, sessions []simulate.Session) agentRTResult {
	data := t.TempDir()
	h := startPolicyHub(t, data, freePort(t), fleetFile, policy)
	base := "http://" + h.http
	rtWaitAllReady(t, data, len(realtimeNodes), 3*time.Minute)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()

	outcomes := make([][]agentRTTurn, len(sessions))
	var wg sync.WaitGroup
	start := time.Now()
	for i, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(s.Start)))
			outcomes[i] = runAgentSession(client, base, i, system[s.Kind], s)
		}()
	}
	wg.Wait()
	r := agentRTResult{policy: policy, workerHit: map[string]float64{}}
	for i, turns := range outcomes {
		for k, o := range turns {
			switch {
			case o.err != nil:
				t.Errorf("%s: session %d turn %d: %v", policy, i, k, o.err)
			case o.rejected:
				r.rejected++
			default:
				r.ttft = append(r.ttft, rtMS(o.ttft))
				r.e2e = append(r.e2e, rtMS(o.e2e))
				r.prompt += o.prompt
				r.cached += o.cached
			}
		}
	}
	sort.Float64s(r.ttft)
	sort.Float64s(r.e2e)
	share, err := rtBackendShares(base)
	if err != nil {
		t.Errorf("reading the router's metrics: %v", err)
	}
	r.share = share
	// Each worker's cache hit ratio as `workers --json` shows it.
	for _, w := range workersJSON(t, data) {
		if w.CacheHit != nil {
			r.workerHit[w.Name()] = *w.CacheHit
		} else if share[w.Name()] > 0 {
			t.Errorf("%s: workers --json shows no cache hit ratio for %s, which served %.0f%% of the turns", policy, w.Name(), 100*share[w.Name()])
		}
	}
	t.Logf("%s: %d turns served, %d rejected in %.1f s", policy, len(r.ttft), r.rejected, time.Since(start).Seconds())
	return r
}

// agentText is n tokens of the sim's tokenizer (4 bytes a token) of
// deterministic text named by tag.
func agentText(tag string, n int) string {
	unit := tag + " lorem ipsum dolor sit amet. "
	return strings.Repeat(unit, max(n*4, len(unit))/len(unit)+1)[:max(n*4, 1)]
}

// runAgentSession plays one session: every turn resends the conversation so
// far plus a tool result, as coding agents do.
func runAgentSession(client *http.Client, base string, id, system int, s simulate.Session) []agentRTTurn {
	msgs := []map[string]string{{"role": "system", "content": agentText(fmt.Sprintf("agent kind %d system and tools", s.Kind), system)}}
	var out []agentRTTurn
	for k, turn := range s.Turns {
		var user string
		if k == 0 {
			user = agentText(fmt.Sprintf("session %d task", id), turn.Prompt-system)
		} else {
			prev := s.Turns[k-1]
			user = agentText(fmt.Sprintf("session %d tool result %d", id, k), turn.Prompt-prev.Prompt-prev.Output)
		}
		msgs = append(msgs, map[string]string{"role": "user", "content": user})
		o, answer := agentRTRequest(client, base, msgs, turn.Output)
		out = append(out, o)
		if o.err != nil {
			return out
		}
		msgs = append(msgs, map[string]string{"role": "assistant", "content": answer})
		time.Sleep(turn.Think)
	}
	return out
}

func agentRTRequest(client *http.Client, base string, msgs []map[string]string, output int) (agentRTTurn, string) {
	body, _ := json.Marshal(map[string]any{
		"model": "qwen3-4b", "stream": true, "stream_options": map[string]any{"include_usage": true},
		"max_tokens": output, "messages": msgs,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return agentRTTurn{err: err}, ""
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return agentRTTurn{err: err}, ""
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		io.Copy(io.Discard, resp.Body)
		return agentRTTurn{rejected: true}, ""
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return agentRTTurn{err: fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)}, ""
	}
	var o agentRTTurn
	var answer strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	usage := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			o.e2e = time.Since(sent)
			break
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens int `json:"prompt_tokens"`
				Details      *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return agentRTTurn{err: fmt.Errorf("a chunk is not JSON: %w", err)}, ""
		}
		if chunk.Error != nil {
			return agentRTTurn{err: fmt.Errorf("error event mid-stream: %s", chunk.Error.Message)}, ""
		}
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			if o.ttft == 0 {
				o.ttft = time.Since(sent)
			}
			answer.WriteString(chunk.Choices[0].Delta.Content)
		}
		if chunk.Usage != nil {
			usage = true
			o.prompt = chunk.Usage.PromptTokens
			if chunk.Usage.Details != nil {
				o.cached = chunk.Usage.Details.CachedTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		return agentRTTurn{err: fmt.Errorf("reading the stream: %w", err)}, ""
	}
	if o.e2e == 0 || !usage {
		return agentRTTurn{err: fmt.Errorf("the stream ended without usage and [DONE]")}, ""
	}
	return o, answer.String()
}
